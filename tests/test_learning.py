"""GRPO learns: on PointReach it lifts a weak policy's sampled success, and shuffled rewards do not.

The other GRPO tests show that it equals itself (resume, processes); this one shows that its
updates move a policy the right way. The policy is the real tiny MiniVLA at 56 px; its action
statistics stretch dim 0 so that the VQ code it picks moves the point by visibly different
amounts. The goal line is set from the starting policy's own sampled actions so that ~15% of its
episodes reach it: a weak policy whatever the random initialisation gives.
"""

import dataclasses

import numpy as np
import pytest
import torch

from envs.point_reach import ENV_ID
from minivla_wmrl.infra.config import config_from_dict
from minivla_wmrl.policy import MiniVLA, preset
from minivla_wmrl.policy.action_tokenizer import ActionTokenizer, ActionTokenizerConfig
from minivla_wmrl.policy.normalization import ActionStatistics
from minivla_wmrl.policy.tokenizer import tiny_qwen_style_tokenizer
from minivla_wmrl.train.grpo import GRPORecipe, train_grpo
from world_models.progress_model import ProgressModelConfig, ProgressWorldModel

IMAGE = 56
EPISODE_STEPS = 16  # two 8-action chunks
INSTRUCTION = "move the red dot to the green line"


def weak_policy() -> MiniVLA:
    """One VQ token per query (one codebook: the reward is a clean function of each token), then a
    few steps of behaviour cloning on uniformly random codes, so that the policy samples action
    codes evenly, as an undertrained SFT policy does, rather than the untrained vocabulary."""
    torch.manual_seed(0)
    actions = np.random.default_rng(0).uniform(-1, 1, (200, 7))
    actions[:, 0] *= 50  # dim 0 moves the point: wide statistics make the codes' choice matter
    actions[:, 6] = actions[:, 6] > 0
    config = dataclasses.replace(preset("tiny"), image_size=IMAGE, num_action_tokens=1)
    policy = MiniVLA(config, tiny_qwen_style_tokenizer(), ActionTokenizer(ActionTokenizerConfig(num_codebooks=1)),
                     ActionStatistics.from_actions(actions, num_trajectories=4))
    optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=3e-3)
    frames = np.full((32, IMAGE, IMAGE, 3), 96, np.uint8)
    for _ in range(30):
        tokens = policy.vocab_len - 1 - torch.randint(0, config.codebook_size, (32, 1))
        logits = policy.target_logits(frames, [INSTRUCTION] * 32, tokens)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return policy.eval()


def goal_for(policy: MiniVLA, quantile: float = 0.85) -> float:
    """The goal x that `1 - quantile` of the policy's sampled two-chunk episodes reach (speed 1/16:
    x after 16 steps is the mean of the clipped dim-0 actions)."""
    rng = np.random.default_rng(1)
    frames = np.full((256, IMAGE, IMAGE, 3), 96, np.uint8)
    with torch.no_grad():
        query = policy.generate(frames, [INSTRUCTION] * 256, temperature=1.0, uniforms=rng.random((256, 1)))
    chunk_means = np.clip(query.actions[:, :, 0], -1, 1).mean(1)
    episodes = (chunk_means[:128] + chunk_means[128:]) / 2
    return float(np.quantile(episodes, quantile))


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    root = tmp_path_factory.mktemp("learning")
    policy = weak_policy()
    goal = goal_for(policy)
    policy.save_pretrained(checkpoint := root / "policy")
    world_model = root / "world_model"  # scores for the log only: sparse rewards are the real outcomes
    world_model.mkdir()
    ProgressWorldModel(ProgressModelConfig(image_size=32, dim=32, layers=1, dropout=0.0)).save_pretrained(world_model)
    return checkpoint, world_model, goal


def learning_recipe(start, out, **grpo) -> GRPORecipe:
    checkpoint, world_model, goal = start
    return config_from_dict(GRPORecipe, {
        "out": str(out),
        "policy": {"checkpoint": str(checkpoint), "lora": False, "freeze_vision": True},
        "env": {"suite": "gym", "tasks": [ENV_ID], "envs_per_task": 8, "backend": "inline", "train_init_states": 16,
                "gym": {"instruction": INSTRUCTION, "resolution": IMAGE,
                        "make_kwargs": {"goal": goal, "speed": 1 / EPISODE_STEPS}}},
        "world_model": {"name": "progress", "options": {"path": str(world_model)}},
        "grpo": {"steps": 10, "rollouts_per_task": 32, "init_states_per_step": 4, "max_real_steps": EPISODE_STEPS,
                 "reward_mode": "sparse", "lr": 6e-3, "inner_epochs": 2, "minibatch_size": 32,
                 "queries_per_rollout": 2, "wm_cotrain": False, "save_every": 100, **grpo},
    }, "learning test recipe")


def test_grpo_lifts_a_weak_policy_and_shuffled_rewards_do_not(start, tmp_path):
    learned = [r["success_rate"] for r in
               train_grpo(learning_recipe(start, tmp_path / "sparse"), progress=False)["history"]]
    shuffled = [r["success_rate"] for r in
                train_grpo(learning_recipe(start, tmp_path / "shuffled", shuffle_rewards=True),
                           progress=False)["history"]]
    print("sampled success per step: sparse", learned, "shuffled", shuffled)
    assert learned[0] <= 0.3 and shuffled[0] <= 0.3, (learned, shuffled)  # a weak start, 32 sampled episodes a step
    assert np.mean(learned[-2:]) >= 0.7, learned  # 64 sampled episodes over the last two steps
    assert np.mean(shuffled[-2:]) < 0.5, shuffled


def test_truncated_execution_runs_on_a_gymnasium_env(start, tmp_path):
    """WMRL with truncated execution on the gymnasium path: 8 anchors of 32 run the whole 16 steps
    (or to success), the rest stop after one 8-action chunk unless they succeed first."""
    recipe = learning_recipe(start, tmp_path, steps=2, reward_mode="dense_calib", execution="truncated",
                             anchor_fraction=0.25, wm_horizon=8, wm_reduction="success")
    recipe.debias.min_pairs = 8
    history = train_grpo(recipe, progress=False)["history"]
    for r in history:
        assert r["step_real_episodes"] == 32 and r["anchor_fraction"] == 0.25
        assert r["step_real_steps_full"] <= 8 * EPISODE_STEPS and r["step_real_steps_horizon"] <= 24 * 8
        assert r["step_truncated_episodes"] * 8 <= r["step_real_steps_horizon"]
        assert r["step_real_steps"] == r["step_real_steps_full"] + r["step_real_steps_horizon"]
    assert history[-1]["real_steps"] == sum(r["step_real_steps"] for r in history)
    assert history[-1]["truncated_episodes"] > 0 and history[-1]["samples"] > 0


def test_activation_checkpointing_and_static_decoding_leave_a_grpo_run_unchanged(start, tmp_path):
    """The same two steps with the update's activations recomputed, and with the rollouts decoded on a
    static KV cache: the same losses and successes."""
    runs = []
    for name, setting, value in (("plain", "activation_checkpointing", False),
                                 ("recomputed", "activation_checkpointing", True), ("static", "decoding", "static")):
        recipe = learning_recipe(start, tmp_path / name, steps=2)
        setattr(recipe.policy, setting, value)
        runs.append(train_grpo(recipe, progress=False)["history"])
    keys = ("success_rate", "loss", "entropy", "approx_kl", "clip_high", "grad_norm")
    for plain, *others in zip(*runs):
        for other in others:
            for key in keys:
                assert other.get(key) == pytest.approx(plain.get(key), rel=1e-5, abs=1e-7), key
