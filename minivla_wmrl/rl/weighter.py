"""Inverse-Variance Denoising: how much more anchor advantages count than world-model ones.

Per anchor group with non-constant truth y and calibrated scores d,
    s² = mean(((d − d̄) − (y − ȳ))²) / Var(y),
the world model's noise relative to the real signal. Modelling world-model variance as
(1 + c·s²) × real variance gives anchors the relative weight w = 1 + c·s². s² is tracked by an
EMA with a half-life of `half_life` observations; after `warmup` observations c is frozen once
so that w = `target_weight` at that moment; then w = clip(1 + c·EMA, 1, `max_weight`).

A GRPO step's anchors are observed by `observe_step`: each group that has anchors of both outcomes
on its own, and the anchors of the other groups pooled as one observation (with one anchor per
group, as under truncated execution, no group varies alone; pooled, they still measure the noise).
"""

from __future__ import annotations

import numpy as np

MIN_OUTCOME_VARIANCE = 1e-9


class InverseVarianceWeighter:
    def __init__(self, half_life: float = 64, warmup: int = 32, target_weight: float = 2.0, max_weight: float = 4.0):
        if half_life <= 0 or warmup < 1 or not 1.0 <= target_weight <= max_weight:
            raise ValueError(f"need half_life > 0, warmup >= 1, 1 <= target_weight <= max_weight; got {half_life}, "
                             f"{warmup}, {target_weight}, {max_weight}")
        self.alpha = 1.0 - 0.5 ** (1.0 / half_life)
        self.warmup, self.target_weight, self.max_weight = warmup, target_weight, max_weight
        self.ema: float | None = None
        self.observations = 0
        self.c: float | None = None

    def observe(self, calibrated_scores, outcomes) -> float | None:
        """Update from one anchor group; returns its s², or None when its outcomes are constant."""
        d, y = np.asarray(calibrated_scores, float), np.asarray(outcomes, float)
        if d.shape != y.shape or d.ndim != 1:
            raise ValueError(f"scores {d.shape} and outcomes {y.shape} must be 1-D arrays of one length")
        variance = y.var()
        if variance < MIN_OUTCOME_VARIANCE:
            return None
        s2 = float(np.mean(((d - d.mean()) - (y - y.mean())) ** 2) / variance)
        self.ema = s2 if self.ema is None else (1 - self.alpha) * self.ema + self.alpha * s2
        self.observations += 1
        if self.c is None and self.observations >= self.warmup:
            self.c = (self.target_weight - 1.0) / self.ema if self.ema > 0 else 0.0
        return s2

    def observe_step(self, calibrated_scores, outcomes, groups) -> int:
        """Observe one step's anchors (see the module doc); returns how many observations it added."""
        d, y, groups = (np.asarray(a) for a in (calibrated_scores, outcomes, groups))
        varied = [g for g in np.unique(groups)
                  if (groups == g).sum() >= 2 and y[groups == g].var() >= MIN_OUTCOME_VARIANCE]
        added = sum(self.observe(d[groups == g], y[groups == g]) is not None for g in varied)
        rest = ~np.isin(groups, varied)
        if rest.sum() >= 2:
            added += self.observe(d[rest], y[rest]) is not None
        return added

    @property
    def active(self) -> bool:
        """Whether anchors count more than world-model rewards now (c frozen and the weight above 1)."""
        return self.weight > 1.0

    @property
    def weight(self) -> float:
        if self.c is None:
            return 1.0
        return float(np.clip(1.0 + self.c * self.ema, 1.0, self.max_weight))

    def state_dict(self) -> dict:
        return {"ema": self.ema, "observations": self.observations, "c": self.c}

    def load_state_dict(self, state: dict) -> None:
        self.ema, self.observations, self.c = state["ema"], state["observations"], state["c"]
