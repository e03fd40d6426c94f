"""`minivla-wmrl bench train-memory`: the peak memory of one training step, with and without activation
checkpointing, side by side on the same weights and batch.

A step is the forward, backward and AdamW step over `batch` samples of the policy's action tokens,
in the stage's own precision: `sft` trains everything (MiniVLA's full fine-tune) on float32 weights,
under bfloat16 autocast when its dtype is bfloat16 on CUDA, as `sft` does; `grpo` trains the
language model's LoRA adapters with the vision frozen on weights in its dtype, as `grpo` loads them.
`--recipe` takes the stage's settings (preset, batch or minibatch, LoRA rank, frozen vision, dtype,
device) from a pipeline recipe: the memory of the product's own update. Each configuration runs in a
fresh process, so each peak is its own: on CUDA `torch.cuda.max_memory_allocated` (tensors only), on
the CPU the process's peak resident set (`ru_maxrss`, which also holds the interpreter and the
weights). A step that runs out of memory is reported as such. No ratio is printed unless both
steps ran and computed the same loss.
"""

from __future__ import annotations

import resource
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch

from minivla_wmrl.bench.policy import INSTRUCTIONS, random_policy
from minivla_wmrl.infra.outputs import write_json_output
from minivla_wmrl.policy.config import DTYPES

SETTINGS = ("sft", "grpo")


@dataclass
class TrainStep:
    """What one measured step trains, and how."""

    setting: str = "sft"  # sft: everything; grpo: LoRA adapters, vision frozen
    preset: str = "tiny"
    batch: int = 8
    device: str = "cpu"
    dtype: str = "float32"
    lora_r: int = 32  # grpo only
    lora_alpha: int = 64

    def check(self) -> None:
        if self.setting not in SETTINGS:
            raise ValueError(f"--setting {self.setting!r}: expected one of {SETTINGS}")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype {self.dtype!r}: expected one of {sorted(DTYPES)}")


def recipe_step(path: str, setting: str) -> TrainStep:
    """The SFT step (its batch) or the GRPO update's minibatch as a pipeline recipe sets them."""
    from minivla_wmrl.infra.config import load_recipe
    from minivla_wmrl.pipeline import PipelineRecipe  # the recipe's classes: only --recipe needs them

    recipe = load_recipe(PipelineRecipe, Path(path))
    if setting == "sft":
        policy = recipe.sft.policy
        if policy.lora or policy.freeze_vision:
            raise ValueError(f"recipe {path}: its sft trains LoRA adapters or freezes the vision; this bench measures "
                             "a full fine-tune")
        return TrainStep("sft", policy.preset, recipe.sft.sft.batch_size, policy.device, policy.dtype)
    policy = recipe.grpo.policy
    if not (policy.lora and policy.freeze_vision):
        raise ValueError(f"recipe {path}: its grpo trains more than LoRA adapters on a frozen vision; this bench "
                         "measures that setting only")
    return TrainStep("grpo", recipe.sft.policy.preset, recipe.grpo.grpo.minibatch_size, policy.device, policy.dtype,
                     policy.lora_r, policy.lora_alpha)


def step_peak(step: TrainStep, checkpointing: bool, seed: int = 0) -> dict:
    """One training step in this process; its loss and peak memory in MB (None for both: out of memory)."""
    torch.manual_seed(seed)
    cuda = step.device.startswith("cuda")
    sft = step.setting == "sft"
    weights = torch.float32 if sft else DTYPES[step.dtype]  # sft keeps float32 weights and autocasts
    policy = random_policy(step.preset, step.device, weights)
    config = policy.config
    policy.configure_training(lora=not sft, lora_r=step.lora_r, lora_alpha=step.lora_alpha, freeze_vision=not sft)
    policy.set_activation_checkpointing(checkpointing)
    policy.train()
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if sft and cuda and step.dtype == "bfloat16"
                else nullcontext())
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (step.batch, config.image_size, config.image_size, 3), dtype=np.uint8)
    instructions = [INSTRUCTIONS[i % len(INSTRUCTIONS)] for i in range(step.batch)]
    tokens = policy.vocab_len - 1 - torch.as_tensor(rng.integers(0, config.codebook_size,
                                                                   (step.batch, config.num_action_tokens)))
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-5)
    if cuda:
        torch.cuda.reset_peak_memory_stats(step.device)
    try:
        with autocast:
            logits = policy.target_logits(images, instructions, tokens)
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                 tokens.to(logits.device).reshape(-1))
        loss.backward()
        optimizer.step()
    except torch.OutOfMemoryError:
        return {"loss": None, "peak_mb": None, "failed": "out of device memory"}
    if cuda:
        peak = torch.cuda.max_memory_allocated(step.device) / 2**20
    else:  # ru_maxrss: kilobytes on Linux, bytes on macOS
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**20 if sys.platform == "darwin" else 2**10)
    return {"loss": loss.item(), "peak_mb": peak, "failed": None}


def bench_train_memory(step: TrainStep) -> dict:
    step.check()
    runs = {}
    for checkpointing in (False, True):  # a fresh process each: each peak is its own
        with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
            try:
                runs[checkpointing] = pool.submit(step_peak, step, checkpointing).result()
            except BrokenProcessPool:  # what the kernel's OOM killer leaves
                runs[checkpointing] = {"loss": None, "peak_mb": None, "failed": "process killed (out of host memory?)"}
    plain, recomputed = runs[False], runs[True]
    both = plain["loss"] is not None and recomputed["loss"] is not None
    if both and not np.isclose(plain["loss"], recomputed["loss"], rtol=1e-4):
        raise RuntimeError(f"the two steps computed different losses ({plain['loss']} and {recomputed['loss']}); "
                           "the benchmark would compare different work")
    return asdict(step) | {
        "measure": "cuda max_memory_allocated" if step.device.startswith("cuda") else "peak resident set (ru_maxrss)",
        "loss": plain["loss"] if plain["loss"] is not None else recomputed["loss"],
        "peak_mb": plain["peak_mb"], "peak_mb_checkpointing": recomputed["peak_mb"],
        "failed": plain["failed"], "failed_checkpointing": recomputed["failed"],
        "ratio": plain["peak_mb"] / recomputed["peak_mb"] if both else None}


def main(args) -> None:
    flags = {"--preset": args.preset, "--batch": args.batch, "--dtype": args.dtype, "--lora-r": args.lora_r}
    if args.recipe:
        given = [flag for flag, value in flags.items() if value is not None]
        if given:
            raise ValueError(f"--recipe sets the step; {', '.join(given)} would contradict it (only --device may be "
                             "given with it)")
        step = recipe_step(args.recipe, args.setting)
        step = replace(step, device=args.device or step.device)
    else:
        lora_r = args.lora_r or 32
        step = TrainStep(args.setting, args.preset or "tiny", args.batch or 8, args.device or "cpu",
                         args.dtype or "float32", lora_r, 2 * lora_r)
    result = bench_train_memory(step)

    def peak(suffix: str) -> str:
        return result["failed" + suffix] or f"{result['peak_mb' + suffix]:.0f} MB"

    summary = (f"{result['setting']} step, policy {result['preset']}, batch {result['batch']}, {result['device']} "
               f"{result['dtype']} ({result['measure']}): {peak('')}; with activation checkpointing "
               f"{peak('_checkpointing')}")
    print(summary + (f" ({result['ratio']:.2f}x less); the same loss {result['loss']:.4f}" if result["ratio"] else ""))
    if args.json:
        write_json_output(Path(args.json), result)
