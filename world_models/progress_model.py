"""A trainable progress/success world model: frame encoder + instruction + temporal transformer + two heads.

Sequence: [instruction token, frame_1 … frame_n], each frame a feature vector from the frame
encoder (a timm model of its own, or a MiniVLA checkpoint's frozen fused vision backbone),
plus a learned position embedding. A transformer encoder mixes them; the progress head reads
every frame token (sigmoid → [0, 1]), the success head reads the last one.

The instruction is a bag of hashed words (an `EmbeddingBag`): the model needs to tell tasks
apart, not to understand language, and this needs no tokenizer download.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from minivla_wmrl.config import config_from_dict
from world_models.scorer import Prediction, TrajectoryScorer

FORMAT = "minivla-wmrl-world-model/1"


@dataclass
class ProgressModelConfig:
    encoder: str = "resnet10t"  # a timm model name, or "policy:<checkpoint dir>" (its frozen vision features)
    image_size: int = 96  # frames are resized to this before the timm encoder (the policy encoder uses its own)
    num_frames: int = 8  # frames sampled uniformly per trajectory
    dim: int = 128  # transformer width
    layers: int = 2
    heads: int = 4
    dropout: float = 0.1
    vocab_buckets: int = 4096  # hashed instruction words

    @classmethod
    def from_dict(cls, data: dict, where: str = "world model config") -> ProgressModelConfig:
        return config_from_dict(cls, data, where)


def hash_words(instruction: str, buckets: int) -> list[int]:
    return [zlib.crc32(w.encode()) % buckets for w in instruction.lower().split()] or [0]


class _PolicyVisionEncoder(nn.Module):
    """A MiniVLA checkpoint's fused DINOv2/SigLIP features, mean-pooled over patches, frozen."""

    def __init__(self, checkpoint: str):
        super().__init__()
        from minivla_wmrl.policy.checkpoint import load_policy

        policy = load_policy(Path(checkpoint))
        self.vision, self.image_size = policy.vision.eval().requires_grad_(False), policy.config.image_size
        self.num_features = policy.vision.embed_dim

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            pixels = F.interpolate(pixels, size=(self.image_size, self.image_size), mode="bilinear", antialias=True)
            return self.vision(pixels).mean(1)


class ProgressWorldModel(nn.Module, TrajectoryScorer):
    def __init__(self, config: ProgressModelConfig):
        super().__init__()
        self.config, self.num_frames = config, config.num_frames
        if config.encoder.startswith("policy:"):
            self.encoder = _PolicyVisionEncoder(config.encoder[len("policy:"):])
        else:
            import timm

            self.encoder = timm.create_model(config.encoder, pretrained=False, num_classes=0)
        self.frame_proj = nn.Linear(self.encoder.num_features, config.dim)
        self.words = nn.EmbeddingBag(config.vocab_buckets, config.dim, mode="mean")
        self.position = nn.Parameter(torch.zeros(config.num_frames + 1, config.dim))
        layer = nn.TransformerEncoderLayer(config.dim, config.heads, 4 * config.dim, config.dropout, batch_first=True,
                                           norm_first=True)
        self.temporal = nn.TransformerEncoder(layer, config.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(config.dim)
        self.progress_head = nn.Linear(config.dim, 1)
        self.success_head = nn.Linear(config.dim, 1)

    @property
    def device(self) -> torch.device:
        return self.frame_proj.weight.device

    def forward(self, frames: torch.Tensor, instructions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """frames (B, n, H, W, 3) uint8 → progress logits (B, n), success logits (B,)."""
        b, n = frames.shape[:2]
        if n != self.config.num_frames:
            raise ValueError(f"got {n} frames per trajectory; the world model takes {self.config.num_frames}")
        pixels = frames.to(self.device).flatten(0, 1).permute(0, 3, 1, 2).float() / 255.0
        if not isinstance(self.encoder, _PolicyVisionEncoder):
            size = self.config.image_size
            pixels = F.interpolate(pixels, size=(size, size), mode="bilinear", antialias=True)
            pixels = (pixels - 0.5) / 0.5
        features = self.frame_proj(self.encoder(pixels)).view(b, n, -1)
        words = [hash_words(i, self.config.vocab_buckets) for i in instructions]
        offsets = torch.tensor([0] + [len(w) for w in words[:-1]], device=self.device).cumsum(0)
        text = self.words(torch.tensor([x for w in words for x in w], device=self.device), offsets)
        tokens = torch.cat([text[:, None], features], dim=1) + self.position
        hidden = self.norm(self.temporal(tokens))[:, 1:]
        return self.progress_head(hidden)[..., 0], self.success_head(hidden[:, -1])[..., 0]

    @torch.no_grad()
    def predict(self, frames: np.ndarray, instructions: list[str]) -> Prediction:
        training = self.training
        self.eval()
        progress, success = self(torch.as_tensor(np.asarray(frames)), instructions)
        self.train(training)
        return Prediction(torch.sigmoid(progress).cpu().numpy(), torch.sigmoid(success).cpu().numpy())

    def save(self, directory: Path) -> None:
        """Write `config.json` + `model.safetensors` into an existing directory (callers make it atomic)."""
        from safetensors.torch import save_model

        directory = Path(directory)
        (directory / "config.json").write_text(json.dumps({"format": FORMAT, "config": asdict(self.config)}, indent=2))
        save_model(self, str(directory / "model.safetensors"))

    @classmethod
    def load(cls, directory: Path, device: str = "cpu") -> ProgressWorldModel:
        from safetensors import SafetensorError
        from safetensors.torch import load_model

        directory = Path(directory)
        for name in ("config.json", "model.safetensors"):
            if not (directory / name).is_file():
                raise FileNotFoundError(f"world model directory {directory} lacks {name}")
        try:
            meta = json.loads((directory / "config.json").read_text())
        except ValueError as error:
            raise ValueError(f"{directory}/config.json is not valid JSON ({error})") from None
        if meta.get("format") != FORMAT:
            raise ValueError(f"{directory}/config.json is not a {FORMAT} world model")
        model = cls(ProgressModelConfig.from_dict(meta["config"], str(directory / "config.json")))
        try:
            load_model(model, str(directory / "model.safetensors"), strict=True)
        except SafetensorError as error:
            raise ValueError(f"{directory}/model.safetensors cannot be read ({error}); truncated or damaged") from None
        except RuntimeError as error:
            raise ValueError(f"{directory}/model.safetensors does not fit its config.json: "
                             f"{str(error).splitlines()[1:2]}") from None
        return model.to(device).eval()
