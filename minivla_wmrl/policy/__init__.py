"""The MiniVLA policy: fused DINOv2/SigLIP vision, GELU-MLP projector, Qwen2 language model."""

from minivla_wmrl.policy import frame_encoder  # noqa: F401 - registers the world models' "policy:" encoder
from minivla_wmrl.policy.config import PRESETS, MiniVLAConfig, preset
from minivla_wmrl.policy.minivla import ActionQuery, MiniVLA

__all__ = ["MiniVLA", "MiniVLAConfig", "ActionQuery", "PRESETS", "preset"]
