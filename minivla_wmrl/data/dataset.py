"""A torch dataset of (upright image, instruction, normalised action chunk) from LIBERO demonstrations.

Reads LIBERO hdf5 (the original layout, the no-noops variant, our generated files) and LeRobot
datasets of the same demos. Actions are no-op filtered, put in the training gripper convention,
normalised with BOUNDS_Q99 statistics of the training episodes, and cut into chunks with the
reference padding. Images are read lazily (a LIBERO-90 set does not fit in memory), turned
upright as the env does, and resized to the policy's size (bicubic, antialiased). The hdf5 demos
also convert to LeRobot episodes (`iter_hdf5_demos`, for `demos --format lerobot`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset

from minivla_wmrl.data.chunks import episode_chunks
from minivla_wmrl.data.lerobot import ACTION_KEYS, STORED_ORIENTATION, LeRobotDataset, is_lerobot_dataset
from minivla_wmrl.data.lerobot import IMAGE_KEYS as LEROBOT_IMAGE_KEYS
from minivla_wmrl.policy.normalization import ActionStatistics, gripper_to_training


def _demo_order(name: str) -> int:
    match = re.fullmatch(r"demo_(\d+)", name)
    return int(match.group(1)) if match else -1


def keep_mask(actions: np.ndarray, threshold: float = 1e-4) -> np.ndarray:
    """The reference's "no-noops" rule as a mask: drop an action whose arm dims (all but the last;
    LIBERO's first six) have norm < threshold and whose gripper (the last dim) equals the previous
    kept action's; before any action is kept, a still arm alone drops it, whatever the gripper
    (openvla-mini's regenerate_libero_dataset.py). Those steps teach a policy to stand still."""
    keep = np.ones(len(actions), bool)
    previous_gripper = None
    for i, action in enumerate(actions):
        if np.linalg.norm(action[:-1]) < threshold and (previous_gripper is None or action[-1] == previous_gripper):
            keep[i] = False
        else:
            previous_gripper = action[-1]
    return keep


GRIPPER_CONVENTIONS = ("libero", "none")  # "none": actions are trained and executed as stored
IMAGE_TRANSFORMS = {"minivla": lambda f: f[..., ::-1, :, :], "openvla": lambda f: f[..., ::-1, ::-1, :]}
# stored orientations that are LIBERO's raw frames, or a fixed transform of them, → the raw frames
STORED_TO_RAW = {"opengl": lambda f: f, STORED_ORIENTATION: lambda f: f[..., ::-1, ::-1, :]}


def upright_frames(frames: np.ndarray, stored: str, image_convention: str) -> np.ndarray:
    """Stored frames as the env shows them under `image_convention`; frames stored upright
    (e.g. a gymnasium env's) are kept as they are."""
    if stored not in STORED_TO_RAW:
        return frames
    return IMAGE_TRANSFORMS[image_convention](STORED_TO_RAW[stored](frames))


class Hdf5Frames:
    """The frames of one LIBERO hdf5 file, opened on first use in each process (loader workers too)."""

    def __init__(self, path: Path):
        self.path, self._handle = Path(path), None

    def read(self, demo: str, key: str, indices) -> np.ndarray:
        if self._handle is None:
            self._handle = h5py.File(self.path, "r")
        try:
            return np.asarray(self._handle["data"][demo]["obs"][key][np.asarray(indices, dtype=np.int64)])
        except OSError as error:  # a damaged (compressed) chunk: h5py's message names no file
            raise ValueError(f"{self.path}: data/{demo}/obs/{key} frames {np.asarray(indices).tolist()} cannot be "
                             f"read ({error}); the file is damaged") from None

    def __getstate__(self):
        return {"path": self.path, "_handle": None}


@dataclass
class DemoEpisode:
    file: Path  # an hdf5 file, or a LeRobot dataset directory
    demo: str  # "demo_N" in the file, or "episode_N" in the LeRobot dataset
    instruction: str
    actions: np.ndarray  # (T, 7) training convention, no-ops dropped
    frames: np.ndarray  # indices into the stored frames, one per kept action
    image_convention: str  # how the stored frames are oriented ("opengl": raw, upside down)
    gripper_convention: str = "libero"  # "libero": dim 6 is LIBERO's gripper, mapped to 1 = open / 0 = close
    source: Hdf5Frames | LeRobotDataset | None = None  # reads the stored frames: .read(demo, key, indices)

    def read_frames(self, key: str, indices) -> np.ndarray:
        return self.source.read(self.demo, key, indices)


def instruction_of(handle, path: Path) -> str:
    info = handle["data"].attrs.get("problem_info")
    if info is not None:
        return json.loads(info)["language_instruction"]
    # The no-noops files drop the file attributes; LIBERO names files after the task.
    name = path.name.removesuffix("_demo.hdf5").removesuffix("_no_noops")
    words = name.split("_")
    while words and words[0].isupper():
        words = words[1:]
    return " ".join(words)


def resize_frames(frames: np.ndarray, size: int, mode: str = "bilinear") -> np.ndarray:
    """(N, H, W, 3) uint8 frames → (N, size, size, 3), antialiased; unchanged when already that size."""
    if frames.shape[1:3] == (size, size):
        return np.ascontiguousarray(frames)
    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float()
    x = torch.nn.functional.interpolate(x, size=(size, size), mode=mode, antialias=True, align_corners=False)
    return x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()


def open_hdf5(path: Path, what: str):
    """Open an hdf5 file for reading; a missing or unreadable file is an error naming it."""
    if Path(path).is_dir():
        raise IsADirectoryError(f"{what} {path} is a directory; expected an hdf5 file")
    if not Path(path).is_file():
        raise FileNotFoundError(f"{what} {path} does not exist")
    try:
        return h5py.File(path, "r")
    except OSError as error:
        raise ValueError(f"{path} is not a readable hdf5 file ({error})") from None


def demo_files(paths: list[Path]) -> list[Path]:
    """The hdf5 files `paths` name (directories: their *.hdf5)."""
    files = []
    for path in map(Path, paths):
        files.extend(sorted(path.glob("*.hdf5")) if path.is_dir() else [path])
    if not files:
        raise FileNotFoundError(f"no demonstration files found in {', '.join(map(str, paths))}")
    return files


def demo_names(handle, path: Path, limit: int | None = None) -> list[str]:
    """The file's data/demo_N groups in numeric order (the first `limit`)."""
    if "data" not in handle:
        raise ValueError(f"{path} has no 'data' group; expected the LIBERO layout data/demo_N")
    demos = sorted((k for k in handle["data"] if _demo_order(k) >= 0), key=_demo_order)[:limit]
    if not demos:
        raise ValueError(f"{path} has no data/demo_N groups")
    return demos


def read_episodes(paths: list[Path], chunk_len: int = 8, image_key: str | None = "agentview_rgb",
                  wrist_key: str | None = None, max_demos_per_file: int | None = None) -> list[DemoEpisode]:
    """Every demo of every source, validated: a problem names the file and the demo. A source is an
    hdf5 file, a directory of them, or a LeRobot dataset directory (see `data.lerobot`; camera keys
    may be ours, e.g. agentview_rgb, or the dataset's). With `image_key=None` only the actions are
    needed (action-tokenizer training). `max_demos_per_file` keeps the first N demos of each file
    (LIBERO: one file per task), or of each task of a LeRobot dataset."""
    if not paths:
        raise ValueError("no demonstration sources: data.paths (vq --data) is empty; expected hdf5 files, "
                         "directories of them, or LeRobot dataset directories")
    sources, seen = [], {}
    for path in map(Path, paths):  # each source once, checked before any is read: `--data D D` counted D twice
        for source in [path] if is_lerobot_dataset(path) else demo_files([path]):
            if source.resolve() in seen:
                raise ValueError(f"demonstration source {source} is named twice (also as {seen[source.resolve()]}); "
                                 "each demo would count twice")
            seen[source.resolve()] = source
            sources.append(source)
    episodes = []
    for file in sources:
        if file.is_dir():  # a LeRobot dataset
            episodes.extend(_lerobot_episodes(file, chunk_len, image_key, wrist_key, max_demos_per_file))
            continue
        with open_hdf5(file, "demonstration file") as handle:
            instruction = instruction_of(handle, file)
            convention = handle["data"].attrs.get("macros_image_convention", "opengl")
            gripper = handle["data"].attrs.get("gripper_convention", "libero")
            source = Hdf5Frames(file)
            for demo in demo_names(handle, file, max_demos_per_file):
                group = handle["data"][demo]
                for key in ["actions"] + [f"obs/{k}" for k in (image_key, wrist_key) if k]:
                    if key not in group:
                        raise ValueError(f"{file}: data/{demo} lacks '{key}'")
                try:
                    raw = np.asarray(group["actions"], dtype=np.float64)
                except OSError as error:
                    raise ValueError(f"{file}: data/{demo}/actions cannot be read ({error}); "
                                     "the file is damaged") from None
                for key in (image_key, wrist_key):  # float frames in [0, 1] once became near-black uint8
                    frames = group[f"obs/{key}"] if key else None
                    if frames is not None and (frames.dtype != np.uint8 or frames.ndim != 4
                                               or frames.shape[-1] != 3):
                        raise ValueError(f"{file}: data/{demo}/obs/{key} is {frames.dtype} {frames.shape}; "
                                         "expected uint8 (T, H, W, 3) RGB frames in 0..255 "
                                         "(scale float images before writing them)")
                if image_key and len(group[f"obs/{image_key}"]) != len(raw):
                    raise ValueError(f"{file}: data/{demo} has {len(group[f'obs/{image_key}'])} frames "
                                     f"for {len(raw)} actions")
                episodes.append(_episode(f"{file}: data/{demo}", DemoEpisode(
                    file, demo, instruction, raw, np.arange(len(raw)), convention, gripper, source), chunk_len))
    return episodes


def _lerobot_episodes(path: Path, chunk_len: int, image_key: str | None, wrist_key: str | None,
                      max_per_task: int | None) -> list[DemoEpisode]:
    dataset = LeRobotDataset(path)
    if dataset.action_key is None:
        raise ValueError(f"{path}/meta/info.json has no action feature; demonstrations need one of "
                         f"{ACTION_KEYS}, found {sorted(dataset.features)}")
    for key in (image_key, wrist_key):
        if key:
            dataset.image_key(key)  # a missing camera is named before any training starts
    episodes, per_task = [], {}
    for index in dataset.episodes:
        task = dataset.task_of[index]
        per_task[task] = per_task.get(task, 0) + 1
        if max_per_task is not None and per_task[task] > max_per_task:
            continue
        raw = dataset.actions[index]
        episodes.append(_episode(f"{path}: episode_{index}", DemoEpisode(
            path, f"episode_{index}", task, raw, np.arange(len(raw)), STORED_ORIENTATION, "libero", dataset),
            chunk_len))
    return episodes


def _episode(where: str, episode: DemoEpisode, chunk_len: int) -> DemoEpisode:
    """Check the raw actions, drop the no-ops, put the gripper in the training convention."""
    raw, gripper = episode.actions, episode.gripper_convention
    if gripper not in GRIPPER_CONVENTIONS:
        raise ValueError(f"{where}: gripper_convention {gripper!r} is unknown; expected one of {GRIPPER_CONVENTIONS}")
    expected_dim = 7 if gripper == "libero" else raw.shape[-1]
    if raw.ndim != 2 or raw.shape[1] != expected_dim:
        raise ValueError(f"{where}/actions has shape {raw.shape}; expected (T, {expected_dim})")
    if not np.all(np.isfinite(raw)):
        raise ValueError(f"{where}/actions contains NaN/inf")
    keep = np.flatnonzero(keep_mask(raw))
    if len(keep) < chunk_len:
        raise ValueError(f"{where} has {len(keep)} actions after no-op filtering, fewer than one chunk ({chunk_len})")
    actions = raw[keep]
    if gripper == "libero":
        actions[:, 6] = gripper_to_training(actions[:, 6])
    episode.actions, episode.frames = actions, episode.frames[keep]
    return episode


class DemoDataset(Dataset):
    """One item per kept step: image(s) (uint8, upright, `image_size`), instruction, chunk (normalised)."""

    def __init__(self, episodes: list[DemoEpisode], statistics: ActionStatistics, chunk_len: int = 8,
                 image_size: int = 224, image_key: str = "agentview_rgb", wrist_key: str | None = None,
                 image_convention: str = "minivla"):
        if image_convention not in IMAGE_TRANSFORMS:
            raise ValueError(f"unknown image_convention {image_convention!r}; expected one of {list(IMAGE_TRANSFORMS)}")
        self.episodes, self.statistics = episodes, statistics
        self.image_size, self.keys = image_size, [image_key] + ([wrist_key] if wrist_key else [])
        self.image_convention = image_convention
        self.chunks = [episode_chunks(statistics.normalize(e.actions), chunk_len).astype(np.float32) for e in episodes]
        self.index = [(e, t) for e, episode in enumerate(episodes) for t in range(len(episode.actions))]

    def __len__(self) -> int:
        return len(self.index)

    def _frames(self, episode: DemoEpisode, t: int) -> np.ndarray:
        frames = np.stack([episode.read_frames(k, [episode.frames[t]])[0] for k in self.keys])
        return np.ascontiguousarray(upright_frames(frames, episode.image_convention, self.image_convention))

    def __getitem__(self, i: int) -> dict:
        e, t = self.index[i]
        frames = resize_frames(self._frames(self.episodes[e], t), self.image_size, mode="bicubic")
        return {"image": frames[0] if len(self.keys) == 1 else frames, "instruction": self.episodes[e].instruction,
                "chunk": self.chunks[e][t]}


def collate(items: list[dict]) -> dict:
    return {"image": np.stack([it["image"] for it in items]), "instruction": [it["instruction"] for it in items],
            "chunk": torch.from_numpy(np.stack([it["chunk"] for it in items]))}


def iter_hdf5_demos(paths: list[Path]) -> Iterator[dict]:
    """LIBERO hdf5 demos (every step, as stored) as LeRobot episodes in the published LIBERO layout:
    frames rotated 180° from the raw ones, `observation.state` = eef position, axis-angle, gripper."""
    for path in demo_files(paths):
        with open_hdf5(path, "demonstration file") as handle:
            instruction = instruction_of(handle, path)
            convention = handle["data"].attrs.get("macros_image_convention", "opengl")
            if convention != "opengl":
                raise ValueError(f"{path}: macros_image_convention {convention!r}; only LIBERO's raw ('opengl') "
                                 "frames have a LeRobot LIBERO orientation to convert to")
            for demo in demo_names(handle, path):
                group = handle["data"][demo]
                frames = {"action": np.asarray(group["actions"])}  # as stored (LIBERO: float64), so exactly equal
                obs = group["obs"]
                if "ee_states" in obs and "gripper_states" in obs:
                    frames["observation.state"] = np.concatenate([obs["ee_states"], obs["gripper_states"]],
                                                                 axis=1).astype(np.float32)
                for ours, (theirs, *_) in LEROBOT_IMAGE_KEYS.items():  # the first name: the published sets' own
                    if ours in obs:
                        frames[theirs] = np.ascontiguousarray(np.asarray(obs[ours])[:, ::-1, ::-1])
                yield {"task": instruction, "frames": frames}
