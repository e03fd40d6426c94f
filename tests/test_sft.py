"""Scripted demos written as LIBERO hdf5, the demo dataset, and SFT (learning, resume, recipes)."""

import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch

from minivla_wmrl.data.chunks import episode_chunks
from minivla_wmrl.data.dataset import DemoDataset, read_episodes
from minivla_wmrl.infra.config import config_from_dict, load_recipe
from minivla_wmrl.policy.normalization import ActionStatistics
from minivla_wmrl.train.sft import SFTRecipe, train_sft


@pytest.mark.simulator
def test_generated_file_has_the_libero_layout(demos):
    with h5py.File(demos) as f:
        data = f["data"]
        assert {"env_name", "problem_info", "macros_image_convention", "bddl_file_name", "bddl_file_content",
                "env_args", "num_demos", "total"} <= set(data.attrs)
        assert json.loads(data.attrs["problem_info"])["language_instruction"] == "close the top drawer of the cabinet"
        assert data.attrs["num_demos"] == 3 and data.attrs["macros_image_convention"] == "opengl"
        total = 0
        for i in range(3):
            demo = data[f"demo_{i}"]
            steps = demo.attrs["num_samples"]
            total += steps
            assert {"model_file", "init_state"} <= set(demo.attrs) and "<mujoco" in demo.attrs["model_file"]
            assert demo["actions"].shape == (steps, 7)
            for key, shape in {"agentview_rgb": (128, 128, 3), "eye_in_hand_rgb": (128, 128, 3), "gripper_states": (2,),
                               "joint_states": (7,), "ee_states": (6,), "ee_pos": (3,), "ee_ori": (3,)}.items():
                assert demo[f"obs/{key}"].shape == (steps, *shape), key
            assert demo["obs/agentview_rgb"].dtype == np.uint8
            assert demo["robot_states"].shape == (steps, 9) and demo["states"].shape[0] == steps
            np.testing.assert_array_equal(demo.attrs["init_state"], demo["states"][0])
            for key in ("rewards", "dones"):
                assert demo[key][-1] == 1 and demo[key][:-1].sum() == 0
        assert data.attrs["total"] == total


@pytest.mark.simulator
def test_dataset_items_are_upright_resized_and_padded(demos):
    episodes = read_episodes([demos])
    stats = ActionStatistics.from_actions(np.concatenate([e.actions for e in episodes]), num_trajectories=3)
    native = DemoDataset(episodes, stats, image_size=128)
    item = native[0]
    with h5py.File(demos) as f:
        np.testing.assert_array_equal(item["image"], f["data/demo_0/obs/agentview_rgb"][0][::-1])
    assert item["instruction"] == "close the top drawer of the cabinet"
    last = len(episodes[0].actions) - 1
    np.testing.assert_allclose(native[last]["chunk"], episode_chunks(stats.normalize(episodes[0].actions))[last])
    assert np.all(native[last]["chunk"][1:, :6] == 0)
    resized = DemoDataset(episodes, stats, image_size=224)[0]["image"]
    assert resized.shape == (224, 224, 3) and resized.dtype == np.uint8
    two = DemoDataset(episodes, stats, image_size=128, wrist_key="eye_in_hand_rgb")[0]["image"]
    assert two.shape == (2, 128, 128, 3)


def make_recipe(demos, out, **sft) -> SFTRecipe:
    return config_from_dict(SFTRecipe, {
        "out": str(out), "policy": {"preset": "tiny"}, "data": {"paths": [str(demos)], "val_fraction": 0.34},
        "vq": {"train": {"steps": 100, "batch_size": 256}},
        "sft": {"batch_size": 8, "lr": 3e-3, "log_every": 1, "eval_every": 1000, "save_every": 1000} | sft},
        "test recipe")


@pytest.mark.simulator
def test_sft_lowers_the_loss_and_raises_action_token_accuracy(demos, tmp_path):
    result = train_sft(make_recipe(demos, tmp_path / "run", steps=80), progress=False)
    history = result["history"]
    first, last = np.mean([h["loss"] for h in history[:5]]), np.mean([h["loss"] for h in history[-5:]])
    assert last < 0.6 * first
    assert np.mean([h["action_accuracy"] for h in history[-10:]]) > 0.15
    assert "val_action_accuracy" in history[-1]


@pytest.mark.simulator
def test_interrupted_sft_resumes_with_the_same_loss_curve(demos, tmp_path):
    straight = train_sft(make_recipe(demos, tmp_path / "a", steps=6), progress=False)["history"]
    train_sft(make_recipe(demos, tmp_path / "b", steps=3, save_every=3), progress=False)
    resumed = train_sft(make_recipe(demos, tmp_path / "b", steps=6, save_every=3), progress=False)["history"]
    assert [h["step"] for h in resumed] == [4, 5, 6]
    np.testing.assert_allclose([h["loss"] for h in resumed], [h["loss"] for h in straight[3:]], rtol=1e-5)
    logged = [json.loads(line)["step"] for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert logged == [1, 2, 3, 4, 5, 6]
    again = train_sft(make_recipe(demos, tmp_path / "b", steps=6, save_every=3), progress=False)  # finished: a no-op
    assert again["history"] == [] and again["last"]["step"] == 6  # once a KeyError: 'step'


def test_recipe_errors_name_the_key(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("sft:\n  steps: 10\n  learning_rate: 0.1\n")
    with pytest.raises(ValueError, match=r"recipe.yaml.sft: unknown key\(s\) \['learning_rate'\]"):
        load_recipe(SFTRecipe, path)
    path.write_text("sft:\n  steps: ten\n")
    with pytest.raises(ValueError, match="recipe.yaml.sft.steps: expected int, got 'ten'"):
        load_recipe(SFTRecipe, path)
    path.write_text("out: x\n")
    assert load_recipe(SFTRecipe, path, ["sft.lr=1e-4", "policy.lora=true"]).sft.lr == 1e-4


@pytest.mark.simulator
def test_two_process_ddp_and_fsdp_match_one_process_with_the_same_global_batch(demos, tmp_path):
    """DDP, and FSDP interrupted after 2 steps and resumed (its checkpoints hold full tensors), reach
    the single-process parameters and losses; so does FSDP resuming the single process's checkpoint."""
    import shutil

    from safetensors.torch import load_file

    from minivla_wmrl.train.vq import VQTrainConfig, run_vq

    vq = run_vq([str(demos)], tmp_path / "vq", VQTrainConfig(steps=50, batch_size=256))["action_tokenizer"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def run(name: str, processes: int, steps: int, **policy) -> None:
        recipe = tmp_path / f"{name}.yaml"
        recipe.write_text(json.dumps({
            "out": str(tmp_path / name), "policy": {"preset": "tiny", **policy}, "vq": {"path": vq},
            "data": {"paths": [str(demos)], "val_fraction": 0.34},
            "sft": {"steps": steps, "batch_size": 8, "lr": 3e-3, "log_every": 1, "eval_every": 2, "save_every": 2}}))
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                        str(processes), "-m", "minivla_wmrl.cli", "sft", str(recipe)],
                       check=True, env=env, capture_output=True)

    run("one", 1, 4)
    run("ddp", 2, 4)
    run("fsdp", 2, 2, fsdp=True)
    run("fsdp", 2, 4, fsdp=True)
    shutil.copytree(tmp_path / "one", tmp_path / "mixed")
    shutil.rmtree(tmp_path / "mixed" / "checkpoints" / "step_0000004")
    run("mixed", 2, 4, fsdp=True)
    final = {name: load_file(tmp_path / name / "checkpoints" / "step_0000004" / "model.safetensors")
             for name in ("one", "ddp", "fsdp", "mixed")}
    logs = {name: [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
            for name in final}
    assert logs["one"][-1]["loss"] < logs["one"][0]["loss"]  # it trained
    for name in ("ddp", "fsdp", "mixed"):
        assert final[name].keys() == final["one"].keys()
        # four Adam steps at lr 3e-3 move a weight by up to ~1e-2; the all-reduce's summation order changes
        # gradients in their last bits, which Adam's normalisation can lift to ~2e-5 on an element whose
        # gradient is near zero (2026-12-06's machine: one element of 452k, DDP and FSDP alike)
        for key, tensor in final["one"].items():
            torch.testing.assert_close(final[name][key], tensor, atol=1e-4, rtol=1e-4, msg=f"{name}: {key}")
        assert [r["step"] for r in logs[name]] == [1, 2, 3, 4]
        # rank 0 logs the mean over processes: the global batch's loss; validation runs on rank 0
        for key in ("loss", "grad_norm", "val_loss"):
            np.testing.assert_allclose([r[key] for r in logs[name] if key in r],
                                       [r[key] for r in logs["one"] if key in r],
                                       rtol=1e-4, err_msg=f"{name}: {key}")


# Runs SFT in a child process and SIGKILLs it at a chosen point: while the checkpoint of step `at` is
# being written (after the weights, before the training state), or halfway through the metrics line
# of step `at`.
KILLED_SFT = """
import json, os, signal, sys
from minivla_wmrl.infra import run_checkpoint as checkpoint, run_log
from minivla_wmrl.infra.config import config_from_dict
from minivla_wmrl.train.sft import SFTRecipe, train_sft

recipe, fault, at = config_from_dict(SFTRecipe, json.loads(sys.argv[1]), "driver"), sys.argv[2], int(sys.argv[3])
die = lambda: os.kill(os.getpid(), signal.SIGKILL)
write_state, write_line = checkpoint.write_training_state, run_log.MetricsLog.write
if fault == "checkpoint":
    checkpoint.write_training_state = lambda d, s: die() if s["step"] == at else write_state(d, s)
else:
    def write(self, record):
        if record["step"] == at:
            self.file.write(json.dumps(record)[:20])
            self.file.flush()
            die()
        write_line(self, record)
    run_log.MetricsLog.write = write
train_sft(recipe, progress=False)
"""


@pytest.mark.simulator
def test_sft_killed_at_random_points_resumes_to_the_uninterrupted_run(demos, tmp_path):
    """Fault injection: SIGKILL mid-checkpoint and mid-metrics-line at seeded random steps (twice in one
    run), then a damaged latest checkpoint; every resume ends where the uninterrupted run ends."""
    from dataclasses import asdict

    from safetensors.torch import load_file

    steps, save_every = 8, 2
    straight = train_sft(make_recipe(demos, tmp_path / "straight", steps=steps, save_every=save_every), progress=False)
    recipe = make_recipe(demos, tmp_path / "killed", steps=steps, save_every=save_every)
    rng = np.random.default_rng(0)
    kills = [("checkpoint", int(rng.choice([2, 4]))), ("metrics", int(rng.integers(5, steps + 1)))]
    for fault, at in kills:
        child = subprocess.run([sys.executable, "-c", KILLED_SFT, json.dumps(asdict(recipe)), fault, str(at)],
                               capture_output=True, text=True)
        assert child.returncode == -9, child.stderr[-2000:]
    final = tmp_path / "killed" / "checkpoints" / f"step_{steps:07d}"
    assert not final.exists()  # both kills came before the end
    train_sft(recipe, progress=False)
    (final / "model.safetensors").write_bytes((final / "model.safetensors").read_bytes()[:1000])  # damaged
    train_sft(recipe, progress=False)  # falls back to step 6 and redoes 7-8

    def logged(run):
        return [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]

    assert [r["step"] for r in logged("killed")] == list(range(1, steps + 1))
    np.testing.assert_allclose([r["loss"] for r in logged("killed")], [r["loss"] for r in logged("straight")],
                               rtol=1e-5)
    a, b = load_file(f"{straight['checkpoint']}/model.safetensors"), load_file(final / "model.safetensors")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)
    assert not [p for p in (tmp_path / "killed" / "checkpoints").iterdir() if p.name.startswith(".")]


@pytest.mark.simulator
def test_resuming_sft_with_another_batch_size_is_refused(demos, tmp_path):
    train_sft(make_recipe(demos, tmp_path, steps=2, save_every=2), progress=False)
    with pytest.raises(ValueError, match="sft.batch_size: 8 → 4"):
        train_sft(make_recipe(demos, tmp_path, steps=4, batch_size=4), progress=False)
    assert train_sft(make_recipe(demos, tmp_path, steps=3, save_every=3), progress=False)["last"]["step"] == 3
