"""Atomic outputs (directories and files): write into a temporary sibling, rename into place when complete.

Temporary siblings are named `.<name>.<pid>.<random>`: one left behind by a killed process (its pid
gone) is removed the next time the same output is written. Outputs get the user's normal
permissions (umask), not the 0700/0600 of `tempfile`'s. A full disk is reported as such, naming the
output.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove `.<name>.<pid>.*` siblings of `path` whose process is gone; returns what was removed."""
    path, removed = Path(path), []
    for candidate in path.parent.glob(f".{path.name}.*"):
        pid = candidate.name[len(path.name) + 2:].split(".", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(candidate, ignore_errors=True) if candidate.is_dir() else candidate.unlink(missing_ok=True)
            removed.append(candidate)
    return removed


@contextmanager
def _disk_full_named(path: Path) -> Iterator[None]:
    try:
        yield
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise OSError(errno.ENOSPC, f"no space left on device while writing {path}; the previous version, if "
                                        "any, is untouched") from error
        raise


@contextmanager
def atomic_directory(directory: Path) -> Iterator[Path]:
    """Yield a temporary directory that replaces `directory` only if the block finishes.

    A failure (or interruption) removes the temporary directory and leaves any previous
    `directory` untouched, so readers never see a half-written checkpoint.
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(directory)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.{os.getpid()}."))
    os.chmod(tmp, 0o777 & ~_umask())
    try:
        with _disk_full_named(directory):
            yield tmp
            if directory.exists():
                shutil.rmtree(directory)
            os.replace(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """Yield a temporary sibling path that replaces `path` only if the block finishes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    # the temporary keeps the extension: writers that pick a format from it (imageio) work on it
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=f".tmp{path.suffix}")
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())
    try:
        with _disk_full_named(path):
            yield Path(tmp)
            os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
