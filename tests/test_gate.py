"""Gated execution: the gate's rule and calibration (pure logic), and GRPO with the gate on PointReach."""

import numpy as np
import pytest

from minivla_wmrl.evaluation.statistics import auroc
from minivla_wmrl.train.gate import (Gate, GateConfig, OutcomePredictor, cross_fit_statistics, cut_statistic,
                                     beyond_time, decision_steps)
from minivla_wmrl.train.grpo import GRPOTrainer, train_grpo, validate
from tests.test_learning import EPISODE_STEPS, learning_recipe, start  # noqa: F401  (start: the fixture)
from tests.test_outcome_probe import CAP, rollouts


def test_the_cut_statistic_is_the_lowest_threshold_at_which_the_rule_cuts():
    probabilities = np.array([0.05, 0.5, 0.2, 0.3, 0.1, 0.4])
    steps = np.array([8, 16, 24, 32, 40, 48])
    # eligible from step 24: [0.2, 0.3, 0.1, 0.4]; runs of 2 → maxima 0.3, 0.3, 0.4
    assert cut_statistic(probabilities, steps, min_steps=24, patience=2) == 0.3
    assert cut_statistic(probabilities, steps, min_steps=8, patience=1) == 0.05
    assert cut_statistic(probabilities, steps, min_steps=48, patience=2) == float("inf")  # never eligible
    gate = Gate(GateConfig(min_steps=24, patience=2))
    gate.active, gate.threshold = True, 0.3 + 1e-9
    assert not gate.cuts(probabilities[:3], steps[:3])  # the run (0.5, 0.2) starts before min_steps
    assert gate.cuts(probabilities[:4], steps[:4])  # (0.2, 0.3) < threshold: cut here, as the statistic says
    gate.threshold = 0.3
    assert not gate.cuts(probabilities[:4], steps[:4])


def test_the_threshold_cuts_at_most_the_target_share_of_recent_successes():
    rng = np.random.default_rng(0)
    outcomes = rng.random(400) < 0.4
    statistics = np.where(outcomes, rng.uniform(0.2, 1.0, 400), rng.uniform(0.0, 0.5, 400))
    gate = Gate(GateConfig(wrong_cut_rate=0.1, window=400, auroc_floor=0.7))
    gate.observe(statistics, outcomes, np.full(400, np.nan))
    assert gate.active and gate.quality > 0.85
    cut = statistics < gate.threshold
    assert (cut & outcomes).sum() <= 0.1 * outcomes.sum() < (cut & outcomes).sum() + 1
    assert (cut & ~outcomes).mean() / (~outcomes).mean() > 0.3  # and it cuts failures

    gate = Gate(GateConfig(wrong_cut_rate=0.1, window=400, auroc_floor=0.7))
    gate.observe(rng.uniform(0, 1, 400), outcomes, np.full(400, np.nan))  # a predictor at chance
    assert not gate.active and "below the floor" in gate.reason


def test_the_conformal_rule_bounds_the_share_of_new_successes_cut_where_the_quantile_exceeds_it():
    """Windows of 20 successes and 20 failures, then one more success from the same distribution: over many
    draws the quantile threshold cuts it more often than the target (3/21), the conformal one at most as
    often (2/21); below 1/rate - 1 successes the conformal gate does not cut at all."""
    rng = np.random.default_rng(0)
    rate, n, draws = 0.1, 20, 4000
    cut = {"quantile": 0, "conformal": 0}
    for _ in range(draws):
        successes, failures, new = rng.uniform(0.2, 1.0, n), rng.uniform(0.0, 0.5, n), rng.uniform(0.2, 1.0)
        outcomes = np.r_[np.ones(n, bool), np.zeros(n, bool)]
        for rule in cut:
            gate = Gate(GateConfig(wrong_cut_rate=rate, window=2 * n, auroc_floor=0.5, threshold_rule=rule))
            gate.observe(np.r_[successes, failures], outcomes, np.full(2 * n, np.nan))
            cut[rule] += gate.active and new < gate.threshold
    error = 3 * np.sqrt(rate * (1 - rate) / draws)
    assert cut["quantile"] / draws > rate + error and abs(cut["quantile"] / draws - 3 / 21) < error
    assert cut["conformal"] / draws <= rate and abs(cut["conformal"] / draws - 2 / 21) < error

    gate = Gate(GateConfig(wrong_cut_rate=rate, window=16, min_per_outcome=4, threshold_rule="conformal"))
    gate.observe(np.r_[rng.uniform(0.5, 1.0, 8), rng.uniform(0.0, 0.2, 8)], np.arange(16) < 8, np.full(16, np.nan))
    assert not gate.active and "too few to bound the wrong-cut rate" in gate.reason  # 8 < 1/0.1 - 1
    for rule in ("quantile", "conformal"):  # a rate of 1: the threshold is the highest success statistic
        gate = Gate(GateConfig(wrong_cut_rate=1.0, window=16, threshold_rule=rule))
        gate.observe(np.r_[np.linspace(0.5, 0.9, 8), np.zeros(8)], np.arange(16) < 8, np.full(16, np.nan))
        assert gate.threshold == pytest.approx(0.9)


def test_the_gate_stops_cutting_when_its_predictor_degrades_and_restores_from_its_state():
    rng = np.random.default_rng(1)
    config = GateConfig(window=40, min_per_outcome=4, auroc_floor=0.7)
    gate = Gate(config)
    gate.observe(rng.uniform(0, 1, 6), np.zeros(6, bool), rng.uniform(0, 1, 6))
    assert not gate.active and "0 successes" in gate.reason
    outcomes = np.arange(40) % 2 == 0
    gate.observe(np.where(outcomes, 0.8, 0.1) + rng.uniform(0, 0.05, 40), outcomes, np.where(outcomes, 0.6, 0.4))
    assert gate.active and gate.quality == 1.0
    copy = Gate(config)
    copy.load_state_dict(gate.state_dict())
    assert ((copy.active, copy.threshold, copy.quality, copy.beyond_time_auroc)
            == (gate.active, gate.threshold, gate.quality, gate.beyond_time_auroc) == (True, gate.threshold, 1.0, 1.0))
    older = Gate(config)  # a checkpoint from before the log-odds beyond time were kept: the gate is as it was
    older.load_state_dict({k: v for k, v in gate.state_dict().items() if k != "beyond_time"})
    assert (older.active, older.threshold, older.quality) == (gate.active, gate.threshold, gate.quality)
    assert np.isnan(older.beyond_time_auroc)
    gate.observe(np.where(outcomes, 0.1, 0.8), outcomes, np.full(40, 0.5))  # the last 40 anchors: ranked backwards
    assert not gate.active and gate.quality == 0.0


def test_warm_start_statistics_are_cross_fitted_and_fill_one_window():
    episodes = rollouts(0, 60)  # successes planted in the policy's signals
    config = GateConfig(predictor="policy", min_steps=24, patience=1, window=40, min_per_outcome=4)
    statistics, outcomes, excess = cross_fit_statistics(episodes, config, CAP)
    assert len(statistics) == len(outcomes) == len(excess) == 40 and 0 < outcomes.sum() < 40
    assert auroc(statistics, outcomes) > 0.9
    gate = Gate(config)
    gate.observe(statistics, outcomes, excess)
    assert gate.active  # before any anchor
    # each episode is scored by a predictor that never saw it: one fit on all of them would score them otherwise
    seen = OutcomePredictor("policy", CAP)
    seen.fit(episodes)
    by_seen = [cut_statistic(p, decision_steps(t), 24, 1) for p, t in zip(seen(episodes), episodes)]
    assert not set(np.round(statistics, 9)) <= set(np.round(by_seen, 9))
    few = cross_fit_statistics(episodes[:4], config, CAP)[0]  # folds too small to fit on: nothing to calibrate on
    assert len(few) == 0


def test_the_log_odds_beyond_time_are_taken_where_the_gate_may_first_cut():
    probabilities, steps = np.array([0.1, 0.2, 0.5, 0.4]), np.array([8, 16, 24, 30])  # the last: the end, step 30
    time_alone = {16: 0.2, 24: 0.2}.get
    assert beyond_time(probabilities, steps, 30, 16, 1, time_alone) == pytest.approx(0.0)
    assert beyond_time(probabilities, steps, 30, 20, 1, time_alone) == pytest.approx(np.log(4))  # odds 1 against 1/4
    assert beyond_time(probabilities, steps, 30, 16, 2, time_alone) == pytest.approx(np.log(4))  # two decisions due
    assert np.isnan(beyond_time(probabilities, steps, 30, 20, 2, time_alone))  # ended before a second one
    assert np.isnan(beyond_time(probabilities, steps, 30, 25, 1, time_alone))  # ended before a cut was due
    with pytest.raises(ValueError, match="got 2, 2 and 1"):
        Gate(GateConfig()).observe(np.zeros(2), np.zeros(2, bool), np.zeros(1))


def test_time_alone_passes_the_quality_floor_but_knows_nothing_beyond_time():
    """Successes end early, so ranking by the cut statistic rewards time alone as much as a probe
    that reads the planted signal; among the anchors still running where cuts begin, only the probe
    ranks them (time alone's excess over itself is 0 in every fold: AUROC 0.5)."""
    episodes = rollouts(0, 80)
    gates = {}
    for predictor in ("time", "policy"):
        config = GateConfig(predictor=predictor, min_steps=24, patience=1, window=80, min_per_outcome=4)
        gates[predictor] = Gate(config)
        gates[predictor].observe(*cross_fit_statistics(episodes, config, CAP))
    assert gates["time"].active and gates["time"].quality > 0.9 and gates["policy"].quality > 0.9
    assert gates["time"].beyond_time_auroc == 0.5
    assert gates["policy"].beyond_time_auroc > 0.9
    assert gates["policy"].log()["gate_auroc_beyond_time"] == gates["policy"].beyond_time_auroc


def gated(start, out, **grpo):  # noqa: F811
    recipe = learning_recipe(start, out, **{"steps": 4, "execution": "gated", "anchor_fraction": 0.25, **grpo})
    recipe.gate.min_steps, recipe.gate.patience, recipe.gate.min_per_outcome = 8, 1, 2
    return recipe


@pytest.mark.parametrize("predictor", ["policy", "proprio"])
def test_gated_grpo_cuts_predicted_failures_and_keeps_real_outcomes(start, tmp_path, predictor):  # noqa: F811
    """Step 1 runs everything (no predictor yet); once fit on the replay store and calibrated on
    anchors it scored unseen, the gate cuts non-anchors after their first chunk; a cut rollout's
    reward is the gate's prediction, below the threshold; anchors always run to their end."""
    recipe = gated(start, tmp_path)
    recipe.gate.predictor = predictor
    trainer = GRPOTrainer(recipe, progress=False)
    records, batches = [], []
    original = trainer.rewards

    def rewards(batch, scores, calibrated):
        r, real_labelled = original(batch, scores, calibrated)
        batches.append((batch, r, real_labelled, trainer.gate.threshold))
        return r, real_labelled

    trainer.rewards = rewards
    try:
        for _ in range(4):
            records.append(trainer.train_step())
    finally:
        trainer.close()
    assert records[0]["cut_rollouts"] == 0 and records[0]["predictor_fit"] == 0.0
    assert sum(r["cut_rollouts"] for r in records) > 0
    for (batch, reward, real_labelled, threshold), record in zip(batches, records):
        cut = batch.cut()
        lengths = np.array([t.length for t in batch.trajectories])
        assert not (cut & batch.anchors).any()
        assert all(not t.truncated and (t.length == EPISODE_STEPS or t.success)
                   for t, anchor in zip(batch.trajectories, batch.anchors) if anchor)
        assert (lengths[cut] == 8).all() and (reward[cut] < threshold + 1e-12).all()
        np.testing.assert_array_equal(reward[~cut], batch.outcomes[~cut])
        np.testing.assert_array_equal(real_labelled, ~cut)  # every rollout that ran to its end gave its real label
        assert record["step_real_steps"] == lengths.sum()
        assert record["step_real_steps_full"] == lengths[batch.anchors].sum()
    assert records[-1]["real_labels_used"] == sum(int((~b.cut()).sum()) for b, *_ in batches)


def test_a_cut_rollout_rewarded_as_a_failure_leaves_a_group_of_failures_without_advantage(start, tmp_path):  # noqa: F811
    """`gate.cut_reward: failure`: cut rollouts get 0 (their prediction is still logged), so a group whose
    rollouts all failed has no spread and no advantage, as in sparse GRPO; with predictions it would."""
    # 4 groups of 8 a step; a policy left as weak as it starts (lr 0), so that some groups fail throughout
    recipe = gated(start, tmp_path, grouping="init_state", lr=0.0, steps=6)
    recipe.gate.cut_reward = "failure"
    trainer = GRPOTrainer(recipe, progress=False)
    seen = []
    original = trainer.advantages

    def advantages(batch, rewards):
        result = original(batch, rewards)
        seen.append((batch, rewards, result[0]))
        return result

    trainer.advantages = advantages
    try:
        records = [trainer.train_step() for _ in range(6)]
    finally:
        trainer.close()
    assert sum(record["cut_rollouts"] for record in records) > 0
    failed_groups = 0
    for (batch, rewards, advantages), record in zip(seen, records):
        cut = batch.cut()
        np.testing.assert_array_equal(rewards[cut], 0.0)
        np.testing.assert_array_equal(rewards[~cut], batch.outcomes[~cut])
        if cut.any():
            assert record["predicted_success_cut"] == pytest.approx(batch.predicted[cut].mean())
            assert record["predicted_success_cut"] > 0  # a probability, not the reward
        for group in np.unique(batch.groups):
            members = batch.groups == group
            if not batch.outcomes[members].any() and (cut & members).any():
                failed_groups += 1
                np.testing.assert_array_equal(advantages[members], 0.0)
                spread = np.where(cut, batch.predicted, batch.outcomes)[members]
                assert spread.std() > 0  # what the prediction reward would have graded
    assert failed_groups > 0


def test_a_warm_started_gate_cuts_from_the_first_grpo_step(start, tmp_path):  # noqa: F811
    """Calibrated on an earlier run's real-labelled episodes, the gate cuts in step 1; without, it cannot."""
    train_grpo(learning_recipe(start, tmp_path / "earlier", steps=2), progress=False)
    first = {}
    for warm in (False, True):
        recipe = gated(start, tmp_path / f"warm_{warm}", steps=1)
        recipe.gate.replay, recipe.gate.warm_start = [str(tmp_path / "earlier" / "replay")], warm
        first[warm] = train_grpo(recipe, progress=False)["history"][0]
    assert first[False]["cut_rollouts"] == 0
    assert first[True]["cut_rollouts"] > 0 and first[True]["step_real_steps"] < first[False]["step_real_steps"]


def test_gated_grpo_resumes_exactly(start, tmp_path):  # noqa: F811
    whole = train_grpo(gated(start, tmp_path / "whole"), progress=False)["history"]
    train_grpo(gated(start, tmp_path / "cut", steps=2, save_every=1), progress=False)
    resumed = train_grpo(gated(start, tmp_path / "cut", save_every=1), progress=False)["history"]
    keys = ("success_rate", "cut_rollouts", "gate_threshold", "gate_active", "gate_auroc_beyond_time", "real_steps",
            "loss")
    np.testing.assert_equal([[r[k] for k in keys] for r in resumed], [[r[k] for k in keys] for r in whole])  # NaN==NaN
    assert sum(r["cut_rollouts"] for r in whole) > 0


def test_the_oracle_cut_trains_failures_outside_the_whole_quarter_on_their_first_chunk_alone(start, tmp_path):  # noqa: F811
    """`oracle_cut_steps` 8: each group of 8 keeps 2 rollouts whole, picked regardless of outcome; every
    other failure offers the loss only its first query (issued at step 0, before the cut), as a gate
    that cut exactly the failures at step 8 would leave it; successes keep all theirs."""
    recipe = learning_recipe(start, tmp_path, steps=1, grouping="init_state", oracle_cut_steps=8, anchor_fraction=0.25)
    trainer = GRPOTrainer(recipe, progress=False)
    seen = []
    original = trainer._samples

    def samples(batch, advantages):  # with the step's choice of whole rollouts (drawn per step)
        seen.append((batch, trainer._trainable_queries(batch), original(batch, advantages)))
        return seen[-1][2]

    trainer._samples = samples
    try:
        record = trainer.train_step()
    finally:
        trainer.close()
    (batch, queries, samples), = seen
    whole = queries == batch.num_queries
    failed = batch.outcomes == 0
    assert (batch.num_queries[failed] == 2).all()  # failures ran both chunks
    np.testing.assert_array_equal(queries[failed & ~whole], 1)
    for group in np.unique(batch.groups):
        members = batch.groups == group
        assert (members & whole & failed).sum() <= 2 <= (members & whole).sum()  # 2 picked, successes whole anyway
    assert (failed & ~whole).any() and (failed & whole).any()
    picked = {}
    for s in samples:
        picked.setdefault(s.rollout, []).append(s.query)
    assert record["samples"] == len(samples) and picked
    assert all(picked[k] == list(range(queries[k])) for k in picked)  # 2 queries a rollout sampled: all it offers
    assert any(failed[k] and not whole[k] for k in picked) and any(failed[k] and whole[k] for k in picked)
    assert record["real_steps"] == sum(t.length for t in batch.trajectories)  # full execution: nothing saved


def test_gated_settings_are_checked(start, tmp_path):  # noqa: F811
    with pytest.raises(ValueError, match="'gated' needs reward_mode sparse"):
        validate(gated(start, tmp_path, reward_mode="dense_calib"))
    with pytest.raises(ValueError, match="anchor_fraction < 1"):
        validate(gated(start, tmp_path, anchor_fraction=1.0))
    for oracle in ({"execution": "gated"}, {"reward_mode": "dense_calib"}, {"anchor_fraction": 1.0}):
        with pytest.raises(ValueError, match="oracle_cut_steps emulates a perfect gate"):
            validate(learning_recipe(start, tmp_path, **{"oracle_cut_steps": 8, "anchor_fraction": 0.25, **oracle}))
    recipe = gated(start, tmp_path)
    recipe.gate.replay = [str(tmp_path / "missing")]
    with pytest.raises(FileNotFoundError, match="gate.replay"):  # before anything is written
        GRPOTrainer(recipe, progress=False)
    recipe = gated(start, tmp_path)
    recipe.gate.warm_start = True
    with pytest.raises(ValueError, match="gate.warm_start calibrates on gate.replay's episodes"):
        GRPOTrainer(recipe, progress=False)
    assert not tmp_path.joinpath("checkpoints").exists()


def test_a_gated_ablation_arm_fits_its_first_predictor_on_the_wm_stage_collection():
    from pathlib import Path

    from minivla_wmrl.ablation import AblationRecipe, cell_recipe
    from minivla_wmrl.infra.config import load_recipe
    from minivla_wmrl.pipeline import Pipeline

    arms = ('ablation.arms=[{name: sparse}, {name: gated, overrides: [grpo.execution=gated, grpo.reward_mode=sparse, '
            'grpo.anchor_fraction=0.25]}]')
    recipe = load_recipe(AblationRecipe, Path("recipes/rl_cpu.yaml"), [arms, "out=runs/x"])
    Pipeline(recipe)
    assert cell_recipe(recipe, 1, 0).gate.replay == ["runs/x/wm/replay"]
    assert cell_recipe(recipe, 0, 0).gate.replay == []  # full execution: no gate, the setting stays unset
