"""Parameter counts of a policy architecture, built on the `meta` device (no memory, no weights)."""

from __future__ import annotations

import torch

from minivla_wmrl.policy.config import MiniVLAConfig
from minivla_wmrl.policy.minivla import FusedMLPProjector, FusedVisionBackbone


def parameter_counts(config: MiniVLAConfig) -> dict[str, int]:
    from transformers import Qwen2Config, Qwen2ForCausalLM  # transformers' Qwen2: ~3 s; only model-info needs it

    with torch.device("meta"):
        vision = FusedVisionBackbone(config)
        projector = FusedMLPProjector(vision.embed_dim, config.llm["hidden_size"], config.projector_mult)
        llm = Qwen2ForCausalLM(Qwen2Config(**config.llm))

    def count(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())  # parameters() counts tied weights once

    counts = {"dino": count(vision.dino_featurizer), "siglip": count(vision.siglip_featurizer),
              "vision": count(vision), "projector": count(projector), "language_model": count(llm)}
    counts["total"] = counts["vision"] + counts["projector"] + counts["language_model"]
    counts["visual_tokens"] = vision.num_patches * config.num_images
    counts["fused_vision_dim"] = vision.embed_dim
    return counts
