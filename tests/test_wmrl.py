"""The WMRL corrections and GRPO advantages against hand-computed cases (pure logic)."""

import numpy as np
import pytest

from minivla_wmrl.rl.advantages import group_advantages, shuffle_within_groups, weight_anchor_advantages
from minivla_wmrl.rl.anchors import pick_anchors
from minivla_wmrl.rl.debiaser import OnlineDebiaser, centred_residual, fit_bucketed_isotonic, pool_adjacent_violators
from minivla_wmrl.rl.weighter import InverseVarianceWeighter


def test_pool_adjacent_violators_with_violations_weights_and_ties():
    np.testing.assert_allclose(pool_adjacent_violators([1, 3, 2, 4], [1, 1, 1, 1]), [1, 2.5, 2.5, 4])
    np.testing.assert_allclose(pool_adjacent_violators([1, 3, 2, 4], [1, 1, 3, 1]), [1, 2.25, 2.25, 4])
    np.testing.assert_allclose(pool_adjacent_violators([2, 2, 1], [1, 1, 1]), [5 / 3] * 3)  # a tie pooled on
    np.testing.assert_allclose(pool_adjacent_violators([0, 1, 1, 2], [1, 2, 3, 4]), [0, 1, 1, 2])  # already monotone


def test_bucketed_isotonic_fit_and_clamped_interpolation():
    x, y = fit_bucketed_isotonic([0.05, 0.15, 0.15, 0.95], [1, 0, 0, 1], bins=10)
    np.testing.assert_allclose(x, [0.05, 0.15, 0.95])
    np.testing.assert_allclose(y, [1 / 3, 1 / 3, 1])
    assert fit_bucketed_isotonic([0.11, 0.12, 0.19], [0, 1, 1]) is None  # one populated bin → identity
    debiaser = OnlineDebiaser(min_pairs=4)
    debiaser.add([0.05, 0.15, 0.15, 0.95], [1, 0, 0, 1])
    assert debiaser.calibrated
    np.testing.assert_allclose(debiaser([0.0, 0.55, 1.0, -0.3]), [1 / 3, 2 / 3, 1, 1 / 3])


def test_debiaser_is_identity_until_min_pairs_then_refits_on_schedule_with_a_fifo():
    debiaser = OnlineDebiaser(min_pairs=4, refit_every=3, capacity=5)
    assert not debiaser.add([0.1, 0.5, 0.9], [0, 1, 1]) and not debiaser.calibrated
    np.testing.assert_allclose(debiaser([0.3]), [0.3])
    assert debiaser.add([0.2], [0]) and debiaser.calibrated and debiaser.fits == 1
    assert not debiaser.add([0.3, 0.4], [1, 0]) and debiaser.fits == 1
    assert debiaser.add([0.6], [1]) and debiaser.fits == 2
    assert len(debiaser.pairs) == 5 and list(debiaser.pairs)[0] == (0.9, 1.0)  # the two oldest pairs dropped
    restored = OnlineDebiaser(min_pairs=4, refit_every=3, capacity=5)
    restored.load_state_dict(debiaser.state_dict())
    np.testing.assert_allclose(restored([0.25, 0.7]), debiaser([0.25, 0.7]))
    with pytest.raises(ValueError, match="finite"):
        debiaser.add([np.nan], [1])


def test_centred_residual_and_bias_reduction():
    # A constant offset within a group is removed by centring; a slope error is not.
    assert centred_residual([0.5, 0.6], [0, 0.1], [0, 0]) == pytest.approx(0)
    assert centred_residual([0.4, 0.6], [0, 1], [0, 0]) == pytest.approx(((-0.1 + 0.5) ** 2 + (0.1 - 0.5) ** 2) / 2)


def test_weighter_ema_freezes_c_once_and_clips():
    assert InverseVarianceWeighter().alpha == pytest.approx(0.010772, abs=1e-6)
    w = InverseVarianceWeighter(half_life=1, warmup=2, target_weight=2.0, max_weight=4.0)  # alpha = 0.5
    assert w.observe([0, 1], [0, 1]) == 0.0 and w.weight == 1.0  # s² = 0
    assert w.observe([0.3, 0.7], [1, 1]) is None and w.observations == 1  # constant outcomes ignored
    assert w.observe([1, 0], [0, 1]) == pytest.approx(4.0)  # ((±1)²) / 0.25
    assert w.ema == pytest.approx(2.0) and w.c == pytest.approx(0.5) and w.weight == pytest.approx(2.0)
    w.observe([1, 0], [0, 1])
    assert w.ema == pytest.approx(3.0) and w.c == pytest.approx(0.5) and w.weight == pytest.approx(2.5)
    w.observe([10, 0], [0, 1])  # s² = 121: the weight would be 32
    assert w.c == pytest.approx(0.5) and w.weight == 4.0


def test_a_step_of_single_anchor_groups_is_observed_pooled():
    w = InverseVarianceWeighter(half_life=1, warmup=1, target_weight=2.0)
    # one anchor per group (truncated execution): no group varies alone, pooled they do
    assert w.observe_step([0.9, 0.1, 0.8, 0.3], [1, 0, 1, 0], [0, 1, 2, 3]) == 1 and w.active
    w = InverseVarianceWeighter(half_life=1, warmup=1)
    # groups 0 and 1 vary on their own: one observation each; group 2's lone anchor and group 3's
    # constant pair are pooled into a third
    assert w.observe_step([0.9, 0.1, 0.7, 0.2, 0.5, 0.4, 0.3], [1, 0, 1, 0, 1, 0, 0], [0, 0, 1, 1, 2, 3, 3]) == 3
    w = InverseVarianceWeighter(half_life=1, warmup=1)
    assert w.observe_step([0.2, 0.4], [0, 0], [0, 1]) == 0  # one outcome everywhere: nothing to measure
    assert w.observe_step([0.5], [1], [0]) == 0 and w.observations == 0 and not w.active


def test_group_advantages_with_and_without_std_scaling():
    rewards, groups = np.array([1.0, 0, 0, 1, 0.2, 0.4]), np.array([0, 0, 0, 0, 1, 1])
    advantages, graded = group_advantages(rewards, groups)
    np.testing.assert_allclose(advantages, [0.5 / 0.5001, -0.5 / 0.5001, -0.5 / 0.5001, 0.5 / 0.5001,
                                            -0.1 / 0.1001, 0.1 / 0.1001])
    assert graded.all()
    centred, _ = group_advantages(rewards, groups, scale_std=False)
    np.testing.assert_allclose(centred, [0.5, -0.5, -0.5, 0.5, -0.1, 0.1])
    constant, _ = group_advantages(np.ones(3), np.zeros(3))
    np.testing.assert_allclose(constant, 0)


def test_unlabelled_rewards_are_left_out_not_zeroed():
    advantages, graded = group_advantages(np.array([1.0, np.nan, 0.0, np.nan, 0.5]), np.array([0, 0, 0, 1, 1]))
    np.testing.assert_allclose(advantages, [1 / 1.0002, 0, -1 / 1.0002, 0, 0], rtol=1e-6)
    assert graded.tolist() == [True, False, True, False, False]  # group 1 has one graded member: no signal


def test_anchor_weighting_after_normalisation():
    advantages, _ = group_advantages(np.array([1.0, 0.0, 1.0, 0.0]), np.zeros(4))
    weighted = weight_anchor_advantages(advantages, [True, True, False, False], 2.0)
    np.testing.assert_allclose(weighted, advantages * [2, 2, 1, 1])


def test_debiaser_bins_over_the_scorers_range_so_potential_failures_spread():
    # potential scores lie in [-1, 1]: failures at -0.6 and -0.1, successes at 0.5. On [0, 1] bins every
    # failure would fall into bin 0 together; on [-1, 1] they fall into their own bins.
    scores, outcomes = [-0.6, -0.6, -0.1, -0.1, 0.5, 0.5], [0, 0, 0, 1, 1, 1]
    x, y = fit_bucketed_isotonic(scores, outcomes, bins=10, score_range=(-1, 1))
    np.testing.assert_allclose(x, [-0.6, -0.1, 0.5])
    np.testing.assert_allclose(y, [0, 0.5, 1])
    x01, _ = fit_bucketed_isotonic(scores, outcomes, bins=10)
    assert len(x01) == 2  # [0, 1] bins merge both failure levels: the bug this range fixes
    debiaser = OnlineDebiaser(min_pairs=6, score_range=(-1, 1))
    debiaser.add(scores, outcomes)
    np.testing.assert_allclose(debiaser([-0.6, -0.35, 0.5]), [0, 0.25, 1])


def test_fit_failure_fallback_is_explicit_and_recorded():
    identity = OnlineDebiaser(min_pairs=3)
    identity.add([0.11, 0.12, 0.13], [0, 1, 1])  # one populated bin: nothing to fit
    assert identity.fit_failed and not identity.calibrated
    np.testing.assert_allclose(identity([0.11, 0.9]), [0.11, 0.9])
    mean = OnlineDebiaser(min_pairs=3, fit_fallback="mean")
    mean.add([0.11, 0.12, 0.13], [0, 1, 1])
    assert mean.fit_failed and mean.calibrated
    np.testing.assert_allclose(mean([0.11, 0.9, -3]), [2 / 3] * 3)
    restored = OnlineDebiaser(min_pairs=3, fit_fallback="mean")
    restored.load_state_dict(mean.state_dict())
    assert restored.fit_failed and restored([0.5])[0] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="fit_fallback 'zero' is unknown"):
        OnlineDebiaser(fit_fallback="zero")
    with pytest.raises(ValueError, match="score_range"):
        OnlineDebiaser(score_range=(1, -1))


def test_shuffled_rewards_are_a_derangement_within_each_group():
    rewards = np.array([1.0, 0.1, 0.3, 0.5, np.nan, 0.2, 0.4, 0.9, 0.7])
    groups = np.array([0, 0, 0, 0, 0, 1, 1, 1, 2])
    for seed in range(50):
        shuffled = shuffle_within_groups(rewards, groups, np.random.default_rng(seed))
        assert np.isnan(shuffled[4]) and shuffled[8] == 0.7  # unlabelled stays unlabelled; a lone member keeps its own
        for g in (0, 1):
            member = (groups == g) & np.isfinite(rewards)
            assert sorted(shuffled[member]) == sorted(rewards[member])
        labelled = np.isfinite(rewards) & (groups < 2)
        assert np.all(shuffled[labelled] != rewards[labelled])  # no rollout keeps its own reward


def test_pick_anchors_draws_what_the_two_rules_it_replaced_drew():
    """Masks of the code before `pick_anchors` (GRPOTrainer's truncated and full anchor picking, with
    the same generators): one rule, the same draws, so seeded runs keep their rollouts' anchors."""
    groups = np.repeat([3, 5, 8], 4)
    valid = np.ones(12, bool)
    valid[[1, 6, 7]] = False
    truncated = pick_anchors(groups, np.ones(12, bool), 0.25, np.random.default_rng(7), min_per_group=1)
    assert np.flatnonzero(truncated).tolist() == [3, 6, 10]  # one per group, before anything ran
    topped_up = pick_anchors(groups, valid, 0.25, np.random.default_rng(7), min_total=5)
    assert np.flatnonzero(topped_up).tolist() == [3, 5, 8, 9, 10] and not (topped_up & ~valid).any()
    half = pick_anchors(groups, valid, 0.5, np.random.default_rng(11), min_total=2)
    assert np.flatnonzero(half).tolist() == [0, 3, 4, 9, 10]
