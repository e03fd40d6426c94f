"""MiniVLA architecture settings and named presets.

`minivla-1b` is the published architecture (reference/minivla.md): DINOv2 ViT-L/14 with 4
registers + SigLIP So400m/14 at 224 px, the fused GELU MLP projector (2176 → 8704 → 896 → 896)
and Qwen2.5-0.5B. Small presets keep the same classes and key layout at tiny widths (timm
architecture overrides, a small Qwen2 config) for tests and CPU demos.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

import torch

from minivla_wmrl.infra.config import config_from_dict

PolicyDtype = Literal["float32", "bfloat16"]  # the policy's weights (sft/eval bfloat16: autocast on CUDA)
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}

QWEN25_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu")


@dataclass
class MiniVLAConfig:
    """Everything that fixes the policy's architecture and I/O."""

    dino: str = "vit_large_patch14_reg4_dinov2.lvd142m"  # timm model name
    siglip: str = "vit_so400m_patch14_siglip_224"
    dino_overrides: dict = field(default_factory=dict)  # timm kwargs that shrink the ViT (small presets)
    siglip_overrides: dict = field(default_factory=dict)
    image_size: int = 224
    num_images: int = 1  # 2: agent view + wrist, or [previous, current] frames (512 visual tokens)
    llm: dict = field(default_factory=lambda: dict(QWEN25_05B))  # transformers.Qwen2Config kwargs
    projector_mult: int = 4  # projector hidden width = mult × fused vision width
    num_action_tokens: int = 7  # one token per residual-VQ codebook
    codebook_size: int = 128
    gripper_convention: str = "libero"  # "libero": the last action dim maps back to LIBERO's ±1 gripper; "none": as is
    center_crop: bool = False  # crop every input image to its central 0.9 of the area (runs trained with image_aug)

    @classmethod
    def from_dict(cls, data: dict, where: str = "policy config") -> MiniVLAConfig:
        return config_from_dict(cls, data, where)

    def to_dict(self) -> dict:
        return asdict(self)


def _tiny_llm(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, vocab: int) -> dict:
    return dict(QWEN25_05B, vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                max_position_embeddings=2048)


PRESETS: dict[str, MiniVLAConfig] = {
    "minivla-1b": MiniVLAConfig(),
    # Vocabulary 576 fits the code-built test tokenizer (515 tokens) rounded up to a multiple of 64.
    "tiny": MiniVLAConfig(dino_overrides=dict(embed_dim=48, depth=3, num_heads=2),
                          siglip_overrides=dict(embed_dim=48, depth=3, num_heads=2),
                          llm=_tiny_llm(64, 2, 4, 2, 128, 576)),
    "small": MiniVLAConfig(dino_overrides=dict(embed_dim=192, depth=6, num_heads=3),
                           siglip_overrides=dict(embed_dim=192, depth=6, num_heads=3),
                           llm=_tiny_llm(256, 6, 4, 2, 768, 576)),
}


def preset(name: str) -> MiniVLAConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown policy preset {name!r}; expected one of {sorted(PRESETS)}")
    return MiniVLAConfig.from_dict(PRESETS[name].to_dict())
