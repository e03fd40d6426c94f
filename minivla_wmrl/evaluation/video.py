"""Episode videos: the frames the policy saw, with a banner saying success or failure."""

from __future__ import annotations

from pathlib import Path

import imageio.v2 as imageio
import numpy as np
from PIL import Image, ImageDraw

from minivla_wmrl.infra.atomic import atomic_file

BANNER = 18  # pixels


def overlay(frame: np.ndarray, text: str, success: bool) -> np.ndarray:
    """The frame under a green (success) or red (failure) banner holding `text`."""
    height, width = frame.shape[:2]
    canvas = Image.new("RGB", (width, height + BANNER), (30, 140, 60) if success else (170, 40, 40))
    canvas.paste(Image.fromarray(frame), (0, BANNER))
    ImageDraw.Draw(canvas).text((4, 3), text, fill=(255, 255, 255))
    return np.asarray(canvas)


def write_episode_video(path: Path, frames: list[np.ndarray], steps: list[int], success: bool, title: str,
                        fps: float) -> Path:
    """Write an mp4 atomically (temp file, then rename); frame k is labelled with its env step."""
    if not frames:
        raise ValueError(f"no frames to write to {path}")
    path = Path(path)
    verdict = "SUCCESS" if success else "FAILURE"
    with atomic_file(path) as tmp:
        with imageio.get_writer(tmp, fps=fps, codec="libx264", macro_block_size=1,
                                ffmpeg_log_level="error") as writer:
            for frame, step in zip(frames, steps):
                writer.append_data(overlay(frame, f"{title}  step {step}  {verdict}", success))
    return path
