"""A MiniVLA checkpoint's frozen vision features as a world-model frame encoder.

`world_model.encoder: "policy:<checkpoint dir>"` builds it; registering it here keeps
`world_models/` free of any import of this package.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from minivla_wmrl.policy.minivla import MiniVLA
from world_models.progress_model import register_frame_encoder


class PolicyFrameEncoder(nn.Module):
    """The checkpoint's fused DINOv2/SigLIP features, mean-pooled over patches, frozen."""

    def __init__(self, checkpoint: str):
        super().__init__()
        policy = MiniVLA.from_pretrained(checkpoint)
        self.vision, self.image_size = policy.vision.eval().requires_grad_(False), policy.config.image_size
        self.num_features = policy.vision.embed_dim

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            pixels = F.interpolate(pixels, size=(self.image_size, self.image_size), mode="bilinear", antialias=True)
            return self.vision(pixels).mean(1)


register_frame_encoder("policy", PolicyFrameEncoder)
