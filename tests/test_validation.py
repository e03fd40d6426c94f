"""GRPO's guard against harm: validation states apart from training and test states, the best
checkpoint kept, an early stop when training makes the policy worse, exact resume.

The runs are PointReach (`tests/test_learning.py`'s weak policy, inline envs); a run made to get
worse has its rewards inverted (success punished): a planted fall of validation success. The
states' split on LIBERO runs on the real simulator.
"""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from minivla_wmrl.rl.init_states import TRAIN_SEED_BASE, VALIDATION_SEED_BASE, check_disjoint, training_init_states
from minivla_wmrl.train.grpo import GRPOTrainer, train_grpo
from minivla_wmrl.train.validation import ValidationConfig, ValidationTracker
from tests.test_learning import goal_for, learning_recipe, weak_policy
from world_models.progress_model import ProgressModelConfig, ProgressWorldModel


def episodes(successes: list[bool]) -> dict:
    return {("task", s, 0): bool(v) for s, v in enumerate(successes)}


def test_the_tracker_keeps_the_best_and_stops_on_a_significant_fall():
    tracker = ValidationTracker(ValidationConfig(every=1))
    start = [True] * 12 + [False] * 8
    first = tracker.update(0, episodes(start))
    assert first["val_success"] == 0.6 and tracker.best_step == 0 and not first["val_stop"]
    better = tracker.update(1, episodes([True] * 14 + [False] * 6))  # gains states 12, 13
    assert better["val_improved"] and better["val_best_step"] == 1 and better["val_gained"] == 2
    same = tracker.update(2, episodes([True] * 14 + [False] * 6))
    assert not same["val_improved"] and same["val_best_step"] == 1  # a tie keeps the earlier checkpoint
    slight = tracker.update(3, episodes([True] * 7 + [False] * 13))  # 5 lost, none gained: p = 0.0625
    assert slight["val_lost"] == 5 and slight["val_p_worse"] == pytest.approx(0.0625) and not slight["val_stop"]
    fall = tracker.update(4, episodes([True] * 6 + [False] * 14))  # 6 lost: p = 0.03125
    assert fall["val_stop"] and fall["val_best_step"] == 1 and tracker.stopped_at == 4
    restored = ValidationTracker(ValidationConfig(every=1))
    restored.load_state_dict(json.loads(json.dumps(tracker.state_dict())))  # what a checkpoint keeps
    assert restored.update(5, episodes(start)) == tracker.update(5, episodes(start))
    with pytest.raises(ValueError, match="ran other episodes than the first"):
        tracker.update(6, episodes(start[:10]))
    never = ValidationTracker(ValidationConfig(every=1, early_stop=False))
    never.update(0, episodes(start))
    assert not never.update(1, episodes([False] * 20))["val_stop"]


def test_with_accept_p_only_a_significant_gain_replaces_the_start():
    tracker = ValidationTracker(ValidationConfig(every=1, accept_p=0.05))
    tracker.update(0, episodes([True] * 4 + [False] * 16))
    noise = tracker.update(1, episodes([True] * 8 + [False] * 12))  # 4 gained, none lost: p = 0.125
    assert noise["val_p_better"] == pytest.approx(0.125) and not noise["val_improved"] and tracker.best_step == 0
    mixed = tracker.update(2, episodes([False] * 2 + [True] * 10 + [False] * 8))  # 8 gained, 2 lost: p = 0.11
    assert not mixed["val_improved"] and mixed["val_p_better"] == pytest.approx(0.109375)
    clear = tracker.update(3, episodes([True] * 10 + [False] * 10))  # 6 gained, none lost: p = 0.03125
    assert clear["val_improved"] and clear["val_best_step"] == 3 and tracker.best_success == 0.5


def test_gym_validation_seeds_are_apart_from_training_and_test_seeds():
    training = training_init_states(None, None, 64, "gym", base=TRAIN_SEED_BASE)
    validation = training_init_states(None, None, 64, "gym", base=VALIDATION_SEED_BASE)
    test = set(range(50))
    assert not set(training) & set(validation) and not (set(training) | set(validation)) & test


@pytest.mark.simulator
def test_libero_validation_states_are_apart_from_training_and_test_states(libero_env):
    published = libero_env.published_init_states()
    training = training_init_states(libero_env.sample_init_state, published, 3, libero_env.task_id)
    validation = training_init_states(libero_env.sample_init_state, published, 3, libero_env.task_id,
                                      base=VALIDATION_SEED_BASE, avoid=training)
    for state in validation:
        assert not np.any(np.all(np.abs(published - state) <= 1e-6, axis=1))
        assert not np.any(np.all(np.abs(np.stack(training) - state) <= 1e-6, axis=1))
    with pytest.raises(ValueError, match="validation init state 1 equals RL training init state 0"):
        check_disjoint(np.stack([validation[0], training[0]]), np.stack(training), libero_env.task_id,
                       names=("validation", "RL training"))


def policy_and_goal(root: Path, quantile: float):
    """The weak policy, a goal that `1 - quantile` of its sampled episodes reach, a world model."""
    policy = weak_policy()
    goal = goal_for(policy, quantile=quantile)
    policy.save_pretrained(checkpoint := root / "policy")
    world_model = root / "world_model"
    world_model.mkdir()
    ProgressWorldModel(ProgressModelConfig(image_size=32, dim=32, layers=1, dropout=0.0)).save_pretrained(world_model)
    return checkpoint, world_model, goal


@pytest.fixture(scope="module")
def easy_start(tmp_path_factory):
    """70% of the sampled episodes succeed at the start: room to fall."""
    return policy_and_goal(tmp_path_factory.mktemp("easy"), quantile=0.3)


@pytest.fixture(scope="module")
def hard_start(tmp_path_factory):
    """15% succeed at the start: room to improve (as in the learning test)."""
    return policy_and_goal(tmp_path_factory.mktemp("hard"), quantile=0.85)


def guarded(start, out, steps: int, **grpo):
    recipe = learning_recipe(start, out, steps=steps, save_every=100, **grpo)
    recipe.validation = ValidationConfig(every=1, states_per_task=8, samples_per_state=4, temperature=1.0)
    return recipe


def test_a_run_made_worse_stops_early_and_keeps_the_starting_checkpoint(easy_start, tmp_path, monkeypatch):
    rewards = GRPOTrainer.rewards

    def punish_success(self, batch, scores, calibrated):  # the planted fall: success is rewarded as failure
        return rewards(self, dataclasses.replace(batch, outcomes=1 - batch.outcomes), scores, calibrated)

    monkeypatch.setattr(GRPOTrainer, "rewards", punish_success)
    result = train_grpo(guarded(easy_start, tmp_path, steps=8), progress=False)
    history = result["history"]
    assert history[-1]["val_stop"] and len(history) < 8, [r["val_success"] for r in history]
    assert history[-1]["val_success"] < history[-1]["val_success_start"] and history[-1]["val_p_worse"] < 0.05
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["step"] == 0 and best["checkpoint"] == str(easy_start[0]) == result["checkpoint"]
    assert history[-1]["validation_episodes"] == 32 * (len(history) + 1)  # the start, then every step
    assert history[-1]["real_episodes"] == 32 * len(history)  # validation is counted apart from training
    again = train_grpo(guarded(easy_start, tmp_path, steps=8), progress=False)  # a re-run resumes the stopped run
    assert len(again["history"]) == len(history) and again["checkpoint"] == result["checkpoint"]  # and trains no more


def test_the_best_checkpoint_is_kept_and_resume_is_exact(hard_start, tmp_path):
    start = hard_start
    straight = train_grpo(guarded(start, tmp_path / "straight", steps=4), progress=False)
    history = straight["history"]
    best = json.loads((tmp_path / "straight" / "best.json").read_text())
    successes = [history[0]["val_success_start"]] + [r["val_success"] for r in history]
    assert best["val_success"] == max(successes) and best["step"] == successes.index(max(successes))
    assert straight["checkpoint"] == best["checkpoint"]  # the run's result
    if best["step"]:  # training beat the start: that step's checkpoint was saved
        assert Path(best["checkpoint"]).is_dir() and best["checkpoint"].endswith(f"step_{best['step']:07d}")
    else:
        assert best["checkpoint"] == str(start[0])
    first = guarded(start, tmp_path / "resumed", steps=2)
    first.grpo.save_every = 1
    train_grpo(first, progress=False)
    again = guarded(start, tmp_path / "resumed", steps=4)
    again.grpo.save_every = 1
    resumed = train_grpo(again, progress=False)["history"]
    keys = ("success_rate", "val_success", "val_success_start", "val_best_step", "val_gained", "val_lost",
            "validation_real_steps", "real_steps")
    assert [{k: r[k] for k in keys} for r in resumed] == [{k: r[k] for k in keys} for r in history]


def test_with_accept_p_a_run_keeps_its_start_unless_a_check_is_significantly_better(hard_start, tmp_path):
    """The same run as above with `accept_p`: the result is the start unless some check's gain over
    it is significant at that level, whatever validation success the checks read."""
    recipe = guarded(hard_start, tmp_path, steps=4)
    recipe.validation.accept_p = 0.05
    result = train_grpo(recipe, progress=False)
    history, best = result["history"], json.loads((tmp_path / "best.json").read_text())
    significant = [r["step"] for r in history if r["val_p_better"] <= 0.05]
    assert all(r["val_p_better"] == 1.0 for r in history if r["val_gained"] <= r["val_lost"])
    if not significant:
        assert best["step"] == 0 and result["checkpoint"] == str(hard_start[0])
    else:  # the best of the significant checks (ties: the earlier)
        chosen = max(significant, key=lambda s: (history[s - 1]["val_success"], -s))
        assert best["step"] == chosen and result["checkpoint"].endswith(f"step_{chosen:07d}")
    assert all(r["val_best_step"] in [0, *significant] for r in history)
