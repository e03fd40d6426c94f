"""A trainable progress/success world model: frame encoder + instruction + temporal transformer + two heads.

Sequence: [instruction token, frame_1 … frame_n], each frame a feature vector from the frame
encoder (a timm model of its own, or one registered under a prefix with `register_frame_encoder`,
such as minivla_wmrl's `policy:<checkpoint>`: a MiniVLA checkpoint's frozen fused vision
backbone), plus a learned position embedding. A transformer encoder mixes them; the progress head reads
every frame token (sigmoid → [0, 1]), the success head reads the last one.

The instruction is a bag of hashed words (an `EmbeddingBag`): the model needs to tell tasks
apart, not to understand language, and this needs no tokenizer download.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model
from torch import nn
from torch.nn import functional as F

from world_models.pretrained import Pretrained
from world_models.scorer import Prediction, TrajectoryScorer

FORMAT = "minivla-wmrl-world-model/1"


# prefix → factory(argument) of a frame encoder: an nn.Module with `num_features` that takes
# (N, 3, H, W) pixels in [0, 1] at any size and returns (N, num_features); see register_frame_encoder
FRAME_ENCODERS: dict[str, Callable[[str], nn.Module]] = {}


def register_frame_encoder(prefix: str, factory: Callable[[str], nn.Module]) -> None:
    """Make `encoder: "<prefix>:<argument>"` build `factory(argument)`: how a caller injects its own
    features (minivla_wmrl registers `policy`) without this package importing the caller."""
    FRAME_ENCODERS[prefix] = factory


@dataclass
class ProgressModelConfig:
    encoder: str = "resnet10t"  # a timm model name, or "<registered prefix>:<argument>", e.g. "policy:<checkpoint dir>"
    # pretrained weights for the timm encoder: a local file (.safetensors, .bin, .pth) or a directory holding
    # model.safetensors or pytorch_model.bin (a Hub download of the timm model); None: random initialisation
    encoder_weights: str | None = None
    image_size: int = 96  # frames are resized to this before the timm encoder (the policy encoder uses its own)
    num_frames: int = 8  # frames sampled uniformly per trajectory
    dim: int = 128  # transformer width
    layers: int = 2
    heads: int = 4
    dropout: float = 0.1
    vocab_buckets: int = 4096  # hashed instruction words

    def __post_init__(self) -> None:
        """Sizes are positive and the width splits into heads: a bad value is named before a model is built."""
        for name in ("image_size", "num_frames", "dim", "layers", "heads", "vocab_buckets"):
            value = getattr(self, name)
            if isinstance(value, int) and not 1 <= value <= 1 << 20:
                raise ValueError(f"world model config {name}: {value!r} is out of range; expected 1 <= {name} <= 2**20")
        if isinstance(self.dropout, (int, float)) and not 0 <= self.dropout < 1:
            raise ValueError(f"world model config dropout: {self.dropout!r} is out of range; expected 0 <= dropout < 1")
        if isinstance(self.dim, int) and isinstance(self.heads, int) and self.dim % self.heads:
            raise ValueError(f"world model config: dim {self.dim} is not a multiple of heads {self.heads}")

    @classmethod
    def from_dict(cls, data: dict, where: str = "world model config") -> ProgressModelConfig:
        """Unknown keys and values of the wrong type are named, with what was expected."""
        declared = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(declared))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; expected a subset of {sorted(declared)}")
        for key, value in data.items():
            default = declared[key].default
            if value is None and default is None:
                continue
            expected = object if default is MISSING else (str if default is None else type(default))
            if not isinstance(value, expected) or isinstance(value, bool) != (expected is bool):
                if not (expected is float and isinstance(value, int) and not isinstance(value, bool)):
                    raise ValueError(f"{where}.{key}: expected {expected.__name__}, got {value!r}")
        return cls(**data)


def timm_weights_file(path: str) -> Path:
    """The weights file a local path names (a file, or a directory holding one)."""
    path = Path(path).expanduser()
    if path.is_dir():
        found = [path / name for name in ("model.safetensors", "pytorch_model.bin") if (path / name).is_file()]
        if not found:
            raise FileNotFoundError(f"world model encoder_weights {path} holds no model.safetensors "
                                    "or pytorch_model.bin")
        return found[0]
    if not path.is_file():
        raise FileNotFoundError(f"world model encoder_weights {path} does not exist")
    return path


def hash_words(instruction: str, buckets: int) -> list[int]:
    return [zlib.crc32(w.encode()) % buckets for w in instruction.lower().split()] or [0]


class ProgressWorldModel(nn.Module, TrajectoryScorer, Pretrained):
    _pretrained_kind = "world model"

    def __init__(self, config: ProgressModelConfig):
        super().__init__()
        self.config, self.num_frames = config, config.num_frames
        prefix, _, argument = config.encoder.partition(":")
        self.own_encoder = not argument  # a timm model trained with the rest; registered encoders preprocess themselves
        if argument:
            if prefix not in FRAME_ENCODERS:
                raise ValueError(f"world model encoder {config.encoder!r}: no frame encoder is registered as "
                                 f"{prefix!r} (registered: {sorted(FRAME_ENCODERS)}); for 'policy', import "
                                 "minivla_wmrl.policy.storage first")
            self.encoder = FRAME_ENCODERS[prefix](argument)
        else:
            import timm  # ~2 s over torch: only a world model built with its own timm encoder needs it

            weights = timm_weights_file(config.encoder_weights) if config.encoder_weights else None
            self.encoder = timm.create_model(config.encoder, pretrained=weights is not None, num_classes=0,
                                             pretrained_cfg_overlay={"file": str(weights)} if weights else None)
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
        if self.own_encoder:
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

    def _save_pretrained(self, directory: Path) -> None:
        """`config.json` + `model.safetensors` (save_pretrained adds a model card); a trainer writes into a
        temporary directory it renames when complete."""
        directory = Path(directory)
        (directory / "config.json").write_text(json.dumps({"format": FORMAT, "config": asdict(self.config)}, indent=2))
        save_model(self, str(directory / "model.safetensors"))

    @classmethod
    def load(cls, directory: Path, device: str = "cpu") -> ProgressWorldModel:
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
        config = ProgressModelConfig.from_dict(meta["config"], str(directory / "config.json"))
        model = cls(replace(config, encoder_weights=None))  # every weight comes from model.safetensors
        model.config = config
        try:
            load_model(model, str(directory / "model.safetensors"), strict=True)
        except SafetensorError as error:
            raise ValueError(f"{directory}/model.safetensors cannot be read ({error}); truncated or damaged") from None
        except RuntimeError as error:
            raise ValueError(f"{directory}/model.safetensors does not fit its config.json: "
                             f"{str(error).splitlines()[1:2]}") from None
        return model.to(device).eval()
