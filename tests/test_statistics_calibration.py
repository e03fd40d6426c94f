"""The reporting itself, calibrated on simulated ablations (pure logic).

Each simulated ablation is what `ablate` measures: one SFT evaluation and one checkpoint per
training seed, all on the same init states (25 states × 2 samples). States differ in difficulty,
training seeds in their effect (sd `seed_sd` around the true effect), every episode is a coin
flip of its state's success probability. With no true effect, the reported 95% seed-level
interval must exclude zero in ≤ 7% of ablations; with a planted effect it must cover it in
≥ 90%. Pooling the seeds' episodes into one state-level bootstrap, as reported before, fails.
The mean over several tasks' ablations (`pooled_over_tasks`) is held to the same standard.
So is the comparison of two trained arms (gated against sparse), which share no evaluation, and
the seeds such a comparison would take to settle.
"""

import numpy as np
import pytest

from minivla_wmrl.evaluation.statistics import (
    paired_difference,
    pooled_over_tasks,
    satterthwaite_df,
    seed_level_difference,
    seeds_for_half_width,
)

STATES, SAMPLES, ABLATIONS = 25, 2, 300


def episodes(rng, p_by_state, keys) -> dict:
    return {key: rng.random() < p_by_state[key[0]] for key in keys}


def trained(rng, difficulty, keys, seeds: int, seed_sd: float, effect: float) -> list[dict]:
    """One checkpoint per training seed, each shifted from `difficulty` by `effect` + its own noise."""
    return [episodes(rng, np.clip(difficulty + effect + rng.normal(0, seed_sd), 0, 1), keys) for _ in range(seeds)]


def simulate(rng, seeds: int, seed_sd: float, effect: float, compare: str = "sft"):
    """A's and B's episodes by (state, sample): `compare` "sft", one SFT evaluation (shared by every
    seed) and each seed's checkpoint; "arms", two trained arms (a +12-point gain, then `effect` more
    for B), each seed its own run of each."""
    difficulty = rng.uniform(0.2, 0.6, STATES)
    keys = [(u, k) for u in range(STATES) for k in range(SAMPLES)]
    if compare == "sft":
        return [episodes(rng, difficulty, keys)] * seeds, trained(rng, difficulty, keys, seeds, seed_sd, effect)
    return (trained(rng, difficulty, keys, seeds, seed_sd, 0.12),
            trained(rng, difficulty, keys, seeds, seed_sd, 0.12 + effect))


def rates(seeds: int, seed_sd: float, effect: float, compare: str = "sft") -> tuple[float, float, float, float]:
    """Over simulated ablations: the share of seed-level intervals excluding zero, the share covering
    `effect`, the share of pooled-episode intervals excluding zero, and the seed-level intervals'
    median width."""
    rng = np.random.default_rng(1000 * seeds + int(100 * seed_sd) + int(100 * effect) + (compare == "arms"))
    excluded = covered = pooled_excluded = 0
    widths = []
    for i in range(ABLATIONS):
        a, b = simulate(rng, seeds, seed_sd, effect, compare)
        low, high = seed_level_difference(a, b, resamples=400, seed=i)["ci95"]
        excluded += not low <= 0 <= high
        covered += low <= effect <= high
        widths.append(high - low)
        pooled_a = {(key, s): v for s, episodes_a in enumerate(a) for key, v in episodes_a.items()}
        pooled_b = {(key, s): v for s, episodes_b in enumerate(b) for key, v in episodes_b.items()}
        low, high = paired_difference(pooled_a, pooled_b)["ci95"]
        pooled_excluded += not low <= 0 <= high
    return excluded / ABLATIONS, covered / ABLATIONS, pooled_excluded / ABLATIONS, float(np.median(widths))


@pytest.mark.parametrize("seeds, seed_sd", [(3, 0.0), (3, 0.08), (5, 0.08)])
def test_no_true_effect_is_rarely_reported(seeds, seed_sd):
    false_positives, _, pooled, _ = rates(seeds, seed_sd, effect=0.0)
    assert false_positives <= 0.07
    if seed_sd:
        assert pooled > 0.07  # what the pooled statistics claimed: the test can tell the difference


@pytest.mark.parametrize("seeds", [3, 5])
def test_a_planted_effect_is_covered(seeds):
    _, coverage, _, _ = rates(seeds, 0.08, effect=0.15)
    assert coverage >= 0.90


@pytest.mark.parametrize("seeds", [3, 5])
def test_two_trained_arms_are_compared_calibrated_and_informative(seeds):
    """Arm against arm (gated against sparse): no shared SFT evaluation, so the states' shared part
    cancels. Calibrated as against SFT, and not uninformative: the untruncated degrees of freedom fell
    to ~1 here, for median widths of 100 (3 seeds) and 46 points (5 seeds) with no seed variation."""
    false_positives, _, _, width = rates(seeds, 0.0, effect=0.0, compare="arms")
    assert false_positives <= 0.07 and width <= 0.40
    false_positives, _, _, _ = rates(seeds, 0.08, effect=0.0, compare="arms")
    assert false_positives <= 0.07
    _, coverage, _, _ = rates(seeds, 0.08, effect=0.15, compare="arms")
    assert coverage >= 0.90


def test_the_seeds_planned_for_a_half_width_give_about_that_width():
    """Planned from 5 seeds of two trained arms, the seeds for a ±10-point interval: ablations run at
    that many seeds report intervals whose median half-width is near 10 points (the plan is only as
    good as 5 seeds' spread, hence the median over several plans)."""
    rng = np.random.default_rng(11)
    plans = [seeds_for_half_width(seed_level_difference(*simulate(rng, 5, 0.08, 0.0, "arms"), resamples=400, seed=i),
                                  half_width=0.10) for i in range(40)]
    planned = int(np.median(plans))
    assert 5 < planned < 40  # wider than ±10 at 5 seeds, and within reach
    half_widths = []
    for i in range(60):
        low, high = seed_level_difference(*simulate(rng, planned, 0.08, 0.0, "arms"), resamples=400, seed=i)["ci95"]
        half_widths.append((high - low) / 2)
    assert 0.08 <= np.median(half_widths) <= 0.12
    one_seed = seed_level_difference(*simulate(rng, 1, 0.08, 0.0, "arms"))
    assert seeds_for_half_width(one_seed) is None
    assert seeds_for_half_width(dict(one_seed, se=0.0, seeds=3)) == 2  # nothing varies: the fewest seeds do


def test_per_seed_mcnemar_and_the_sign_flip_test():
    sft = {((u, 0), 0): u < 10 for u in range(20)}
    better = [{k: k[0][0] < 10 + g for k in sft} for g in (3, 5, 4, 6, 2)]  # each seed gains g states, loses none
    d = seed_level_difference([sft] * 5, better)
    assert d["difference"] == pytest.approx(np.mean([3, 5, 4, 6, 2]) / 20)
    assert [s["gained"] for s in d["per_seed"]] == [3, 5, 4, 6, 2] and all(s["lost"] == 0 for s in d["per_seed"])
    assert d["p_sign_flip"] == pytest.approx(2 / 32)  # all five positive: the smallest p five seeds allow
    low, high = d["ci95"]
    assert low < d["difference"] < high and (d["p"] < 0.05) == (low > 0) and "training seeds" in d["unit"]
    one = seed_level_difference([sft], better[:1])
    assert one["ci95"] is None and one["per_seed"][0]["p_mcnemar"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="same init states"):
        seed_level_difference([sft, sft], [better[0], {((99, 0), 0): True}])


def test_degrees_of_freedom_follow_where_the_variation_is():
    rng = np.random.default_rng(0)
    seeds_differ = np.repeat(rng.normal(0, 1, (5, 1)), 30, axis=1) + rng.normal(0, 0.01, (5, 30))
    assert satterthwaite_df(seeds_differ) == pytest.approx(4, abs=0.5)  # seeds − 1
    states_differ = np.repeat(rng.normal(0, 1, (1, 30)), 5, axis=0) + rng.normal(0, 0.1, (5, 30))
    assert satterthwaite_df(states_differ) > 25  # shared by every seed (e.g. the one SFT evaluation's): ~states − 1
    # seeds that differ a little more than the episodes do, and no state component (two trained arms):
    # MS_seeds + MS_states − MS_residual nearly cancels; the negative states component counts as 0
    noise = rng.normal(0, 1, (5, 30))
    noise -= noise.mean(axis=0, keepdims=True) + noise.mean(axis=1, keepdims=True) - noise.mean()
    residual_ms = (noise ** 2).sum() / (4 * 29)
    row_effects = np.array([1.0, -1.0, 1.0, -1.0, 0.0]) * np.sqrt(1.1 * residual_ms / 30)  # MS_seeds = 1.1 MS_res
    assert satterthwaite_df(noise + row_effects[:, None]) == pytest.approx(4)


@pytest.mark.parametrize("effects", [(0.0, 0.0, 0.0), (0.15, -0.05, 0.05)])
def test_the_mean_over_tasks_is_calibrated(effects):
    """Three tasks, each its own simulated ablation (5 seeds): the pooled interval covers the mean of
    the tasks' true effects in >= 90% of experiments (with none, it excludes zero in <= 7%)."""
    rng = np.random.default_rng(7)
    truth, experiments, covered = float(np.mean(effects)), 150, 0
    for i in range(experiments):
        per_task = []
        for effect in effects:
            per_task.append(seed_level_difference(*simulate(rng, 5, 0.08, effect), resamples=400, seed=i))
        low, high = pooled_over_tasks(per_task)["ci95"]
        covered += low <= truth <= high
    assert covered / experiments >= (0.93 if truth == 0 else 0.90)


def test_pooling_needs_an_interval_for_every_task():
    sft = {((u, 0), 0): u < 10 for u in range(20)}
    one_seed = seed_level_difference([sft], [{k: k[0][0] < 12 for k in sft}])
    with pytest.raises(ValueError, match=r"task\(s\) \[1\] have no seed-level interval"):
        pooled_over_tasks([seed_level_difference([sft] * 2, [sft, {k: not v for k, v in sft.items()}]), one_seed])
    with pytest.raises(ValueError, match="at least one"):
        pooled_over_tasks([])
