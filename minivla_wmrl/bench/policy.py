"""`minivla-wmrl bench policy`: action queries per second, batched KV-cache generation vs a naive loop,
and how much of the hardware the batched generation uses.

The naive loop is what a simple rollout does: one environment at a time, and every one of the 7
action tokens recomputes the whole sequence (no cache), greedily. The batched call is timed as
rollouts make it (sampled from per-row uniforms; its greedy tokens are what the naive loop must
reproduce) in each decoding asked for (`--decoding`: dynamic, static, compiled; see
`policy/decoding.py`), each checked to give the dynamic cache's tokens before its rate is printed
(all of them in float32; in bfloat16, whose rounding moves near-boundary samples, 95%).
All run side by side on the same random weights, images and instructions. The dynamic call is also
split into its stages (vision + projector, the language model's prefill, the 6 decode steps), and
`--profile` adds torch.profiler's table of the ops of one call: where a query's time goes.

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
from minivla_wmrl.policy.action_tokenizer import ActionTokenizer
from minivla_wmrl.policy.config import DTYPES
from minivla_wmrl.policy.decoding import DECODINGS, DynamicDecoding
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


def random_policy(preset_name: str, device: str, dtype: torch.dtype) -> MiniVLA:
    """A policy of the preset with random weights (the code-built test tokenizer), initialised on
    `device` itself: MiniVLA-1B's 1.25 B parameters take ~25 s to initialise on 2 CPU cores."""
    action_tokenizer = ActionTokenizer()  # the policy keeps it on the CPU
    with torch.device(device):
        policy = MiniVLA(preset(preset_name), tiny_qwen_style_tokenizer(), action_tokenizer)
    return policy.to(dtype=dtype)


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


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))


@torch.no_grad()
def stage_seconds(policy: MiniVLA, images: np.ndarray, instructions: list[str], device: str) -> dict:
    """One dynamic-cache generate call timed stage by stage (greedy, the device synchronised between)."""
    times, start = {}, time.perf_counter()

    def lap(name: str) -> None:
        nonlocal start
        _synchronize(device)
        times[name] = time.perf_counter() - start
        start = time.perf_counter()

    embeds, mask = policy.prefix(images, instructions)
    lap("vision_and_projector")
    decoding = DynamicDecoding(policy.llm, embeds, mask)
    lap("prefill")
    token = decoding.logits.argmax(-1)
    for _ in range(policy.config.num_action_tokens - 1):
        token = decoding.advance(token).argmax(-1)
    lap("decode_steps")
    return times


def profile_table(policy: MiniVLA, images: np.ndarray, instructions: list[str], device: str, rows: int = 25) -> str:
    """torch.profiler's per-op table of one greedy call in the policy's current decoding, most time first."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as profiler:
        policy.generate(images, instructions)
        _synchronize(device)
    return profiler.key_averages().table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total",
                                         row_limit=rows)


# the share of tokens that must equal the baseline's before a rate is printed: float32 computes them
# exactly alike; bfloat16 rounding (fused or batched kernels) moves a sampled token whose uniform sits
# near a CDF boundary, and a greedy one at a near-tie (policy/decoding.py)
REQUIRED_AGREEMENT = {"float32": 1.0, "bfloat16": 0.95}


def same_work(what: str, tokens: torch.Tensor, reference: torch.Tensor, dtype: str) -> float:
    """The share of `tokens` equal to `reference`; refused below what `dtype` allows."""
    agreement = (tokens.cpu() == reference.cpu()).float().mean().item()
    if agreement < REQUIRED_AGREEMENT[dtype]:
        raise RuntimeError(f"{what} gave other tokens than the baseline's ({agreement:.1%} agree; "
                           f"{REQUIRED_AGREEMENT[dtype]:.0%} required in {dtype}): the benchmark would compare "
                           "different work")
    return agreement


def timed_generate(policy: MiniVLA, images: np.ndarray, instructions: list[str], decodings: tuple[str, ...],
                   repeats: int, device: str, seed: int) -> tuple[dict, dict]:
    """The median seconds of `repeats` batched calls as rollouts make them (sampled at temperature 1 from
    per-row uniforms) in each decoding, the decodings taking turns within each repeat (so a drift of the
    machine's speed hits all alike) after one warm-up call each at the same batch (a compiled decoding
    compiles there); and each decoding's tokens."""
    uniforms = np.random.default_rng(seed).random((len(images), policy.config.num_action_tokens))
    seconds, tokens = {d: [] for d in decodings}, {}

    def rollout_query():
        return policy.generate(images, instructions, temperature=1.0, uniforms=uniforms)

    for decoding in decodings:
        policy.set_decoding(decoding)
        rollout_query()
    for _ in tqdm(range(repeats), desc=f"batched x{len(images)}"):
        for decoding in decodings:
            policy.set_decoding(decoding)
            _synchronize(device)
            start = time.perf_counter()
            tokens[decoding] = rollout_query().token_ids
            _synchronize(device)
            seconds[decoding].append(time.perf_counter() - start)
    policy.set_decoding("dynamic")
    return {d: float(np.median(s)) for d, s in seconds.items()}, tokens


def bench_policy(preset_name: str = "small", batch: int = 64, repeats: int = 3, naive_queries: int = 8,
                 device: str = "cpu", seed: int = 0, dtype: str = "float32", peak: float | None = None,
                 decodings: tuple[str, ...] = ("dynamic",), profile: bool = False) -> dict:
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: expected one of {sorted(DTYPES)}")
    unknown = set(decodings) - set(DECODINGS)
    if unknown:
        raise ValueError(f"--decoding {sorted(unknown)}: expected some of {DECODINGS}")
    decodings = ("dynamic",) + tuple(d for d in DECODINGS if d in decodings and d != "dynamic")
    torch.manual_seed(seed)
    policy = random_policy(preset_name, device, DTYPES[dtype]).eval()
    config = policy.config
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (batch, config.image_size, config.image_size, 3), dtype=np.uint8)
    instructions = [INSTRUCTIONS[i % len(INSTRUCTIONS)] for i in range(batch)]
    seconds, decoded = timed_generate(policy, images, instructions, decodings, repeats, device, seed)
    agreement = {d: same_work(f"{d} decoding", tokens, decoded["dynamic"], dtype) for d, tokens in decoded.items()}
    rates = {d: batch / s for d, s in seconds.items()}
    stages = stage_seconds(policy, images, instructions, device)
    greedy = policy.generate(images, instructions).token_ids
    naive_queries = min(naive_queries, batch)
    start = time.perf_counter()
    naive = [naive_query(policy, images[i], instructions[i])[0] for i in tqdm(range(naive_queries), desc="naive")]
    naive_qps = naive_queries / (time.perf_counter() - start)
    same_work("the naive loop", torch.stack(naive), greedy[:naive_queries], dtype)  # greedy: it has no sampling
    flops_per_query = generation_flops(policy, images, instructions) / batch
    best = max(rates, key=rates.get)
    policy.set_decoding(best)
    table = profile_table(policy, images, instructions, device) if profile else None
    achieved = flops_per_query * rates[best] / 1e12
    peak = peak_tflops(device, dtype, peak)
    return {"preset": preset_name, "batch": batch, "device": device, "dtype": dtype,
            "batched_queries_per_s": rates["dynamic"], "naive_queries_per_s": naive_qps,
            "ratio": rates["dynamic"] / naive_qps, "repeats": repeats, "naive_queries": naive_queries,
            "decodings": {d: {"queries_per_s": r, "vs_dynamic": r / rates["dynamic"], "token_agreement": agreement[d]}
                          for d, r in rates.items()},
            "stage_seconds": stages, "parameters": sum(p.numel() for p in policy.parameters()),
            "tflop_per_query": flops_per_query / 1e12, "best_decoding": best, "achieved_tflops": achieved,
            "peak_tflops": peak, "fraction_of_peak": achieved / peak if peak else None, "profile": table}


def main(args) -> None:
    result = bench_policy(args.preset, args.batch, args.repeats, args.naive_queries, args.device, dtype=args.dtype,
                          peak=args.peak_tflops, decodings=tuple(args.decoding), profile=args.profile)
    print(f"policy {result['preset']} ({result['parameters'] / 1e6:.1f} M params), {result['device']} "
          f"{result['dtype']}: batched KV-cache x{result['batch']}: {result['batched_queries_per_s']:.2f} queries/s; "
          f"one at a time, no cache: {result['naive_queries_per_s']:.2f} queries/s; ratio {result['ratio']:.1f}x")
    for decoding, rate in result["decodings"].items():
        if decoding != "dynamic":
            print(f"  {decoding} decoding ({100 * rate['token_agreement']:.1f}% of tokens as the dynamic cache's): "
                  f"{rate['queries_per_s']:.2f} queries/s, {rate['vs_dynamic']:.2f}x the dynamic cache's")
    stages = result["stage_seconds"]
    print("  one dynamic call: " + ", ".join(f"{name.replace('_', ' ')} {seconds:.3f} s"
                                             for name, seconds in stages.items()))
    utilisation = (f"{100 * result['fraction_of_peak']:.1f}% of a {result['peak_tflops']:g} TFLOP/s peak"
                   if result["peak_tflops"] else "peak unknown (--peak-tflops)")
    print(f"{result['tflop_per_query'] * 1e3:.2f} GFLOP per query: {result['achieved_tflops']:.3f} TFLOP/s achieved "
          f"({result['best_decoding']} decoding), {utilisation}")
    if result["profile"]:
        print(f"one call, {result['best_decoding']} decoding, by op:\n{result['profile']}")
    if args.json:
        write_json_output(Path(args.json), result)
