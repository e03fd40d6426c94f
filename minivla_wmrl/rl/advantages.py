"""GRPO group advantages and the anchor weighting applied after them."""

from __future__ import annotations

import numpy as np


def group_advantages(rewards, groups, scale_std: bool = True, eps: float = 1e-4) -> tuple[np.ndarray, np.ndarray]:
    """Per group g over its graded members (finite rewards; NaN = unlabelled, left out):
        A_i = (r_i − mean_g) / (std_g + eps)   (or r_i − mean_g without std scaling),
    std_g the population standard deviation. A group with fewer than 2 graded members gives no
    signal (A = 0). Returns (advantages, graded), ungraded rows 0 and False.
    """
    rewards, groups = np.asarray(rewards, float), np.asarray(groups)
    if rewards.shape != groups.shape or rewards.ndim != 1:
        raise ValueError(f"rewards {rewards.shape} and groups {groups.shape} must be 1-D arrays of one length")
    graded = np.isfinite(rewards)
    advantages = np.zeros_like(rewards)
    for g in np.unique(groups):
        member = (groups == g) & graded
        if member.sum() < 2:
            graded[groups == g] = False
            continue
        centred = rewards[member] - rewards[member].mean()
        advantages[member] = centred / (rewards[member].std() + eps) if scale_std else centred
    return advantages, graded


def weight_anchor_advantages(advantages, is_anchor, weight: float) -> np.ndarray:
    """Multiply the (already normalised) advantages of anchor rows by `weight`; world-model rows unchanged.

    Re-weighting rewards instead would be undone by the group normalisation.
    """
    advantages, is_anchor = np.asarray(advantages, float), np.asarray(is_anchor, bool)
    return np.where(is_anchor, advantages * weight, advantages)


def shuffle_within_groups(rewards, groups, rng: np.random.Generator) -> np.ndarray:
    """The labelled (finite) rewards of each group deranged among its labelled members (no rollout
    keeps its own reward; a group with one labelled member keeps it): the reward control, which
    keeps every group's reward distribution and destroys which rollout earned what."""
    rewards, groups = np.asarray(rewards, float), np.asarray(groups)
    shuffled = rewards.copy()
    for g in np.unique(groups):
        members = np.flatnonzero((groups == g) & np.isfinite(rewards))
        if len(members) < 2:
            continue
        order = rng.permutation(len(members))
        while np.any(order == np.arange(len(members))):  # uniform over derangements; ~e draws on average
            order = rng.permutation(len(members))
        shuffled[members] = rewards[members[order]]
    return shuffled
