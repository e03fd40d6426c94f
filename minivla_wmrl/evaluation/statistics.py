"""Statistics for success rates: Wilson intervals, paired comparisons, seed-level differences (one task's
and pooled over tasks), AUROC.

A success rate without its interval proves nothing either way; a difference between two
checkpoints is judged on the episodes they share (same task, init state and sampling seed), so
the init-state noise cancels. A claim that *training* helped treats the training seed as the
unit (`seed_level_difference`): checkpoints of several seeds compared with one SFT evaluation are
not independent experiments, and pooling their episodes (one McNemar test, one bootstrap over
states) reports intervals far too narrow. scipy supplies the distributions; the pairing is ours.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
RATE_BOUNDS = (0.0, 1.0)  # success rates: intervals clipped to these


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
            "ci95": [low, high], "gained": gained, "lost": lost, "p_mcnemar": mcnemar_exact(gained, lost),
            "unit": "init states (two fixed checkpoints; their samples kept together)"}


def mean_interval(values, confidence: float = CONFIDENCE, bounds: tuple[float, float] | None = None) -> dict:
    """Mean over seeds with a Student-t interval (None for a single seed), clipped to `bounds`
    (e.g. (0, 1) for success rates)."""
    values = np.asarray(values, float)
    mean = float(values.mean())
    if values.size < 2:
        return {"mean": mean, "ci95": None, "n": int(values.size)}
    half = float(stats.t.ppf((1 + confidence) / 2, values.size - 1) * values.std(ddof=1) / math.sqrt(values.size))
    return {"mean": mean, "ci95": _clip([mean - half, mean + half], bounds), "n": int(values.size)}


def _clip(interval: list[float], bounds: tuple[float, float] | None) -> list[float]:
    return interval if bounds is None else [max(interval[0], bounds[0]), min(interval[1], bounds[1])]


def sign_flip_p(values) -> float:
    """Two-sided exact sign-flip permutation p-value of mean(values) = 0 over all 2^n sign patterns
    (n ≤ 16): the seed-level test that assumes only symmetry. With 5 seeds it cannot go below 1/16."""
    values = np.asarray(values, float)
    if not 0 < values.size <= 16:
        raise ValueError(f"sign-flip test over {values.size} values; expected 1..16 seeds")
    signs = 1 - 2 * ((np.arange(2 ** values.size)[:, None] >> np.arange(values.size)) & 1)
    means = np.abs((signs * values).mean(axis=1))
    return float(np.mean(means >= abs(values.mean()) - 1e-12))


SEED_LEVEL_UNIT = ("training seeds and init states, resampled independently (crossed: every seed's checkpoint "
                   "is evaluated on the same states); t with Satterthwaite's degrees of freedom")


def satterthwaite_df(table: np.ndarray) -> float:
    """Degrees of freedom of the grand mean's variance in a seeds × states table of differences.

    That variance is σ²_seeds/seeds + σ²_states/states + σ²_residual/(seeds·states), each component
    estimated from the table's two-way random-effects mean squares and set to 0 where the estimate is
    negative (a variance cannot be). The df are Satterthwaite's for that combination of mean squares:
    near seeds − 1 when the seeds differ much, near states − 1 when what every seed shares (the
    states, and the one SFT evaluation's noise) dominates. Without the truncation a comparison of two
    trained arms, where the states' shared part cancels, gave MS_seeds + MS_states − MS_residual ≈ 0
    and df 1: intervals of ±70 points.
    """
    n_seeds, n_units = table.shape
    mean, rows, columns = table.mean(), table.mean(axis=1), table.mean(axis=0)
    seeds_df, states_df = n_seeds - 1, max(n_units - 1, 1)
    seeds_ms = n_units * ((rows - mean) ** 2).sum() / seeds_df
    states_ms = n_seeds * ((columns - mean) ** 2).sum() / states_df
    residual = table - rows[:, None] - columns[None, :] + mean
    residual_ms = (residual ** 2).sum() / (seeds_df * states_df)
    # seeds·states × the mean's variance = c_seeds·MS_seeds + c_states·MS_states + c_residual·MS_residual
    c_seeds, c_states = float(seeds_ms > residual_ms), float(states_ms > residual_ms)
    terms = [(c_seeds * seeds_ms, seeds_df), (c_states * states_ms, states_df),
             ((1 - c_seeds - c_states) * residual_ms, seeds_df * states_df)]
    denominator = sum(term ** 2 / df for term, df in terms)
    if denominator == 0:
        return float(n_seeds - 1)
    return float(np.clip(sum(term for term, _ in terms) ** 2 / denominator, 1.0, n_seeds * n_units))


def seed_level_difference(a_by_seed: list[dict], b_by_seed: list[dict], confidence: float = CONFIDENCE,
                          resamples: int = 2000, seed: int = 0) -> dict:
    """B − A with the training seed as the unit of inference.

    `a_by_seed[s]`, `b_by_seed[s]`: success (0/1) by episode key `(unit, sample)` for seed s's two
    checkpoints (A may be one SFT evaluation shared by every seed; B the checkpoint seed s trained).
    The per-seed, per-state differences form a seeds × states table. Its mean's standard error is
    bootstrapped by resampling seeds and states independently, so it holds both the variation
    between training seeds and that between states, including the shared SFT evaluation's, which
    a t interval over per-seed differences would miss. The interval and p use Student's t with
    Satterthwaite's degrees of freedom from the table's mean squares: seeds − 1 would be right only
    if the seeds' spread dominated, and made the interval exclude a +15-point effect in 0% (3
    seeds) to 11% (5 seeds) of simulated ablations against 27% to 37% this way, both calibrated.
    Also returned: the exact sign-flip p over per-seed differences, and per seed the exact McNemar
    test of its one checkpoint against A (the only place McNemar is valid). Differences clipped to
    [−1, 1]. One seed: no seed-level interval.
    """
    if len(a_by_seed) != len(b_by_seed) or not a_by_seed:
        raise ValueError(f"seed-level difference needs one A and one B evaluation per seed; got {len(a_by_seed)} "
                         f"and {len(b_by_seed)}")
    units = None
    per_seed, table = [], []
    for a, b in zip(a_by_seed, b_by_seed):
        keys = sorted(set(a) & set(b))
        by_unit: dict = {}
        for key in keys:
            by_unit.setdefault(key[0], []).append(float(b[key]) - float(a[key]))
        if units is None:
            units = sorted(by_unit)
        if sorted(by_unit) != units or not units:
            raise ValueError("every seed's evaluations must cover the same init states (units); got "
                             f"{len(by_unit)} vs {len(units or [])} shared units")
        table.append([np.mean(by_unit[u]) for u in units])
        gained = sum(1 for k in keys if b[k] and not a[k])
        lost = sum(1 for k in keys if a[k] and not b[k])
        per_seed.append({"difference": float(np.mean(table[-1])), "episodes": len(keys), "gained": gained,
                         "lost": lost, "p_mcnemar": mcnemar_exact(gained, lost)})
    table = np.asarray(table)
    n_seeds, n_units = table.shape
    difference = float(table.mean())
    result = {"difference": difference, "seeds": n_seeds, "units": n_units, "per_seed": per_seed,
              "ci95": None, "se": None, "df": None, "p": None, "p_sign_flip": None, "unit": SEED_LEVEL_UNIT}
    if n_seeds < 2:
        return result
    rng = np.random.default_rng(seed)
    seeds = rng.integers(n_seeds, size=(resamples, n_seeds))
    states = rng.integers(n_units, size=(resamples, n_units))
    se = float(table[seeds[:, :, None], states[:, None, :]].mean(axis=(1, 2)).std(ddof=1))
    df = satterthwaite_df(table)
    if se == 0:
        interval, p = [difference, difference], (1.0 if difference == 0 else 0.0)
    else:
        half = float(stats.t.ppf((1 + confidence) / 2, df)) * se
        interval = [difference - half, difference + half]
        p = float(2 * stats.t.sf(abs(difference) / se, df))
    result.update(ci95=_clip(interval, (-1.0, 1.0)), se=se, df=df, p=p,
                  p_sign_flip=sign_flip_p([e["difference"] for e in per_seed]) if n_seeds <= 16 else None)
    return result


PLANNING_HALF_WIDTH = 0.05  # the non-inferiority margin the issues judge by: an interval this narrow settles them
MAX_PLANNED_SEEDS = 1000


def seeds_for_half_width(difference: dict, half_width: float = PLANNING_HALF_WIDTH,
                         confidence: float = CONFIDENCE) -> int | None:
    """How many seeds a side a seed-level comparison of two trained arms (`seed_level_difference`) would
    take for its interval to shrink to ±`half_width`, at the spread it shows: a planning figure (what
    settling it would cost), not an inference. Assumes the standard error falls as 1/√seeds and takes
    t with seeds − 1 df, as when the seeds' variation dominates. That holds where the two arms share no
    evaluation; against one SFT evaluation, whose noise every seed shares and more seeds do not
    average away, it is a lower bound. None without an interval (one seed) or beyond
    `MAX_PLANNED_SEEDS`."""
    se, seeds = difference.get("se"), difference["seeds"]
    if se is None:
        return None
    for n in range(2, MAX_PLANNED_SEEDS + 1):
        if float(stats.t.ppf((1 + confidence) / 2, n - 1)) * se * math.sqrt(seeds / n) <= half_width:
            return n
    return None


def pooled_over_tasks(differences: list[dict], confidence: float = CONFIDENCE) -> dict:
    """The mean of several tasks' seed-level differences (`seed_level_difference`, each from its own
    ablation: its own SFT checkpoint, seeds and states), with a t interval whose standard error adds
    the tasks' variances and whose degrees of freedom are Welch-Satterthwaite's.

    The tasks are fixed, not sampled: the interval is about the average effect on *these* tasks
    (is the recipe's effect over them positive?), not about a task drawn from the suite, which a
    handful of tasks could not support. Every task needs a seed-level interval (≥ 2 seeds).
    """
    if not differences:
        raise ValueError("pooling over tasks needs at least one task's seed-level difference")
    missing = [i for i, d in enumerate(differences) if d.get("se") is None or d.get("df") is None]
    if missing:
        raise ValueError(f"task(s) {missing} have no seed-level interval (one seed?); pooling needs >= 2 seeds a task")
    k = len(differences)
    difference = float(np.mean([d["difference"] for d in differences]))
    variances = np.array([d["se"] ** 2 for d in differences]) / k ** 2
    se = float(math.sqrt(variances.sum()))
    if se == 0:
        return {"difference": difference, "tasks": k, "se": 0.0, "df": None, "p": 1.0 if difference == 0 else 0.0,
                "ci95": [difference, difference]}
    df = float(variances.sum() ** 2 / sum(v ** 2 / d["df"] for v, d in zip(variances, differences) if v > 0))
    half = float(stats.t.ppf((1 + confidence) / 2, df)) * se
    return {"difference": difference, "tasks": k, "se": se, "df": df,
            "p": float(2 * stats.t.sf(abs(difference) / se, df)),
            "ci95": _clip([difference - half, difference + half], (-1.0, 1.0))}


def auroc(scores, labels) -> float:
    """Area under the ROC curve by the Mann-Whitney rank statistic (ties count half); NaN without
    both classes."""
    labels = np.asarray(labels, bool)
    positives, negatives = labels.sum(), (~labels).sum()
    if not positives or not negatives:
        return float("nan")
    ranks = stats.rankdata(scores)
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))
