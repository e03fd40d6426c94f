"""Atomic output directories: write into a temporary sibling, rename into place when complete."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_directory(directory: Path) -> Iterator[Path]:
    """Yield a temporary directory that replaces `directory` only if the block finishes.

    A failure (or interruption) removes the temporary directory and leaves any previous
    `directory` untouched, so readers never see a half-written checkpoint.
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}."))
    try:
        yield tmp
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
