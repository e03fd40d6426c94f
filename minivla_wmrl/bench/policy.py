"""`minivla-wmrl bench policy`: action queries per second, batched KV-cache generation vs a naive loop.

The naive loop is what a simple rollout does: one environment at a time, and every one of the 7
action tokens recomputes the whole sequence (no cache). Both run side by side on the same random
weights, images and instructions.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from minivla_wmrl.infra.outputs import write_json_output
from minivla_wmrl.policy import MiniVLA, preset
from minivla_wmrl.policy.action_tokenizer import ActionTokenizer
from minivla_wmrl.policy.tokenizer import tiny_qwen_style_tokenizer

INSTRUCTIONS = ["close the top drawer of the cabinet", "put the black bowl on the plate",
                "turn on the stove", "pick up the alphabet soup and place it in the basket"]


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
                 device: str = "cpu", seed: int = 0) -> dict:
    torch.manual_seed(seed)
    config = preset(preset_name)
    policy = MiniVLA(config, tiny_qwen_style_tokenizer(), ActionTokenizer()).to(device).eval()
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
    return {"preset": preset_name, "batch": batch, "device": device, "batched_queries_per_s": batched_qps,
            "naive_queries_per_s": naive_qps, "ratio": batched_qps / naive_qps, "repeats": repeats,
            "naive_queries": naive_queries, "parameters": sum(p.numel() for p in policy.parameters())}


def main(args) -> None:
    result = bench_policy(args.preset, args.batch, args.repeats, args.naive_queries, args.device)
    print(f"policy {result['preset']} ({result['parameters'] / 1e6:.1f} M params), {result['device']}: "
          f"batched KV-cache x{result['batch']}: {result['batched_queries_per_s']:.2f} queries/s; "
          f"one at a time, no cache: {result['naive_queries_per_s']:.2f} queries/s; ratio {result['ratio']:.1f}x")
    if args.json:
        write_json_output(Path(args.json), result)
