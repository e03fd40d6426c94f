"""Scorers by name, so a recipe can say `world_model: {name: ..., ...}` and users can plug in their own.

Built in:
- `progress`: the trainable `ProgressWorldModel`, loaded from a directory (`path`) or built
  fresh from config fields;
- `callable`: wraps any Python callable given as `fn` (an object, or "module:attribute");
- `directory`: a pretrained model in a local directory holding `scorer.py`, which defines
  `load_scorer(directory) -> fn`;
- `robometer`: the published Robometer progress model (WMRL's embodied scorer) from a local directory.

The contract of `fn`: `fn(frames, instructions) -> (progress, success)`, where `frames` is a
uint8 array (B, num_frames, H, W, 3) of frames sampled uniformly from each trajectory (first and
last included), `instructions` a list of B strings, `progress` a (B, num_frames) array in [0, 1]
and `success` a (B,) array in [0, 1]. Register new classes with `@register_scorer("name")`.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from pathlib import Path
from typing import Callable

import numpy as np

from world_models.progress_model import ProgressModelConfig, ProgressWorldModel
from world_models.robometer import RobometerScorer
from world_models.scorer import Prediction, TrajectoryScorer

SCORERS: dict[str, Callable[..., TrajectoryScorer]] = {}


def register_scorer(name: str):
    def decorate(cls):
        SCORERS[name] = cls
        return cls

    return decorate


def make_scorer(name: str, **kwargs) -> TrajectoryScorer:
    if name not in SCORERS:
        raise ValueError(f"unknown world model {name!r}; registered: {sorted(SCORERS)}")
    parameters = inspect.signature(SCORERS[name]).parameters.values()
    if not any(p.kind is p.VAR_KEYWORD for p in parameters):  # a scorer taking **options checks them itself
        known = {p.name for p in parameters}
        if unknown := sorted(set(kwargs) - known):
            raise ValueError(f"world model {name!r}: unknown option(s) {unknown}; expected a subset of {sorted(known)}")
    return SCORERS[name](**kwargs)


@register_scorer("callable")
class CallableScorer(TrajectoryScorer):
    """Any `fn(frames, instructions) -> (progress, success)` (see the module docstring)."""

    def __init__(self, fn: Callable | str, num_frames: int = 8):
        if isinstance(fn, str):
            module, _, attribute = fn.partition(":")
            fn = getattr(importlib.import_module(module), attribute)
        self.fn, self.num_frames = fn, num_frames

    def predict(self, frames: np.ndarray, instructions: list[str]) -> Prediction:
        progress, success = self.fn(frames, instructions)
        progress, success = np.asarray(progress, np.float64), np.asarray(success, np.float64)
        if progress.shape != frames.shape[:2] or success.shape != frames.shape[:1]:
            raise ValueError(f"scorer returned progress {progress.shape} and success {success.shape}; expected "
                             f"{frames.shape[:2]} and {frames.shape[:1]}")
        if not (np.all(np.isfinite(progress)) and np.all(np.isfinite(success))):
            raise ValueError("scorer returned NaN/inf progress or success")
        return Prediction(np.clip(progress, 0, 1), np.clip(success, 0, 1))


@register_scorer("directory")
class DirectoryScorer(CallableScorer):
    """A pretrained scorer in a local directory: `scorer.py` there defines `load_scorer(directory) -> fn`."""

    def __init__(self, path: str, num_frames: int = 8):
        source = Path(path) / "scorer.py"
        if not source.is_file():
            raise FileNotFoundError(f"world model directory {path} has no scorer.py defining load_scorer(directory)")
        spec = importlib.util.spec_from_file_location(f"external_scorer_{abs(hash(str(source)))}", source)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if not hasattr(module, "load_scorer"):
            raise ValueError(f"{source} defines no load_scorer(directory)")
        super().__init__(module.load_scorer(Path(path)), num_frames)


@register_scorer("progress")
def _progress_model(path: str | None = None, device: str = "cpu", **config) -> TrajectoryScorer:
    if path is not None:
        if config:
            raise ValueError(f"world model 'progress' loaded from {path} takes no config fields, got {sorted(config)}")
        return ProgressWorldModel.from_pretrained(path, device=device)
    return ProgressWorldModel(ProgressModelConfig.from_dict(config)).to(device)


SCORERS["robometer"] = RobometerScorer  # built in, defined in its own module (which does not import this one)
