"""The gate of WMRL's gated execution: cut a rollout once its predicted success has stayed low.

Each GRPO step, an `OutcomePredictor` is fit on the replay store's real-labelled episodes (earlier
steps, and optionally the world-model stage's collection) and gives, after every executed chunk of
a running rollout, P(final success | the prefix so far). A non-anchor rollout is cut when its
prediction has stayed below the gate's `threshold` for `patience` consecutive chunks, all of them
after `min_steps` env steps. Anchors always run to their end.

The threshold is calibrated online on the anchors, which the predictor had not been fit on when it
scored them: for each anchor, `cut_statistic` is the lowest threshold at which the rule would
have cut it; the threshold is set so that at most `wrong_cut_rate` of the recent successful anchors
would have been cut. Cutting stops (the gate is inactive, and the log says why) until the recent
anchors hold `min_per_outcome` successes and failures, and whenever the statistic's AUROC among
the recent anchors still running at `min_steps` falls below `auroc_floor` (successes that all end
before `min_steps` leave nothing to rank: then the threshold alone guards them).

Length alone makes that AUROC high (failures run to the cap, so their statistics fall lowest), so it
cannot tell an informative predictor from time alone. `beyond_time_auroc` can: at the first decision
where the gate may cut (the `patience`-th at or after `min_steps`), each anchor still running there is
scored by the predictor's log-odds above those of time alone fit on the same episodes, and the AUROC
is taken over the window (under `warm_start`, the replay's episodes until anchors push them out). Time
alone scores 0.5 by construction (every excess is 0), and the subtraction keeps a base rate that
moves between GRPO steps from passing for information. Logged (`gate_auroc_beyond_time`), not acted on.

With `warm_start`, the window starts full of `replay`'s episodes, each scored by a predictor fit
on the other folds, so the gate can cut from the first step instead of waiting for successful
anchors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

import numpy as np
from scipy.special import logit

from minivla_wmrl.evaluation.prefix_auroc import probe_episode, time_only
from minivla_wmrl.evaluation.statistics import auroc
from minivla_wmrl.infra.config import Range
from minivla_wmrl.rl.rollout import Trajectory
from world_models.outcome_probe import fit_outcome_probe

Predictor = Literal["policy", "proprio", "privileged", "time"]


@dataclass
class GateConfig:
    # what predicts the outcome: the outcome probe on the policy's own signals, on them with the robot's
    # proprioception (`proprio`: what a real robot also has), on the simulator's privileged state (free in
    # simulation, unavailable on a real robot), or time alone
    # (P(success | still running), the baseline the others must beat)
    predictor: Predictor = "policy"
    min_steps: Annotated[int, Range(1)] = 32  # no cut before this many env steps
    patience: Annotated[int, Range(1)] = 2  # chunks in a row the prediction must stay below the threshold
    wrong_cut_rate: Annotated[float, Range(0, 1)] = 0.05  # target share of successes the rule cuts
    # how the threshold is read off the n recent successful anchors' cut statistics: `quantile`, the
    # floor(rate·n)+1-th lowest, cuts about (floor(rate·n)+1)/(n+1) of new successes (14% at a rate of 0.1
    # and n = 20); `conformal`, the floor(rate·(n+1))-th lowest, at most the rate for a success exchangeable
    # with them (split conformal), and no cuts while n < 1/rate - 1
    threshold_rule: Literal["quantile", "conformal"] = "quantile"
    auroc_floor: Annotated[float, Range(0, 1)] = 0.7  # below it (recent anchors, still running at min_steps): no cuts
    window: Annotated[int, Range(2)] = 64  # recent anchors that set the threshold and judge the predictor
    min_per_outcome: Annotated[int, Range(1)] = 4  # successes and failures among them before any cut
    # more real-labelled episodes to fit the predictor on, e.g. the wm stage's collection (runs/x/wm/replay)
    replay: list[str] = field(default_factory=list)
    # calibrate from the first step on `replay`'s episodes, each scored by a predictor fit on the other
    # folds (cross-fitting: like an anchor, by a predictor that never saw it); the anchors then replace
    # them in the window. Off, the gate waits for `min_per_outcome` successful anchors (at a low success
    # rate, several steps of full execution)
    warm_start: bool = False
    warm_start_folds: Annotated[int, Range(2)] = 4
    # a cut rollout's reward: the predictor's P(success) at the cut, or 0, the failure the gate predicted. Group
    # advantages divide by the group's spread, so predictions grade a group of failures (an anchor's real 0
    # against its cut siblings' 0.03-0.08 becomes advantages of about ±1); "failure" keeps sparse GRPO's rule
    # that a group whose rollouts all failed teaches nothing
    cut_reward: Literal["prediction", "failure"] = "prediction"


def decision_steps(trajectory: Trajectory) -> np.ndarray:
    """The env step after each query's chunk: where the gate decides (the next query's step, or the end)."""
    return np.append(trajectory.query_steps[1:], trajectory.length).astype(np.int64)


class OutcomePredictor:
    """P(final success | prefix) after each executed chunk, fit on real-labelled trajectories."""

    def __init__(self, kind: Predictor, time_scale: float, seed: int = 0):
        self.kind, self.time_scale, self.seed = kind, time_scale, seed
        self.signals = "policy" if kind == "time" else kind  # what the probe reads (time: lengths only)
        self.model = None
        self.time_alone = None  # P(success | still running at a step), fit on the same episodes

    def fit(self, episodes: list[Trajectory]) -> str | None:
        """Fit on `episodes`; returns why it cannot (None when fit)."""
        successes = sum(t.success for t in episodes)
        if successes < 2 or len(episodes) - successes < 2:
            self.model = self.time_alone = None
            return f"{len(episodes)} real-labelled episodes ({successes} successes): too few to fit the predictor"
        probe_episodes = [probe_episode(t, self.signals) for t in episodes]
        self.time_alone = time_only(probe_episodes)
        self.model = (self.time_alone if self.kind == "time"
                      else fit_outcome_probe(probe_episodes, time_scale=self.time_scale, seed=self.seed))
        return None

    def __call__(self, trajectories: list[Trajectory]) -> list[np.ndarray]:
        """Per trajectory, the prediction after each of its queries' chunks."""
        if self.model is None:
            raise RuntimeError("the outcome predictor is not fit")
        if self.kind == "time":
            return [np.array([self.model(int(s)) for s in decision_steps(t)]) for t in trajectories]
        return self.model.predict([probe_episode(t, self.signals) for t in trajectories])


def cut_statistic(probabilities: np.ndarray, steps: np.ndarray, min_steps: int, patience: int) -> float:
    """The lowest threshold at which the rule cuts this prefix: the minimum, over runs of `patience`
    consecutive decisions at or after `min_steps`, of the run's highest prediction (inf: never
    eligible). The rule cuts once this falls below the threshold."""
    eligible = np.asarray(probabilities)[np.asarray(steps) >= min_steps]
    if len(eligible) < patience:
        return float("inf")
    windows = np.lib.stride_tricks.sliding_window_view(eligible, patience)
    return float(windows.max(axis=1).min())


def beyond_time(probabilities: np.ndarray, steps: np.ndarray, length: int, min_steps: int, patience: int,
                time_alone) -> float:
    """At the first decision where the gate may cut (the `patience`-th at or after `min_steps`), the
    prediction's log-odds minus those of `time_alone` there; NaN when the episode ended before it."""
    steps = np.asarray(steps)
    due = np.flatnonzero((steps >= min_steps) & (steps < length))
    if len(due) < patience:
        return float("nan")
    first = due[patience - 1]
    p, base = np.clip([np.asarray(probabilities)[first], time_alone(int(steps[first]))], 1e-6, 1 - 1e-6)
    return float(logit(p) - logit(base))


def anchor_statistics(probabilities: np.ndarray, trajectory: Trajectory, config: GateConfig,
                      predictor: OutcomePredictor) -> tuple[float, float]:
    """What an anchor scored by `predictor` tells the gate: its cut statistic and its log-odds beyond time."""
    steps = decision_steps(trajectory)
    return (cut_statistic(probabilities, steps, config.min_steps, config.patience),
            beyond_time(probabilities, steps, trajectory.length, config.min_steps, config.patience,
                        predictor.time_alone))


def cross_fit_statistics(episodes: list[Trajectory], config: GateConfig, time_scale: float,
                         seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`gate.warm_start`'s calibration data: the cut statistics of up to `window` of `episodes` (drawn at
    random), each by a predictor fit on the folds it is not in, their outcomes and their log-odds beyond
    time. Episodes whose complement is too small to fit on are left out."""
    rng = np.random.default_rng(seed)
    folds = rng.permutation(len(episodes)) % config.warm_start_folds
    statistics, excess = np.full(len(episodes), np.nan), np.full(len(episodes), np.nan)
    for fold in range(config.warm_start_folds):
        held = np.flatnonzero(folds == fold)
        predictor = OutcomePredictor(config.predictor, time_scale, seed)
        if len(held) == 0 or predictor.fit([episodes[i] for i in np.flatnonzero(folds != fold)]) is not None:
            continue
        for i, probabilities in zip(held, predictor([episodes[i] for i in held])):
            statistics[i], excess[i] = anchor_statistics(probabilities, episodes[i], config, predictor)
    drawn = [i for i in rng.permutation(len(episodes)) if not np.isnan(statistics[i])][:config.window]
    return statistics[drawn], np.array([episodes[i].success for i in drawn], bool), excess[drawn]


class Gate:
    """The threshold, its calibration on recent anchors, and the quality check."""

    def __init__(self, config: GateConfig):
        self.config = config
        self.statistics: list[float] = []  # recent anchors' cut statistics
        self.outcomes: list[bool] = []
        self.beyond_time: list[float] = []  # their log-odds beyond time (NaN: ended before the gate could cut)
        self.threshold, self.quality, self.active, self.reason = 0.0, float("nan"), False, "no anchors yet"
        self.beyond_time_auroc = float("nan")

    def observe(self, statistics: np.ndarray, outcomes: np.ndarray, beyond_time: np.ndarray) -> None:
        """Add this step's anchors (scored by a predictor not fit on them) and recalibrate."""
        if not len(statistics) == len(outcomes) == len(beyond_time):
            raise ValueError(f"the gate observes one cut statistic, outcome and log-odds beyond time per anchor; got "
                             f"{len(statistics)}, {len(outcomes)} and {len(beyond_time)}")
        self.statistics = (self.statistics + [float(s) for s in statistics])[-self.config.window:]
        self.outcomes = (self.outcomes + [bool(y) for y in outcomes])[-self.config.window:]
        self.beyond_time = (self.beyond_time + [float(x) for x in beyond_time])[-self.config.window:]
        self._calibrate()

    def _calibrate(self) -> None:
        c = self.config
        stats, y = np.array(self.statistics), np.array(self.outcomes, bool)
        excess = np.array(self.beyond_time)
        ran = np.isfinite(excess)
        self.beyond_time_auroc = (auroc(excess[ran], y[ran])
                                  if min(y[ran].sum(), (~y[ran]).sum()) >= c.min_per_outcome else float("nan"))
        if y.sum() < c.min_per_outcome or (~y).sum() < c.min_per_outcome:
            self.active, self.reason = False, (f"{int(y.sum())} successes and {int((~y).sum())} failures among the "
                                               f"recent anchors; cutting needs {c.min_per_outcome} of each")
            return
        judged = np.isfinite(stats)  # still running at min_steps: what the predictor must rank
        self.quality = auroc(stats[judged], y[judged]) if y[judged].sum() >= c.min_per_outcome else float("nan")
        n = int(y.sum())
        # the threshold: the rank-th lowest success statistic
        rank = (int(np.floor(c.wrong_cut_rate * (n + 1))) if c.threshold_rule == "conformal"
                else int(np.floor(c.wrong_cut_rate * n)) + 1)
        if rank == 0:
            self.active, self.reason = False, (f"{n} successes among the recent anchors: too few to bound the "
                                               f"wrong-cut rate at {c.wrong_cut_rate}")
            return
        self.threshold = float(min(np.sort(stats[y])[min(rank, n) - 1], 1.0))
        if self.quality < c.auroc_floor:  # NaN (too few judged successes) compares False: the threshold guards
            self.active, self.reason = False, (f"predictor AUROC {self.quality:.2f} on the recent anchors is below the "
                                               f"floor {c.auroc_floor}")
        else:
            self.active, self.reason = True, ""

    def cuts(self, probabilities: np.ndarray, steps: np.ndarray) -> bool:
        """Whether a running prefix is cut now: its last `patience` decisions, all at or after
        `min_steps`, predicted below the threshold."""
        c = self.config
        recent = np.asarray(probabilities)[-c.patience:]
        return (self.active and len(recent) == c.patience and int(np.asarray(steps)[-c.patience]) >= c.min_steps
                and bool((recent < self.threshold).all()))

    def log(self) -> dict:
        return {"gate_active": float(self.active), "gate_threshold": self.threshold, "gate_auroc": self.quality,
                "gate_auroc_beyond_time": self.beyond_time_auroc, "gate_anchors": len(self.outcomes)}

    def state_dict(self) -> dict:
        return {"statistics": list(self.statistics), "outcomes": list(self.outcomes),
                "beyond_time": list(self.beyond_time)}

    def load_state_dict(self, state: dict) -> None:
        self.statistics, self.outcomes = list(state["statistics"]), list(state["outcomes"])
        # checkpoints written before it was kept resume with it unknown (a diagnostic only)
        self.beyond_time = list(state.get("beyond_time", [float("nan")] * len(self.outcomes)))
        self._calibrate()
