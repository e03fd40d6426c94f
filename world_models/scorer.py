"""The world-model interface: trajectories (frames + instruction) → per-frame progress and success → one reward.

A scorer sees `num_frames` frames sampled uniformly from each trajectory (8 by default, as the
WMRL paper's progress model) and returns per-frame progress in [0, 1] and a success probability.
`reduce_scores` collapses them to one scalar per trajectory:

- `potential` (default): mean of the last k progress values minus mean of the first k;
- `final`: the last progress value;
- `max`: the largest progress value (invites reward hacking: reach a good state, then collapse);
- `success`: the success probability.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

import numpy as np

REDUCTIONS = ("potential", "final", "max", "success")
# the range of each reduction's scores
SCORE_RANGES = {"potential": (-1.0, 1.0), "final": (0.0, 1.0), "max": (0.0, 1.0), "success": (0.0, 1.0)}


@dataclass
class Prediction:
    progress: np.ndarray  # (B, n) in [0, 1]
    success: np.ndarray  # (B,) in [0, 1]


def sample_frame_indices(length: int, num_frames: int) -> np.ndarray:
    """`num_frames` indices spread uniformly over 0..length-1, first and last included (repeats when short)."""
    if length < 1:
        raise ValueError("cannot sample frames from an empty trajectory")
    return np.round(np.linspace(0, length - 1, num_frames)).astype(np.int64)


def check_trajectories(trajectories: Sequence[np.ndarray], instructions: Sequence[str]) -> None:
    """Every trajectory a non-empty (T, H, W, 3) uint8 array, all with the same frame shape."""
    if len(trajectories) != len(instructions):
        raise ValueError(f"got {len(trajectories)} trajectories and {len(instructions)} instructions")
    if not len(trajectories):
        raise ValueError("no trajectories to score")
    expected = None
    for i, frames in enumerate(trajectories):
        frames = np.asarray(frames)
        if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
            raise ValueError(f"trajectory {i} has frames of shape {frames.shape} and dtype {frames.dtype}; expected "
                             "uint8 (T, H, W, 3)")
        if len(frames) == 0:
            raise ValueError(f"trajectory {i} is empty; a trajectory needs at least one frame")
        if expected is None:
            expected = frames.shape[1:]
        elif frames.shape[1:] != expected:
            raise ValueError(f"trajectory {i} has {frames.shape[1]}x{frames.shape[2]} frames, trajectory 0 has "
                             f"{expected[0]}x{expected[1]}; all frames of a batch must have one size")


def reduce_scores(prediction: Prediction, mode: str = "potential", k: int = 3) -> np.ndarray:
    """One scalar per trajectory from per-frame progress and success."""
    progress = np.asarray(prediction.progress, dtype=np.float64)
    if mode == "potential":
        if progress.shape[1] < k:
            raise ValueError(f"potential needs at least k={k} frames, got {progress.shape[1]}")
        return progress[:, -k:].mean(1) - progress[:, :k].mean(1)
    if mode == "final":
        return progress[:, -1]
    if mode == "max":
        return progress.max(1)
    if mode == "success":
        return np.asarray(prediction.success, dtype=np.float64)
    raise ValueError(f"unknown reduction {mode!r}; expected one of {REDUCTIONS}")


class TrajectoryScorer(ABC):
    """Anything that maps sampled trajectory frames + instructions to progress and success.

    Implement `predict` (frames already sampled: each trajectory (num_frames, H, W, 3) uint8).
    """

    num_frames: int = 8

    @abstractmethod
    def predict(self, frames: np.ndarray, instructions: list[str]) -> Prediction:
        """frames (B, num_frames, H, W, 3) uint8 → Prediction with progress (B, num_frames)."""

    def sample(self, trajectories: Sequence[np.ndarray], instructions: Sequence[str]) -> np.ndarray:
        check_trajectories(trajectories, instructions)
        return np.stack([np.asarray(f)[sample_frame_indices(len(f), self.num_frames)] for f in trajectories])

    def predict_trajectories(self, trajectories: Sequence[np.ndarray], instructions: Sequence[str],
                             batch_size: int = 32) -> Prediction:
        """Sample each trajectory's frames uniformly, then predict in batches."""
        progress, success = [], []
        for start in range(0, len(trajectories), batch_size):
            frames = self.sample(trajectories[start:start + batch_size], instructions[start:start + batch_size])
            prediction = self.predict(frames, list(instructions[start:start + batch_size]))
            progress.append(np.asarray(prediction.progress, np.float64))
            success.append(np.asarray(prediction.success, np.float64))
        if not progress:
            raise ValueError("no trajectories to score")
        return Prediction(np.concatenate(progress), np.concatenate(success))

    def score(self, trajectories: Sequence[np.ndarray], instructions: Sequence[str], mode: str = "potential",
              k: int = 3) -> np.ndarray:
        """One reward per trajectory (see the module docstring for the modes)."""
        if mode not in REDUCTIONS:
            raise ValueError(f"unknown reduction {mode!r}; expected one of {REDUCTIONS}")
        return reduce_scores(self.predict_trajectories(trajectories, instructions), mode, k)
