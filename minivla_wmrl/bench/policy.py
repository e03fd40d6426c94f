"""`minivla-wmrl bench policy`: action queries per second, batched KV-cache generation vs a naive loop,
and how much of the hardware the batched generation uses.

The naive loop is what a simple rollout does: one environment at a time, and every one of the 7
action tokens recomputes the whole sequence (no cache). Both run side by side on the same random
weights, images and instructions.

Utilisation: the FLOPs of one batched `generate` call are counted by torch's `FlopCounterMode` on
the call itself (every matmul, convolution and attention the two ViTs, the projector, the prefill,
the 6 cached decode steps and the LM head run), so achieved TFLOP/s = FLOPs per query × queries/s;
the fraction of peak needs the device's peak for the policy's dtype (`--peak-tflops`, or the
table below for a known GPU in bfloat16).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode
from tqdm import tqdm

from minivla_wmrl.infra.outputs import write_json_output
from minivla_wmrl.policy import MiniVLA, preset
from minivla_wmrl.policy.config import DTYPES
from minivla_wmrl.policy.action_tokenizer import ActionTokenizer
from minivla_wmrl.policy.tokenizer import tiny_qwen_style_tokenizer

INSTRUCTIONS = ["close the top drawer of the cabinet", "put the black bowl on the plate",
                "turn on the stove", "pick up the alphabet soup and place it in the basket"]


# bf16 peak, TFLOP/s, by a substring of torch.cuda.get_device_name(): the figure the project's GPU
# measurements are quoted against (issue 35); other devices take --peak-tflops
PEAK_BF16_TFLOPS = {"H200": 790.0}


def peak_tflops(device: str, dtype: str, given: float | None) -> float | None:
    """The peak to compare with: the flag's, or the table's for a known GPU in bfloat16 (None: unknown)."""
    if given is not None:
        return given
    if dtype != "bfloat16" or not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(torch.device(device))
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)


@torch.no_grad()
def generation_flops(policy: MiniVLA, images: np.ndarray, instructions: list[str]) -> int:
    """The FLOPs of one batched `generate` call, counted op by op as it runs."""
    with FlopCounterMode(display=False) as counter:
        policy.generate(images, instructions)
    return counter.get_total_flops()


@torch.no_grad()
def naive_query(policy: MiniVLA, image: np.ndarray, instruction: str) -> torch.Tensor:
    """Greedy action tokens for one env, recomputing the full sequence for every token."""
    embeds, mask = policy.prefix(image[None], [instruction])
    embed = policy.llm.get_input_embeddings()
    tokens = []
    for _ in range(policy.config.num_action_tokens):
        logits = policy.llm(inputs_embeds=embeds, attention_mask=mask).logits[:, -1]
        tokens.append(logits.argmax(-1))
        embeds = torch.cat([embeds, embed(tokens[-1][:, None])], dim=1)
        mask = torch.cat([mask, mask.new_ones(1, 1)], dim=1)
    return torch.stack(tokens, dim=1)


def bench_policy(preset_name: str = "small", batch: int = 64, repeats: int = 3, naive_queries: int = 8,
                 device: str = "cpu", seed: int = 0, dtype: str = "float32", peak: float | None = None) -> dict:
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: expected one of {sorted(DTYPES)}")
    torch.manual_seed(seed)
    config = preset(preset_name)
    policy = MiniVLA(config, tiny_qwen_style_tokenizer(), ActionTokenizer()).to(device, DTYPES[dtype]).eval()
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (batch, config.image_size, config.image_size, 3), dtype=np.uint8)
    instructions = [INSTRUCTIONS[i % len(INSTRUCTIONS)] for i in range(batch)]
    policy.generate(images[:2], instructions[:2])  # warm-up
    batched = []
    for _ in tqdm(range(repeats), desc=f"batched x{batch}"):
        start = time.perf_counter()
        query = policy.generate(images, instructions)
        batched.append(time.perf_counter() - start)
    naive_queries = min(naive_queries, batch)
    start = time.perf_counter()
    for i in tqdm(range(naive_queries), desc="naive"):
        tokens = naive_query(policy, images[i], instructions[i])
        if not torch.equal(tokens[0], query.token_ids[i]):
            raise RuntimeError("naive and batched generation disagree; the benchmark would compare different work")
    naive_s = time.perf_counter() - start
    batched_qps = batch / float(np.median(batched))
    naive_qps = naive_queries / naive_s
    flops_per_query = generation_flops(policy, images, instructions) / batch
    achieved = flops_per_query * batched_qps / 1e12
    peak = peak_tflops(device, dtype, peak)
    return {"preset": preset_name, "batch": batch, "device": device, "dtype": dtype,
            "batched_queries_per_s": batched_qps, "naive_queries_per_s": naive_qps, "ratio": batched_qps / naive_qps,
            "repeats": repeats, "naive_queries": naive_queries,
            "parameters": sum(p.numel() for p in policy.parameters()),
            "tflop_per_query": flops_per_query / 1e12, "achieved_tflops": achieved, "peak_tflops": peak,
            "fraction_of_peak": achieved / peak if peak else None}


def main(args) -> None:
    result = bench_policy(args.preset, args.batch, args.repeats, args.naive_queries, args.device, dtype=args.dtype,
                          peak=args.peak_tflops)
    print(f"policy {result['preset']} ({result['parameters'] / 1e6:.1f} M params), {result['device']} "
          f"{result['dtype']}: batched KV-cache x{result['batch']}: {result['batched_queries_per_s']:.2f} queries/s; "
          f"one at a time, no cache: {result['naive_queries_per_s']:.2f} queries/s; ratio {result['ratio']:.1f}x")
    utilisation = (f"{100 * result['fraction_of_peak']:.1f}% of a {result['peak_tflops']:g} TFLOP/s peak"
                   if result["peak_tflops"] else "peak unknown (--peak-tflops)")
    print(f"{result['tflop_per_query'] * 1e3:.2f} GFLOP per query: {result['achieved_tflops']:.3f} TFLOP/s achieved, "
          f"{utilisation}")
    if args.json:
        write_json_output(Path(args.json), result)
