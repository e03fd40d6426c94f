"""GRPO's guard against harm: its checkpoints checked on validation init states as it trains.

RL can make a policy better where it trains and worse where it is evaluated (a task the recipe
was never tuned on lost 20 points held out while its training success doubled). So every
`every` GRPO steps, and once before the first, the policy runs the same episodes on a task's
validation states (`minivla_wmrl.rl.init_states`: disjoint from the RL training states and from
the protocol's test states), with the protocol's temperature, the same sampling seed per
(state, sample) every time so that checks pair episode by episode. The tracker keeps the best
checkpoint by validation success (ties keep the earlier: the SFT checkpoint unless training
beat it; with `accept_p` < 1, only a significant gain over the start counts) and stops training
when the policy is significantly worse than it started (exact McNemar test on the paired
episodes, more lost than gained).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import numpy as np

from minivla_wmrl.evaluation.statistics import mcnemar_exact
from minivla_wmrl.infra.config import Range

SALT_VALIDATION = 6_000_003  # the sampling seeds of validation episodes (fixed for the whole run: paired checks)


@dataclass
class ValidationConfig:
    every: Annotated[int, Range(0)] = 0  # check every this many GRPO steps, and before the first (0: no checks)
    states_per_task: Annotated[int, Range(1)] = 10  # generated validation init states per task
    samples_per_state: Annotated[int, Range(1)] = 1  # episodes per state (> 1 with temperature > 0)
    temperature: Annotated[float, Range(0)] = 0.0  # the evaluation protocol's: 0 greedy, as LIBERO's protocol
    keep_best: bool = True  # the run's result is the checkpoint with the best validation success
    # a checkpoint becomes the best only when its gain over the start is significant at this level
    # (exact McNemar on the paired episodes); 1: any gain. Below 1, a run whose checks cannot tell
    # training's gains from sampling noise keeps its starting checkpoint.
    accept_p: Annotated[float, Range(0, 1)] = 1.0
    early_stop: bool = True  # stop when validation success falls significantly below the start's
    stop_p: Annotated[float, Range(0, 1)] = 0.05  # significance of that fall (exact McNemar, paired episodes)


def validation_seed(task_index: int, state: int, sample: int) -> int:
    return int(np.random.SeedSequence([SALT_VALIDATION, task_index, state, sample]).generate_state(1)[0])


class ValidationTracker:
    """The decisions, from each check's episodes (success by (task, state, sample)): pure logic."""

    def __init__(self, config: ValidationConfig):
        self.config = config
        self.start: dict | None = None  # the starting policy's episodes
        self.best_step, self.best_success = 0, float("nan")
        self.stopped_at: int | None = None  # the step at which the run stopped early (a resume does not go on)

    def update(self, step: int, episodes: dict) -> dict:
        """Record a check at GRPO step `step` (0: the starting policy); returns what to log and do:
        `val_improved` (a new best: keep this step's checkpoint), `val_stop` (stop training)."""
        success = float(np.mean(list(episodes.values())))
        if self.start is None:
            self.start, self.best_step, self.best_success = dict(episodes), step, success
            return {"val_success": success, "val_success_start": success, "val_gained": 0, "val_lost": 0,
                    "val_p_worse": 1.0, "val_p_better": 1.0, "val_best_step": step, "val_improved": False,
                    "val_stop": False}
        missing = set(self.start) ^ set(episodes)
        if missing:
            raise ValueError(f"validation check at step {step} ran other episodes than the first ({len(missing)} "
                             "differ); the checks must pair episode by episode")
        gained = sum(1 for k in episodes if episodes[k] and not self.start[k])
        lost = sum(1 for k in episodes if self.start[k] and not episodes[k])
        p_worse = mcnemar_exact(gained, lost) if lost > gained else 1.0
        p_better = mcnemar_exact(gained, lost) if gained > lost else 1.0
        improved = success > self.best_success and p_better <= self.config.accept_p
        if improved:
            self.best_step, self.best_success = step, success
        stop = bool(self.config.early_stop and p_worse < self.config.stop_p)
        if stop:
            self.stopped_at = step
        return {"val_success": success, "val_success_start": float(np.mean(list(self.start.values()))),
                "val_gained": gained, "val_lost": lost, "val_p_worse": p_worse, "val_p_better": p_better,
                "val_best_step": self.best_step,
                "val_improved": improved, "val_stop": stop}

    def state_dict(self) -> dict:
        return {"start": None if self.start is None else [[*k, int(v)] for k, v in sorted(self.start.items())],
                "best_step": self.best_step, "best_success": self.best_success, "stopped_at": self.stopped_at}

    def load_state_dict(self, state: dict) -> None:
        self.start = None if state["start"] is None else {tuple(row[:-1]): bool(row[-1]) for row in state["start"]}
        self.best_step, self.best_success = state["best_step"], state["best_success"]
        self.stopped_at = state.get("stopped_at")
