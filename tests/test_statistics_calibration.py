"""The reporting itself, calibrated on simulated ablations (pure logic).

Each simulated ablation is what `ablate` measures: one SFT evaluation and one checkpoint per
training seed, all on the same init states (25 states × 2 samples). States differ in difficulty,
training seeds in their effect (sd `seed_sd` around the true effect), every episode is a coin
flip of its state's success probability. With no true effect, the reported 95% seed-level
interval must exclude zero in ≤ 7% of ablations; with a planted effect it must cover it in
≥ 90%. Pooling the seeds' episodes into one state-level bootstrap, as reported before, fails.
The mean over several tasks' ablations (`pooled_over_tasks`) is held to the same standard.
"""

import numpy as np
import pytest

from minivla_wmrl.evaluation.statistics import (
    paired_difference,
    pooled_over_tasks,
    satterthwaite_df,
    seed_level_difference,
)

STATES, SAMPLES, ABLATIONS = 25, 2, 300


def simulate(rng, seeds: int, seed_sd: float, effect: float):
    """SFT's episodes and each seed's checkpoint's, by (state, sample)."""
    difficulty = rng.uniform(0.2, 0.6, STATES)
    keys = [(u, k) for u in range(STATES) for k in range(SAMPLES)]
    sft = {key: rng.random() < difficulty[key[0]] for key in keys}
    checkpoints = []
    for _ in range(seeds):
        p = np.clip(difficulty + effect + rng.normal(0, seed_sd), 0, 1)
        checkpoints.append({key: rng.random() < p[key[0]] for key in keys})
    return sft, checkpoints


def rates(seeds: int, seed_sd: float, effect: float) -> tuple[float, float]:
    """(share of seed-level intervals excluding zero, share covering `effect`), and the same share
    for pooled intervals, over simulated ablations."""
    rng = np.random.default_rng(1000 * seeds + int(100 * seed_sd) + int(100 * effect))
    excluded = covered = pooled_excluded = 0
    for i in range(ABLATIONS):
        sft, checkpoints = simulate(rng, seeds, seed_sd, effect)
        low, high = seed_level_difference([sft] * seeds, checkpoints, resamples=400, seed=i)["ci95"]
        excluded += not low <= 0 <= high
        covered += low <= effect <= high
        pooled_a = {((u, k), s): v for s in range(seeds) for (u, k), v in sft.items()}
        pooled_b = {((u, k), s): v for s, c in enumerate(checkpoints) for (u, k), v in c.items()}
        low, high = paired_difference(pooled_a, pooled_b)["ci95"]
        pooled_excluded += not low <= 0 <= high
    return excluded / ABLATIONS, covered / ABLATIONS, pooled_excluded / ABLATIONS


@pytest.mark.parametrize("seeds, seed_sd", [(3, 0.0), (3, 0.08), (5, 0.08)])
def test_no_true_effect_is_rarely_reported(seeds, seed_sd):
    false_positives, _, pooled = rates(seeds, seed_sd, effect=0.0)
    assert false_positives <= 0.07
    if seed_sd:
        assert pooled > 0.07  # what the pooled statistics claimed: the test can tell the difference


@pytest.mark.parametrize("seeds", [3, 5])
def test_a_planted_effect_is_covered(seeds):
    _, coverage, _ = rates(seeds, 0.08, effect=0.15)
    assert coverage >= 0.90


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


@pytest.mark.parametrize("effects", [(0.0, 0.0, 0.0), (0.15, -0.05, 0.05)])
def test_the_mean_over_tasks_is_calibrated(effects):
    """Three tasks, each its own simulated ablation (5 seeds): the pooled interval covers the mean of
    the tasks' true effects in >= 90% of experiments (with none, it excludes zero in <= 7%)."""
    rng = np.random.default_rng(7)
    truth, experiments, covered = float(np.mean(effects)), 150, 0
    for i in range(experiments):
        per_task = []
        for effect in effects:
            sft, checkpoints = simulate(rng, 5, 0.08, effect)
            per_task.append(seed_level_difference([sft] * 5, checkpoints, resamples=400, seed=i))
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
