"""`minivla-wmrl wm RECIPE`: train the progress/success world model on demos and real-labelled rollouts.

Targets. A demonstration is a success whose progress at frame index i of T is i / (T − 1); a
random prefix of it (with probability `prefix_prob`) is not yet a success, its progress targets
unchanged. A rollout labelled by the real simulator keeps its success label; a successful one
gets the same progress ramp, a failed one progress 0 (`failed_progress: zero`) or no progress
loss (`none`). Each example shows the model `num_frames` frames sampled uniformly.

Prefix targets (`prefix_target`): "reached" labels a cut success as not yet a success; "final"
cuts every trajectory and keeps its final real outcome, so the success head estimates
P(real success | prefix): a full real-labelled trajectory gives labelled prefixes of every
length, which is what GRPO's truncated execution scores its cut rollouts with.

Reported on held-out trajectories (the policy's own rollouts when there are any, never the scripted
demonstrations then): success AUROC (also on prefixes of `eval_prefixes` frames),
mean Spearman rank correlation of predicted progress with time on successes, and expected
calibration error of the success probability.
`WorldModelTrainer.update` is the online step GRPO calls with newly labelled rollouts.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import torch
from torch.nn import functional as F
from tqdm import tqdm

import minivla_wmrl.policy.frame_encoder  # noqa: F401 - registers the world model's "policy:<checkpoint>" encoder
from minivla_wmrl.data.replay import write_replay
from minivla_wmrl.data.trajectories import (
    LabelledTrajectory,
    demo_trajectories,
    load_trajectories,
    rollout_trajectories,
    save_trajectories,
)
from minivla_wmrl.evaluation.statistics import auroc
from minivla_wmrl.infra.config import (
    RESUMABLE,
    RUNTIME,
    InputPath,
    Range,
    Seed,
    check_config,
    check_input_paths,
    load_recipe,
    marked_keys,
)
from minivla_wmrl.infra.outputs import replaced_directory
from minivla_wmrl.infra.run_checkpoint import (
    global_rng_state,
    restore_global_rng,
    resume_checkpoint,
    run_lock,
    save_checkpoint,
)
from minivla_wmrl.infra.run_log import MetricsLog
from minivla_wmrl.policy.minivla import MiniVLA
from minivla_wmrl.rl.env_setup import EnvSetup
from minivla_wmrl.rl.init_states import vector_training_init_states
from minivla_wmrl.rl.rollout import EpisodeSpec, RolloutConfig, RolloutEngine
from minivla_wmrl.train.vq import split_episodes
from world_models.progress_model import ProgressModelConfig, ProgressWorldModel
from world_models.scorer import sample_frame_indices


@dataclass
class WMTrainConfig:
    steps: Annotated[int, Range(1), RESUMABLE] = 2000
    batch_size: Annotated[int, Range(1)] = 16
    lr: Annotated[float, Range(0)] = 3e-4
    weight_decay: Annotated[float, Range(0)] = 0.01
    grad_clip: Annotated[float, Range(above=0)] = 1.0
    prefix_prob: Annotated[float, Range(0, 1)] = 0.5  # chance an example is cut to a random prefix
    # what a prefix's success target is: "reached" (successes cut: not yet a success; failures never cut)
    # or "final" (every trajectory cut, labelled with its final real outcome: P(success | prefix), what
    # truncated GRPO execution needs)
    prefix_target: Literal["reached", "final"] = "reached"
    # also report held-out AUROC on prefixes of these many frames
    eval_prefixes: Annotated[list[int], RESUMABLE] = field(default_factory=list)
    # "zero": failed rollouts' progress target is 0; "none": no progress loss on them
    failed_progress: Literal["zero", "none"] = "zero"
    progress_weight: Annotated[float, Range(0)] = 1.0
    success_weight: Annotated[float, Range(0)] = 1.0
    val_fraction: Annotated[float, Range(0, below=1)] = 0.2
    eval_every: Annotated[int, Range(1), RESUMABLE] = 200
    save_every: Annotated[int, Range(1), RESUMABLE] = 500
    seed: Seed = 0


@dataclass
class WMData:
    # LIBERO hdf5 files or directories (successes)
    demos: Annotated[list[str], InputPath("either")] = field(default_factory=list)
    # trajectory files (save_trajectories) labelled by the simulator
    rollouts: Annotated[list[str], InputPath("file")] = field(default_factory=list)
    # demo frames kept every `stride` steps (the rollouts' query interval at execute_steps 8)
    stride: Annotated[int, Range(1)] = 8
    image_convention: Literal["minivla", "openvla"] = "minivla"
    image_key: str = "agentview_rgb"  # the demos' camera (gym demos: image_rgb)


@dataclass(kw_only=True)
class WMCollect(EnvSetup):
    """Optionally collect real-labelled rollouts first (RL training init states, never evaluation ones)."""

    checkpoint: Annotated[str | None, InputPath("dir")] = None  # a policy checkpoint; None: collect nothing
    episodes_per_task: Annotated[int, Range(0)] = 16
    temperature: Annotated[float, Range(0)] = 1.0
    execute_steps: Annotated[int, Range(1)] = 8
    max_steps: Annotated[int | None, Range(1)] = None  # None: the suite's protocol cap
    envs: Annotated[int, Range(1), RESUMABLE] = 2  # parallel envs per task


@dataclass
class WMRecipe:
    out: Annotated[str, RUNTIME] = "runs/wm"
    resume: Annotated[bool, RUNTIME] = True
    data: WMData = field(default_factory=WMData)
    collect: WMCollect = field(default_factory=WMCollect)
    model: ProgressModelConfig = field(default_factory=ProgressModelConfig)
    train: WMTrainConfig = field(default_factory=WMTrainConfig)


def calibration_error(probabilities: np.ndarray, labels: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error over equal-width probability bins."""
    edges = np.minimum((np.asarray(probabilities) * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        members = edges == b
        if members.any():
            total += members.sum() * abs(probabilities[members].mean() - np.asarray(labels, float)[members].mean())
    return float(total / len(probabilities))


class WorldModelTrainer:
    """Optimiser, example sampling and metrics for a `ProgressWorldModel`; `update` is the online step."""

    def __init__(self, model: ProgressWorldModel, config: WMTrainConfig, reduce_gradients=None):
        """`reduce_gradients(parameters)`: averages gradients over processes (GRPO under torchrun),
        so every process's copy of the world model takes the same steps."""
        if config.failed_progress not in ("zero", "none"):
            raise ValueError(f"failed_progress must be 'zero' or 'none', got {config.failed_progress!r}")
        if config.prefix_target not in ("reached", "final"):
            raise ValueError(f"prefix_target must be 'reached' or 'final', got {config.prefix_target!r}")
        if any(n < 1 for n in config.eval_prefixes):
            raise ValueError(f"eval_prefixes must be frame counts >= 1, got {config.eval_prefixes}")
        self.model, self.config, self.reduce_gradients = model, config, reduce_gradients
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr,
                                           weight_decay=config.weight_decay)
        self.rng = np.random.default_rng(config.seed)

    def example(self, t: LabelledTrajectory, cut: bool) -> tuple[np.ndarray, np.ndarray, float, float]:
        """(frames, progress target, success target, progress-loss weight) for one trajectory."""
        n, length = self.model.config.num_frames, len(t.frames)
        end = int(self.rng.integers(1, length)) if cut and length > 1 else length
        idx = sample_frame_indices(end, n)
        ramp = idx / max(length - 1, 1)
        if t.success:
            return t.frames[idx], ramp, float(end == length or self.config.prefix_target == "final"), 1.0
        weight = 1.0 if self.config.failed_progress == "zero" else 0.0
        return t.frames[idx], np.zeros(n), 0.0, weight

    def loss(self, batch: list[LabelledTrajectory], cut: bool = True) -> torch.Tensor:
        cuttable = lambda t: t.success or self.config.prefix_target == "final"  # noqa: E731
        examples = [self.example(t, cut and cuttable(t) and self.rng.random() < self.config.prefix_prob) for t in batch]
        device = self.model.device
        frames = torch.as_tensor(np.stack([e[0] for e in examples]))
        progress_target = torch.tensor(np.stack([e[1] for e in examples]), dtype=torch.float32, device=device)
        success_target = torch.tensor([e[2] for e in examples], dtype=torch.float32, device=device)
        weight = torch.tensor([e[3] for e in examples], dtype=torch.float32, device=device)
        progress, success = self.model(frames, [t.instruction for t in batch])
        progress_loss = (F.binary_cross_entropy_with_logits(progress, progress_target, reduction="none").mean(1)
                         * weight).sum() / weight.sum().clamp(min=1)
        success_loss = F.binary_cross_entropy_with_logits(success, success_target)
        return self.config.progress_weight * progress_loss + self.config.success_weight * success_loss

    def step(self, batch: list[LabelledTrajectory]) -> float:
        """One optimiser step; an empty batch only joins the gradient averaging (NaN loss)."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(batch) if batch else None
        if loss is not None:
            loss.backward()
        if self.reduce_gradients is not None:
            self.reduce_gradients([p for p in self.model.parameters() if p.requires_grad])
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.optimizer.step()
        return loss.item() if loss is not None else float("nan")

    def update(self, trajectories: list[LabelledTrajectory], steps: int, batch_size: int | None = None) -> float:
        """A few steps on newly labelled trajectories (GRPO's online co-training); mean loss."""
        if steps < 1 or (not trajectories and self.reduce_gradients is None):
            return float("nan")
        size = min(batch_size or self.config.batch_size, len(trajectories))
        losses = [self.step([trajectories[i] for i in self.rng.choice(len(trajectories), size, replace=False)]
                            if trajectories else []) for _ in range(steps)]
        return float(np.nanmean(losses)) if trajectories else float("nan")

    @torch.no_grad()
    def metrics(self, trajectories: list[LabelledTrajectory]) -> dict:
        """Held-out success AUROC, progress rank correlation on successes, success calibration error."""
        from scipy.stats import spearmanr  # scipy.stats: ~0.5 s to import; only the held-out metrics need it

        prediction = self.model.predict_trajectories([t.frames for t in trajectories],
                                                     [t.instruction for t in trajectories])
        labels = np.array([t.success for t in trajectories])
        correlations = [spearmanr(np.arange(p.size), p).statistic for p, y in zip(prediction.progress, labels)
                        if y and np.ptp(p) > 0]
        potential = prediction.progress[:, -3:].mean(1) - prediction.progress[:, :3].mean(1)
        prefixes = {}
        for n in self.config.eval_prefixes:  # the final outcome predicted from the first n frames
            cut = self.model.predict_trajectories([t.frames[:n] for t in trajectories],
                                                  [t.instruction for t in trajectories])
            prefixes[f"prefix{n}_success_auroc"] = auroc(cut.success, labels)
        return {"success_auroc": auroc(prediction.success, labels), "potential_auroc": auroc(potential, labels),
                "progress_spearman": float(np.mean(correlations)) if correlations else float("nan"),
                "calibration_error": calibration_error(prediction.success, labels), **prefixes,
                "held_out": len(trajectories), "held_out_successes": int(labels.sum())}

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.bit_generator.state = state["rng"]


def collect_rollouts(collect: WMCollect, size: int, out: Path) -> Path:
    """Run a policy on RL training init states of each task and save the real-labelled trajectories
    (their frames at `out`, for the world model; their policy signals in the replay store beside it,
    `replay/collect.hdf5`, for outcome probes)."""
    policy = MiniVLA.from_pretrained(collect.checkpoint)
    cameras = ("agentview", "wrist")[:policy.config.num_images]
    labelled, executed = [], []
    for task in collect.tasks:
        with collect.pool([collect.factory(task, cameras, collect.max_steps)] * collect.envs) as envs:
            states = vector_training_init_states(envs, 0, collect.episodes_per_task)
            specs = [EpisodeSpec(envs.infos[0].task_id, state, seed=k) for k, state in enumerate(states)]
            engine = RolloutEngine(policy, envs, RolloutConfig(collect.execute_steps, collect.temperature))
            executed += engine.run(specs, desc=f"collect {collect.suite}/{task}")
    labelled = rollout_trajectories(executed, size)
    write_replay(Path(out).parent / "replay" / "collect.hdf5", executed, "collect")
    return save_trajectories(out, labelled)


# settings a resume may change: how long, how often to evaluate and save, where it runs
RESUMABLE_CHANGES = marked_keys(WMRecipe, RESUMABLE)


def train_world_model(recipe: WMRecipe, progress: bool = True) -> dict:
    check_config(recipe, "wm recipe")
    check_input_paths(recipe, "wm recipe")
    if recipe.collect.checkpoint:
        recipe.collect.check_pool()
    with run_lock(Path(recipe.out), "wm"):
        return _train_world_model(recipe, progress)


def _train_world_model(recipe: WMRecipe, progress: bool) -> dict:
    settings, out = recipe.train, Path(recipe.out)
    random.seed(settings.seed), np.random.seed(settings.seed), torch.manual_seed(settings.seed)
    recipe_record = asdict(recipe)
    resumed = resume_checkpoint(out, recipe_record, RESUMABLE_CHANGES, asdict(WMRecipe())) if recipe.resume else None
    size = recipe.model.image_size
    rollout_files = list(recipe.data.rollouts)
    if recipe.collect.checkpoint:
        collected = out / "collected_rollouts.hdf5"
        if not collected.exists():
            collect_rollouts(recipe.collect, size, collected)
        rollout_files.append(str(collected))
    demos = (demo_trajectories(recipe.data.demos, size, recipe.data.stride, recipe.data.image_convention,
                               recipe.data.image_key) if recipe.data.demos else [])
    rollouts = load_trajectories(rollout_files, size)
    if not demos and not rollouts:
        raise ValueError(f"{recipe.out}: no training data; set data.demos, data.rollouts or collect.checkpoint")
    # held out from the policy's own rollouts when there are any: a scripted demonstration (always a
    # success) is told apart from a rollout by its look alone, which makes a held-out success AUROC
    # over both say nothing about the outcomes GRPO needs predicted
    pool, always_trained = (rollouts, demos) if rollouts else (demos, [])
    train_ids, val_ids = split_episodes(len(pool), settings.val_fraction, settings.seed)
    train_set = always_trained + [pool[i] for i in train_ids]
    val_set = [pool[i] for i in val_ids]

    found, state = resumed if resumed is not None else (None, None)
    model = (ProgressWorldModel.from_pretrained(found / "world_model") if found is not None
             else ProgressWorldModel(recipe.model))
    trainer = WorldModelTrainer(model, settings)
    # once the inputs read back and the model is built: a run refused before this leaves no directory
    (out / "recipe.json").write_text(json.dumps(recipe_record, indent=2))
    start = 0
    if state is not None:
        trainer.load_state_dict(state["trainer"])
        restore_global_rng(state)
        start = state["step"]

    last = {}
    with MetricsLog(out, "wm", start) as log:
        for step in tqdm(range(start + 1, settings.steps + 1), desc="wm", disable=not progress, initial=start,
                         total=settings.steps):
            size_b = min(settings.batch_size, len(train_set))
            batch = [train_set[i] for i in trainer.rng.choice(len(train_set), size_b, replace=False)]
            record = {"step": step, "loss": trainer.step(batch)}
            if val_set and (step % settings.eval_every == 0 or step == settings.steps):
                record.update({f"val_{k}": v for k, v in trainer.metrics(val_set).items()})
            if step % 10 == 0 or step == settings.steps or "val_success_auroc" in record:
                log.write(record)
            last = record
            if step % settings.save_every == 0 or step == settings.steps:
                save_checkpoint(out, step, recipe_record,
                                {"trainer": trainer.state_dict(), "step": step, **global_rng_state()},
                                lambda directory: model.save_pretrained(directory / "world_model"))
    with replaced_directory(out / "world_model", "wm") as tmp:
        model.save_pretrained(tmp)
    return {"last": last, "world_model": str(out / "world_model"), "train": len(train_set), "held_out": len(val_set),
            "model": model, "trainer": trainer}


def main(args) -> None:
    recipe = load_recipe(WMRecipe, Path(args.recipe), args.overrides)
    result = train_world_model(recipe)
    last = result["last"]
    print(f"world model: {result['world_model']} "
          f"({result['train']} train / {result['held_out']} held-out trajectories)")
    if "val_success_auroc" in last:
        print(f"held-out success AUROC {last['val_success_auroc']:.3f}, "
              f"potential AUROC {last['val_potential_auroc']:.3f}, "
              f"progress Spearman {last['val_progress_spearman']:.3f}, "
              f"calibration error {last['val_calibration_error']:.3f}")
        for n in recipe.train.eval_prefixes:
            print(f"held-out success AUROC from the first {n} frames: {last[f'val_prefix{n}_success_auroc']:.3f}")
