"""Statistics for success rates: Wilson intervals, paired comparisons, means over seeds, AUROC.

A success rate without its interval proves nothing either way; a difference between two
checkpoints is judged on the episodes they share (same task, init state and sampling seed), so
the init-state noise cancels. scipy supplies the distributions; the pairing is ours.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

CONFIDENCE = 0.95


def wilson_interval(successes: int, trials: int, confidence: float = CONFIDENCE) -> list[float] | None:
    """The Wilson score interval [low, high] of a binomial proportion (None without trials).
    Intervals are lists throughout, so that they read back from JSON unchanged."""
    if trials == 0:
        return None
    interval = stats.binomtest(int(successes), int(trials)).proportion_ci(confidence, method="wilson")
    return [float(interval.low), float(interval.high)]


def rate(successes: int, trials: int) -> dict:
    """`{successes, trials, success_rate, ci95}`: how every success rate is reported."""
    return {"successes": int(successes), "trials": int(trials),
            "success_rate": successes / trials if trials else None, "ci95": wilson_interval(successes, trials)}


def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pairs (B succeeds where A failed, and back)."""
    if gained + lost == 0:
        return 1.0
    return float(stats.binomtest(int(gained), int(gained + lost), 0.5).pvalue)


def bootstrap_mean_interval(values, confidence: float = CONFIDENCE, resamples: int = 10_000,
                            seed: int = 0) -> list[float]:
    """Percentile bootstrap interval of the mean of independent units (e.g. per-state differences)."""
    values = np.asarray(values, float)
    if values.size == 0:
        raise ValueError("no values to bootstrap")
    if np.all(values == values[0]):  # every resample has the same mean
        return [float(values[0]), float(values[0])]
    result = stats.bootstrap((values,), np.mean, confidence_level=confidence, n_resamples=resamples,
                             method="percentile", rng=np.random.default_rng(seed))
    return [float(result.confidence_interval.low), float(result.confidence_interval.high)]


def paired_difference(a: dict, b: dict, confidence: float = CONFIDENCE) -> dict:
    """B − A on the episodes both hold.

    `a`, `b`: success (0/1) by episode key `(unit, sample)`, where the unit (e.g. (task, init
    state)) is what the bootstrap resamples, so repeated samples of one state stay together.
    Returns the difference in success rate with a 95% paired-bootstrap interval, the exact
    McNemar p-value, and the discordant counts.
    """
    keys = sorted(set(a) & set(b))
    if not keys:
        raise ValueError("the two evaluations share no episode (task, trial, sample)")
    units: dict = {}
    for key in keys:
        units.setdefault(key[0], []).append(float(b[key]) - float(a[key]))
    per_unit = np.array([np.mean(v) for v in units.values()])
    gained = sum(1 for k in keys if b[k] and not a[k])
    lost = sum(1 for k in keys if a[k] and not b[k])
    low, high = bootstrap_mean_interval(per_unit, confidence)
    return {"episodes": len(keys), "units": len(units),
            "success_a": sum(int(a[k]) for k in keys) / len(keys),
            "success_b": sum(int(b[k]) for k in keys) / len(keys),
            "difference": float(per_unit.mean()),
            "ci95": [low, high], "gained": gained, "lost": lost, "p_mcnemar": mcnemar_exact(gained, lost)}


def mean_interval(values, confidence: float = CONFIDENCE) -> dict:
    """Mean over seeds with a Student-t interval (None for a single seed)."""
    values = np.asarray(values, float)
    mean = float(values.mean())
    if values.size < 2:
        return {"mean": mean, "ci95": None, "n": int(values.size)}
    half = float(stats.t.ppf((1 + confidence) / 2, values.size - 1) * values.std(ddof=1) / math.sqrt(values.size))
    return {"mean": mean, "ci95": [mean - half, mean + half], "n": int(values.size)}


def auroc(scores, labels) -> float:
    """Area under the ROC curve by the Mann-Whitney rank statistic (ties count half); NaN without
    both classes."""
    labels = np.asarray(labels, bool)
    positives, negatives = labels.sum(), (~labels).sum()
    if not positives or not negatives:
        return float("nan")
    ranks = stats.rankdata(scores)
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))
