"""The WMRL corrections: Online Debiasing and Inverse-Variance Denoising, plus GRPO group advantages."""

from minivla_wmrl.wmrl.advantages import group_advantages, shuffle_within_groups, weight_anchor_advantages
from minivla_wmrl.wmrl.debiaser import OnlineDebiaser, centred_residual, fit_bucketed_isotonic, pool_adjacent_violators
from minivla_wmrl.wmrl.weighter import InverseVarianceWeighter

__all__ = ["OnlineDebiaser", "InverseVarianceWeighter", "group_advantages", "weight_anchor_advantages",
           "centred_residual", "fit_bucketed_isotonic", "pool_adjacent_violators", "shuffle_within_groups"]
