"""The MiniVLA policy: fused DINOv2/SigLIP vision, GELU-MLP projector, Qwen2 language model."""

from minivla_wmrl.policy.config import PRESETS, MiniVLAConfig, preset
from minivla_wmrl.policy.minivla import ActionQuery, MiniVLA

__all__ = ["MiniVLA", "MiniVLAConfig", "ActionQuery", "PRESETS", "preset"]
