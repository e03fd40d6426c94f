"""Success-rate statistics against hand-computed and textbook values (pure logic)."""

import numpy as np
import pytest

from minivla_wmrl.evaluation.statistics import (
    auroc,
    bootstrap_mean_interval,
    mcnemar_exact,
    mean_interval,
    paired_difference,
    rate,
    wilson_interval,
)


def test_wilson_interval_matches_the_closed_form():
    low, high = wilson_interval(8, 30)
    p, n, z = 8 / 30, 30, 1.959963984540054
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    assert [low, high] == pytest.approx([centre - half, centre + half], abs=1e-9)
    assert wilson_interval(0, 10)[0] == 0 and 0.25 < wilson_interval(0, 10)[1] < 0.35  # never a zero-width interval
    assert wilson_interval(0, 0) is None
    assert rate(3, 4) == {"successes": 3, "trials": 4, "success_rate": 0.75, "ci95": wilson_interval(3, 4)}


def test_exact_mcnemar_on_the_discordant_pairs():
    assert mcnemar_exact(6, 1) == pytest.approx(0.125)  # the first data point: 6 gained, 1 lost
    assert mcnemar_exact(11, 1) == pytest.approx(2 * 13 / 4096)  # 0.0063
    assert mcnemar_exact(0, 0) == 1.0 and mcnemar_exact(3, 3) == 1.0


def test_paired_difference_counts_discordant_episodes_and_resamples_states():
    a = {((0, s), 0): s < 4 for s in range(10)}  # A succeeds on states 0-3
    b = {((0, s), 0): s < 8 for s in range(10)}  # B on 0-7: gains 4, loses none
    d = paired_difference(a, b)
    assert (d["episodes"], d["units"], d["gained"], d["lost"]) == (10, 10, 4, 0)
    assert d["difference"] == pytest.approx(0.4) and d["success_a"] == 0.4 and d["success_b"] == 0.8
    assert 0 < d["ci95"][0] < 0.4 < d["ci95"][1] <= 0.8 and d["p_mcnemar"] == pytest.approx(0.125)
    same = paired_difference(a, dict(a))
    assert same["difference"] == 0 and same["ci95"] == [0.0, 0.0] and same["p_mcnemar"] == 1.0
    with pytest.raises(ValueError, match="share no episode"):
        paired_difference(a, {((1, 0), 0): True})


def test_paired_difference_keeps_the_samples_of_a_state_together():
    a = {((0, s), k): False for s in range(6) for k in range(2)}
    b = {((0, s), k): s % 2 == 0 for s in range(6) for k in range(2)}
    d = paired_difference(a, b)
    assert (d["episodes"], d["units"], d["difference"]) == (12, 6, 0.5)


def test_bootstrap_and_t_intervals():
    low, high = bootstrap_mean_interval(np.r_[np.zeros(50), np.ones(50)])
    assert 0.38 < low < 0.5 < high < 0.62
    m = mean_interval([0.4, 0.5, 0.6])
    half = 4.302653 * 0.1 / np.sqrt(3)  # t(0.975, 2 df) × s / √n
    assert m["mean"] == pytest.approx(0.5) and m["ci95"] == pytest.approx([0.5 - half, 0.5 + half], abs=1e-5)
    assert mean_interval([0.3])["ci95"] is None


def test_auroc_ranks_positives_above_negatives_with_ties_counting_half():
    assert auroc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1]) == 1.0
    assert auroc([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1]) == 0.0
    assert auroc([0.5, 0.5, 0.5], [0, 1, 1]) == 0.5
    assert auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75  # one of four (positive, negative) pairs reversed
    assert np.isnan(auroc([0.1, 0.2], [1, 1]))
