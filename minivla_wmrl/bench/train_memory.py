"""`minivla-wmrl bench train-memory`: the peak memory of one training step, with and without activation
checkpointing, side by side on the same weights and batch.

A step is the forward, backward and AdamW step over `batch` samples of the policy's action tokens:
`sft` trains everything (MiniVLA's full fine-tune), `grpo` the language model's LoRA adapters with the
vision frozen (the recipes' GRPO update). Each configuration runs in a fresh process, so each peak is
its own: on CUDA `torch.cuda.max_memory_allocated` (tensors only), on the CPU the process's peak
resident set (`ru_maxrss`, which also holds the interpreter and the weights). No ratio is printed
unless both steps computed the same loss.
"""

from __future__ import annotations

import resource
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch

from minivla_wmrl.bench.policy import INSTRUCTIONS
from minivla_wmrl.infra.outputs import write_json_output
from minivla_wmrl.policy import MiniVLA, preset
from minivla_wmrl.policy.action_tokenizer import ActionTokenizer
from minivla_wmrl.policy.config import DTYPES
from minivla_wmrl.policy.tokenizer import tiny_qwen_style_tokenizer

SETTINGS = ("sft", "grpo")


def step_peak(preset_name: str, batch: int, setting: str, checkpointing: bool, device: str, dtype: str,
              lora_r: int = 32, seed: int = 0) -> dict:
    """One training step in this process; its loss and peak memory in MB."""
    torch.manual_seed(seed)
    config = preset(preset_name)
    policy = MiniVLA(config, tiny_qwen_style_tokenizer(), ActionTokenizer()).to(device, DTYPES[dtype])
    lora = setting == "grpo"
    policy.configure_training(lora=lora, lora_r=lora_r, lora_alpha=2 * lora_r, freeze_vision=lora)
    policy.set_activation_checkpointing(checkpointing)
    policy.train()
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (batch, config.image_size, config.image_size, 3), dtype=np.uint8)
    instructions = [INSTRUCTIONS[i % len(INSTRUCTIONS)] for i in range(batch)]
    tokens = policy.vocab_len - 1 - torch.as_tensor(rng.integers(0, config.codebook_size,
                                                                   (batch, config.num_action_tokens)))
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-5)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
    logits = policy.target_logits(images, instructions, tokens)
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                             tokens.to(logits.device).reshape(-1))
    loss.backward()
    optimizer.step()
    if device.startswith("cuda"):
        peak = torch.cuda.max_memory_allocated(device) / 2**20
    else:  # ru_maxrss: kilobytes on Linux, bytes on macOS
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**20 if sys.platform == "darwin" else 2**10)
    return {"loss": loss.item(), "peak_mb": peak}


def bench_train_memory(preset_name: str = "tiny", batch: int = 8, setting: str = "sft", device: str = "cpu",
                       dtype: str = "float32", lora_r: int = 32) -> dict:
    if setting not in SETTINGS:
        raise ValueError(f"--setting {setting!r}: expected one of {SETTINGS}")
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: expected one of {sorted(DTYPES)}")
    runs = {}
    for checkpointing in (False, True):  # a fresh process each: each peak is its own
        with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
            runs[checkpointing] = pool.submit(step_peak, preset_name, batch, setting, checkpointing, device, dtype,
                                              lora_r).result()
    plain, recomputed = runs[False], runs[True]
    if not np.isclose(plain["loss"], recomputed["loss"], rtol=1e-4):
        raise RuntimeError(f"the two steps computed different losses ({plain['loss']} and {recomputed['loss']}); "
                           "the benchmark would compare different work")
    return {"preset": preset_name, "batch": batch, "setting": setting, "device": device, "dtype": dtype,
            "measure": "cuda max_memory_allocated" if device.startswith("cuda") else "peak resident set (ru_maxrss)",
            "loss": plain["loss"], "peak_mb": plain["peak_mb"], "peak_mb_checkpointing": recomputed["peak_mb"],
            "ratio": plain["peak_mb"] / recomputed["peak_mb"]}


def main(args) -> None:
    result = bench_train_memory(args.preset, args.batch, args.setting, args.device, args.dtype, args.lora_r)
    print(f"{result['setting']} step, policy {result['preset']}, batch {result['batch']}, {result['device']} "
          f"{result['dtype']} ({result['measure']}): {result['peak_mb']:.0f} MB; with activation checkpointing "
          f"{result['peak_mb_checkpointing']:.0f} MB ({result['ratio']:.2f}x less); the same loss {result['loss']:.4f}")
    if args.json:
        write_json_output(Path(args.json), result)
