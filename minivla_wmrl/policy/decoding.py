"""How `MiniVLA.generate` runs its language model: one prefill over the prompt, then one decode step
per action token after the first, each on a KV cache.

- `dynamic`: transformers' DynamicCache, grown by concatenation at every step (no setup, any shapes).
- `static`: the prefill's keys and values are copied into a preallocated StaticCache whose batch and
  length are rounded up to buckets (powers of two; multiples of 64 positions), and every decode step
  writes in place: the same shapes and addresses at every step and every call of a bucket.
- `compiled`: `static`, with the decode step under `torch.compile` (on CUDA in "reduce-overhead"
  mode, so the whole step over all layers is captured once as a CUDA graph and replayed). A decode
  step of MiniVLA-1B is 24 layers of small kernels over one token per row: launch overhead, not
  arithmetic, bounds it on a GPU.

In float32 all three give the same tokens. In bfloat16 they compute the same thing with different
rounding (the compiled step fuses kernels; any kernel, batch or device change does the same), so a
sampled token whose uniform falls near a boundary of its CDF can differ (tiny preset, batch 64:
about 1 token in 500 under `compiled`).

The prefill itself stays eager: its length follows the instruction, and its large matmuls already
run near the hardware's rate. Written here rather than through transformers' `generate(
cache_implementation="static")` because the policy's prompt is embeddings (image patches inside the
prompt) and its sampling is its own (per-row inverse CDF on given uniforms).
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import nn

Decoding = Literal["dynamic", "static", "compiled"]
DECODINGS: tuple[str, ...] = get_args(Decoding)
LENGTH_BUCKET = 64


def make_decoder(decoding: str) -> DynamicDecoder | StaticDecoder:
    """The decoder of a decoding's name (a policy keeps one per name: a compiled one is compiled once)."""
    if decoding not in DECODINGS:
        raise ValueError(f"decoding {decoding!r}: expected one of {DECODINGS}")
    return DynamicDecoder() if decoding == "dynamic" else StaticDecoder(compiled=decoding == "compiled")


def _bucket_batch(batch: int) -> int:
    return 1 << (batch - 1).bit_length()


def _bucket_length(length: int) -> int:
    return -(-length // LENGTH_BUCKET) * LENGTH_BUCKET


def _decode_step(llm: nn.Module, embeds: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                 cache) -> torch.Tensor:
    """One token per row through the language model on a static cache → the next logits (B, vocab)."""
    return llm(inputs_embeds=embeds, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
               logits_to_keep=1).logits[:, -1]


def prompt_positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded batch: each row counts from its first real token."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


class DynamicDecoder:
    """Nothing to keep between calls: each call grows its own DynamicCache."""

    def begin(self, llm: nn.Module, embeds: torch.Tensor, mask: torch.Tensor, new_tokens: int) -> DynamicDecoding:
        return DynamicDecoding(llm, embeds, mask)


class DynamicDecoding:
    """The prefill (`logits`: the first token's) and each decode step on a DynamicCache that grows by one
    position a step."""

    def __init__(self, llm: nn.Module, embeds: torch.Tensor, mask: torch.Tensor):
        positions = prompt_positions(mask)
        out = llm(inputs_embeds=embeds, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        self.llm, self.cache, self.mask, self.position = llm, out.cache, mask, positions[:, -1:] + 1
        self.logits = out.logits[:, -1]

    def advance(self, token: torch.Tensor) -> torch.Tensor:
        """Feed one token per row; the logits of the next."""
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(self.mask), 1)], dim=1)
        out = self.llm(inputs_embeds=self.llm.get_input_embeddings()(token[:, None]), attention_mask=self.mask,
                       position_ids=self.position, cache=self.cache, use_cache=True, logits_to_keep=1)
        self.cache, self.position = out.cache, self.position + 1
        return out.logits[:, -1]


class StaticDecoder:
    """Keeps one StaticCache and its input buffers per (batch, length) bucket across `generate` calls:
    CUDA graphs replay on fixed addresses, so a bucket's buffers must outlive the call that made them."""

    def __init__(self, compiled: bool):
        self.compiled = compiled
        self.buckets: dict[tuple, dict] = {}
        self._steps: dict[str, object] = {}  # compiled steps by device type

    def step_function(self, device: torch.device):
        if not self.compiled:
            return _decode_step
        if device.type not in self._steps:
            # "reduce-overhead" captures CUDA graphs; on other devices it would only warn and fall back
            self._steps[device.type] = torch.compile(_decode_step,
                                                     mode="reduce-overhead" if device.type == "cuda" else None)
        return self._steps[device.type]

    def begin(self, llm: nn.Module, embeds: torch.Tensor, mask: torch.Tensor, new_tokens: int) -> StaticDecoding:
        return StaticDecoding(self, llm, embeds, mask, new_tokens)

    def bucket(self, llm: nn.Module, batch: int, length: int, dtype: torch.dtype, device: torch.device) -> dict:
        from transformers import StaticCache  # ~3 s over torch: a built policy has already paid it

        config = llm.config
        key = (batch, length, dtype, device)
        if key not in self.buckets:
            # buckets of another dtype or device belong to a policy that has since been moved: free them
            self.buckets = {k: b for k, b in self.buckets.items() if k[2:] == (dtype, device)}
            cache = StaticCache(config=config, max_cache_len=length)
            head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            cache.early_initialization(batch, config.num_key_value_heads, head_dim, dtype, device)
            self.buckets[key] = {"cache": cache,
                                 "embeds": torch.zeros(batch, 1, config.hidden_size,
                                                       dtype=llm.get_input_embeddings().weight.dtype, device=device),
                                 "mask": torch.ones(batch, length, dtype=torch.long, device=device),
                                 "positions": torch.zeros(batch, 1, dtype=torch.long, device=device)}
        return self.buckets[key]


class StaticDecoding:
    """One call's decode steps on its bucket: rows past the batch are padding (their outputs dropped)."""

    def __init__(self, decoder: StaticDecoder, llm: nn.Module, embeds: torch.Tensor, mask: torch.Tensor,
                 new_tokens: int):
        prefill = DynamicDecoding(llm, embeds, mask)
        batch, length = mask.shape
        self.llm, self.batch, self.length = llm, batch, length
        kv = prefill.cache.layers[0].keys
        self.buffers = decoder.bucket(llm, _bucket_batch(batch), _bucket_length(length + new_tokens - 1),
                                      kv.dtype, kv.device)
        self.step = decoder.step_function(kv.device)
        for static, grown in zip(self.buffers["cache"].layers, prefill.cache.layers, strict=True):
            static.keys[:batch, :, :length] = grown.keys
            static.values[:batch, :, :length] = grown.values
            static.keys[:batch, :, length:] = 0  # an earlier call's entries are masked, but 0 × NaN is NaN
            static.values[:batch, :, length:] = 0
            static.cumulative_length.fill_(length)
        self.buffers["mask"][:batch] = 0
        self.buffers["mask"][:batch, :length] = mask
        self.buffers["mask"][batch:] = 1  # padding rows attend everywhere: finite, whatever they held before
        self.buffers["positions"][:batch] = prefill.position - 1  # `advance` steps it before each token
        self.logits = prefill.logits

    def advance(self, token: torch.Tensor) -> torch.Tensor:
        """Feed one token per row; the logits of the next (the cache's position advances in place)."""
        buffers, batch = self.buffers, self.batch
        buffers["embeds"][:batch] = self.llm.get_input_embeddings()(token[:, None])
        buffers["positions"][:batch] += 1
        buffers["mask"][:batch, self.length] = 1
        self.length += 1
        logits = self.step(self.llm, buffers["embeds"], buffers["mask"], buffers["positions"], buffers["cache"])
        return logits[:batch].clone()  # a CUDA graph's output is overwritten by its next replay
