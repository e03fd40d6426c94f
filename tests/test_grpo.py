"""WMRL GRPO: every reward mode, exact resume and bad input on PointReach (the learning test's
fake env, inline: `make test-fast`); truncated execution's accounting, the simulator's own step
counter and two processes on the real LIBERO simulator."""

import functools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from envs.libero_env import LiberoEnv
from envs.point_reach import ENV_ID
from envs.vector_env import VectorEnv
from minivla_wmrl.data.replay import read_replay
from minivla_wmrl.infra.config import config_from_dict
from minivla_wmrl.train.grpo import REWARD_MODES, GRPORecipe, GRPOTrainer, train_grpo
from tests.conftest import TASK0
from tests.test_learning import IMAGE, INSTRUCTION, goal_for, weak_policy
from tests.tiny_policy import make_policy
from world_models.progress_model import ProgressModelConfig, ProgressWorldModel

EPISODE_STEPS = 16


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    """PointReach's weak policy (samples reach the goal ~15% of the time) and a fresh world model."""
    root = tmp_path_factory.mktemp("grpo_point_reach")
    policy = weak_policy()
    goal = goal_for(policy)
    policy.save_pretrained(root / "policy")
    torch.manual_seed(0)
    (root / "world_model").mkdir()
    ProgressWorldModel(ProgressModelConfig(image_size=32, dim=32, layers=1, dropout=0.0)).save_pretrained(
        root / "world_model")
    return root / "policy", root / "world_model", goal


def recipe(start, out, **grpo) -> GRPORecipe:
    """Two GRPO steps of one group of 8 PointReach rollouts (inline envs: no simulator)."""
    policy, world_model, goal = start
    return config_from_dict(GRPORecipe, {
        "out": str(out),
        "policy": {"checkpoint": str(policy), "lora": True, "lora_r": 4, "lora_alpha": 8},
        "env": {"suite": "gym", "tasks": [ENV_ID], "envs_per_task": 4, "backend": "inline", "train_init_states": 8,
                "gym": {"instruction": INSTRUCTION, "resolution": IMAGE,
                        "make_kwargs": {"goal": goal, "speed": 1 / EPISODE_STEPS}}},
        "world_model": {"name": "progress", "options": {"path": str(world_model)},
                        "train": {"batch_size": 2, "lr": 1e-3}},
        "debias": {"min_pairs": 4, "refit_every": 2},
        "denoise": {"warmup": 1},
        "grpo": {"steps": 2, "rollouts_per_task": 8, "init_states_per_step": 2, "max_real_steps": EPISODE_STEPS,
                 "minibatch_size": 4, "queries_per_rollout": 2, "inner_epochs": 2, "wm_update_steps": 1,
                 "save_every": 1, **grpo},
    }, "test recipe")


@pytest.mark.parametrize("mode", REWARD_MODES)
def test_two_steps_in_every_reward_mode(start, tmp_path, mode):
    # dense_calib: a calibration map fitted to 8 pairs is flat; the anchors' "mix" reward keeps their outcome in
    extra = {"dense_calib": {"kl_coef": 0.04, "anchor_reward": "mix"}, "sparse_scarce": {"anchor_fraction": 0.5}}
    result = train_grpo(recipe(start, tmp_path, reward_mode=mode, **extra.get(mode, {})), progress=False)
    history = result["history"]
    assert [r["step"] for r in history] == [1, 2]
    last = history[-1]
    replay = read_replay([tmp_path / "replay"])  # every rollout ran to its end: all are in the replay store
    assert last["real_episodes"] == len(replay) == 16 and last["real_steps"] == sum(t.length for t in replay)
    assert last["success_rate"] == np.mean([t.success for t in replay[8:]])  # the step's real outcomes
    assert all(t.length == EPISODE_STEPS or t.success for t in replay)  # a success ends its episode early
    expected_anchor_fraction = {"sparse": 1.0, "dense_raw": 1.0, "dense_calib": 1.0, "sparse_scarce": 0.5}[mode]
    assert last["anchor_fraction"] == expected_anchor_fraction
    # the anchors of both steps; dense_raw uses no real label
    assert last["real_labels_used"] == (0 if mode == "dense_raw" else expected_anchor_fraction * 16)
    assert all(last[key] > 0 for key in ("time_rollout", "time_scoring", "time_update"))
    debiaser = result["trainer"].debiaser
    assert last["calibrated"] == float(mode == "dense_calib" and debiaser.calibrated)
    assert last["debias_fit_failed"] == float(debiaser.fit_failed)
    if mode != "dense_calib":
        assert last["anchor_weight"] == 1.0 and last["denoise_active"] == 0.0 and np.isnan(last["bias_reduction"])
        assert "calibration_auroc" not in last
    else:
        assert last["denoise_active"] == 0.0  # every rollout an anchor: the weight cannot separate anything
        assert debiaser.fits >= 1 and len(debiaser.pairs) == 16 and 0 <= last["calibration_auroc"] <= 1
    # rewards that vary within the group: every mode updates the policy, on 2 queries of each rollout
    assert last["frac_reward_zero_std"] == 0.0
    assert last["samples"] == (8 if mode == "sparse_scarce" else 16)
    assert 0 <= last["clip_low"] <= 1 and 0 <= last["clip_high"] <= 1
    assert np.isfinite(last["loss"]) and last["approx_kl"] > 0  # the second epoch's policy moved
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    checkpoint = tmp_path / "checkpoints" / "step_0000002"
    assert (checkpoint / "model.safetensors").exists() and (checkpoint / "world_model" / "config.json").exists()


def uncalibrated(start, out, **grpo) -> GRPORecipe:
    """dense_calib before its calibration map is fitted (the identity: rewards are the world model's
    scores, which vary); the debiaser only collects pairs, and its state must still resume exactly."""
    r = recipe(start, out, reward_mode="dense_calib", **grpo)
    r.debias.min_pairs = 100
    return r


def assert_same_run(full: dict, resumed: dict) -> None:
    a, b = full["history"][-1], resumed["history"][-1]
    assert a["samples"] > 0  # the resumed step updates the policy
    for key in ("success_rate", "wm_score_mean", "loss", "approx_kl", "wm_loss", "real_episodes", "samples"):
        assert a[key] == pytest.approx(b[key], rel=1e-6, nan_ok=True), key
    for (name, p), q in zip(full["trainer"].policy.named_parameters(), resumed["trainer"].policy.parameters()):
        assert torch.allclose(p, q, atol=1e-6), name
    assert full["trainer"].debiaser.state_dict() == resumed["trainer"].debiaser.state_dict()


def test_interrupted_run_resumes_with_identical_results(start, tmp_path):
    full = train_grpo(uncalibrated(start, tmp_path / "full"), progress=False)
    train_grpo(uncalibrated(start, tmp_path / "cut", steps=1), progress=False)
    assert_same_run(full, train_grpo(uncalibrated(start, tmp_path / "cut"), progress=False))


def test_faults_mid_checkpoint_and_mid_metrics_line_resume_exactly(start, tmp_path, monkeypatch):
    """Interrupted while writing step 2's training state, then halfway through step 3's metrics line:
    each resume continues from the last complete checkpoint and ends where the uninterrupted run ends."""
    from minivla_wmrl.infra import run_checkpoint as checkpoint
    from minivla_wmrl.infra import run_log

    full = train_grpo(uncalibrated(start, tmp_path / "full", steps=3), progress=False)
    write_state, write_line = checkpoint.write_training_state, run_log.MetricsLog.write

    def state_fault(directory, state):
        if state["step"] == 2:
            raise KeyboardInterrupt
        write_state(directory, state)

    def line_fault(self, record):
        if record["step"] == 3:
            self.file.write(json.dumps(record)[:30])
            raise KeyboardInterrupt
        write_line(self, record)

    cut = uncalibrated(start, tmp_path / "cut", steps=3)
    for target, fault in ((checkpoint, ("write_training_state", state_fault)),
                          (run_log.MetricsLog, ("write", line_fault))):
        monkeypatch.setattr(target, *fault)
        with pytest.raises(KeyboardInterrupt):
            train_grpo(cut, progress=False)
        monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "cut" / "checkpoints").iterdir()) == ["step_0000001", "step_0000002"]
    resumed = train_grpo(cut, progress=False)
    assert [r["step"] for r in resumed["history"]] == [1, 2, 3]
    assert_same_run(full, resumed)
    other = uncalibrated(start, tmp_path / "cut", steps=4, rollouts_per_task=16)
    with pytest.raises(ValueError, match="grpo.rollouts_per_task: 8 → 16"):
        train_grpo(other, progress=False)


def test_real_step_budget_ends_the_run_at_the_step_that_reaches_it(start, tmp_path):
    # 8 rollouts of at most 16 steps: at most 128 real steps per GRPO step; a budget of 150 ends the run
    # after the step at which the count reaches it (step 2, unless successes cut enough episodes short)
    budget = recipe(start, tmp_path, steps=5, real_step_budget=150, save_every=5)
    history = train_grpo(budget, progress=False)["history"]
    counts = [r["real_steps"] for r in history]
    assert 2 <= len(counts) < 5 and counts[-1] >= 150 > counts[-2]
    last = f"step_{len(counts):07d}"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [last]  # saved where it stopped
    again = train_grpo(budget, progress=False)  # a re-run resumes, finds the budget spent, does nothing
    assert [r["step"] for r in again["history"]] == list(range(1, len(counts) + 1))
    with pytest.raises(ValueError, match="real_step_budget: -1 is out of range; expected >= 0"):
        train_grpo(recipe(start, tmp_path / "bad", real_step_budget=-1), progress=False)


def nan_world_model(frames, instructions):
    return np.full(frames.shape[:2], np.nan), np.full(len(frames), np.nan)


def test_bad_settings_and_a_nan_world_model_are_refused(start, tmp_path):
    with pytest.raises(ValueError, match="reward_mode: 'dense' is not one of"):
        train_grpo(recipe(start, tmp_path / "a", reward_mode="dense"), progress=False)
    for fraction in (0.0, 1.5):
        with pytest.raises(ValueError, match="anchor_fraction: .* is out of range; expected > 0 and <= 1"):
            train_grpo(recipe(start, tmp_path / "b", anchor_fraction=fraction), progress=False)
    with pytest.raises(ValueError, match="groups of 1 rollout"):
        train_grpo(recipe(start, tmp_path / "c", grouping="init_state", rollouts_per_task=2),
                   progress=False)
    assert not any((tmp_path / d).exists() for d in "abc")
    bad = recipe(start, tmp_path / "d", reward_mode="dense_calib")
    bad.world_model.name, bad.world_model.options = "callable", {"fn": nan_world_model}
    with pytest.raises(ValueError, match="NaN"):
        train_grpo(bad, progress=False)
    assert (tmp_path / "d" / "metrics.jsonl").read_text() == ""
    assert not (tmp_path / "d" / "checkpoints").exists()


@pytest.fixture(scope="module")
def envs():
    envs = VectorEnv([functools.partial(LiberoEnv, *TASK0, cameras=("agentview",), max_steps=EPISODE_STEPS)] * 2)
    yield envs
    envs.close()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpo_start")
    make_policy(seed=13).save_pretrained(policy := root / "policy")
    torch.manual_seed(0)
    world_model = root / "world_model"
    world_model.mkdir()
    ProgressWorldModel(ProgressModelConfig(image_size=32, dim=32, layers=1, dropout=0.0)).save_pretrained(world_model)
    return policy, world_model


def libero_recipe(checkpoints, out, **grpo) -> GRPORecipe:
    """LIBERO task 0 with a random tiny policy (it never succeeds: every episode runs to the cap)."""
    policy, world_model = checkpoints
    return config_from_dict(GRPORecipe, {
        "out": str(out),
        "policy": {"checkpoint": str(policy), "lora": True, "lora_r": 4, "lora_alpha": 8},
        "env": {"train_init_states": 3},
        "world_model": {"name": "progress", "options": {"path": str(world_model)},
                        "train": {"batch_size": 2, "lr": 1e-3}},
        "debias": {"min_pairs": 4, "refit_every": 2},
        "denoise": {"warmup": 1},
        "grpo": {"steps": 2, "rollouts_per_task": 4, "init_states_per_step": 2, "minibatch_size": 4,
                 "queries_per_rollout": 2, "inner_epochs": 2, "wm_update_steps": 1, "save_every": 1, **grpo},
    }, "test recipe")


@pytest.mark.simulator
def test_two_process_grpo_matches_one_process(checkpoints, tmp_path):
    """Under torchrun each process runs half the rollouts; gathered outcomes and summed gradients
    give the single-process run's parameters and metrics, with a full copy per process and with
    the policy sharded (FSDP). Minibatches of one sample: in each, one process holds no sample. The
    vision backbone trains, so the KL term reads a separate reference model (sharded too under FSDP)."""
    from safetensors.torch import load_file

    policy, _ = checkpoints
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    weights, logs = {}, {}
    for name, processes, fsdp in (("one", 1, False), ("ddp", 2, False), ("fsdp", 2, True)):
        out = tmp_path / name
        path = tmp_path / f"{name}.yaml"
        path.write_text(json.dumps({
            "out": str(out),
            "policy": {"checkpoint": str(policy), "lora": True, "lora_r": 4, "lora_alpha": 8, "freeze_vision": False,
                       "fsdp": fsdp},
            "env": {"suite": "libero_90", "tasks": ["0"], "envs_per_task": 1, "train_init_states": 3},
            # a scorer whose value does not depend on batch composition: an untrained network's
            # near-constant scores would make z-scored advantages amplify float noise
            "world_model": {"name": "callable", "options": {"fn": "tests.test_world_model:progress_by_brightness"}},
            "debias": {"min_pairs": 4, "refit_every": 2},
            "grpo": {"steps": 2, "rollouts_per_task": 4, "init_states_per_step": 2, "max_real_steps": EPISODE_STEPS,
                     "minibatch_size": 1, "queries_per_rollout": 2, "inner_epochs": 2, "wm_cotrain": False,
                     "reward_mode": "dense_calib", "kl_coef": 0.04, "save_every": 2}}))
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                        str(processes), "-m", "minivla_wmrl.cli", "grpo", str(path)], check=True, env=env,
                       capture_output=True)
        weights[name] = load_file(out / "checkpoints" / "step_0000002" / "model.safetensors")
        logs[name] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert logs["one"][-1]["samples"] > 0  # an update happened
    for name in ("ddp", "fsdp"):
        for key in ("real_episodes", "real_steps", "samples", "rollouts", "success_rate"):
            assert [r[key] for r in logs[name]] == [r[key] for r in logs["one"]], f"{name}: {key}"
        np.testing.assert_allclose([r["wm_score_mean"] for r in logs[name]], [r["wm_score_mean"] for r in logs["one"]],
                                   rtol=1e-6)
        for key in ("loss", "approx_kl", "clip_low", "clip_high", "grad_norm"):  # token means over both processes
            np.testing.assert_allclose([r[key] for r in logs[name]], [r[key] for r in logs["one"]],
                                       rtol=1e-3, atol=1e-7, err_msg=f"{name}: {key}")
        assert weights[name].keys() == weights["one"].keys()
        for key, tensor in weights["one"].items():
            torch.testing.assert_close(weights[name][key], tensor, atol=1e-5, rtol=1e-4, msg=f"{name}: {key}")


class CountingEnvs:
    """The fixture's envs, counting the env steps they execute (the accounting's ground truth)."""

    def __init__(self, envs):
        self.envs, self.executed = envs, 0

    def __getattr__(self, name):
        return getattr(self.envs, name)

    def step(self, actions):
        results = self.envs.step(actions)
        self.executed += sum(r.steps for r in results if r is not None)
        return results


def truncated(checkpoints, out, **grpo) -> GRPORecipe:
    """2 groups of 2 rollouts, one anchor each run to the 16-step cap, the other cut after 8 steps."""
    r = libero_recipe(checkpoints, out, reward_mode="dense_calib", execution="truncated", anchor_fraction=0.5,
               grouping="init_state", max_real_steps=EPISODE_STEPS, wm_horizon=8, wm_cotrain=False, **grpo)
    r.world_model.name, r.world_model.options = "callable", {"fn": "tests.test_world_model:progress_by_brightness"}
    return r


@pytest.mark.simulator
def test_truncated_execution_runs_anchors_to_the_cap_and_cuts_the_rest(envs, checkpoints, tmp_path):
    from minivla_wmrl.data.trajectories import rollout_trajectories

    counting = CountingEnvs(envs)
    trainer = GRPOTrainer(truncated(checkpoints, tmp_path), envs=counting, progress=False)
    batch = trainer.rollouts()
    for group in np.unique(batch.groups):  # anchors were chosen per group before anything ran
        assert batch.anchors[batch.groups == group].sum() == 1
    for t, anchor in zip(batch.trajectories, batch.anchors):
        assert (t.length, t.truncated, t.spec.horizon) == ((EPISODE_STEPS, False, None) if anchor else (8, True, 8))
    assert not batch.early.any()  # a random policy: nothing ends within the horizon
    assert trainer.counters["real_steps"] == counting.executed == 2 * EPISODE_STEPS + 2 * 8
    assert trainer.counters["real_steps_full"] == 2 * EPISODE_STEPS and trainer.counters["real_steps_horizon"] == 16
    assert trainer.counters["truncated_episodes"] == 2

    # calibration pairs score the anchors' prefix of the horizon, not their whole episode
    prefix = trainer.world_model_inputs(batch, 8)
    scores = trainer.score(batch, prefix)
    whole = trainer.score(batch, trainer.world_model_inputs(batch))
    a = batch.anchors
    assert not np.allclose(scores[a], whole[a]) and np.allclose(scores[~a], whole[~a])
    for k in np.flatnonzero(a):  # the anchor's prefix is what its cut sibling would have shown
        assert len(prefix[k].frames) == len(rollout_trajectories([batch.trajectories[k]], None)[0].frames) - 1
    trainer.corrections(batch, scores)
    assert [p[0] for p in trainer.debiaser.pairs] == pytest.approx(list(scores[a]))

    # what ran to its end is rewarded with its real outcome, never its prefix's score: the anchors, and a
    # rollout that ended within the horizon; only cut rollouts get the world model's prediction
    batch.early = ~a & (np.arange(len(a)) == np.flatnonzero(~a)[0])
    batch.outcomes = np.where(a, [1.0, 0.0, 1.0, 0.0], 0.0) + batch.early
    calibrated, _ = trainer.corrections(batch, scores)
    rewards, real_labelled = trainer.rewards(batch, scores, calibrated)
    _, log = trainer.advantages(batch, rewards)
    known = a | batch.early
    assert np.array_equal(rewards[known], batch.outcomes[known]) and np.array_equal(real_labelled, known)
    assert np.allclose(rewards[~known], trainer.debiaser(scores[~known]))
    assert log["denoise_active"] == float(trainer.weighter.active)
    trainer.close()


@pytest.mark.simulator
def test_truncated_run_logs_its_accounting_and_resumes_exactly(envs, checkpoints, tmp_path):
    counting = CountingEnvs(envs)
    full = train_grpo(truncated(checkpoints, tmp_path / "full"), envs=counting, progress=False)
    assert full["history"][-1]["real_steps"] == counting.executed == 2 * 48
    assert len(read_replay([tmp_path / "full" / "replay"])) == 2 * 2  # the anchors only: cut rollouts have no outcome
    for r in full["history"]:
        assert (r["step_real_steps"], r["step_real_steps_full"], r["step_real_steps_horizon"],
                r["step_truncated_episodes"], r["cut_rollouts"]) == (48, 32, 16, 2, 2)
        assert r["success_rate"] == 0.0 and np.isfinite(r["predicted_success_cut"])  # the anchors' real outcomes
    train_grpo(truncated(checkpoints, tmp_path / "cut", steps=1), envs=envs, progress=False)
    resumed = train_grpo(truncated(checkpoints, tmp_path / "cut"), envs=envs, progress=False)
    a, b = full["history"][-1], resumed["history"][-1]
    assert a["samples"] > 0
    for key in ("wm_score_mean", "loss", "approx_kl", "real_steps", "real_steps_horizon", "samples"):
        assert a[key] == pytest.approx(b[key], rel=1e-6, nan_ok=True), key
    for (name, p), q in zip(full["trainer"].policy.named_parameters(), resumed["trainer"].policy.parameters()):
        assert torch.allclose(p, q, atol=1e-6), name
    assert full["trainer"].debiaser.state_dict() == resumed["trainer"].debiaser.state_dict()


@pytest.mark.simulator
def test_sim_steps_count_every_physics_step_the_simulator_ran(checkpoints, tmp_path, monkeypatch):
    """A counting wrapper on robosuite's own step sees the wait steps of every reset too."""
    import robosuite.environments.base

    from envs.vector_env import InlineEnvs

    calls = []
    step = robosuite.environments.base.MujocoEnv.step
    monkeypatch.setattr(robosuite.environments.base.MujocoEnv, "step",
                        lambda self, action: calls.append(1) or step(self, action))
    envs = InlineEnvs([functools.partial(LiberoEnv, *TASK0, cameras=("agentview",), max_steps=EPISODE_STEPS)] * 2)
    try:
        trainer = GRPOTrainer(truncated(checkpoints, tmp_path), envs=envs, progress=False)
        calls.clear()  # building the envs ran the simulator too; count what the step does
        trainer.rollouts()
    finally:
        envs.close()
    assert trainer.counters["sim_steps"] == len(calls) == 48 + 4 * 10  # 4 resets of 10 wait steps each
    assert trainer.counters["real_steps"] == 48


@pytest.mark.simulator
def test_truncated_settings_are_checked(envs, checkpoints, tmp_path):
    for extra, message in (({"reward_mode": "sparse"}, "needs reward_mode dense_calib"),
                           ({"anchor_fraction": 1.0}, "anchor_fraction < 1"),
                           ({"wm_horizon": EPISODE_STEPS}, "wm_horizon must lie in \\[1, max_real_steps 16\\)"),
                           ({"execution": "partial"},
                            "execution: 'partial' is not one of \\['full', 'truncated', 'gated'\\]")):
        bad = truncated(checkpoints, tmp_path / "bad")
        for key, value in extra.items():
            setattr(bad.grpo, key, value)
        with pytest.raises(ValueError, match=message):
            train_grpo(bad, envs=envs, progress=False)
    assert not (tmp_path / "bad").exists()
