"""`minivla-wmrl grpo RECIPE [key=value ...]`: WMRL GRPO on LIBERO.

One step (the order of the WMRL reference), one `GRPOTrainer` method each:
1. `rollouts`: `rollouts_per_task` episodes per task in the real simulator (temperature sampling,
   RL training init states, capped at `max_real_steps`), optionally re-sampling groups whose
   success rate lies outside a band (dynamic sampling, capped attempts); the anchors are picked
   (`rl.anchors`);
2. `predictions`: the world model scores every rollout (query frames + the final frame);
3. `corrections`: the anchors' (score, real outcome) pairs go to the `OnlineDebiaser`, their
   calibrated residuals to the `InverseVarianceWeighter`;
4. `rewards` by `reward_mode`; 5. `advantages`: group-normalised, the anchors' × the anchor weight;
6. `update`: token-level PPO-clip on a sampled subset of each rollout's queries; then
   `cotrain_world_model` on the anchors' real outcomes.

Reward modes: `sparse` (real success for all; the GRPO baseline), `dense_raw` (world-model
score for all), `dense_calib` (WMRL: calibrated score; anchors per `anchor_reward`),
`sparse_scarce` (real success for anchors only; the rest are left out of the advantage).
`shuffle_rewards` deranges the rewards within each group: a control that must not learn.

With `validation.every` > 0 the policy is checked on validation init states before the first
step and every `every` steps (`minivla_wmrl.train.validation`): the best checkpoint is kept
(`best.json`, the run's result) and training stops when it made the policy significantly worse.

Gated execution (`execution: gated`, sparse rewards): anchors run to their end; every other rollout
is cut once an outcome predictor, refit each step on the replay store, has predicted failure for a
few chunks in a row, under a threshold the anchors calibrate (`minivla_wmrl.train.gate`); a cut
rollout's reward is that prediction (or 0: `gate.cut_reward`), everything that ran to its end keeps its
real outcome.

Denoising acts only when some rollouts are not anchors (`anchor_fraction < 1`): with every
rollout an anchor the anchor weight multiplies every advantage alike, a learning-rate multiplier
that Adam cancels. The log says which (`denoise_active`).

Under `torchrun`, each process runs a share of every step's rollouts; what the corrections and
advantages need is gathered, and minibatch gradients are summed (see `GRPOTrainer.update`). With
`policy.fsdp` the policy is sharded (FSDP2) and gathered whole for the rollouts.
"""

from __future__ import annotations

import json
import random
import sys
import time
import typing
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Annotated, Literal, NamedTuple

import numpy as np
import torch
from tqdm import tqdm

from minivla_wmrl.data.replay import read_replay, write_replay
from minivla_wmrl.data.trajectories import LabelledTrajectory, rollout_trajectories
from minivla_wmrl.evaluation.statistics import auroc
from minivla_wmrl.infra.atomic import atomic_file
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
from minivla_wmrl.infra.distributed import init_distributed
from minivla_wmrl.infra.fsdp import (
    clip_gradients,
    full_parameters,
    load_optimizer_state,
    optimizer_state,
    policy_weights,
    shard_policy,
)
from minivla_wmrl.infra.run_checkpoint import (
    global_rng_state,
    latest_checkpoint,
    load_weights,
    restore_global_rng,
    resume_checkpoint,
    run_lock,
    save_checkpoint,
    selected_checkpoint,
)
from minivla_wmrl.infra.run_log import MetricsLog
from minivla_wmrl.policy.config import DTYPES, PolicyDtype
from minivla_wmrl.policy.decoding import Decoding
from minivla_wmrl.policy.minivla import MiniVLA
from minivla_wmrl.policy.storage import write_policy
from minivla_wmrl.rl.advantages import group_advantages, shuffle_within_groups, weight_anchor_advantages
from minivla_wmrl.rl.anchors import pick_anchors
from minivla_wmrl.rl.debiaser import OnlineDebiaser, centred_residual
from minivla_wmrl.rl.env_setup import EnvSetup
from minivla_wmrl.rl.init_states import VALIDATION_SEED_BASE, select_rl_init_states, vector_training_init_states
from minivla_wmrl.rl.rollout import EpisodeSpec, RolloutConfig, RolloutEngine, Trajectory
from minivla_wmrl.rl.weighter import InverseVarianceWeighter
from minivla_wmrl.train.gate import (Gate, GateConfig, OutcomePredictor, anchor_statistics, cross_fit_statistics,
                                     decision_steps)
from minivla_wmrl.train.validation import SALT_VALIDATION, ValidationConfig, ValidationTracker, validation_seed
from minivla_wmrl.train.wm import WMTrainConfig, WorldModelTrainer
from world_models.registry import make_scorer
from world_models.scorer import SCORE_RANGES

# Each random choice of a GRPO step draws from its own stream, seeded by (grpo.seed, step, salt):
# the salts only keep the streams apart (any distinct values would do); changing one changes every
# seeded result, so they stay as first chosen.
SALT_FULL_ANCHORS = 1_000_003  # which rollouts are anchors under full execution
SALT_QUERY_SAMPLES = 2_000_003  # which queries of each rollout enter the loss
SALT_MINIBATCHES = 3_000_003  # the minibatch order of the update
SALT_SHUFFLED_REWARDS = 4_000_003  # the control arm's derangement of rewards within groups
SALT_TRUNCATED_ANCHORS = 5_000_003  # which rollouts are anchors under truncated or gated execution (per task, attempt)
SALT_ORACLE_ANCHORS = 6_000_003  # which failed rollouts `oracle_cut_steps` leaves whole

RewardMode = Literal["sparse", "dense_raw", "dense_calib", "sparse_scarce"]
REWARD_MODES = typing.get_args(RewardMode)


@dataclass
class GRPOConfig:
    steps: Annotated[int, Range(0), RESUMABLE] = 40
    rollouts_per_task: Annotated[int, Range(1)] = 64  # per task per step
    grouping: Literal["task", "init_state"] = "task"  # one group per task, or per (task, init state)
    # distinct training init states per task per step (rollouts split evenly)
    init_states_per_step: Annotated[int, Range(1)] = 8
    temperature: Annotated[float, Range(0)] = 1.0  # the WMRL paper's; peers use 1.5-1.6
    execute_steps: Annotated[int, Range(1)] = 8  # actions per query (the whole VQ chunk)
    # rollout engine: envs in this many groups, one simulating while the policy generates for another (1: plain);
    # same trajectories either way, faster when policy and simulation use different hardware (README, Benchmarks)
    overlap_groups: Annotated[int, Range(1)] = 1
    max_real_steps: Annotated[int, Range(1)] = 520  # real-simulator step cap after the 10 wait steps
    # "full": every rollout runs to success or the cap; "truncated": only anchors do, the rest stop at
    # wm_horizon; "gated": only anchors surely do, the rest stop when the gate predicts failure (`gate:`)
    execution: Literal["full", "truncated", "gated"] = "full"
    # truncated: real steps a non-anchor runs; the world model scores the rest
    wm_horizon: Annotated[int, Range(1)] = 200
    reward_mode: RewardMode = "dense_calib"
    # anchors per group = round(fraction × size); < 1 for denoising to act
    anchor_fraction: Annotated[float, Range(above=0, high=1)] = 1.0
    min_anchors: Annotated[int, Range(0)] = 2  # per step at least this many anchors (added at random)
    # dense_calib anchors under full execution: f(x) | y | (2y + f(x)) / 3. Under truncated execution every
    # rollout that ran to its end (anchors, and those that ended within the horizon) keeps its real outcome y:
    # its score is of a prefix, never of what it did after the horizon
    anchor_reward: Literal["calib", "sparse", "mix"] = "calib"
    wm_reduction: Literal["potential", "final", "max", "success"] = "potential"  # potential in [-1, 1]; others [0, 1]
    shuffle_rewards: bool = False  # control arm: derange rewards within each group (must not learn)
    scale_std: bool = True  # A = (r − mean) / (std + 1e-4); False: r − mean
    clip_eps: Annotated[float, Range(0)] = 0.2
    clip_eps_high: Annotated[float, Range(0)] = 0.28
    inner_epochs: Annotated[int, Range(1)] = 1  # with one epoch ρ = 1 and the clip never binds; use >= 2
    minibatch_size: Annotated[int, Range(1)] = 32  # queries per optimiser step
    queries_per_rollout: Annotated[int, Range(1)] = 12  # sampled queries per rollout in the loss
    # diagnostic of gated execution (> 0; full execution, sparse rewards): every failed rollout except
    # `anchor_fraction` of each group's, picked at random, trains on its queries issued before this env step
    # alone: the update a gate that cut exactly the failures there would make, scoring them 0 (their real
    # outcome). It saves no real step; it asks whether a perfect predictor would close gated execution's gap
    oracle_cut_steps: Annotated[int, Range(0)] = 0
    kl_coef: Annotated[float, Range(0)] = 0.0  # KL to the starting policy (k3 estimator); the paper config has 0.04
    entropy_coef: Annotated[float, Range(0)] = 0.0
    lr: Annotated[float, Range(0)] = 1e-4
    weight_decay: Annotated[float, Range(0)] = 0.0
    grad_clip: Annotated[float, Range(0)] = 1.0
    dynamic_sampling: bool = False
    success_band: list[float] = field(default_factory=lambda: [0.1, 0.9])  # keep groups with rate in [lo, hi]
    max_resample: Annotated[int, Range(0)] = 2  # re-sampling attempts per step for out-of-band groups, then skipped
    wm_cotrain: bool = True  # update a trainable world model on the anchors' real labels
    wm_update_steps: Annotated[int, Range(0)] = 4
    save_every: Annotated[int, Range(1), RESUMABLE] = 5
    # > 0: stop after the step at which real steps reach it
    real_step_budget: Annotated[int, Range(0), RESUMABLE] = 0
    seed: Seed = 0


@dataclass
class GRPOPolicy:
    checkpoint: Annotated[str, InputPath("dir")] = ""  # the SFT checkpoint to start from
    lora: bool = True
    lora_r: Annotated[int, Range(1)] = 16
    lora_alpha: Annotated[int, Range(1)] = 32
    freeze_vision: bool = True
    device: Annotated[str, RUNTIME] = "cpu"
    dtype: PolicyDtype = "float32"
    # under torchrun: shard the policy's parameters, gradients and optimiser state (FSDP2)
    fsdp: Annotated[bool, RESUMABLE] = False
    # recompute activations in the update's backward pass (ViT blocks, LM layers): less memory, same gradients
    activation_checkpointing: Annotated[bool, RUNTIME] = False
    # how rollouts run the decode steps: dynamic | static (preallocated KV cache) | compiled (+ torch.compile,
    # CUDA graphs on CUDA); the same tokens in float32, in bfloat16 up to rounding (policy/decoding.py). The
    # pipeline's evaluations use it too.
    decoding: Annotated[Decoding, RUNTIME] = "dynamic"


@dataclass(kw_only=True)
class GRPOEnv(EnvSetup):
    suite: str = "libero_10"
    envs_per_task: Annotated[int, Range(1)] = 2
    train_init_states: Annotated[int, Range(1)] = 50  # size of each task's pool of generated RL training states
    rl_init_states: list[int] | None = None  # protocol (evaluation) indices instead; needs allow_eval_states
    allow_eval_states: bool = False


@dataclass
class WorldModelSetup:
    name: str = "progress"  # a registered scorer (world_models.registry)
    options: dict = field(default_factory=dict)  # its keyword arguments, e.g. {path: runs/wm/world_model}
    train: WMTrainConfig = field(default_factory=lambda: WMTrainConfig(lr=1e-4))  # online co-training


@dataclass
class DebiasConfig:
    bins: Annotated[int, Range(2)] = 10
    min_pairs: Annotated[int, Range(1)] = 200
    refit_every: Annotated[int, Range(1)] = 64
    capacity: Annotated[int, Range(1)] = 5000
    # all pairs in one bin: identity (the reference's) | mean (the base rate)
    fit_fallback: Literal["identity", "mean"] = "identity"


@dataclass
class DenoiseConfig:
    half_life: Annotated[float, Range(above=0)] = 64
    warmup: Annotated[int, Range(1)] = 32
    target_weight: Annotated[float, Range(1)] = 2.0
    max_weight: Annotated[float, Range(1)] = 4.0


@dataclass
class GRPORecipe:
    out: Annotated[str, RUNTIME] = "runs/grpo"
    resume: Annotated[bool, RUNTIME] = True
    policy: GRPOPolicy = field(default_factory=GRPOPolicy)
    env: GRPOEnv = field(default_factory=GRPOEnv)
    world_model: WorldModelSetup = field(default_factory=WorldModelSetup)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    debias: DebiasConfig = field(default_factory=DebiasConfig)
    denoise: DenoiseConfig = field(default_factory=DenoiseConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    gate: GateConfig = field(default_factory=GateConfig)  # gated execution's cut rule (minivla_wmrl.train.gate)


# settings a resume may change: how long, how often to save, where the rollouts and the policy run
# (not the co-trained world model's step counts: they are the wm command's, unused by GRPO)
RESUMABLE_CHANGES = tuple(k for k in marked_keys(GRPORecipe, RESUMABLE) if not k.startswith("world_model.train."))


def validate(recipe: GRPORecipe) -> None:
    check_config(recipe, "grpo recipe")
    grpo = recipe.grpo
    recipe.env.check_pool()
    if recipe.debias.capacity < recipe.debias.min_pairs:
        raise ValueError(f"debias.capacity {recipe.debias.capacity} holds fewer anchor pairs than debias.min_pairs "
                         f"{recipe.debias.min_pairs}; expected capacity >= min_pairs")
    if recipe.denoise.target_weight > recipe.denoise.max_weight:
        raise ValueError(f"denoise.target_weight {recipe.denoise.target_weight} exceeds denoise.max_weight "
                         f"{recipe.denoise.max_weight}; expected target_weight <= max_weight")
    if grpo.rollouts_per_task % grpo.init_states_per_step:
        raise ValueError(f"grpo.rollouts_per_task {grpo.rollouts_per_task} is not a multiple of init_states_per_step "
                         f"{grpo.init_states_per_step}")
    group_size = grpo.rollouts_per_task // (grpo.init_states_per_step if grpo.grouping == "init_state" else 1)
    if group_size < 2:
        raise ValueError(f"GRPO groups of {group_size} rollout(s): a group needs at least 2 (raise rollouts_per_task "
                         "or lower init_states_per_step)")
    if len(grpo.success_band) != 2 or not 0 <= grpo.success_band[0] <= grpo.success_band[1] <= 1:
        raise ValueError(f"grpo.success_band must be [lo, hi] with 0 <= lo <= hi <= 1, got {grpo.success_band}")
    if grpo.execution != "full":
        # what scores a cut rollout: the calibrated world model (truncated) or the gate's predictor (gated)
        needed = {"truncated": "dense_calib", "gated": "sparse"}[grpo.execution]
        if grpo.reward_mode != needed or grpo.anchor_fraction >= 1 or grpo.dynamic_sampling:
            raise ValueError(f"grpo.execution {grpo.execution!r} needs reward_mode {needed}, anchor_fraction < 1 "
                             "(anchors are never cut) and no dynamic_sampling (a cut rollout's outcome is unknown); "
                             f"got {grpo.reward_mode}, {grpo.anchor_fraction}, {grpo.dynamic_sampling}")
    if grpo.oracle_cut_steps and (grpo.execution != "full" or grpo.reward_mode != "sparse"
                                  or grpo.anchor_fraction >= 1):
        raise ValueError("grpo.oracle_cut_steps emulates a perfect gate's update from full execution with sparse "
                         "rewards, keeping anchor_fraction < 1 of each group whole; got execution "
                         f"{grpo.execution!r}, reward_mode {grpo.reward_mode!r}, "
                         f"anchor_fraction {grpo.anchor_fraction}")
    if grpo.execution == "truncated" and not 1 <= grpo.wm_horizon < grpo.max_real_steps:
        raise ValueError(f"grpo.wm_horizon must lie in [1, max_real_steps {grpo.max_real_steps}), "
                         f"got {grpo.wm_horizon}")
    if not recipe.policy.checkpoint:
        raise ValueError("policy.checkpoint is empty; GRPO starts from an SFT checkpoint (minivla-wmrl sft)")


@dataclass
class RolloutSummary:
    """What every process learns of a rollout it may not hold (gathered under torchrun)."""

    success: bool
    valid: bool  # False: an infrastructure failure
    length: int  # env steps executed
    num_queries: int
    instruction: str
    truncated: bool  # cut (at the horizon, or by the gate)
    early: bool  # ended (success or a terminal failure) within `horizon` steps, as a rollout cut there would
    predicted: float = float("nan")  # gated execution, a cut rollout: the gate's prediction at the cut
    statistic: float = float("nan")  # gated execution, an anchor: its cut statistic (`train.gate`)
    beyond_time: float = float("nan")  # gated execution, an anchor: its log-odds beyond time (`train.gate`)

    @classmethod
    def of(cls, t: Trajectory, horizon: int, predicted: float = float("nan"),
           statistic: float = float("nan"), beyond_time: float = float("nan")) -> "RolloutSummary":
        issued = t.query_steps[:len(t.executed)]  # a worker lost mid-step leaves a query without its steps
        within = int(t.executed[issued < horizon].sum())  # the steps a rollout cut at `horizon` runs
        return cls(t.success, t.failure is None, t.length, t.num_queries, t.instruction, t.truncated,
                   not t.truncated and t.length <= within, predicted, statistic, beyond_time)


class PlannedRollout(NamedTuple):
    spec: EpisodeSpec
    group: int
    anchor: bool  # chosen as an anchor before it runs (truncated execution; full execution picks afterwards)


class GroupMember(NamedTuple):
    summary: RolloutSummary
    trajectory: Trajectory | None  # None: another process ran it
    anchor: bool  # the planned anchor flag


class Sample(NamedTuple):
    """One policy-gradient sample: a query of a rollout (its index in the step) with the rollout's advantage."""

    rollout: int
    query: int
    advantage: float


class HeldSample(NamedTuple):
    """A sample whose rollout this process holds."""

    trajectory: Trajectory
    query: int
    advantage: float


@dataclass
class StepBatch:
    """The rollouts of one step (across all processes) with their groups, anchors and labels.

    Under torchrun each process runs a share of the rollouts: `trajectories[k]` is None for
    rollouts another process holds; the arrays cover every rollout.
    """

    trajectories: list[Trajectory | None]
    groups: np.ndarray  # group id per rollout
    outcomes: np.ndarray  # real success (0/1)
    anchors: np.ndarray  # bool
    valid: np.ndarray  # False: an infrastructure failure (left out of everything)
    num_queries: np.ndarray
    instructions: list[str]
    resampled_groups: int = 0
    skipped_groups: int = 0
    early: np.ndarray | None = None  # truncated execution: ended within the horizon, its real outcome known (bool)
    predicted: np.ndarray | None = None  # gated execution: the gate's prediction for cut rollouts (NaN: not cut)
    statistics: np.ndarray | None = None  # gated execution: the anchors' cut statistics (NaN: not an anchor)
    beyond_time: np.ndarray | None = None  # gated execution: the anchors' log-odds beyond time (NaN: not an anchor)

    def local(self) -> list[int]:
        return [k for k, t in enumerate(self.trajectories) if t is not None]

    def cut(self) -> np.ndarray:
        """Rollouts stopped before their end, whose outcome is unknown (a prediction stands in)."""
        if self.predicted is not None:
            return np.isfinite(self.predicted)
        if self.early is not None:
            return self.valid & ~self.anchors & ~self.early
        return np.zeros_like(self.valid)


def _labelled_mean(rewards: np.ndarray) -> float:
    return float(np.nanmean(rewards)) if np.isfinite(rewards).any() else float("nan")


class GRPOTrainer:
    """Everything one GRPO run holds: policy, optimiser, envs, world model, corrections, counters."""

    def __init__(self, recipe: GRPORecipe, envs=None, progress: bool = True, resume: tuple[Path, dict] | None = None):
        """`resume`: a checkpoint of this run and its training state (`resume_checkpoint`) to continue
        from (weights, optimiser, corrections, RNG). The parts are built in this order (the policy's
        fresh adapters and a new world model draw from torch's RNG)."""
        validate(recipe)
        self.recipe, self.out = recipe, Path(recipe.out)
        self.dist = init_distributed(recipe.policy.device)
        recipe.policy.device = self.dist.device(recipe.policy.device)
        self.progress = progress and self.dist.is_main
        self._build_policy(resume)
        self._build_world_model()
        self._build_corrections()
        self.step, self.counters = 0, {"real_steps": 0, "sim_steps": 0, "real_episodes": 0, "real_labels_used": 0,
                                       "real_steps_full": 0, "real_steps_horizon": 0, "truncated_episodes": 0,
                                       "validation_episodes": 0, "validation_real_steps": 0}
        self._build_gate()
        self._build_envs(envs)
        self._build_validation()
        if resume is not None:
            try:
                self._load_training_state(*resume)
            except BaseException:
                self.close()
                raise

    # -- building --------------------------------------------------------------------------------------------

    def _build_policy(self, resume: tuple[Path, dict] | None) -> None:
        """The policy (its adapters, sharded under torchrun with fsdp), the KL reference, the optimiser."""
        grpo, p = self.recipe.grpo, self.recipe.policy
        if p.fsdp and self.dist.enabled and p.decoding == "compiled":
            raise ValueError("policy.decoding 'compiled' with policy.fsdp: a sharded policy gathers its weights in "
                             "hooks a compiled decode step would capture; use 'static' or 'dynamic'")
        self.policy = MiniVLA.from_pretrained(p.checkpoint, device=p.device, dtype=DTYPES[p.dtype])
        self.policy.configure_training(p.lora, p.lora_r, p.lora_alpha, p.freeze_vision, fresh_adapters=True)
        self.policy.set_activation_checkpointing(p.activation_checkpointing)
        self.policy.set_decoding(p.decoding)
        if resume is not None:
            load_weights(self.policy, resume[0] / "model.safetensors")
        self.sharded = p.fsdp and self.dist.enabled
        if self.sharded:  # each process scales its loss by the global token count: gradients are summed
            shard_policy(self.policy, sum_gradients=True)
        self.reference = None
        if grpo.kl_coef > 0 and not (p.lora and p.freeze_vision):  # else: the model with its adapters disabled
            self.reference = MiniVLA.from_pretrained(p.checkpoint, device=p.device,
                                                     dtype=DTYPES[p.dtype]).requires_grad_(False)
            if self.sharded:  # its forward passes run in the update, in step on every process
                shard_policy(self.reference)
        self.trainable = [q for q in self.policy.parameters() if q.requires_grad]
        self.optimizer = torch.optim.AdamW(self.trainable, lr=grpo.lr, weight_decay=grpo.weight_decay)

    def _build_world_model(self) -> None:
        """The scorer, and its co-trainer when it is trainable (gradients averaged over processes)."""
        setup, grpo = self.recipe.world_model, self.recipe.grpo
        options = dict(setup.options)
        if setup.name == "progress":
            options.setdefault("device", self.recipe.policy.device)  # score and co-train beside the policy
        self.world_model = make_scorer(setup.name, **options)
        self.wm_trainer = None
        if grpo.wm_cotrain and isinstance(self.world_model, torch.nn.Module):
            average = ((lambda params: self.dist.sum_gradients([q for q in params if q.requires_grad],
                                                               1.0 / self.dist.world_size))
                       if self.dist.enabled else None)
            self.wm_trainer = WorldModelTrainer(self.world_model, setup.train, average)

    def _build_corrections(self) -> None:
        """Online Debiasing (the calibrator of scores against anchors' outcomes) and Inverse-Variance
        Denoising (the anchor weight)."""
        grpo = self.recipe.grpo
        self.debiaser = OnlineDebiaser(**asdict(self.recipe.debias), score_range=SCORE_RANGES[grpo.wm_reduction])
        if grpo.reward_mode == "dense_calib" and grpo.anchor_fraction == 1 and self.dist.is_main:
            print("grpo: every rollout is an anchor (anchor_fraction 1): the anchor weight scales all advantages "
                  "alike and Adam cancels it; set anchor_fraction < 1 for denoising to act", file=sys.stderr)
        self.weighter = InverseVarianceWeighter(**asdict(self.recipe.denoise))

    def _build_envs(self, envs) -> None:
        """The envs (given, or from the recipe's env setup), each task's training states, the engine."""
        grpo = self.recipe.grpo
        self.envs = envs if envs is not None else self._make_envs()
        self.owns_envs = envs is None
        self.task_ids = list(dict.fromkeys(info.task_id for info in self.envs.infos))
        self.init_pools = self._init_state_pools()
        self.engine = RolloutEngine(self.policy, self.envs,
                                    RolloutConfig(grpo.execute_steps, grpo.temperature, grpo.seed,
                                                  overlap_groups=grpo.overlap_groups))

    def _build_validation(self) -> None:
        """The guard: validation states apart from the training ones, their engine, the tracker."""
        grpo, v = self.recipe.grpo, self.recipe.validation
        self.validation = ValidationTracker(v) if v.every else None
        if self.validation is not None:
            self.validation_pools = {task_id: vector_training_init_states(
                self.envs, self._env_of(task_id), v.states_per_task, base=VALIDATION_SEED_BASE,
                avoid=self.init_pools[task_id]) for task_id in self.task_ids}
            self.validation_engine = RolloutEngine(
                self.policy, self.envs, RolloutConfig(grpo.execute_steps, v.temperature, SALT_VALIDATION,
                                                      record_frames=False, overlap_groups=grpo.overlap_groups))

    def _build_gate(self) -> None:
        """Gated execution: the gate and the outcome predictor it reads (refit every step)."""
        grpo = self.recipe.grpo
        self.gate = Gate(self.recipe.gate) if grpo.execution == "gated" else None
        missing = [p for p in self.recipe.gate.replay if not Path(p).exists()] if self.gate else []
        if missing:
            raise FileNotFoundError(f"gate.replay: {missing} do not exist; expected replay files or directories "
                                    "(OUT/replay of a wm or grpo run)")
        if self.gate and self.recipe.gate.warm_start and not self.recipe.gate.replay:
            raise ValueError("gate.warm_start calibrates on gate.replay's episodes, and gate.replay is empty; name "
                             "replay files or directories (OUT/replay of a wm or grpo run), or set warm_start false")
        self.predictor = OutcomePredictor(self.recipe.gate.predictor, grpo.max_real_steps, grpo.seed)
        self.predictor_unfit = "no predictor fit yet"  # why the predictor could not be fit (None: fit)
        self.gate_said = ""  # the gate's state as last printed

    def _make_envs(self):
        e, cameras = self.recipe.env, ("agentview", "wrist")[:self.policy.config.num_images]
        return e.pool([e.factory(task, cameras, self.recipe.grpo.max_real_steps)
                       for task in e.tasks for _ in range(e.envs_per_task)])

    def _env_of(self, task_id: str) -> int:
        return next(k for k, info in enumerate(self.envs.infos) if info.task_id == task_id)

    def _init_state_pools(self) -> dict[str, list]:
        """Per task: generated RL training states (see `minivla_wmrl.rl.init_states`), or protocol
        indices when the recipe lists them and allows it."""
        e, infos, pools = self.recipe.env, self.envs.infos, {}
        for task_id in self.task_ids:
            i = self._env_of(task_id)
            chosen = select_rl_init_states(e.rl_init_states, infos[i].num_init_states, e.allow_eval_states, task_id)
            pools[task_id] = (chosen if chosen is not None
                              else vector_training_init_states(self.envs, i, e.train_init_states))
        return pools

    # -- 1. rollouts ------------------------------------------------------------------------------------

    def _specs(self, task_index: int, attempt: int, group_slots: list[int]) -> list[PlannedRollout]:
        """(spec, group, anchor) for the given group slots of one task (init states and seeds fixed by
        step/attempt). Truncated and gated execution pick each group's anchors here, before anything
        runs, and cut every other rollout at `wm_horizon` or when the gate says; full execution picks
        anchors afterwards."""
        grpo, task_id = self.recipe.grpo, self.task_ids[task_index]
        rng = np.random.default_rng([grpo.seed, self.step, attempt, task_index])
        pool = self.init_pools[task_id]
        per_state = grpo.rollouts_per_task // grpo.init_states_per_step
        states = rng.choice(len(pool), grpo.init_states_per_step, replace=len(pool) < grpo.init_states_per_step)
        specs = []
        for slot in range(grpo.init_states_per_step):
            group = task_index * grpo.init_states_per_step + slot if grpo.grouping == "init_state" else task_index
            if group not in group_slots:
                continue
            for r in range(per_state):
                seed = int(np.random.SeedSequence([grpo.seed, self.step, attempt, task_index, slot, r])
                           .generate_state(1)[0])
                specs.append(PlannedRollout(EpisodeSpec(task_id, pool[states[slot]], seed=seed), group, anchor=False))
        if grpo.execution != "full":
            anchor_rng = np.random.default_rng([grpo.seed, self.step, attempt, task_index, SALT_TRUNCATED_ANCHORS])
            groups = np.array([planned.group for planned in specs])
            anchors = pick_anchors(groups, np.ones(len(specs), bool), grpo.anchor_fraction, anchor_rng, min_per_group=1)
            cut = ({"horizon": grpo.wm_horizon} if grpo.execution == "truncated" else {"gated": True})
            specs = [PlannedRollout(p.spec if anchor else replace(p.spec, **cut), p.group, bool(anchor))
                     for p, anchor in zip(specs, anchors)]
        return specs

    def fit_predictor(self) -> None:
        """Gated execution: fit the outcome predictor on the replay store's episodes of the steps so far
        (and `gate.replay`), so that a resumed run fits on exactly what the uninterrupted one did."""
        files = [f for f in sorted((self.out / "replay").glob("step_*.hdf5"))
                 if int(f.stem.split("_")[1]) <= self.step]
        sources = files + [Path(p) for p in self.recipe.gate.replay]
        episodes = read_replay(sources) if sources else []
        self.predictor_unfit = self.predictor.fit(episodes)
        if self.step == 0 and self.recipe.gate.warm_start:  # later, the gate's state (checkpointed) holds it
            # before step 1 (replay files are step_1 on) the episodes are gate.replay's alone
            self.gate.observe(*cross_fit_statistics(episodes, self.recipe.gate, self.predictor.time_scale,
                                                    self.predictor.seed))

    def _cut(self, prefixes: list[Trajectory]) -> list[bool]:
        """The gate's decision for running gated rollouts."""
        return [self.gate.cuts(p, decision_steps(t)) for p, t in zip(self.predictor(prefixes), prefixes)]

    def _gate_summary(self, t: Trajectory, horizon: int, anchor: bool) -> RolloutSummary:
        """A rollout's summary with, under gated execution, a cut rollout's prediction at the cut and
        an anchor's cut statistic and log-odds beyond time (by the predictor before it learns from this step)."""
        if self.gate is None or self.predictor.model is None or t.failure is not None or not (t.truncated or anchor):
            return RolloutSummary.of(t, horizon)
        probabilities = self.predictor([t])[0]
        if t.truncated:
            return RolloutSummary.of(t, horizon, predicted=float(probabilities[-1]))
        statistic, excess = anchor_statistics(probabilities, t, self.recipe.gate, self.predictor)
        return RolloutSummary.of(t, horizon, statistic=statistic, beyond_time=excess)

    def rollouts(self) -> StepBatch:
        """This step's rollouts; under torchrun process r runs every world_size-th one and the
        outcomes are gathered, so groups, anchors and advantages are the same in every process."""
        grpo, rank, world = self.recipe.grpo, self.dist.rank, self.dist.world_size
        groups_per_task = grpo.init_states_per_step if grpo.grouping == "init_state" else 1
        wanted = {t: list(range(t * groups_per_task, (t + 1) * groups_per_task)) for t in range(len(self.task_ids))}
        kept: dict[int, list[GroupMember]] = {}
        resampled = 0
        if self.gate is not None:
            self.fit_predictor()
        # the engine asks the gate after every chunk only while it may cut: a fit predictor, an active gate
        cutting = self.gate is not None and self.predictor.model is not None and self.gate.active
        for attempt in range(grpo.max_resample + 1 if grpo.dynamic_sampling else 1):
            todo = [item for t, slots in wanted.items() for item in self._specs(t, attempt, slots)]
            if not todo:
                break
            mine = list(range(rank, len(todo), world))
            local = dict(zip(mine, self.engine.run([todo[k].spec for k in mine], progress=self.progress,
                                                   desc=f"step {self.step + 1} rollouts",
                                                   cut=self._cut if cutting else None)))
            summaries = {}
            for part in self.dist.gather({k: self._gate_summary(t, grpo.wm_horizon, todo[k].anchor)
                                          for k, t in local.items()}):
                summaries.update(part)
            self._count(todo, summaries)
            by_group: dict[int, list[GroupMember]] = {}
            for k, planned in enumerate(todo):
                by_group.setdefault(planned.group, []).append(GroupMember(summaries[k], local.get(k), planned.anchor))
            for group, members in by_group.items():
                rate = np.mean([m.summary.success for m in members if m.summary.valid] or [0.0])
                if not grpo.dynamic_sampling or grpo.success_band[0] <= rate <= grpo.success_band[1]:
                    kept[group] = members
            wanted = {t: [s for s in slots if s not in kept] for t, slots in wanted.items()}
            resampled += sum(len(s) for s in wanted.values()) if attempt < grpo.max_resample else 0
        skipped = sum(len(s) for s in wanted.values())
        members = [m for group in sorted(kept) for m in kept[group]]
        groups = np.array([group for group in sorted(kept) for _ in kept[group]], dtype=np.int64)
        summaries = [m.summary for m in members]
        valid = np.array([m.valid for m in summaries], bool)
        planned = grpo.execution != "full"
        anchors = np.array([m.anchor for m in members], bool) & valid if planned else self._anchors(groups, valid)
        gated = grpo.execution == "gated"
        return StepBatch(trajectories=[m.trajectory for m in members], groups=groups,
                         outcomes=np.array([float(m.success) for m in summaries]), anchors=anchors, valid=valid,
                         num_queries=np.array([m.num_queries for m in summaries], np.int64),
                         instructions=[m.instruction for m in summaries],
                         resampled_groups=resampled if grpo.dynamic_sampling else 0, skipped_groups=skipped,
                         early=(np.array([m.early for m in summaries], bool) & valid
                                if grpo.execution == "truncated" else None),
                         predicted=np.array([m.predicted for m in summaries]) if gated else None,
                         statistics=np.array([m.statistic for m in summaries]) if gated else None,
                         beyond_time=np.array([m.beyond_time for m in summaries]) if gated else None)

    def _count(self, todo: list[PlannedRollout], summaries: dict) -> None:
        """Real-simulator episodes and steps as the envs executed them, split into rollouts free to
        run to success or the cap (all under full execution, the anchors otherwise) and rollouts that
        may be cut (at `wm_horizon`, or by the gate); `truncated_episodes`: those actually cut. `sim_steps` adds the
        steps every reset runs (LIBERO's wait steps): all the simulator did."""
        reset_steps = {info.task_id: info.reset_steps for info in self.envs.infos}
        for k, planned in enumerate(todo):
            self.counters["real_episodes"] += 1
            self.counters["real_steps"] += summaries[k].length
            self.counters["sim_steps"] += summaries[k].length + reset_steps[planned.spec.task_id]
            free = planned.spec.horizon is None and not planned.spec.gated
            self.counters["real_steps_full" if free else "real_steps_horizon"] += summaries[k].length
            self.counters["truncated_episodes"] += int(summaries[k].truncated)

    def _anchors(self, groups: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """Full execution's anchors, among the rollouts that ran (sparse: every one is labelled)."""
        grpo = self.recipe.grpo
        if grpo.reward_mode == "sparse":
            return valid.copy()
        rng = np.random.default_rng([grpo.seed, self.step, SALT_FULL_ANCHORS])
        return pick_anchors(groups, valid, grpo.anchor_fraction, rng, min_total=grpo.min_anchors)

    # -- 2. predictions ----------------------------------------------------------------------------------

    def predictions(self, batch: StepBatch) -> tuple[dict[int, LabelledTrajectory], np.ndarray]:
        """The world model's view of this process's rollouts (whole: what co-training learns from) and
        every rollout's score (under truncated execution, of the prefix up to the horizon: all that
        a cut rollout has)."""
        inputs = self.world_model_inputs(batch)
        prefixes = self.world_model_inputs(batch, self.recipe.grpo.wm_horizon) if batch.early is not None else inputs
        return inputs, self.score(batch, prefixes)

    def world_model_inputs(self, batch: StepBatch, horizon: int | None = None) -> dict[int, LabelledTrajectory]:
        """This process's valid rollouts as the world model reads them (query frames + final frame,
        at its image size; with `horizon`, the prefix of that many steps), by rollout index: scored,
        and (whole) co-trained on for the anchors."""
        size = getattr(getattr(self.world_model, "config", None), "image_size", None)
        index = [k for k in batch.local() if batch.valid[k]]
        return dict(zip(index, rollout_trajectories([batch.trajectories[k] for k in index], size, horizon)))

    def score(self, batch: StepBatch, inputs: dict[int, LabelledTrajectory]) -> np.ndarray:
        """World-model scores of every valid rollout (NaN for infrastructure failures); each process
        scores the rollouts it holds and the scores are gathered."""
        index = list(inputs)
        frames = [inputs[k].frames for k in index]
        local = {}
        if index:
            values = self.world_model.score(frames, [batch.instructions[k] for k in index],
                                            mode=self.recipe.grpo.wm_reduction)
            local = dict(zip(index, np.asarray(values, float).tolist()))
        scores = np.full(len(batch.groups), np.nan)
        for part in self.dist.gather(local):
            for k, v in part.items():
                scores[k] = v
        bad = [int(k) for k in np.flatnonzero(batch.valid) if not np.isfinite(scores[k])]
        if bad:
            raise ValueError(f"world model {self.recipe.world_model.name!r} returned NaN/inf for rollout(s) {bad[:5]} "
                             f"of step {self.step + 1}; the step is refused and nothing was written")
        return scores

    # -- 3. corrections ----------------------------------------------------------------------------------

    def corrections(self, batch: StepBatch, scores: np.ndarray) -> tuple[np.ndarray | None, dict]:
        """dense_calib: the anchors' (score, real outcome) pairs go to the debiaser, their calibrated
        residuals to the weighter; returns every rollout's calibrated score (None in other modes).
        Under truncated execution the pairs are the anchors that ran past the horizon, scored on
        their prefix: exactly what a cut rollout's calibrated score estimates, P(success | prefix)."""
        log = {"calibrated": 0.0, "bias_reduction": float("nan")}
        if self.gate is not None:  # gated execution: the anchors recalibrate the gate's threshold and quality
            labelled = batch.anchors & ~np.isnan(batch.statistics)  # inf: ended before the gate could judge
            self.gate.observe(batch.statistics[labelled], batch.outcomes[labelled], batch.beyond_time[labelled])
            log.update(self.gate.log(), predictor_fit=float(self.predictor.model is not None))
            said = ("cutting" if self.gate.active and self.predictor_unfit is None
                    else f"not cutting ({self.predictor_unfit or self.gate.reason})")
            if said != self.gate_said and self.dist.is_main:  # when it changes: the metrics hold the rest
                print(f"grpo: after step {self.step + 1} the gate is {said}", file=sys.stderr)
            self.gate_said = said
        if self.recipe.grpo.reward_mode != "dense_calib":
            return None, log
        a, y = batch.anchors, batch.outcomes
        pairs = a if batch.early is None else a & ~batch.early
        self.debiaser.add(scores[pairs], y[pairs])
        # how well the world model's score ranks real outcomes, over every calibration pair so far
        log["calibration_auroc"] = auroc(*np.array(self.debiaser.pairs).T) if self.debiaser.pairs else float("nan")
        if self.debiaser.calibrated:
            before = centred_residual(scores[pairs], y[pairs], batch.groups[pairs])
            after = centred_residual(self.debiaser(scores[pairs]), y[pairs], batch.groups[pairs])
            log.update(calibrated=1.0, bias_reduction=1 - after / before if before > 0 else float("nan"))
            self.weighter.observe_step(self.debiaser(scores[pairs]), y[pairs], batch.groups[pairs])
        return self.debiaser(scores), log

    # -- 4. rewards --------------------------------------------------------------------------------------

    def rewards(self, batch: StepBatch, scores: np.ndarray,
                calibrated: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Each rollout's reward by `reward_mode` (NaN: unlabelled, or an infrastructure failure), and
        which rollouts' real outcomes the step used (in a reward, or as a calibration pair)."""
        grpo, a, y = self.recipe.grpo, batch.anchors, batch.outcomes
        if grpo.reward_mode == "sparse" and batch.predicted is None:
            real, rewards = np.ones_like(a), y.copy()
        elif grpo.reward_mode == "sparse":  # gated execution: a cut rollout's reward is the gate's prediction, or 0
            real = ~batch.cut()
            rewards = np.where(real, y, batch.predicted if self.recipe.gate.cut_reward == "prediction" else 0.0)
        elif grpo.reward_mode == "sparse_scarce":
            real, rewards = a.copy(), np.where(a, y, np.nan)
        elif grpo.reward_mode == "dense_raw":
            real, rewards = np.zeros_like(a), scores.copy()
        elif batch.early is None:  # full execution: every score is of a whole trajectory
            anchor_value = {"calib": calibrated, "sparse": y, "mix": (2 * y + calibrated) / 3}[grpo.anchor_reward]
            real, rewards = a.copy(), np.where(a, anchor_value, calibrated)
        else:  # truncated: what ran to its end keeps its real outcome; only cut rollouts get a prediction
            real = a | batch.early
            rewards = np.where(real, y, calibrated)
        rewards = np.where(batch.valid, rewards, np.nan)
        if grpo.shuffle_rewards:
            rewards = shuffle_within_groups(rewards, batch.groups,
                                            np.random.default_rng([grpo.seed, self.step, SALT_SHUFFLED_REWARDS]))
        return rewards, real & batch.valid

    # -- 5. advantages -----------------------------------------------------------------------------------

    def advantages(self, batch: StepBatch, rewards: np.ndarray) -> tuple[np.ndarray, dict]:
        """Group-normalised advantages (0 for ungraded rollouts), the anchors' × the anchor weight
        while denoising acts."""
        grpo, a = self.recipe.grpo, batch.anchors
        advantages, graded = group_advantages(rewards, batch.groups, grpo.scale_std)
        log = {"anchor_weight": 1.0, "debias_fit_failed": float(self.debiaser.fit_failed)}
        denoising = grpo.reward_mode == "dense_calib" and self.debiaser.calibrated
        # active when the weight exceeds 1 and there are world-model rewards for it to count anchors above
        log["denoise_active"] = float(denoising and self.weighter.active and bool((graded & ~a).any()))
        log["denoise_observations"] = float(self.weighter.observations)
        if denoising:
            log["anchor_weight"] = self.weighter.weight
            advantages = weight_anchor_advantages(advantages, a, self.weighter.weight)
        zero_std = [np.nanstd(rewards[(batch.groups == group) & graded]) < 1e-9 for group in np.unique(batch.groups)
                    if ((batch.groups == group) & graded).any()]
        log["frac_reward_zero_std"] = float(np.mean(zero_std)) if zero_std else 1.0
        return np.where(graded, advantages, 0.0), log

    # -- 6. policy update -----------------------------------------------------------------------------------

    def _samples(self, batch: StepBatch, advantages: np.ndarray) -> list[Sample]:
        """A random subset of each rollout's queries; the same list in every process (it is drawn
        from the gathered arrays)."""
        grpo = self.recipe.grpo
        rng = np.random.default_rng([grpo.seed, self.step, SALT_QUERY_SAMPLES])
        queries = self._trainable_queries(batch)
        samples = []
        for k in range(len(batch.groups)):
            if not batch.valid[k] or not queries[k]:
                continue
            if advantages[k] == 0 and grpo.kl_coef == 0 and grpo.entropy_coef == 0:
                continue  # zero-advantage samples carry no gradient (unless KL or entropy terms apply)
            picks = np.sort(rng.choice(queries[k], min(grpo.queries_per_rollout, queries[k]), replace=False))
            samples += [Sample(k, int(q), float(advantages[k])) for q in picks]
        return samples

    def _trainable_queries(self, batch: StepBatch) -> np.ndarray:
        """How many of each rollout's first queries the loss may sample: all of them, except under
        `oracle_cut_steps`, where a failed rollout left out of the group's whole ones keeps those its
        gate would have issued before the cut (queries come every `execute_steps`)."""
        grpo = self.recipe.grpo
        if not grpo.oracle_cut_steps:
            return batch.num_queries
        rng = np.random.default_rng([grpo.seed, self.step, SALT_ORACLE_ANCHORS])
        whole = pick_anchors(batch.groups, batch.valid, grpo.anchor_fraction, rng, min_per_group=1)
        cut = batch.valid & ~whole & (batch.outcomes == 0)
        issued = -(-grpo.oracle_cut_steps // grpo.execute_steps)
        return np.where(cut, np.minimum(batch.num_queries, issued), batch.num_queries)

    def _reference_log_probs(self, images, instructions, tokens) -> torch.Tensor:
        t = self.recipe.grpo.temperature
        with torch.no_grad():
            if self.reference is not None:
                return self.reference.score(images, instructions, tokens, t)[0]
            with self.policy.llm.disable_adapter():
                return self.policy.score(images, instructions, tokens, t)[0]

    def update(self, batch: StepBatch, samples: list[Sample]) -> dict:
        """PPO-clip over minibatches of the global sample list. Each process computes the summed
        token loss of the samples it holds, divided by the minibatch's token count; summing the
        gradients over processes gives exactly the single-process minibatch gradient. A sharded
        policy's backward is a collective, so a process holding none of a minibatch backpropagates
        a blank sample at weight zero."""
        grpo = self.recipe.grpo
        rng = np.random.default_rng([grpo.seed, self.step, SALT_MINIBATCHES])
        n_tokens = self.policy.config.num_action_tokens
        # activation checkpointing acts in training mode only; the policy has no dropout, so the
        # log-probs are the rollouts' either way
        self.policy.train(self.recipe.policy.activation_checkpointing)
        sums: dict[str, float] = {}
        grad_norms = []
        idle = self._blank_sample() if self.sharded else None
        for _ in range(grpo.inner_epochs):
            order = rng.permutation(len(samples))
            for start in range(0, len(order), grpo.minibatch_size):
                chunk = [samples[i] for i in order[start:start + grpo.minibatch_size]]
                own = [HeldSample(batch.trajectories[s.rollout], s.query, s.advantage) for s in chunk
                       if batch.trajectories[s.rollout] is not None]
                scale = 1.0 / (len(chunk) * n_tokens)
                self.optimizer.zero_grad(set_to_none=True)
                if own:
                    for key, value in self._minibatch_loss(own, scale).items():
                        sums[key] = sums.get(key, 0.0) + value
                elif idle is not None:
                    self._minibatch_loss([idle], 0.0)
                if not self.sharded:  # FSDP reduced the gradients in backward
                    self.dist.sum_gradients(self.trainable)
                grad_norms.append(clip_gradients(self.trainable, grpo.grad_clip))
                self.optimizer.step()
        total = {k: sum(part.get(k, 0.0) for part in self.dist.gather(sums)) for k in
                 ("loss", "entropy", "approx_kl", "clip_low", "clip_high", "tokens")}
        tokens = max(total.pop("tokens"), 1.0)
        return {**{k: v / tokens for k, v in total.items()}, "grad_norm": float(np.mean(grad_norms))}

    def _blank_sample(self) -> HeldSample:
        """A sample of blank images, for zero-weight backward passes."""
        c = self.policy.config
        image = (c.image_size, c.image_size, 3) if c.num_images == 1 else (c.num_images, c.image_size, c.image_size, 3)
        tokens = np.full((1, c.num_action_tokens), self.policy.vocab_len - 1)  # VQ code 0's token
        blank = Trajectory(spec=EpisodeSpec("blank", 0), instruction="", success=False, length=0, success_step=None,
                           failure=None, frames=np.zeros((1, *image), np.uint8), final_frame=None, token_ids=tokens,
                           log_probs=np.zeros(tokens.shape, np.float32), query_steps=np.zeros(1, np.int64),
                           executed=np.zeros(1, np.int64))
        return HeldSample(blank, query=0, advantage=0.0)

    def _minibatch_loss(self, own: list[HeldSample], scale: float) -> dict:
        """Backpropagate `scale` × the summed per-token loss of these samples."""
        grpo, device = self.recipe.grpo, self.policy.device
        images = np.stack([s.trajectory.frames[s.query] for s in own])
        instructions = [s.trajectory.instruction for s in own]
        tokens = torch.as_tensor(np.stack([s.trajectory.token_ids[s.query] for s in own]), device=device)
        old = torch.as_tensor(np.stack([s.trajectory.log_probs[s.query] for s in own]), device=device)
        adv = torch.as_tensor([s.advantage for s in own], dtype=torch.float32, device=device)[:, None]
        new, entropy = self.policy.score(images, instructions, tokens, grpo.temperature)
        ratio = torch.exp(new - old)
        clipped = torch.clamp(ratio, 1 - grpo.clip_eps, 1 + grpo.clip_eps_high)
        per_token = -torch.minimum(ratio * adv, clipped * adv) - grpo.entropy_coef * entropy
        if grpo.kl_coef > 0:
            log_ref_ratio = self._reference_log_probs(images, instructions, tokens) - new
            per_token = per_token + grpo.kl_coef * (torch.exp(log_ref_ratio) - log_ref_ratio - 1)
        (per_token.sum() * scale).backward()
        with torch.no_grad():  # token sums, so that means over processes and minibatches are exact
            log_ratio = new - old
            return {"loss": per_token.sum().item(), "entropy": entropy.sum().item(),
                    "approx_kl": ((torch.exp(log_ratio) - 1) - log_ratio).sum().item(),
                    "clip_low": ((ratio < 1 - grpo.clip_eps) & (adv < 0)).float().sum().item(),
                    "clip_high": ((ratio > 1 + grpo.clip_eps_high) & (adv > 0)).float().sum().item(),
                    "tokens": float(per_token.numel())}

    # -- one step, checkpoints --------------------------------------------------------------------------------

    def train_step(self) -> dict:
        """One GRPO step: rollouts → predictions → corrections → rewards → advantages → update, then
        world-model co-training on the anchors' real outcomes."""
        self.policy.eval()
        t0, before = time.perf_counter(), dict(self.counters)
        with full_parameters(self.policy):
            batch = self.rollouts()
        self.keep_replay(batch)
        t1 = time.perf_counter()
        inputs, scores = self.predictions(batch)
        calibrated, correction_log = self.corrections(batch, scores)
        rewards, real_labelled = self.rewards(batch, scores, calibrated)
        advantages, advantage_log = self.advantages(batch, rewards)
        t2 = time.perf_counter()
        samples = self._samples(batch, advantages)
        update = self.update(batch, samples) if samples else {}
        wm_loss = self.cotrain_world_model(batch, inputs)
        t3 = time.perf_counter()
        self.step += 1
        self.counters["real_labels_used"] += int(real_labelled.sum())
        log = {**correction_log, **advantage_log, "samples": len(samples), **update, "wm_loss": wm_loss,
               "time_rollout": t1 - t0, "time_scoring": t2 - t1, "time_update": t3 - t2}
        return self._step_record(batch, scores, rewards, before, log)

    def cotrain_world_model(self, batch: StepBatch, inputs: dict[int, LabelledTrajectory]) -> float:
        """Update a trainable world model on the anchors' whole trajectories and real outcomes (NaN
        when it does not train; dense_raw uses no real labels, so it has none to learn from)."""
        grpo = self.recipe.grpo
        if self.wm_trainer is None or not batch.anchors.any() or grpo.reward_mode == "dense_raw":
            return float("nan")
        return self.wm_trainer.update([inputs[k] for k in inputs if batch.anchors[k]], grpo.wm_update_steps)

    def _step_record(self, batch: StepBatch, scores: np.ndarray, rewards: np.ndarray, before: dict,
                     log: dict) -> dict:
        """What the step logs. Under truncated or gated execution a cut rollout's outcome is unknown (its
        reward is a prediction): success is measured on the rollouts that ran to their end, and the cut
        ones' predicted success is logged apart."""
        valid, a = batch.valid, batch.anchors
        cut = batch.cut()
        known = valid & ~cut
        return {
            "step": self.step, "success_rate": float(batch.outcomes[known].mean()) if known.any() else float("nan"),
            "cut_rollouts": int(cut.sum()),
            "predicted_success_cut": float(np.nanmean((rewards if batch.predicted is None else batch.predicted)[cut]))
            if cut.any() else float("nan"),
            "rollouts": len(batch.trajectories), "failures": int((~valid).sum()),
            "anchor_fraction": float(a.sum() / max(valid.sum(), 1)),
            "reward_mean_anchor": _labelled_mean(rewards[a]), "reward_mean_wm": _labelled_mean(rewards[valid & ~a]),
            "wm_score_mean": float(np.nanmean(scores)) if valid.any() else float("nan"),
            **log, "resampled_groups": batch.resampled_groups, "skipped_groups": batch.skipped_groups,
            **self.counters,
            **{f"step_{k}": self.counters[k] - before[k] for k in (
                "real_episodes", "real_steps", "sim_steps", "real_steps_full", "real_steps_horizon",
                "truncated_episodes")},
        }

    def keep_replay(self, batch: StepBatch) -> None:
        """Put the step's rollouts that ran to their end in the replay store (`OUT/replay/`), where
        outcome probes learn from every real-labelled episode (each process its own)."""
        rank = f"_rank{self.dist.rank}" if self.dist.world_size > 1 else ""
        write_replay(self.out / "replay" / f"step_{self.step + 1:07d}{rank}.hdf5", batch.trajectories,
                     f"grpo step {self.step + 1}")

    def check_validation(self) -> dict:
        """Run the validation episodes with the current policy (split across processes under
        torchrun) and let the tracker decide; their real steps are counted apart from training's."""
        v, rank, world = self.recipe.validation, self.dist.rank, self.dist.world_size
        specs = [EpisodeSpec(task_id, pool[s], seed=validation_seed(t, s, k), tag=(task_id, s, k))
                 for t, (task_id, pool) in enumerate(self.validation_pools.items())
                 for s in range(len(pool)) for k in range(v.samples_per_state)]
        self.policy.eval()
        with full_parameters(self.policy):
            mine = self.validation_engine.run(specs[rank::world], progress=self.progress,
                                              desc=f"step {self.step} validation")
        outcomes = {}
        for part in self.dist.gather({t.spec.tag: (t.success, t.length) for t in mine}):
            outcomes.update(part)
        self.counters["validation_episodes"] += len(outcomes)
        self.counters["validation_real_steps"] += sum(length for _, length in outcomes.values())
        check = self.validation.update(self.step, {tag: success for tag, (success, _) in outcomes.items()})
        return check | {k: self.counters[k] for k in ("validation_episodes", "validation_real_steps")}

    def state_dict(self) -> dict:
        """Everything but the weights (the optimiser's full state: a collective when sharded)."""
        return {"step": self.step, "counters": dict(self.counters),
                "validation": self.validation.state_dict() if self.validation is not None else None,
                "gate": self.gate.state_dict() if self.gate is not None else None,
                "optimizer": optimizer_state(self.policy, self.optimizer),
                "debiaser": self.debiaser.state_dict(), "weighter": self.weighter.state_dict(),
                "wm_trainer": self.wm_trainer.state_dict() if self.wm_trainer else None,
                **global_rng_state()}

    def save(self) -> Path:
        """Every process calls it (gathering sharded state is a collective); rank 0 writes."""
        weights, state = policy_weights(self.policy), self.state_dict()
        if not self.dist.is_main:
            return self.out / "checkpoints" / f"step_{self.step:07d}"

        def write_models(directory: Path) -> None:
            write_policy(self.policy, directory, weights=weights)
            if isinstance(self.world_model, torch.nn.Module):
                self.world_model.save_pretrained(directory / "world_model")

        return save_checkpoint(self.out, self.step, asdict(self.recipe), state, write_models)

    def _load_training_state(self, directory: Path, state: dict) -> None:
        """All but the policy's weights, which `__init__` loads before sharding."""
        if isinstance(self.world_model, torch.nn.Module):
            load_weights(self.world_model, directory / "world_model" / "model.safetensors")
        self.step = state["step"]
        self.counters.update(state["counters"])
        load_optimizer_state(self.policy, self.optimizer, state["optimizer"])
        self.debiaser.load_state_dict(state["debiaser"])
        self.weighter.load_state_dict(state["weighter"])
        if self.wm_trainer is not None and state["wm_trainer"] is not None:
            self.wm_trainer.load_state_dict(state["wm_trainer"])
        if self.validation is not None and state.get("validation") is not None:
            self.validation.load_state_dict(state["validation"])
        if self.gate is not None:
            self.gate.load_state_dict(state["gate"])
        restore_global_rng(state)

    def close(self) -> None:
        if self.owns_envs:
            self.envs.close()


def train_grpo(recipe: GRPORecipe, envs=None, progress: bool = True) -> dict:
    """Train; under `torchrun` every process runs a share of the rollouts and only rank 0 writes."""
    check_input_paths(recipe, "grpo recipe")
    with run_lock(Path(recipe.out), "grpo"):
        return _train_grpo(recipe, envs, progress)


def _train_grpo(recipe: GRPORecipe, envs, progress: bool) -> dict:
    grpo, out = recipe.grpo, Path(recipe.out)
    random.seed(grpo.seed), np.random.seed(grpo.seed), torch.manual_seed(grpo.seed)
    resume = resume_checkpoint(out, asdict(recipe), RESUMABLE_CHANGES, asdict(GRPORecipe())) if recipe.resume else None
    trainer = GRPOTrainer(recipe, envs, progress, resume)
    main_process = trainer.dist.is_main
    log = None
    try:
        if main_process:
            (out / "recipe.json").write_text(json.dumps(asdict(recipe), indent=2, default=str))
            if resume is None:  # starting over: an earlier run's choice is not this one's
                (out / "best.json").unlink(missing_ok=True)
        log = MetricsLog(out, "grpo", trainer.step) if main_process else None
        history = list(log.history) if log else []
        budget_spent = lambda: 0 < grpo.real_step_budget <= trainer.counters["real_steps"]  # noqa: E731
        if trainer.validation is not None and trainer.validation.start is None:
            trainer.check_validation()  # the starting policy: the best until training beats it
            if main_process:
                write_best(out, trainer)
        stopped = trainer.validation is not None and trainer.validation.stopped_at is not None
        if stopped and main_process:
            print(f"grpo: this run stopped early at step {trainer.validation.stopped_at} (validation fell); not "
                  "training further (resume=false to start over)", file=sys.stderr)
        for _ in tqdm(range(trainer.step, grpo.steps), desc="grpo", disable=not trainer.progress, initial=trainer.step,
                      total=grpo.steps):
            if budget_spent() or stopped:
                break
            record = trainer.train_step()
            check = {}
            if trainer.validation is not None and (trainer.step % recipe.validation.every == 0
                                                   or trainer.step == grpo.steps):
                check = trainer.check_validation()
                record.update(check)
            if log is not None:  # before the checkpoint: a resume never loses a step's record
                log.write(record)
            history.append(record)
            stop = check.get("val_stop", False)
            if (trainer.step % grpo.save_every == 0 or trainer.step == grpo.steps or budget_spent()
                    or check.get("val_improved") or stop):
                trainer.save()
                trainer.dist.barrier()
                if check.get("val_improved") and main_process:
                    write_best(out, trainer)
            if stop:
                if main_process:
                    print(f"grpo: validation success fell from {check['val_success_start']:.3f} to "
                          f"{check['val_success']:.3f} (lost {check['val_lost']}, gained {check['val_gained']} "
                          f"episodes, p = {check['val_p_worse']:.3g}): stopped at step {trainer.step}; the best "
                          f"checkpoint is step {check['val_best_step']}", file=sys.stderr)
                break
        keep_best = trainer.validation is not None and recipe.validation.keep_best
        result = selected_checkpoint(out) if keep_best else latest_checkpoint(out)
        return {"history": history, "checkpoint": str(result), "trainer": trainer}
    finally:
        if log is not None:
            log.close()
        trainer.close()


def write_best(out: Path, trainer: GRPOTrainer) -> None:
    """`best.json`: the checkpoint with the best validation success so far (step 0: the starting one)."""
    tracker = trainer.validation
    checkpoint = (trainer.recipe.policy.checkpoint if tracker.best_step == 0
                  else str(out / "checkpoints" / f"step_{tracker.best_step:07d}"))
    with atomic_file(out / "best.json") as tmp:
        tmp.write_text(json.dumps({"step": tracker.best_step, "val_success": tracker.best_success,
                                   "checkpoint": checkpoint}, indent=2))


def main(args) -> None:
    recipe = load_recipe(GRPORecipe, Path(args.recipe), args.overrides)
    result = train_grpo(recipe)
    for r in result["history"][-3:]:
        print(f"step {r['step']}: success {r['success_rate']:.3f}, anchor weight {r['anchor_weight']:.2f}, "
              f"calibrated {bool(r['calibrated'])}, real episodes {r['real_episodes']}")
    print(f"checkpoint: {result['checkpoint']}")
