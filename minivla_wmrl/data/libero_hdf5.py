"""Reading LIBERO demonstration files (`data/demo_N/...`, one file per task)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np


def _demo_order(name: str) -> int:
    match = re.fullmatch(r"demo_(\d+)", name)
    return int(match.group(1)) if match else -1


def read_demo_actions(path: Path) -> list[np.ndarray]:
    """The raw (T, 7) action arrays of every demo in a LIBERO hdf5 file, in demo order.

    A file that is missing, not hdf5, lacks `data/demo_*/actions`, or holds non-finite actions is an
    error naming the file and the demo.
    """
    import h5py

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"demonstration file {path} does not exist")
    try:
        handle = h5py.File(path, "r")
    except OSError as error:
        raise ValueError(f"{path} is not a readable hdf5 file ({error})") from None
    with handle:
        if "data" not in handle:
            raise ValueError(f"{path} has no 'data' group; expected the LIBERO layout data/demo_N/actions")
        demos = sorted((k for k in handle["data"] if _demo_order(k) >= 0), key=_demo_order)
        if not demos:
            raise ValueError(f"{path} has no data/demo_N groups")
        episodes = []
        for demo in demos:
            if "actions" not in handle["data"][demo]:
                raise ValueError(f"{path}: data/{demo} has no 'actions' dataset")
            actions = np.asarray(handle["data"][demo]["actions"], dtype=np.float64)
            if actions.ndim != 2 or len(actions) == 0:
                raise ValueError(f"{path}: data/{demo}/actions has shape {actions.shape}; expected (T >= 1, D)")
            if not np.all(np.isfinite(actions)):
                raise ValueError(f"{path}: data/{demo}/actions contains NaN/inf")
            episodes.append(actions)
        return episodes


def drop_noops(actions: np.ndarray, threshold: float = 1e-4) -> np.ndarray:
    """LIBERO's "no-noops" rule: drop an action whose first six dims have norm < threshold and whose
    gripper equals the previous kept action's (those steps teach a policy to stand still)."""
    keep, previous_gripper = [], None
    for action in actions:
        if np.linalg.norm(action[:6]) < threshold and previous_gripper is not None and action[6] == previous_gripper:
            continue
        keep.append(action)
        previous_gripper = action[6]
    return np.stack(keep) if keep else actions[:0]
