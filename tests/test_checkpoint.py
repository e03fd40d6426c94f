"""The run directory shared by every trainer: training state without pickles, damaged checkpoints
skipped, resumes with other settings refused, one process per run, metrics cut by a kill."""

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from minivla_wmrl.infra.run_checkpoint import (
    read_training_state,
    recipe_differences,
    resume_checkpoint,
    run_lock,
    save_checkpoint,
    write_training_state,
)
from minivla_wmrl.infra.run_log import MetricsLog


def optimiser_state() -> dict:
    parameter = torch.nn.Parameter(torch.randn(3, 2))
    optimizer = torch.optim.AdamW([parameter], lr=1e-3, betas=(0.9, 0.95))
    parameter.grad = torch.ones_like(parameter)
    optimizer.step()
    return optimizer.state_dict()


def test_training_state_round_trips_without_pickle(tmp_path):
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    state = {"step": 7, "optimizer": optimiser_state(), "torch_rng": torch.get_rng_state(),
             "numpy_rng": np.random.get_state(), "python_rng": random.getstate(),
             "generator": np.random.default_rng(5).bit_generator.state,  # 128-bit ints
             "counters": {"real_steps": 12}, "pairs": [(0.25, 1.0), (0.5, 0.0)], "none": None}
    write_training_state(tmp_path, state)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["training_state.json", "training_state.safetensors"]
    loaded = read_training_state(tmp_path)
    assert loaded["optimizer"]["state"].keys() == {0}  # int keys stay ints
    assert loaded["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.95)
    for key in ("exp_avg", "exp_avg_sq", "step"):
        assert torch.equal(loaded["optimizer"]["state"][0][key], state["optimizer"]["state"][0][key])
    np.random.set_state(loaded["numpy_rng"])
    random.setstate(loaded["python_rng"])
    torch.set_rng_state(loaded["torch_rng"])
    draws = (np.random.rand(), random.random(), torch.rand(1).item())
    np.random.set_state(state["numpy_rng"])
    random.setstate(state["python_rng"])
    torch.set_rng_state(state["torch_rng"])
    assert draws == (np.random.rand(), random.random(), torch.rand(1).item())
    assert loaded["generator"] == state["generator"] and loaded["pairs"] == state["pairs"]
    assert loaded["counters"] == {"real_steps": 12} and loaded["none"] is None
    with pytest.raises(TypeError, match="holds a object"):
        write_training_state(tmp_path, {"x": object()})


RECIPE = {"out": "runs/x", "sft": {"steps": 10, "batch_size": 8, "lr": 1e-3}, "policy": {"preset": "tiny"}}
MAY_DIFFER = ("out", "sft.steps")


def save(out, step, recipe=RECIPE):
    def write_model(directory):
        from safetensors.torch import save_file
        save_file({"w": torch.full((64,), float(step))}, str(directory / "model.safetensors"))
        (directory / "config.json").write_text(json.dumps({"step": step}))
    return save_checkpoint(out, step, recipe, {"step": step}, write_model)


@pytest.mark.parametrize("damage, named", [
    (lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:-40]),
     "model.safetensors"),
    (lambda d: (d / "model.safetensors").write_bytes(b""), "model.safetensors"),
    (lambda d: (d / "config.json").write_text('{"step": '), "config.json"),
    (lambda d: (d / "training_state.json").unlink(), "training_state.json is missing"),
    (lambda d: (d / "training_state.safetensors").write_bytes(b"\x00" * 3), "training_state.safetensors"),
])
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, capsys, damage, named):
    save(tmp_path, 2), damage(save(tmp_path, 4))
    directory, state = resume_checkpoint(tmp_path, RECIPE, MAY_DIFFER)
    assert directory.name == "step_0000002" and state == {"step": 2}
    err = capsys.readouterr().err
    assert "skipping the damaged checkpoint" in err and "step_0000004" in err and named in err


def test_no_readable_checkpoint_starts_over_and_says_so(tmp_path, capsys):
    (save(tmp_path, 2) / "recipe.json").write_text("{")
    assert resume_checkpoint(tmp_path, RECIPE, MAY_DIFFER) is None
    assert "starting over" in capsys.readouterr().err
    assert resume_checkpoint(tmp_path / "fresh", RECIPE, MAY_DIFFER) is None


def test_a_resume_with_settings_that_change_results_is_refused_naming_them(tmp_path):
    save(tmp_path, 2)
    longer = {**RECIPE, "out": "elsewhere", "sft": {**RECIPE["sft"], "steps": 20}}
    assert resume_checkpoint(tmp_path, longer, MAY_DIFFER)[1] == {"step": 2}  # more steps, moved: the same run
    other = {**RECIPE, "sft": {**RECIPE["sft"], "batch_size": 16}, "policy": {"preset": "small"}}
    with pytest.raises(ValueError, match=r"Changed: policy.preset: 'tiny' → 'small'; sft.batch_size: 8 → 16"):
        resume_checkpoint(tmp_path, other, MAY_DIFFER)
    assert recipe_differences({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}}, ()) == ["a.c: '(absent)' → 2"]
    # a setting added after the run was saved: unchanged at its default (the old behaviour), changed otherwise
    defaults = {"a": {"b": 0, "c": 2}}
    assert recipe_differences({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}}, (), defaults) == []
    assert recipe_differences({"a": {"b": 1}}, {"a": {"b": 1, "c": 3}}, (), defaults) == ["a.c: '(absent)' → 3"]
    assert recipe_differences({"a": {"b": 1, "c": 3}}, {"a": {"b": 1}}, (), defaults) == ["a.c: 3 → '(absent)'"]


def test_a_checkpoint_of_the_pickle_era_is_refused_not_unpickled(tmp_path):
    old = tmp_path / "checkpoints" / "step_0000002"
    old.mkdir(parents=True)
    (old / "training_state.pt").write_bytes(b"not even a pickle")
    with pytest.raises(ValueError, match="older minivla-wmrl.*resume=false"):
        resume_checkpoint(tmp_path, RECIPE, MAY_DIFFER)


def test_one_process_per_run_directory(tmp_path):
    with run_lock(tmp_path / "run", "sft"):
        with pytest.raises(RuntimeError, match=f"another process \\(pid {os.getpid()}\\) is writing"):
            with run_lock(tmp_path / "run", "sft"):
                pass
        other = subprocess.run([sys.executable, "-c", "from minivla_wmrl.infra.run_checkpoint import run_lock\n"
                                f"with run_lock({str(tmp_path / 'run')!r}, 'sft'): pass"],
                               capture_output=True, text=True)
        assert other.returncode != 0 and "is writing" in other.stderr
    killed = subprocess.run([sys.executable, "-c", "import os, signal\n"
                             "from minivla_wmrl.infra.run_checkpoint import run_lock\n"
                             f"with run_lock({str(tmp_path / 'stale')!r}, 'sft'):\n"
                             " os.kill(os.getpid(), signal.SIGKILL)"])
    assert killed.returncode == -9 and (tmp_path / "stale" / ".lock").exists()  # the lock file stays behind
    with run_lock(tmp_path / "stale", "sft"):  # but a dead holder holds nothing
        pass
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="output .*file: .*file is an existing file"):
        with run_lock(tmp_path / "file", "sft"):
            pass


def test_metrics_cut_by_a_kill_lose_only_the_cut_line(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')
    log = MetricsLog(tmp_path, "sft", resume_step=2)
    log.close()
    assert [r["step"] for r in log.history] == [1, 2]
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n'
    assert "dropping its last line" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"ste\n{"step": 3}\n')
    with pytest.raises(ValueError, match="metrics.jsonl line 2 is not a metrics record"):
        MetricsLog(tmp_path, "sft", resume_step=3)


def test_a_resumed_run_logs_each_step_once_in_tensorboard_and_keeps_its_run_id(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLog(tmp_path, "sft") as log:
        for step in (1, 2, 3, 4):
            log.write({"step": step, "loss": float(step)})
    with MetricsLog(tmp_path, "sft", resume_step=2) as log:  # killed after 4, resumed from the step-2 checkpoint
        for step in (3, 4):
            log.write({"step": step, "loss": 10.0 + step})
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("sft/loss")] == [(1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0)]
    from minivla_wmrl.infra.run_log import run_id

    kept = run_id(tmp_path)
    assert run_id(tmp_path) == kept == (tmp_path / "run_id").read_text() and len(kept) == 12
    assert run_id(tmp_path, new=True) != kept  # a run that starts over gets a new one
    with MetricsLog(tmp_path, "sft") as log:  # starting over in the same directory: the old curve goes
        log.write({"step": 1, "loss": 7.0})
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("sft/loss")] == [(1, 7.0)]


def _truncate(path):
    path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])


def _other_size(path, *keys):
    """config.json describing another model size (the weights of one preset under another's config)."""
    data = json.loads(path.read_text())
    node = data
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] *= 2
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("kind", ["policy", "world_model", "action_tokenizer"])
@pytest.mark.parametrize("damage, message", [
    (lambda d: _truncate(d / "model.safetensors"), r"model.safetensors cannot be read .*(truncated|damaged)"),
    (lambda d: (d / "model.safetensors").write_bytes(b""), r"model.safetensors cannot be read"),
    (lambda d: (d / "config.json").write_text('{"format": '), r"config.json is not valid JSON"),
    ("other size", r"model.safetensors does not fit"),
])
def test_damaged_model_files_are_named(tmp_path, kind, damage, message):
    from minivla_wmrl.policy.action_tokenizer import ActionTokenizer, ActionTokenizerConfig
    from minivla_wmrl.policy.minivla import MiniVLA
    from tests.tiny_policy import make_policy
    from world_models.progress_model import ProgressModelConfig, ProgressWorldModel

    directory = tmp_path / kind
    if kind == "policy":
        make_policy(seed=1).save_pretrained(directory)
        load, size_keys = MiniVLA.from_pretrained, ("policy", "llm", "hidden_size")
    elif kind == "world_model":
        directory.mkdir()
        ProgressWorldModel(ProgressModelConfig(image_size=32, dim=32, layers=1)).save_pretrained(directory)
        load, size_keys = ProgressWorldModel.from_pretrained, ("config", "dim")
    else:
        ActionTokenizer(ActionTokenizerConfig()).save_pretrained(directory)
        load, size_keys = ActionTokenizer.from_pretrained, ("codebook_size",)
    if damage == "other size":
        _other_size(directory / "config.json", *size_keys)
    else:
        damage(directory)
    with pytest.raises(ValueError, match=message) as error:
        load(directory)
    assert str(directory) in str(error.value) and len(str(error.value)) < 800


def test_what_a_resume_or_an_ablation_cell_may_change_is_derived_from_the_declarations():
    """The lists come from the RESUMABLE / RUNTIME marks on the settings; these are what they must hold
    (the hand-kept lists they replaced, plus the env timeouts, activation checkpointing and decoding)."""
    from minivla_wmrl.ablation import CELL_MAY_DIFFER
    from minivla_wmrl.train import grpo, sft, wm

    runtime = {"out", "resume", "policy.device", "policy.activation_checkpointing", "policy.decoding", "env.backend",
               "env.ray_address", "env.envs_per_worker", "env.step_timeout_s", "env.start_timeout_s"}
    assert set(CELL_MAY_DIFFER) == runtime
    assert set(grpo.RESUMABLE_CHANGES) == runtime | {"policy.fsdp", "grpo.steps", "grpo.save_every",
                                                     "grpo.real_step_budget"}
    assert set(sft.RESUMABLE_CHANGES) == {"out", "resume", "sft.steps", "sft.log_every", "sft.eval_every",
                                          "sft.save_every", "sft.val_batches", "sft.num_workers", "policy.device",
                                          "policy.fsdp", "policy.activation_checkpointing"}
    collect = {f"collect.{k}" for k in ("backend", "ray_address", "envs_per_worker", "step_timeout_s",
                                        "start_timeout_s", "envs")}
    assert set(wm.RESUMABLE_CHANGES) == {"out", "resume", "train.steps", "train.eval_every", "train.save_every",
                                         "train.eval_prefixes"} | collect
