"""A training run's directory, the same for every trainer (sft, wm, grpo): its lock, its
checkpoints, and the identity check that keeps a resume from continuing a different run.

    OUT/.lock                      held (flock) by the one process writing OUT; released when it exits,
                                   however it exits, so a lock file left by a killed run is no obstacle
    OUT/recipe.json                the recipe of the latest invocation
    OUT/metrics.jsonl, tensorboard/
    OUT/checkpoints/step_N/        written atomically (`outputs.replaced_directory`):
        <the model's files>        the policy (config.json, model.safetensors, ...) or world_model/
        training_state.safetensors every tensor and array of the training state (optimiser, RNGs)
        training_state.json        the rest of it, pointing at those tensors: nothing is unpickled
        recipe.json                the recipe that wrote it

A resume starts from the newest checkpoint whose files all read back; a damaged one (truncated
weights, unreadable JSON, missing training state) is skipped with a message naming the file. A
resume whose recipe differs from the checkpoint's in a setting that changes results is refused,
naming the settings; the settings that may change (step counts, logging, devices) are the
trainer's to list.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import re
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, load_model, save_file

from minivla_wmrl.infra.outputs import create_output_dir, holds_only_bookkeeping, replaced_directory

TRAINING_STATE_FILES = ("training_state.safetensors", "training_state.json")
LEGACY_TRAINING_STATE = "training_state.pt"  # a pickle, written before this module: not loaded
RUN_FILES = (*TRAINING_STATE_FILES, "recipe.json", LEGACY_TRAINING_STATE)  # a checkpoint's files that are not the model
STEP_NAME = re.compile(r"step_(\d+)")


def checkpoint_dirs(out: Path) -> list[Path]:
    """A run's `checkpoints/step_N` directories, oldest first. Only exact `step_<digits>` names
    count: `step_0000080.bak2` or `step_final` are someone's copies, not checkpoints."""
    found = [p for p in (Path(out) / "checkpoints").glob("step_*") if STEP_NAME.fullmatch(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: int(p.name[len("step_"):]))


def latest_checkpoint(out: Path) -> Path | None:
    """The highest `checkpoints/step_N` of a run directory, or None."""
    found = checkpoint_dirs(out)
    return found[-1] if found else None


def selected_checkpoint(out: Path) -> Path | None:
    """The run's result: the checkpoint `best.json` names (GRPO with validation: the best by
    validation success, possibly the starting one), else the latest."""
    best = Path(out) / "best.json"
    if best.is_file():
        return Path(read_json(best, "the run's best checkpoint")["checkpoint"])
    return latest_checkpoint(out)


# -- training state: tensors to safetensors, the rest to JSON ---------------------------------------
# Optimiser states have int keys, RNG states tuples and numpy arrays; safetensors stores only flat
# tensors and JSON neither tuples nor non-string keys, so the structure is written by hand here.

def _encode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        key = str(len(tensors))
        tensors[key] = value.detach().cpu().contiguous()
        return {"__tensor__": key}
    if isinstance(value, np.ndarray):
        key = str(len(tensors))
        tensors[key] = torch.from_numpy(np.ascontiguousarray(value))
        return {"__ndarray__": key}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {"__dict__": {k: _encode(v, tensors) for k, v in value.items()}}
        return {"__items__": [[_encode(k, tensors), _encode(v, tensors)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, tensors) for v in value]}
    if isinstance(value, list):
        return [_encode(v, tensors) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"training state holds a {type(value).__name__}, which cannot be saved without pickling")


def _decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    (kind, body), = value.items()
    if kind == "__tensor__":
        return tensors[body]
    if kind == "__ndarray__":
        return tensors[body].numpy()
    if kind == "__dict__":
        return {k: _decode(v, tensors) for k, v in body.items()}
    if kind == "__items__":
        return {_decode(k, tensors): _decode(v, tensors) for k, v in body}
    return tuple(_decode(v, tensors) for v in body)


def write_training_state(directory: Path, state: dict) -> None:
    tensors: dict[str, torch.Tensor] = {}
    structure = _encode(state, tensors)
    save_file(tensors, str(Path(directory) / TRAINING_STATE_FILES[0]))
    (Path(directory) / TRAINING_STATE_FILES[1]).write_text(json.dumps(structure))


def read_training_state(directory: Path) -> dict:
    directory = Path(directory)
    return _decode(json.loads((directory / TRAINING_STATE_FILES[1]).read_text()),
                   load_file(str(directory / TRAINING_STATE_FILES[0])))


def global_rng_state() -> dict:
    """The process-wide RNGs a resume must restore: torch (and this device's CUDA), numpy, python."""
    state = {"torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state(), "python_rng": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda_rng"] = torch.cuda.get_rng_state()
    return state


def restore_global_rng(state: dict) -> None:
    torch.set_rng_state(state["torch_rng"])
    np.random.set_state(state["numpy_rng"])
    random.setstate(state["python_rng"])
    if "cuda_rng" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda_rng"])


# -- reading model files: errors that name the file ---------------------------------------------------

def read_json(path: Path, what: str) -> dict:
    """A JSON file; missing or unparsable is an error naming it and what it should be."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} does not exist")
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}); expected the {what}") from None


def load_weights(module: torch.nn.Module, path: Path) -> None:
    """Load a safetensors file into `module` (strict); a damaged file or one that does not fit the
    module (another preset's weights) is an error naming the file, not 100 lines of size mismatches."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"weights {path} do not exist")
    try:
        load_model(module, str(path), strict=True)
    except SafetensorError as error:
        raise ValueError(f"{path} cannot be read ({error}); the file is truncated or damaged") from None
    except RuntimeError as error:
        problems = [line.strip() for line in str(error).splitlines()[1:] if line.strip()]
        raise ValueError(f"{path} does not fit the model its config.json describes ({len(problems)} mismatches, first: "
                         f"{problems[0] if problems else error}); weights and config.json come from different models"
                         ) from None


# -- checkpoints ---------------------------------------------------------------------------------------

def save_checkpoint(out: Path, step: int, recipe: dict, state: dict, write_model: Callable[[Path], None]) -> Path:
    """Write `checkpoints/step_N` atomically: the model (`write_model(directory)`), the training
    state and the recipe."""
    directory = Path(out) / "checkpoints" / f"step_{step:07d}"
    with replaced_directory(directory, "checkpoint") as tmp:
        write_model(tmp)
        write_training_state(tmp, state)
        (tmp / "recipe.json").write_text(json.dumps(recipe, indent=2, default=str))
    return directory


def damage(directory: Path) -> str | None:
    """What is wrong with a checkpoint directory, or None when every file reads back: the training
    state and recipe exist, every JSON file parses and every safetensors file is complete."""
    directory = Path(directory)
    for name in (*TRAINING_STATE_FILES, "recipe.json"):
        if not (directory / name).is_file():
            return f"{directory / name} is missing"
    for path in sorted(directory.rglob("*")):
        try:
            if path.suffix == ".json":
                json.loads(path.read_text())
            elif path.suffix == ".safetensors":
                with safe_open(str(path), "pt"):  # checks that the data covers the header's offsets
                    pass
        except Exception as error:  # noqa: BLE001 - any failure to read back is damage, reported by name
            return f"{path} cannot be read ({type(error).__name__}: {error})"
    return None


def recipe_differences(saved: dict, current: dict, may_differ: Iterable[str],
                       defaults: dict | None = None) -> list[str]:
    """`key: saved → current` for every dotted setting that differs, except those in `may_differ`. A
    setting added after the run was saved (absent from it) counts as unchanged while its current value
    is its default (`defaults`: the recipe class's): a new setting's default keeps the old behaviour."""
    def flat(d: dict, prefix: str = "") -> dict:
        items = {}
        for k, v in d.items():
            items.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return items

    allowed = set(may_differ)
    old, new = flat(json.loads(json.dumps(saved, default=str))), flat(json.loads(json.dumps(current, default=str)))
    default = flat(json.loads(json.dumps(defaults or {}, default=str)))
    added_at_default = {k for k in new.keys() - old.keys() if k in default and new[k] == default[k]}
    return [f"{k}: {old.get(k, '(absent)')!r} → {new.get(k, '(absent)')!r}" for k in sorted(old.keys() | new.keys())
            if k not in allowed and k not in added_at_default and old.get(k) != new.get(k)]


def resume_checkpoint(out: Path, recipe: dict, may_differ: Iterable[str],
                      defaults: dict | None = None) -> tuple[Path, dict] | None:
    """The newest readable checkpoint of `out` and its training state, or None when there is none.
    Damaged checkpoints are skipped, saying so; a recipe that differs from the checkpoint's in a
    setting outside `may_differ` is refused (ValueError naming them)."""
    for directory in reversed(checkpoint_dirs(out)):
        if (directory / LEGACY_TRAINING_STATE).is_file() and not (directory / TRAINING_STATE_FILES[0]).exists():
            raise ValueError(f"{directory} was written by an older minivla-wmrl ({LEGACY_TRAINING_STATE}, a pickle, "
                             "which is not loaded); resuming it is not supported: start over with resume=false or "
                             "another `out` (its weights load as a policy checkpoint)")
        if (problem := damage(directory)) is not None:
            print(f"resume: skipping the damaged checkpoint {directory}: {problem}; trying the one before",
                  file=sys.stderr)
            continue
        changed = recipe_differences(json.loads((directory / "recipe.json").read_text()), recipe, may_differ, defaults)
        if changed:
            raise ValueError(f"{out} holds a run with other settings; resuming it with these would continue a "
                             f"different run. Changed: {'; '.join(changed)}. Use another `out`, restore the settings, "
                             "or set resume=false to start over")
        return directory, read_training_state(directory)
    if checkpoint_dirs(out):
        print(f"resume: no readable checkpoint in {out}; starting over", file=sys.stderr)
    return None


@contextmanager
def run_lock(out: Path, command: str) -> Iterator[None]:
    """Create `command`'s run directory (`outputs.create_output_dir`) and hold `OUT/.lock` for the
    block: a second process on the same run directory is refused. Under torchrun only rank 0, the
    one that writes, holds it. A directory the block created and left with nothing but its mark (a
    run refused before writing anything) is removed again."""
    out = Path(out)
    created = not out.exists()
    create_output_dir(out, command)
    if os.environ.get("RANK", "0") != "0":
        yield
        return
    try:
        with open(out / ".lock", "a+") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.seek(0)
                raise RuntimeError(f"another process ({lock.read().strip() or 'pid unknown'}) is writing {out}; "
                                   "one process per run directory") from None
            lock.seek(0), lock.truncate(), lock.write(f"pid {os.getpid()}"), lock.flush()
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    finally:
        if created and holds_only_bookkeeping(out):
            shutil.rmtree(out)
