"""Anchors: the rollouts of a step whose real outcome labels them, calibrates the world model
(Online Debiasing) and weighs their advantages (Inverse-Variance Denoising).

One rule for both executions: in each group, `fraction` of the eligible members (at least
`min_per_group`), then random eligible others until the step holds `min_total`. Truncated
execution picks before anything runs (every rollout eligible, at least one per group so that
every group calibrates); full execution afterwards, among the rollouts that ran.
"""

from __future__ import annotations

import numpy as np


def pick_anchors(groups: np.ndarray, eligible: np.ndarray, fraction: float, rng: np.random.Generator,
                 min_per_group: int = 0, min_total: int = 0) -> np.ndarray:
    """A boolean mask of the anchors among `groups` (one group id per rollout)."""
    anchors = np.zeros(len(groups), bool)
    for group in np.unique(groups):
        members = np.flatnonzero((groups == group) & eligible)
        count = min(len(members), max(min_per_group, int(round(fraction * len(members)))))
        anchors[rng.choice(members, count, replace=False)] = True
    missing = min(min_total, int(eligible.sum())) - int(anchors.sum())
    if missing > 0:
        anchors[rng.choice(np.flatnonzero(eligible & ~anchors), missing, replace=False)] = True
    return anchors
