"""Online Debiasing: a monotone map from world-model score to real outcome, refit from anchor pairs.

The fit is a bucketed isotonic regression: scores are binned into `bins` equal-width bins over
the scorer's declared range `score_range` ([0, 1] for progress and success, [−1, 1] for the
`potential` reduction; scores outside fall into the end bins); each populated bin contributes its
mean score, mean outcome and count; pool-adjacent-violators, weighted by count, makes the bin
outcomes non-decreasing; new scores map by linear interpolation between the (mean score, pooled
outcome) points, flat beyond the ends. A monotone map never reorders a group, while an affine map
would be cancelled by GRPO's z-scoring; hence isotonic. Written by hand: the reference's exact
binning and schedule are the point, and sklearn's IsotonicRegression fits raw points, not
count-weighted bins.

When every pair falls into one bin there is nothing to fit. `fit_fallback` chooses what then:
`identity` (the reference's: raw scores pass through) or `mean` (every score maps to the pairs'
mean outcome, the base rate: the world model is taken to say nothing). `fit_failed` records it.
"""

from __future__ import annotations

from collections import deque

import numpy as np

FIT_FALLBACKS = ("identity", "mean")


def pool_adjacent_violators(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence closest to `values` in weighted least squares."""
    blocks: list[list[float]] = []  # [weighted mean, total weight, number of members]
    for value, weight in zip(np.asarray(values, float), np.asarray(weights, float)):
        blocks.append([value, weight, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (v2, w2, n2), (v1, w1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return np.concatenate([np.full(n, v) for v, _, n in blocks]) if blocks else np.zeros(0)


def fit_bucketed_isotonic(scores: np.ndarray, outcomes: np.ndarray, bins: int = 10,
                          score_range: tuple[float, float] = (0.0, 1.0)) -> tuple[np.ndarray, np.ndarray] | None:
    """Knots (mean score per populated bin, pooled outcome), or None when fewer than 2 bins are populated."""
    scores, outcomes = np.asarray(scores, float), np.asarray(outcomes, float)
    low, high = score_range
    index = np.clip(np.floor((scores - low) / (high - low) * bins).astype(int), 0, bins - 1)
    populated = np.unique(index)
    if len(populated) < 2:
        return None
    x = np.array([scores[index == b].mean() for b in populated])
    y = np.array([outcomes[index == b].mean() for b in populated])
    counts = np.array([(index == b).sum() for b in populated], float)
    return x, pool_adjacent_violators(y, counts)


def centred_residual(scores: np.ndarray, outcomes: np.ndarray, groups: np.ndarray) -> float:
    """mean(((x − x̄_g) − (y − ȳ_g))²) with means taken within each group g."""
    scores, outcomes, groups = np.asarray(scores, float), np.asarray(outcomes, float), np.asarray(groups)
    residuals = []
    for g in np.unique(groups):
        member = groups == g
        residuals.append((scores[member] - scores[member].mean()) - (outcomes[member] - outcomes[member].mean()))
    return float(np.mean(np.concatenate(residuals) ** 2)) if residuals else float("nan")


class OnlineDebiaser:
    """Calibrates world-model scores against real outcomes of anchors.

    Identity until `min_pairs` pairs have arrived; then fit, and refit each time `refit_every`
    new pairs have arrived since the last fit. Pairs live in a FIFO buffer of `capacity` (its
    only forgetting).
    """

    def __init__(self, bins: int = 10, min_pairs: int = 200, refit_every: int = 64, capacity: int = 5000,
                 fit_fallback: str = "identity", score_range: tuple[float, float] = (0.0, 1.0)):
        if bins < 2 or min_pairs < 1 or refit_every < 1 or capacity < min_pairs:
            raise ValueError("need bins >= 2, min_pairs >= 1, refit_every >= 1, capacity >= min_pairs; "
                             f"got bins={bins}, min_pairs={min_pairs}, refit_every={refit_every}, "
                             f"capacity={capacity}")
        if fit_fallback not in FIT_FALLBACKS:
            raise ValueError(f"fit_fallback {fit_fallback!r} is unknown; expected one of {FIT_FALLBACKS}")
        if not score_range[0] < score_range[1]:
            raise ValueError(f"score_range must be (low, high) with low < high, got {score_range}")
        self.bins, self.min_pairs, self.refit_every = bins, min_pairs, refit_every
        self.fit_fallback, self.score_range = fit_fallback, tuple(score_range)
        self.fit_failed = False  # the last fit found fewer than 2 populated bins and used the fallback
        self.pairs: deque[tuple[float, float]] = deque(maxlen=capacity)
        self.knots: tuple[np.ndarray, np.ndarray] | None = None
        self.fitted = False  # a fit has run (it may still be the identity: fewer than 2 populated bins)
        self.since_fit = 0
        self.fits = 0

    @property
    def calibrated(self) -> bool:
        return self.knots is not None

    def add(self, scores, outcomes) -> bool:
        """Push anchor pairs; returns True when this call refit the map."""
        scores, outcomes = np.asarray(scores, float).ravel(), np.asarray(outcomes, float).ravel()
        if scores.shape != outcomes.shape:
            raise ValueError(f"got {scores.size} scores and {outcomes.size} outcomes")
        if not (np.all(np.isfinite(scores)) and np.all(np.isfinite(outcomes))):
            raise ValueError("anchor scores and outcomes must be finite")
        self.pairs.extend(zip(scores.tolist(), outcomes.tolist()))
        self.since_fit += scores.size
        due = (len(self.pairs) >= self.min_pairs) if not self.fitted else self.since_fit >= self.refit_every
        if due:
            x, y = np.array(self.pairs).T
            self.knots = fit_bucketed_isotonic(x, y, self.bins, self.score_range)
            self.fit_failed = self.knots is None
            if self.fit_failed and self.fit_fallback == "mean":
                self.knots = (np.array([x.mean()]), np.array([y.mean()]))  # a one-knot map is the constant y.mean()
            self.fitted, self.since_fit, self.fits = True, 0, self.fits + 1
        return due

    def __call__(self, scores) -> np.ndarray:
        scores = np.asarray(scores, float)
        if self.knots is None:
            return scores.copy()
        return np.interp(scores, *self.knots)

    def state_dict(self) -> dict:
        return {"pairs": list(self.pairs), "knots": None if self.knots is None else [k.tolist() for k in self.knots],
                "fitted": self.fitted, "since_fit": self.since_fit, "fits": self.fits, "fit_failed": self.fit_failed}

    def load_state_dict(self, state: dict) -> None:
        self.pairs.clear()
        self.pairs.extend(tuple(p) for p in state["pairs"])
        self.knots = None if state["knots"] is None else tuple(np.array(k) for k in state["knots"])
        self.fitted, self.since_fit, self.fits = state["fitted"], state["since_fit"], state["fits"]
        self.fit_failed = state.get("fit_failed", False)
