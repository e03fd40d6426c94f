"""Which software produced a result: every run directory records it in `versions.json`.

A figure from a fresh install differs from the README's when a dependency range let a newer
release in; with the versions beside each run, two runs can be told apart by what they ran
with. `make setup` installs the exact versions of `constraints.txt` (the lock the README's
figures were measured with). The CPU thread count is recorded too: it changes the order of
floating-point sums, so the same recipe and versions with another `OMP_NUM_THREADS` train other
weights (on the CPU demo, another action tokenizer and SFT policy).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch

from minivla_wmrl.infra.atomic import atomic_file


def _git_commit() -> str | None:
    """The source checkout's commit (with '+dirty' when it has uncommitted changes), if it is one."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if commit.returncode != 0:
        return None
    return commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def run_versions() -> dict:
    """Python, the platform, this package's commit, every installed distribution's version and
    torch's CPU threads (with the OMP_NUM_THREADS that set them, if any)."""
    packages = {dist.metadata["Name"].lower(): dist.version for dist in metadata.distributions()
                if dist.metadata["Name"]}
    return {"python": platform.python_version(), "platform": platform.platform(), "executable": sys.executable,
            "minivla_wmrl_commit": _git_commit(), "torch_threads": torch.get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "packages": dict(sorted(packages.items()))}


def record_versions(directory: Path) -> Path:
    """Write `directory/versions.json` (atomically) and return its path."""
    path = Path(directory) / "versions.json"
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(run_versions(), indent=2))
    return path
