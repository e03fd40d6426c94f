"""Labelled trajectories for world-model training: frames + instruction + real success.

Two sources: demonstrations (successful by construction; frames every `stride` steps plus the
last, upright as the env shows them) and rollouts labelled by the real simulator (the frames the
policy saw at its queries, plus the final frame). Stored as hdf5 (`trajectories/N/frames` +
attributes), written atomically.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal, Sequence

import h5py
import numpy as np

from minivla_wmrl.data.dataset import open_hdf5, read_episodes, resize_frames, upright_frames
from minivla_wmrl.data.lerobot import write_lerobot
from minivla_wmrl.infra.atomic import atomic_file
from minivla_wmrl.infra.config import InputPath, Range, check_input_paths, command_line_parser, config_from_dict
from minivla_wmrl.infra.outputs import check_output_dir


@dataclass
class LabelledTrajectory:
    frames: np.ndarray  # (T, H, W, 3) uint8, upright
    instruction: str
    success: bool
    source: str  # "demo" or "rollout"
    task_id: str = ""


def demo_trajectories(paths: Sequence[str], size: int, stride: int = 8, image_convention: str = "minivla",
                      image_key: str = "agentview_rgb") -> list[LabelledTrajectory]:
    """Each demo's agent-view frames at every `stride`-th kept step and its last one, upright, resized."""
    out = []
    for episode in read_episodes([Path(p) for p in paths], chunk_len=1, image_key=image_key):
        picks = episode.frames[np.unique(np.r_[np.arange(0, len(episode.frames), stride), len(episode.frames) - 1])]
        frames = upright_frames(episode.read_frames(image_key, picks), episode.image_convention, image_convention)
        out.append(LabelledTrajectory(resize_frames(frames, size), episode.instruction, True, "demo",
                                      str(episode.file.name)))
    return out


def trajectory_frames(trajectory, horizon: int | None = None) -> np.ndarray:
    """A rollout's frames for a world model: the first camera at every query, then the final frame.

    With `horizon`, the frames the same rollout cut at `horizon` env steps would show (the queries
    issued before it, then the frame where it stopped): the prefix a truncated rollout is scored on.
    """
    frames = trajectory.frames if trajectory.frames.ndim == 4 else trajectory.frames[:, 0]
    final = trajectory.final_frame
    if final is not None and final.ndim == 4:
        final = final[0]
    if horizon is not None:
        kept = int(np.sum(trajectory.query_steps < horizon))
        if kept < len(frames):  # the episode ran on: the prefix ends at the next query's frame
            frames, final = frames[:kept], frames[kept]
    if final is not None:
        frames = np.concatenate([frames, final[None]])
    return frames


def rollout_trajectories(trajectories, size: int | None, horizon: int | None = None) -> list[LabelledTrajectory]:
    """Rollout-engine trajectories → labelled ones (resized to `size` unless None; cut to the
    prefix of `horizon` steps unless None, labelled with the final outcome); infrastructure
    failures are dropped: they say nothing about the policy."""
    out = []
    for t in trajectories:
        if t.failure is not None or not len(t.frames):
            continue
        frames = trajectory_frames(t, horizon)
        out.append(LabelledTrajectory(frames if size is None else resize_frames(frames, size), t.instruction,
                                      bool(t.success), "rollout", t.spec.task_id))
    return out


def save_trajectories(path: Path, trajectories: Sequence[LabelledTrajectory]) -> Path:
    path = Path(path)
    with atomic_file(path) as tmp, h5py.File(tmp, "w") as f:
        group = f.create_group("trajectories")
        for i, t in enumerate(trajectories):
            item = group.create_group(str(i))
            item.create_dataset("frames", data=t.frames, compression="gzip", compression_opts=1)
            item.attrs.update(instruction=t.instruction, success=bool(t.success), source=t.source, task_id=t.task_id)
    return path


def load_trajectories(paths: Sequence[str], size: int | None) -> list[LabelledTrajectory]:
    """Every trajectory of the files, frames resized to `size` (None: as stored)."""
    out = []
    for path in map(Path, paths):
        with open_hdf5(path, "trajectory file") as handle:
            if "trajectories" not in handle:
                raise ValueError(f"{path} has no 'trajectories' group; write it with save_trajectories")
            for name in sorted(handle["trajectories"], key=int):
                item = handle["trajectories"][name]
                missing = [k for k in ("instruction", "success", "source") if k not in item.attrs]
                if "frames" not in item or missing:
                    raise ValueError(f"{path}: trajectories/{name} lacks {missing or ['frames']}")
                frames = np.asarray(item["frames"])
                if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or not len(frames):
                    raise ValueError(f"{path}: trajectories/{name}/frames has shape {frames.shape} ({frames.dtype}); "
                                     "expected non-empty uint8 (T, H, W, 3)")
                out.append(LabelledTrajectory(frames if size is None else resize_frames(frames, size),
                                              str(item.attrs["instruction"]),
                                              bool(item.attrs["success"]), str(item.attrs["source"]),
                                              str(item.attrs.get("task_id", ""))))
    return out


def lerobot_episodes(trajectories: Sequence[LabelledTrajectory]):
    """Labelled trajectories as LeRobot episodes: the frames (upright, as the policy saw them),
    `next.done` on the last frame and `next.success` (the real label) on the last frame of a success."""
    for t in trajectories:
        last = np.arange(len(t.frames)) == len(t.frames) - 1
        yield {"task": t.instruction, "frames": {"observation.images.image": t.frames, "next.done": last,
                                                 "next.success": last & bool(t.success)}}


@dataclass(kw_only=True)
class ExportCommand:
    """`minivla-wmrl export`: its command-line flags are these fields (`config.command_line_parser`)."""

    trajectories: Annotated[list[str], InputPath("file")] = field(metadata={
        "help": "trajectory hdf5 files written by wm (collected rollouts)", "positional": True})
    out: str = field(metadata={"help": "the LeRobot dataset directory to write"})
    fps: Annotated[int, Range(1, high=1000)] = field(default=10, metadata={
        "help": "frame rate recorded in meta/info.json"})
    lerobot_version: Literal["v3.0", "v2.1"] = "v3.0"
    video: bool = field(default=False, metadata={"help": "cameras as AV1 mp4 (lossy) instead of PNG"})
    overwrite: bool = field(default=False, metadata={
        "help": "replace --out although it holds files this command did not write (see outputs.py)"})


def main(args) -> None:
    """`minivla-wmrl export`: collected rollouts → a LeRobot dataset, to inspect with LeRobot's tools."""
    parser = command_line_parser(ExportCommand, "minivla-wmrl export",
                                 "Write collected rollouts (trajectory files) as a LeRobot dataset.")
    command = config_from_dict(ExportCommand, vars(parser.parse_args(args.options)), "export")
    check_input_paths(command, "export")
    check_output_dir(Path(command.out), "export", command.overwrite)
    if not command.trajectories:
        raise ValueError("export needs trajectory files (written by wm's rollout collection)")
    trajectories = load_trajectories(command.trajectories, None)
    if not trajectories:
        raise ValueError(f"export: {', '.join(command.trajectories)} hold no trajectories")
    write_lerobot(Path(command.out), lerobot_episodes(trajectories), fps=command.fps,
                  version=command.lerobot_version, video=command.video, robot_type="unknown", command="export",
                  overwrite=command.overwrite)
    successes = sum(t.success for t in trajectories)
    print(f"{command.out}: {len(trajectories)} episodes ({successes} successful), LeRobot {command.lerobot_version}")
