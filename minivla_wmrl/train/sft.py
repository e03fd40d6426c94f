"""`minivla-wmrl sft RECIPE [key=value ...]`: supervised fine-tuning of MiniVLA on demonstrations.

Reads the demos, splits episodes into train and held out, computes the BOUNDS_Q99 statistics,
trains (or loads) the action tokenizer, then trains the policy with teacher forcing on the 7
action tokens and the two end tokens. AdamW at a constant lr with grad clipping and gradient
accumulation; bf16 autocast on CUDA. Metrics go to `metrics.jsonl` and TensorBoard; checkpoints
(`checkpoints/step_N/`: the policy, its training state and recipe; see `minivla_wmrl.infra.run_checkpoint`)
are atomic, and a run restarted with the same recipe resumes from the latest one with the same
data order, RNG and optimizer state.
"""

from __future__ import annotations

import json
import random
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler
from tqdm import tqdm

from minivla_wmrl.data.chunks import episode_chunks
from minivla_wmrl.data.dataset import DemoDataset, collate, read_episodes
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
    restore_global_rng,
    resume_checkpoint,
    run_lock,
    save_checkpoint,
)
from minivla_wmrl.infra.run_log import MetricsLog
from minivla_wmrl.policy import MiniVLA, preset
from minivla_wmrl.policy.action_tokenizer import ActionTokenizer, ActionTokenizerConfig
from minivla_wmrl.policy.config import DTYPES, PolicyDtype
from minivla_wmrl.policy.normalization import ActionStatistics
from minivla_wmrl.policy.storage import write_policy
from minivla_wmrl.policy.tokenizer import add_action_tokens, tiny_qwen_style_tokenizer
from minivla_wmrl.train.vq import VQTrainConfig, split_episodes, train_action_tokenizer


@dataclass
class DataConfig:
    # LIBERO hdf5 files, directories of them, or LeRobot datasets
    paths: Annotated[list[str], InputPath("either")] = field(default_factory=list)
    val_fraction: Annotated[float, Range(0, below=1)] = 0.1  # episodes held out for validation
    image_key: str = "agentview_rgb"
    wrist_key: str | None = None  # e.g. "eye_in_hand_rgb" for a two-image policy
    image_convention: Literal["minivla", "openvla"] = "minivla"  # must match the env setting used at evaluation
    chunk_len: Annotated[int, Range(1)] = 8
    dataset_name: str = "libero"  # key in dataset_statistics.json
    # e.g. 1: one demo per task (the WMRL paper's LIBERO-Long SFT)
    max_demos_per_file: Annotated[int | None, Range(1)] = None


@dataclass
class PolicySetup:
    preset: str = "tiny"
    # "tiny" (built in code) or a Qwen2.5 tokenizer directory
    tokenizer: Annotated[str, InputPath("dir", names=("tiny",))] = "tiny"
    # start from one of our checkpoints (e.g. an imported MiniVLA)
    init_checkpoint: Annotated[str | None, InputPath("dir")] = None
    lora: bool = False  # MiniVLA's released SFT is a full fine-tune
    lora_r: Annotated[int, Range(1)] = 16
    lora_alpha: Annotated[int, Range(1)] = 32
    freeze_vision: bool = False
    device: Annotated[str, RUNTIME] = "cpu"
    dtype: PolicyDtype = "float32"  # "bfloat16": autocast on CUDA
    # under torchrun: shard parameters, gradients and optimiser state (FSDP2), not a copy per process (DDP)
    fsdp: Annotated[bool, RESUMABLE] = False
    # recompute activations in the backward pass (ViT blocks, LM layers): less memory, same gradients
    activation_checkpointing: Annotated[bool, RUNTIME] = False


@dataclass
class VQSetup:
    # an existing action tokenizer (ours or the released MiniVLA VQ folder)
    path: Annotated[str | None, InputPath("dir")] = None
    train: VQTrainConfig = field(default_factory=VQTrainConfig)


@dataclass
class SFTConfig:
    steps: Annotated[int, Range(0), RESUMABLE] = 1000
    batch_size: Annotated[int, Range(1)] = 16
    grad_accum: Annotated[int, Range(1)] = 1
    lr: Annotated[float, Range(0)] = 2e-5  # MiniVLA: constant
    weight_decay: Annotated[float, Range(0)] = 0.0
    grad_clip: Annotated[float, Range(0)] = 1.0
    log_every: Annotated[int, Range(1), RESUMABLE] = 10
    eval_every: Annotated[int, Range(1), RESUMABLE] = 100
    save_every: Annotated[int, Range(1), RESUMABLE] = 500
    val_batches: Annotated[int, Range(0), RESUMABLE] = 4
    num_workers: Annotated[int, Range(0), RUNTIME] = 0
    seed: Seed = 0


@dataclass
class SFTRecipe:
    out: Annotated[str, RUNTIME] = "runs/sft"
    resume: Annotated[bool, RUNTIME] = True  # continue from the latest checkpoint in `out` when there is one
    data: DataConfig = field(default_factory=DataConfig)
    policy: PolicySetup = field(default_factory=PolicySetup)
    vq: VQSetup = field(default_factory=VQSetup)
    sft: SFTConfig = field(default_factory=SFTConfig)


# settings a resume may change: how long, how often to log and save, where it runs
RESUMABLE_CHANGES = marked_keys(SFTRecipe, RESUMABLE)


class ResumableBatchSampler(Sampler):
    """Global batches of a fresh seeded permutation each epoch (last partial batch dropped), from any
    batch index; under DDP each process yields its shard of every global batch."""

    def __init__(self, size: int, batch_size: int, seed: int, start_batch: int = 0, shard=None):
        if size < batch_size:
            raise ValueError(f"{size} training samples are fewer than one batch of {batch_size}")
        self.size, self.batch_size, self.seed, self.start_batch = size, batch_size, seed, start_batch
        self.per_epoch = size // batch_size
        self.shard = shard or (lambda batch: batch)  # under DDP: this process's share of each global batch

    def __iter__(self):
        batch = self.start_batch
        while True:
            epoch, offset = divmod(batch, self.per_epoch)
            order = np.random.default_rng((self.seed, epoch)).permutation(self.size)
            for b in range(offset, self.per_epoch):
                yield self.shard(order[b * self.batch_size:(b + 1) * self.batch_size].tolist())
            batch = (epoch + 1) * self.per_epoch

    def __len__(self) -> int:
        return 2**62


def _tokenizer(spec: str):
    if spec == "tiny":
        return tiny_qwen_style_tokenizer()
    from transformers import AutoTokenizer  # transformers: seconds to import; the tiny tokenizer needs none

    if not Path(spec).is_dir():
        raise FileNotFoundError(f"policy.tokenizer {spec!r} is neither 'tiny' nor a local tokenizer directory "
                                "(Qwen2.5-0.5B's tokenizer is published at huggingface.co/Qwen/Qwen2.5-0.5B)")
    tokenizer = AutoTokenizer.from_pretrained(spec)
    add_action_tokens(tokenizer)
    return tokenizer


def gripper_convention(episodes) -> str:
    conventions = {e.gripper_convention for e in episodes}
    if len(conventions) != 1:
        raise ValueError(f"the demonstrations mix gripper conventions {sorted(conventions)}; train on one kind")
    return conventions.pop()


def step_metrics(policy: MiniVLA, batch: dict, autocast,
                 model: torch.nn.Module | None = None) -> tuple[torch.Tensor, dict]:
    """Cross entropy on action + end tokens, action-token accuracy, L1 of the decoded first action.
    `model` is the policy or its DistributedDataParallel wrapper."""
    targets = policy.sft_targets(batch["chunk"])
    with autocast():
        logits = (model or policy)(batch["image"], batch["instruction"], targets)
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    n = policy.config.num_action_tokens
    predicted = logits[:, :n].argmax(-1)
    accuracy = (predicted == targets[:, :n]).float().mean()
    decoded = policy.decode_tokens(predicted, torch.zeros_like(predicted, dtype=torch.float32)).normalized_chunks
    l1 = np.abs(decoded[:, 0] - batch["chunk"][:, 0].numpy()).mean()
    return loss, {"loss": loss.item(), "action_accuracy": accuracy.item(), "l1_first_action": float(l1)}


def train_sft(recipe: SFTRecipe, progress: bool = True) -> dict:
    """Train; under `torchrun` every process trains its shard of each global batch (`sft.batch_size`)
    with gradients averaged over processes (DDP, or FSDP with `policy.fsdp`), and only rank 0 writes
    logs and checkpoints."""
    check_config(recipe, "sft recipe")
    check_input_paths(recipe, "sft recipe")
    dist = init_distributed(recipe.policy.device)
    recipe.policy.device = dist.device(recipe.policy.device)
    with run_lock(Path(recipe.out), "sft") if dist.is_main else nullcontext():
        return _train_sft(recipe, dist, progress)


def _train_sft(recipe: SFTRecipe, dist, progress: bool) -> dict:
    settings, out = recipe.sft, Path(recipe.out)
    progress = progress and dist.is_main
    random.seed(settings.seed), np.random.seed(settings.seed), torch.manual_seed(settings.seed)
    episodes = read_episodes(recipe.data.paths, recipe.data.chunk_len, recipe.data.image_key, recipe.data.wrist_key,
                             recipe.data.max_demos_per_file)
    train_ids, val_ids = split_episodes(len(episodes), recipe.data.val_fraction, settings.seed)
    statistics = ActionStatistics.from_actions(np.concatenate([episodes[i].actions for i in train_ids]),
                                               num_trajectories=len(train_ids))
    recipe_record = asdict(recipe)
    resumed = resume_checkpoint(out, recipe_record, RESUMABLE_CHANGES, asdict(SFTRecipe())) if recipe.resume else None
    resume_from, state = resumed if resumed is not None else (None, None)

    device = torch.device(recipe.policy.device)
    dtype = DTYPES[recipe.policy.dtype]
    if resume_from is not None:
        policy = MiniVLA.from_pretrained(resume_from, device=recipe.policy.device)
    elif recipe.policy.init_checkpoint:
        policy = MiniVLA.from_pretrained(recipe.policy.init_checkpoint, device=recipe.policy.device)
        policy.statistics = statistics
    else:
        if recipe.vq.path:
            action_tokenizer = ActionTokenizer.from_pretrained(Path(recipe.vq.path))
        else:
            def chunks(ids):
                return np.concatenate([episode_chunks(statistics.normalize(episodes[i].actions), recipe.data.chunk_len)
                                       for i in ids])

            action_tokenizer, _ = train_action_tokenizer(
                chunks(train_ids), chunks(val_ids) if len(val_ids) else None,
                ActionTokenizerConfig(chunk_len=recipe.data.chunk_len, action_dim=episodes[0].actions.shape[1]),
                recipe.vq.train, progress=progress)
        config = preset(recipe.policy.preset)
        config.gripper_convention = gripper_convention(episodes)
        policy = MiniVLA(config, _tokenizer(recipe.policy.tokenizer), action_tokenizer, statistics).to(device)
    setup = recipe.policy
    policy.configure_training(setup.lora, setup.lora_r, setup.lora_alpha, setup.freeze_vision)
    policy.set_activation_checkpointing(setup.activation_checkpointing)
    policy.train()
    sharded = setup.fsdp and dist.enabled
    if sharded:
        shard_policy(policy)

    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=settings.lr, weight_decay=settings.weight_decay)
    start_step = 0
    if state is not None:
        load_optimizer_state(policy, optimizer, state["optimizer"])
        restore_global_rng(state)
        start_step = state["step"]

    def dataset(ids):
        return DemoDataset([episodes[i] for i in ids], policy.statistics, recipe.data.chunk_len,
                           policy.config.image_size, recipe.data.image_key, recipe.data.wrist_key,
                           recipe.data.image_convention)

    train_set = dataset(train_ids)
    sampler = ResumableBatchSampler(len(train_set), settings.batch_size, settings.seed,
                                    start_step * settings.grad_accum, dist.shard)
    loader = DataLoader(train_set, batch_sampler=sampler, collate_fn=collate, num_workers=settings.num_workers)
    val_set = dataset(val_ids) if len(val_ids) else None
    use_bf16 = dtype == torch.bfloat16 and device.type == "cuda"

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_bf16)

    batches = iter(loader)
    history, last = [], {}

    def save(step: int) -> None:
        """Every process calls it (gathering sharded state is a collective); rank 0 writes."""
        weights, optimizer_full = policy_weights(policy), optimizer_state(policy, optimizer)
        if not dist.is_main:
            return
        save_checkpoint(out, step, recipe_record,
                        {"optimizer": optimizer_full, "step": step, **global_rng_state()},
                        lambda directory: write_policy(policy, directory, recipe.data.dataset_name, weights))

    model = policy if sharded else dist.wrap(policy)
    if dist.is_main:  # once the run is set up: a run refused before this point leaves no directory
        (out / "recipe.json").write_text(json.dumps(recipe_record, indent=2))
    log = MetricsLog(out, "sft", start_step) if dist.is_main else None
    if log is not None and log.history:  # a finished run re-run (the documented resume) reports where it stands
        last = log.history[-1]
    try:
        for step in tqdm(range(start_step + 1, settings.steps + 1), desc="sft", disable=not progress,
                         initial=start_step, total=settings.steps):
            totals = {}
            for _ in range(settings.grad_accum):
                loss, metrics = step_metrics(policy, next(batches), autocast, model)
                (loss / settings.grad_accum).backward()
                for k, v in metrics.items():
                    totals[k] = totals.get(k, 0.0) + v / settings.grad_accum
            grad_norm = clip_gradients(trainable, settings.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            record = {"step": step, **dist.mean(totals), "grad_norm": grad_norm, "lr": settings.lr}
            if val_set is not None and (step % settings.eval_every == 0 or step == settings.steps):
                with full_parameters(policy):  # rank 0 alone runs forward passes
                    if dist.is_main:
                        record.update(validate(policy, val_set, settings, autocast))
            if log is not None and (step % settings.log_every == 0 or step == settings.steps or "val_loss" in record):
                log.write(record)
            history.append(record)
            last = record
            if step % settings.save_every == 0 or step == settings.steps:
                save(step)
                dist.barrier()
    finally:
        if log is not None:
            log.close()
    return {"history": history, "last": last, "checkpoint": str(latest_checkpoint(out))}


@torch.no_grad()
def validate(policy: MiniVLA, val_set: DemoDataset, settings: SFTConfig, autocast) -> dict:
    policy.eval()
    size = min(settings.batch_size, len(val_set))
    totals, count = {}, 0
    for b in range(min(settings.val_batches, len(val_set) // size)):
        batch = collate([val_set[i] for i in range(b * size, (b + 1) * size)])
        _, metrics = step_metrics(policy, batch, autocast)
        for k, v in metrics.items():
            totals[k] = totals.get(k, 0.0) + v
        count += 1
    policy.train()
    return {f"val_{k}": v / max(count, 1) for k, v in totals.items()}


def main(args) -> None:
    recipe = load_recipe(SFTRecipe, Path(args.recipe), args.overrides)
    result = train_sft(recipe)
    last = result["last"]
    if not last:
        print(f"nothing to do: no step to train (sft.steps {recipe.sft.steps}); checkpoint: {result['checkpoint']}")
        return
    print(f"step {last['step']}: loss {last['loss']:.4f}, action-token accuracy {last['action_accuracy']:.3f}"
          + (f", held-out accuracy {last['val_action_accuracy']:.3f}" if "val_action_accuracy" in last else ""))
    print(f"checkpoint: {result['checkpoint']}")
