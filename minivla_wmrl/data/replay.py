"""The replay store: real-labelled episodes the toolkit executed, kept on disk for outcome probes.

Each write is one hdf5 file (atomic): `episodes/N` groups with the per-query arrays a probe reads
(`query_steps`, `log_probs`, `actions`, `proprio`, `privileged`) and the episode's `task_id`, `instruction`,
`success`, `length` and `source` (who ran it: "collect", "grpo step 3", ...). Only episodes whose
outcome the simulator decided are kept: a cut rollout or an infrastructure failure has none.
`read_replay` takes files or directories of them; files written before `proprio` was recorded read
with an empty one (the probes that need it say so).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import h5py
import numpy as np

from minivla_wmrl.data.dataset import open_hdf5
from minivla_wmrl.infra.atomic import atomic_file
from minivla_wmrl.rl.rollout import EpisodeSpec, Trajectory

ARRAYS = ("query_steps", "log_probs", "actions", "privileged")
OPTIONAL_ARRAYS = ("proprio",)


def real_labelled(trajectories: Sequence[Trajectory]) -> list[Trajectory]:
    """The episodes the simulator ran to their end (not cut, not lost), with recorded actions."""
    return [t for t in trajectories if t is not None and not t.truncated and t.failure is None
            and len(t.actions) == t.num_queries]


def write_replay(path: Path, trajectories: Sequence[Trajectory], source: str) -> int:
    """Write the real-labelled ones of `trajectories` to `path`; returns how many."""
    kept = real_labelled(trajectories)
    with atomic_file(Path(path)) as tmp, h5py.File(tmp, "w") as f:
        group = f.create_group("episodes")
        for i, t in enumerate(kept):
            item = group.create_group(str(i))
            for name in ARRAYS + OPTIONAL_ARRAYS:
                item.create_dataset(name, data=getattr(t, name))
            item.attrs.update(task_id=str(t.spec.task_id), instruction=t.instruction, success=bool(t.success),
                              length=int(t.length), source=source)
    return len(kept)


def _replay_files(paths: Sequence[str | Path]) -> list[Path]:
    """The replay files named by `paths` (directories: their *.hdf5)."""
    files = [f for p in map(Path, paths) for f in (sorted(p.glob("*.hdf5")) if p.is_dir() else [p])]
    if not files:
        raise FileNotFoundError(f"no replay files in {', '.join(map(str, paths))}")
    return files


def _episodes(handle: h5py.File, path: Path) -> h5py.Group:
    if "episodes" not in handle:
        raise ValueError(f"{path} has no 'episodes' group; it is not a replay file (data.replay)")
    return handle["episodes"]


def replay_real_steps(paths: Sequence[str | Path]) -> int:
    """The real steps the files' episodes took (their lengths summed): what gathering them cost the simulator,
    reset wait steps aside, as GRPO's `real_steps` counts."""
    total = 0
    for path in _replay_files(paths):
        with open_hdf5(path, "replay file") as handle:
            total += sum(int(item.attrs["length"]) for item in _episodes(handle, path).values())
    return total


def read_replay(paths: Sequence[str | Path]) -> list[Trajectory]:
    """Every episode of the files (directories: their *.hdf5), as trajectories carrying the probe's fields."""
    out = []
    for path in _replay_files(paths):
        with open_hdf5(path, "replay file") as handle:
            episodes = _episodes(handle, path)
            for name in sorted(episodes, key=int):
                item = episodes[name]
                missing = [k for k in ARRAYS if k not in item] + [
                    k for k in ("task_id", "instruction", "success", "length") if k not in item.attrs]
                if missing:
                    raise ValueError(f"{path}: episodes/{name} lacks {missing}")
                steps = np.asarray(item["query_steps"], np.int64)
                out.append(Trajectory(
                    spec=EpisodeSpec(str(item.attrs["task_id"]), 0), instruction=str(item.attrs["instruction"]),
                    success=bool(item.attrs["success"]), length=int(item.attrs["length"]), success_step=None,
                    failure=None, frames=np.zeros((0,), np.uint8), final_frame=None,
                    token_ids=np.zeros((len(steps), 0), np.int64), log_probs=np.asarray(item["log_probs"], np.float32),
                    query_steps=steps, executed=np.zeros(len(steps), np.int64),
                    actions=np.asarray(item["actions"], np.float32),
                    proprio=np.asarray(item["proprio"] if "proprio" in item else np.zeros((0,)), np.float32),
                    privileged=np.asarray(item["privileged"], np.float32)))
    return out
