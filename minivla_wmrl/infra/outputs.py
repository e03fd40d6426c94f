"""Where a command may write: the one rule for every output directory and output file.

An output directory is written only if it is

- absent or empty: it is created, with the command's mark (`.minivla-wmrl.json`, naming the command);
- the same command's own earlier output, known by that mark (or, for outputs written before marks
  existed, by the file the command always wrote there, `EARLIER_SIGNATURES`): it is resumed or
  replaced, as the command does;
- anything else (a directory holding other files, one another command wrote, a file): refused,
  naming the path and what it holds. Commands that replace a whole directory (`export`, `demos`)
  offer `--overwrite` for a directory of other origin; the others resume, so never replace.

Every check runs before anything is created: a command calls `check_output_dir` while it checks
its settings, and `create_output_dir` only when the work starts; a directory written whole (a
checkpoint, a saved model, a dataset) goes through `replaced_directory`, which checks, then marks
and moves it in place atomically. An output file (`--json FILE`) must not be a directory
(`check_output_file`).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from minivla_wmrl.infra.atomic import atomic_directory, atomic_file

MARK = ".minivla-wmrl.json"
LOCK = ".lock"
# outputs of versions before marks: what each command always wrote (an interrupted ablation: only its
# SFT evaluation, eval/). A command that replaces a whole directory is not listed: only its mark lets
# it delete.
EARLIER_SIGNATURES = {"sft": ("recipe.json",), "wm": ("recipe.json",), "grpo": ("recipe.json",),
                      "eval": ("eval_settings.json",), "pipeline": ("pipeline_recipe.json",),
                      "vq": ("vq_train_config.json",), "ablate": ("ablation.json", "eval")}
# a pipeline directory holding only stage outputs (e.g. another run's demos/ vq/ sft/ wm/ copied in to start
# from) is the pipeline's: each stage directory is then checked by the stage that writes it
PIPELINE_ENTRIES = {"demos", "vq", "sft", "wm", "grpo", "wmrl", "eval", "plots", "pretrained", "ablation"}


class OutputExistsError(FileExistsError):
    """An output directory holds files the command did not write."""


def writer(path: Path) -> str | None:
    """The command whose mark `path` holds (None: no readable mark)."""
    try:
        return json.loads((Path(path) / MARK).read_text())["command"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _no_file_on_the_way(path: Path) -> None:
    for part in (path, *path.parents):
        if part.exists() and not part.is_dir():
            raise NotADirectoryError(f"output {path}: {part} is an existing file, not a directory")


def check_output_dir(path: Path, command: str, overwrite: bool = False) -> Path:
    """Refuse (before any work) an output directory `command` may not write; see the module doc."""
    path = Path(path)
    _no_file_on_the_way(path)
    if not path.exists():
        return path
    held = sorted(p.name for p in path.iterdir() if p.name != LOCK)
    owner = writer(path)
    if not held or owner == command or overwrite:
        return path
    if owner is None and (set(EARLIER_SIGNATURES.get(command, ())) & set(held)
                          or (command == "pipeline" and set(held) <= PIPELINE_ENTRIES)):
        return path
    origin = f"`{owner}`'s output" if owner else "files this command did not write"
    shown = ", ".join(held[:5]) + (f", ... ({len(held)} entries)" if len(held) > 5 else "")
    remedy = "; or pass --overwrite to replace it" if command in ("export", "demos") else ""
    raise OutputExistsError(f"{command}: output directory {path} already holds {origin} ({shown}); nothing was "
                            f"written. Choose a new or empty directory{remedy}")


def create_output_dir(path: Path, command: str, overwrite: bool = False) -> Path:
    """`check_output_dir`, then create the directory (parents too) and write the command's mark."""
    path = check_output_dir(path, command, overwrite)
    path.mkdir(parents=True, exist_ok=True)
    if writer(path) != command:
        mark_output(path, command)
    return path


def mark_output(directory: Path, command: str) -> None:
    """Write `command`'s mark into `directory` (e.g. an atomic temporary before it is moved in place)."""
    (Path(directory) / MARK).write_text(json.dumps({"command": command}) + "\n")


@contextmanager
def replaced_directory(directory: Path, command: str, overwrite: bool = False) -> Iterator[Path]:
    """`atomic.atomic_directory` under the rule: refused (before the block) unless `directory` may be
    replaced by `command`; the new directory gets the command's mark, written last so that a nested
    save into the same temporary does not leave its own."""
    check_output_dir(directory, command, overwrite)
    with atomic_directory(directory) as tmp:
        yield tmp
        mark_output(tmp, command)


def holds_only_bookkeeping(directory: Path) -> bool:
    """Whether `directory` holds nothing but its mark and lock: what a refused run leaves."""
    return {p.name for p in Path(directory).iterdir()} <= {MARK, LOCK}


def check_output_file(path: Path, what: str) -> Path:
    """Refuse (before any work) an output file path that is a directory or lies under a file."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{what} {path} is a directory; expected a file path (e.g. {path / 'result.json'})")
    _no_file_on_the_way(path.parent)
    return path


def write_json_output(path: Path, data) -> None:
    """Write a command's `--json FILE` result atomically (its parent directories created)."""
    with atomic_file(check_output_file(path, "--json")) as tmp:
        tmp.write_text(json.dumps(data, indent=2))
