"""Action normalisation as MiniVLA/OpenVLA do it (BOUNDS_Q99), and `dataset_statistics.json`.

The first six LIBERO dims map [q01, q99] to [-1, 1] and clip; the gripper is not normalised
(mask false; a statistics file without a mask normalises every dim, as the reference reads it);
a dim with min == max becomes 0. The gripper's sign convention changes: LIBERO's raw -1 open / +1 close becomes 1 open /
0 close for training, and back at evaluation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minivla_wmrl.infra.atomic import atomic_file

STAT_KEYS = ("mean", "std", "max", "min", "q01", "q99")


@dataclass
class ActionStatistics:
    """Per-dimension action statistics of one dataset, in the reference JSON format."""

    mean: np.ndarray
    std: np.ndarray
    max: np.ndarray
    min: np.ndarray
    q01: np.ndarray
    q99: np.ndarray
    mask: np.ndarray
    num_transitions: int
    num_trajectories: int
    proprio: dict | None = None

    @classmethod
    def from_actions(cls, actions: np.ndarray, num_trajectories: int, mask: np.ndarray | None = None,
                     proprio: np.ndarray | None = None) -> ActionStatistics:
        """Statistics of training-convention actions (N, D); `mask` defaults to all but the last dim."""
        actions = np.asarray(actions, dtype=np.float64)
        if actions.ndim != 2 or len(actions) == 0 or not np.all(np.isfinite(actions)):
            raise ValueError(f"actions must be a finite, non-empty (N, D) array; got shape {actions.shape}")
        if mask is None:
            mask = np.arange(actions.shape[1]) < actions.shape[1] - 1
        proprio_stats = None
        if proprio is not None:
            proprio = np.asarray(proprio, dtype=np.float64)
            proprio_stats = {k: v.tolist() for k, v in _summary(proprio).items()}
        return cls(**_summary(actions), mask=np.asarray(mask, bool), num_transitions=len(actions),
                   num_trajectories=num_trajectories, proprio=proprio_stats)

    def normalize(self, actions: np.ndarray) -> np.ndarray:
        """Training-convention actions (..., D) → normalised actions; masked-out dims pass through,
        and dims that never vary in the data (min == max) become 0, as the reference maps them."""
        actions = self._check(actions)
        scaled = np.clip(2 * (actions - self.q01) / (self.q99 - self.q01 + 1e-8) - 1, -1, 1)
        return np.where(self.min == self.max, 0.0, np.where(self.mask, scaled, actions))

    def unnormalize(self, normalized: np.ndarray) -> np.ndarray:
        normalized = self._check(normalized)
        return np.where(self.mask, 0.5 * (normalized + 1) * (self.q99 - self.q01) + self.q01, normalized)

    def _check(self, actions: np.ndarray) -> np.ndarray:
        actions = np.asarray(actions, dtype=np.float64)
        if actions.shape[-1] != len(self.q01):
            raise ValueError(f"action has last dimension {actions.shape[-1]}; these statistics have {len(self.q01)}")
        return actions

    def to_json(self) -> dict:
        action = {k: getattr(self, k).tolist() for k in STAT_KEYS}
        action["mask"] = self.mask.tolist()
        entry = {"action": action, "num_transitions": self.num_transitions, "num_trajectories": self.num_trajectories}
        if self.proprio is not None:
            entry["proprio"] = self.proprio
        return entry

    @classmethod
    def from_json(cls, entry: dict, where: str = "dataset statistics") -> ActionStatistics:
        try:
            action = entry["action"]
            arrays = {k: np.asarray(action[k], dtype=np.float64) for k in STAT_KEYS}
            mask = np.asarray(action.get("mask", [True] * len(arrays["q01"])), bool)  # the reference: none = all
            return cls(**arrays, mask=mask, num_transitions=int(entry["num_transitions"]),
                       num_trajectories=int(entry["num_trajectories"]), proprio=entry.get("proprio"))
        except (KeyError, TypeError) as error:
            raise ValueError(f"{where}: missing or malformed key {error}; expected "
                             "{'action': {mean, std, max, min, q01, q99, mask}, 'num_transitions', "
                             "'num_trajectories'}") from None


def _summary(x: np.ndarray) -> dict[str, np.ndarray]:
    return dict(mean=x.mean(0), std=x.std(0), max=x.max(0), min=x.min(0),
                q01=np.quantile(x, 0.01, axis=0), q99=np.quantile(x, 0.99, axis=0))


def gripper_to_training(raw: np.ndarray) -> np.ndarray:
    """LIBERO gripper (-1 open, +1 close) → training convention (1 open, 0 close)."""
    return 1 - np.clip(raw, 0, 1)


def gripper_to_env(trained: np.ndarray) -> np.ndarray:
    """Training-convention gripper → LIBERO's: binarise with sign(2g - 1), then negate."""
    return -np.sign(2 * np.asarray(trained) - 1)


def write_statistics(path: Path, statistics: dict[str, ActionStatistics]) -> None:
    """Write `dataset_statistics.json` ({dataset name: entry}) atomically."""
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps({name: s.to_json() for name, s in statistics.items()}, indent=2))


def read_statistics(path: Path) -> dict[str, ActionStatistics]:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"dataset statistics file {path} does not exist") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{path}: expected a JSON object mapping dataset names to statistics")
    return {name: ActionStatistics.from_json(entry, f"{path} [{name!r}]") for name, entry in data.items()}
