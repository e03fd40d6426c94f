"""World models: reductions, the scorer registry, and the trainable progress model on real demos and rollouts."""

import functools
import json
import math
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from envs.libero_env import LiberoEnv
from envs.vector_env import VectorEnv
from minivla_wmrl.cli import main as cli
from minivla_wmrl.data.demos import generate_demos
from minivla_wmrl.data.trajectories import demo_trajectories, rollout_trajectories, save_trajectories
from minivla_wmrl.evaluation.statistics import auroc
from minivla_wmrl.rl.rollout import EpisodeSpec, RolloutConfig, RolloutEngine
from minivla_wmrl.train.wm import WMTrainConfig, WorldModelTrainer
from tests.conftest import TASK0
from tests.tiny_policy import make_policy
from world_models.progress_model import ProgressModelConfig, ProgressWorldModel
from world_models.registry import make_scorer
from world_models.scorer import Prediction, reduce_scores, sample_frame_indices

SIZE = 64


def test_reductions_match_hand_computed_values():
    prediction = Prediction(np.array([[0.0, 0.1, 0.2, 0.5, 0.6, 0.9, 1.0, 0.8]]), np.array([0.7]))
    assert reduce_scores(prediction, "potential", k=3) == pytest.approx([0.9 - 0.1])
    assert reduce_scores(prediction, "potential", k=1) == pytest.approx([0.8])
    assert reduce_scores(prediction, "final") == pytest.approx([0.8])
    assert reduce_scores(prediction, "max") == pytest.approx([1.0])
    assert reduce_scores(prediction, "success") == pytest.approx([0.7])
    with pytest.raises(ValueError, match="unknown reduction 'mean'"):
        reduce_scores(prediction, "mean")


def test_frames_are_sampled_uniformly_with_both_ends():
    assert sample_frame_indices(10, 8).tolist() == [0, 1, 3, 4, 5, 6, 8, 9]
    assert sample_frame_indices(3, 8).tolist() == [0, 0, 1, 1, 1, 1, 2, 2]


def progress_by_brightness(frames, instructions):
    """An external scorer: progress = mean brightness, success = last frame brightness."""
    progress = frames.reshape(*frames.shape[:2], -1).mean(-1) / 255.0
    return progress, progress[:, -1]


def test_callable_and_directory_scorers_follow_the_contract(tmp_path):
    ramp = np.stack([np.full((4, 4, 3), v, np.uint8) for v in np.linspace(0, 255, 20)])
    scorer = make_scorer("callable", fn=progress_by_brightness)
    potential = scorer.score([ramp, ramp[::-1]], ["a", "b"])
    assert potential[0] > 0.5 and potential[1] < -0.5
    (tmp_path / "scorer.py").write_text(
        "import numpy as np\n"
        "def load_scorer(directory):\n"
        "    weight = float((directory / 'weight.txt').read_text())\n"
        "    return lambda frames, instructions: (np.full(frames.shape[:2], weight), np.full(len(frames), weight))\n")
    (tmp_path / "weight.txt").write_text("0.25")
    external = make_scorer("directory", path=str(tmp_path))
    assert external.score([ramp], ["a"], mode="final") == pytest.approx([0.25])
    bad = make_scorer("callable", fn=lambda frames, instructions: (np.zeros(3), np.zeros(1)))
    with pytest.raises(ValueError, match="expected \\(1, 8\\)"):
        bad.score([ramp], ["a"])


def test_bad_inputs_are_clear_errors():
    scorer = make_scorer("callable", fn=progress_by_brightness)
    frames = np.zeros((5, 8, 8, 3), np.uint8)
    with pytest.raises(ValueError, match="trajectory 1 is empty"):
        scorer.score([frames, frames[:0]], ["a", "b"])
    with pytest.raises(ValueError, match="trajectory 1 has 4x4 frames, trajectory 0 has 8x8"):
        scorer.score([frames, np.zeros((5, 4, 4, 3), np.uint8)], ["a", "b"])
    with pytest.raises(ValueError, match="expected uint8"):
        scorer.score([frames.astype(np.float32)], ["a"])
    with pytest.raises(ValueError, match="unknown world model 'vlm'; registered"):
        make_scorer("vlm")
    with pytest.raises(ValueError, match=r"world model 'callable': unknown option\(s\) \['fun'\]"):
        make_scorer("callable", fun=progress_by_brightness)
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['dimm'\]"):  # the progress model checks its own
        make_scorer("progress", dimm=3)


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """10 scripted demos of libero_90 task 0 at 224 px (successes) and 10 failed real rollouts of a random policy."""
    out = tmp_path_factory.mktemp("wm_demos")
    report = generate_demos("libero_90", 0, num=10, out=out, init_states=list(range(12)), resolution=224)
    assert report["succeeded"] == 10
    demos = demo_trajectories([report["file"]], SIZE)
    factory = functools.partial(LiberoEnv, *TASK0, cameras=("agentview",), max_steps=64)
    with VectorEnv([factory] * 2) as envs:
        engine = RolloutEngine(make_policy(seed=11), envs, RolloutConfig(execute_steps=8, temperature=1.0))
        rollouts = engine.run([EpisodeSpec(envs.infos[0].task_id, i, seed=i) for i in range(10)], progress=False)
    failed = rollout_trajectories(rollouts, SIZE)
    assert len(failed) == 10 and not any(t.success for t in failed)
    return demos, failed, report["file"], out


def small_config(**overrides):
    return ProgressModelConfig(**{"image_size": SIZE, "dim": 64, **overrides})


@pytest.mark.simulator
def test_trained_world_model_separates_demos_from_failed_rollouts(labelled):
    demos, failed, _, _ = labelled
    torch.manual_seed(0)
    model = ProgressWorldModel(small_config())
    trainer = WorldModelTrainer(model, WMTrainConfig(batch_size=8, lr=1e-3))
    train, held_out = demos[:7] + failed[:7], demos[7:] + failed[7:]
    before = trainer.metrics(held_out)
    for _ in range(120):
        trainer.step([train[i] for i in trainer.rng.choice(len(train), 8, replace=False)])
    after = trainer.metrics(held_out)
    assert after["success_auroc"] >= 0.85, (before, after)
    assert after["potential_auroc"] >= 0.85, (before, after)
    assert after["progress_spearman"] > 0.5
    scores = model.score([t.frames for t in held_out], [t.instruction for t in held_out], mode="success")
    assert auroc(scores, [t.success for t in held_out]) == pytest.approx(after["success_auroc"])


@pytest.mark.simulator
def test_online_update_and_save_load_round_trip(labelled, tmp_path):
    demos, failed, _, _ = labelled
    model = ProgressWorldModel(small_config(dim=32, layers=1))
    trainer = WorldModelTrainer(model, WMTrainConfig(batch_size=4))
    before = [p.detach().clone() for p in model.parameters()]
    loss = trainer.update(demos[:2] + failed[:2], steps=2)
    assert np.isfinite(loss) and any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    model.save_pretrained(tmp_path)
    loaded = make_scorer("progress", path=str(tmp_path))
    frames, instructions = [t.frames for t in demos[:3]], [t.instruction for t in demos[:3]]
    np.testing.assert_allclose(loaded.score(frames, instructions), model.score(frames, instructions), atol=1e-6)


@pytest.mark.simulator
def test_wm_command_trains_and_resumes_exactly(labelled, tmp_path, monkeypatch, capsys):
    _, failed, demo_file, _ = labelled
    rollouts = save_trajectories(tmp_path / "rollouts.hdf5", failed)
    recipe = tmp_path / "wm.yaml"
    recipe.write_text(json.dumps({
        "data": {"demos": [demo_file], "rollouts": [str(rollouts)]},
        "model": {"image_size": 32, "dim": 32, "layers": 1, "dropout": 0.0},
        "train": {"steps": 6, "batch_size": 4, "eval_every": 3, "save_every": 3}}))

    def run(out, *overrides):
        assert cli(["wm", str(recipe), f"out={out}", *overrides]) == 0
        return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]

    full = run(tmp_path / "full")
    from minivla_wmrl.infra import run_checkpoint as checkpoint

    write_state = checkpoint.write_training_state
    monkeypatch.setattr(checkpoint, "write_training_state",  # interrupted while writing step 6's checkpoint
                        lambda d, s: (_ for _ in ()).throw(KeyboardInterrupt) if s["step"] == 6 else write_state(d, s))
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "cut")
    monkeypatch.undo()
    assert [p.name for p in (tmp_path / "cut" / "checkpoints").iterdir()] == ["step_0000003"]
    resumed = run(tmp_path / "cut")
    assert [r["step"] for r in full] == [3, 6] and (tmp_path / "full" / "world_model" / "model.safetensors").exists()
    assert resumed[-1]["loss"] == pytest.approx(full[-1]["loss"], rel=1e-5)
    # held out: 2 of the 10 policy rollouts, never a scripted demo (told apart from a rollout by its look alone)
    assert (full[-1]["val_held_out"], full[-1]["val_held_out_successes"]) == (2, 0)
    assert math.isnan(full[-1]["val_success_auroc"])  # one outcome held out: no AUROC, not a perfect one
    assert cli(["wm", str(recipe), f"out={tmp_path / 'bad'}", "train.stepz=3"]) == 1
    assert cli(["wm", str(recipe), f"out={tmp_path / 'cut'}", "train.steps=9", "train.lr=0.01"]) == 1
    assert "train.lr: 0.0003 → 0.01" in capsys.readouterr().err


@pytest.mark.simulator
def test_final_prefix_targets_label_every_prefix_with_the_final_outcome(labelled):
    demos, failed, _, _ = labelled
    model = ProgressWorldModel(small_config(dim=32, layers=1))
    reached = WorldModelTrainer(model, WMTrainConfig(prefix_target="reached"))
    final = WorldModelTrainer(model, WMTrainConfig(prefix_target="final"))
    success, failure = demos[0], failed[0]
    assert reached.example(success, cut=True)[2] == 0.0 or len(success.frames) == 1  # a cut success: not yet
    for _ in range(5):
        frames, progress, target, weight = final.example(success, cut=True)
        assert target == 1.0 and weight == 1.0 and progress[-1] < 1.0  # a prefix, labelled with the final success
        assert final.example(failure, cut=True)[2] == 0.0
    with pytest.raises(ValueError, match="prefix_target must be 'reached' or 'final'"):
        WorldModelTrainer(model, WMTrainConfig(prefix_target="last"))


@pytest.mark.simulator
def test_metrics_report_auroc_on_prefixes(labelled):
    demos, failed, _, _ = labelled
    model = ProgressWorldModel(small_config(dim=32, layers=1))
    trainer = WorldModelTrainer(model, WMTrainConfig(eval_prefixes=[1, 3]))
    metrics = trainer.metrics(demos[:3] + failed[:3])
    first = model.predict_trajectories([t.frames[:1] for t in demos[:3] + failed[:3]],
                                       [t.instruction for t in demos[:3] + failed[:3]])
    assert metrics["prefix1_success_auroc"] == pytest.approx(auroc(first.success, [True] * 3 + [False] * 3))
    assert 0 <= metrics["prefix3_success_auroc"] <= 1
    with pytest.raises(ValueError, match="eval_prefixes must be frame counts >= 1"):
        WorldModelTrainer(model, WMTrainConfig(eval_prefixes=[0]))


def test_training_curves_draw_the_prefix_aurocs_beside_the_whole_episode_one(tmp_path):
    from minivla_wmrl.evaluation.plots import plot_training_curves

    records = [{"step": 10, "loss": 0.9},
               {"step": 100, "loss": 0.5, "val_success_auroc": 1.0, "val_prefix12_success_auroc": 0.7,
                "val_prefix3_success_auroc": 0.55},
               {"step": 200, "loss": 0.4, "val_success_auroc": 1.0, "val_prefix12_success_auroc": 0.8,
                "val_prefix3_success_auroc": float("nan")}]
    (tmp_path / "wm").mkdir()
    (tmp_path / "wm" / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    plot_training_curves(tmp_path, tmp_path / "curves.png")
    drawn = json.loads((tmp_path / "curves.png.json").read_text())
    assert list(drawn) == ["wm: loss", "wm: val_success_auroc", "wm: val_prefix3_success_auroc",
                           "wm: val_prefix12_success_auroc"]  # prefixes by length, not by name
    assert drawn["wm: val_success_auroc"] == [[100, 1.0], [200, 1.0]]
    assert drawn["wm: val_prefix3_success_auroc"] == [[100, 0.55]]  # a NaN (one outcome held out) is not drawn
    assert drawn["wm: val_prefix12_success_auroc"] == [[100, 0.7], [200, 0.8]]


def test_envs_and_world_models_stand_alone():
    """Neither package imports minivla_wmrl; the policy encoder is injected by minivla_wmrl, by name."""
    code = ("import sys\n"
            "import envs.libero_env, envs.libero_assets, envs.vector_env, world_models.registry\n"
            "from world_models.progress_model import ProgressModelConfig, ProgressWorldModel\n"
            "assert not [m for m in sys.modules if m.startswith('minivla_wmrl')], 'imported minivla_wmrl'\n"
            "ProgressWorldModel(ProgressModelConfig(encoder='policy:/some/checkpoint'))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1 and "imported minivla_wmrl" not in done.stderr
    assert "no frame encoder is registered as 'policy'" in done.stderr
    registered = ("import minivla_wmrl.train.wm\nfrom world_models.progress_model import FRAME_ENCODERS\n"
                  "assert 'policy' in FRAME_ENCODERS\n")  # the wm command builds policy-encoder world models
    assert subprocess.run([sys.executable, "-c", registered], capture_output=True, text=True).returncode == 0


def test_the_policy_encoder_gives_frozen_checkpoint_features(tmp_path):
    from tests.tiny_policy import make_policy

    make_policy().save_pretrained(tmp_path / "policy")
    model = ProgressWorldModel(ProgressModelConfig(encoder=f"policy:{tmp_path / 'policy'}", dim=32, layers=1))
    assert not any(p.requires_grad for p in model.encoder.parameters())
    frames = np.random.default_rng(0).integers(0, 256, (2, model.config.num_frames, 40, 40, 3), dtype=np.uint8)
    prediction = model.predict(frames, ["open the drawer", "close the drawer"])
    assert prediction.progress.shape == (2, model.config.num_frames) and prediction.success.shape == (2,)
    assert np.all((prediction.success > 0) & (prediction.success < 1))
    (tmp_path / "wm").mkdir()
    model.save_pretrained(tmp_path / "wm")
    reloaded = ProgressWorldModel.from_pretrained(tmp_path / "wm")
    np.testing.assert_allclose(reloaded.predict(frames, ["open the drawer", "close the drawer"]).success,
                               prediction.success, rtol=1e-5)


def test_the_timm_encoder_starts_from_local_pretrained_weights(tmp_path):
    import timm
    from safetensors.torch import save_file

    pretrained = timm.create_model("resnet10t", pretrained=False)  # stands in for a Hub download of its weights
    (tmp_path / "resnet10t").mkdir()
    weights = {k: v.contiguous() for k, v in pretrained.state_dict().items()}
    save_file(weights, tmp_path / "resnet10t" / "model.safetensors")
    config = ProgressModelConfig(image_size=32, dim=32, layers=1, encoder_weights=str(tmp_path / "resnet10t"))
    model = ProgressWorldModel(config)
    assert torch.equal(model.encoder.conv1[0].weight, pretrained.conv1[0].weight)
    assert not torch.equal(ProgressWorldModel(small_config()).encoder.conv1[0].weight, pretrained.conv1[0].weight)
    (tmp_path / "wm").mkdir()
    model.save_pretrained(tmp_path / "wm")
    shutil.rmtree(tmp_path / "resnet10t")  # a saved world model no longer needs the pretrained file
    reloaded = ProgressWorldModel.from_pretrained(tmp_path / "wm")
    assert torch.equal(reloaded.encoder.conv1[0].weight, pretrained.conv1[0].weight)
    assert reloaded.config.encoder_weights == str(tmp_path / "resnet10t")
    with pytest.raises(FileNotFoundError, match="holds no model.safetensors"):
        ProgressWorldModel(ProgressModelConfig(encoder_weights=str(tmp_path)))
