"""The residual-VQ action tokenizer (from VQ-BeT, as MiniVLA uses it).

A normalised action chunk (chunk_len × action_dim, flattened time-major) is encoded by an MLP to
one latent vector, quantised by `num_codebooks` residual codebooks (coarse → fine, EMA-updated,
Euclidean) into as many codes, and decoded back by an MLP. Code c becomes the language-model
token id `len(tokenizer) - 1 - c`. The residual VQ is `vector_quantize_pytorch.ResidualVQ`, the
library VQ-BeT vendored, so its buffers load from released MiniVLA VQ checkpoints as they are.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from minivla_wmrl.infra.atomic_pretrained import AtomicPretrained
from minivla_wmrl.infra.config import config_from_dict
from minivla_wmrl.infra.run_checkpoint import load_weights, read_json


@dataclass
class ActionTokenizerConfig:
    """Shape and training constants; defaults are MiniVLA's released VQ (reference/minivla.md)."""

    chunk_len: int = 8  # released `input_dim_h`: current action + 7 future ones
    action_dim: int = 7  # released `input_dim_w`
    latent_dim: int = 512  # released `n_latent_dims`
    num_codebooks: int = 7  # released `vqvae_groups`: one token per codebook
    codebook_size: int = 128  # released `vqvae_n_embed`
    hidden_dim: int = 128  # encoder/decoder MLP width
    commitment_weight: float = 5.0
    ema_decay: float = 0.8
    ema_eps: float = 1e-5  # Laplace smoothing of the EMA cluster sizes
    act_scale: float = 1.0  # released `act_scale`: chunks are divided by it before encoding, decoded ones multiplied
    rotation_trick: bool = False  # False: VQ-BeT's straight-through gradient; True: the pip library's rotation trick

    @classmethod
    def from_dict(cls, data: dict, where: str = "action tokenizer config") -> ActionTokenizerConfig:
        return config_from_dict(cls, data, where)

    @classmethod
    def from_released(cls, data: dict) -> ActionTokenizerConfig:
        """The released VQ-BeT `config.json` (input_dim_w/h, n_latent_dims, vqvae_n_embed, vqvae_groups)."""
        try:
            return cls(chunk_len=int(data["input_dim_h"]), action_dim=int(data["input_dim_w"]),
                       latent_dim=int(data["n_latent_dims"]), codebook_size=int(data["vqvae_n_embed"]),
                       num_codebooks=int(data["vqvae_groups"]), act_scale=float(data.get("act_scale", 1.0)))
        except KeyError as key:
            raise ValueError(f"released VQ config lacks {key}; expected input_dim_w, input_dim_h, n_latent_dims, "
                             "vqvae_n_embed, vqvae_groups") from None


class _MLP(nn.Module):
    """Linear-ReLU-Linear-ReLU body plus an output layer, named as VQ-BeT's MLPs (`encoder.*`, `fc.*`)."""

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(in_dim, hidden_dim), nn.ReLU(),
                                     nn.Linear(hidden_dim, hidden_dim), nn.ReLU())
        self.fc = nn.Linear(hidden_dim, out_dim)
        for layer in (self.encoder[0], self.encoder[2], self.fc):
            nn.init.orthogonal_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.encoder(x))


class ActionTokenizer(nn.Module, AtomicPretrained):
    """Action chunk (B, chunk_len, action_dim) ⇄ codes (B, num_codebooks) ⇄ token ids."""

    def __init__(self, config: ActionTokenizerConfig | None = None):
        super().__init__()
        from vector_quantize_pytorch import ResidualVQ  # ~1.3 s over torch: only a built tokenizer needs it

        self.config = config = config or ActionTokenizerConfig()
        flat = config.chunk_len * config.action_dim
        self.encoder = _MLP(flat, config.hidden_dim, config.latent_dim)
        self.decoder = _MLP(config.latent_dim, config.hidden_dim, flat)
        self.vq = ResidualVQ(dim=config.latent_dim, num_quantizers=config.num_codebooks,
                             codebook_size=config.codebook_size, decay=config.ema_decay, eps=config.ema_eps,
                             commitment_weight=config.commitment_weight, kmeans_init=False,
                             threshold_ema_dead_code=0, rotation_trick=config.rotation_trick)

    @property
    def chunk_shape(self) -> tuple[int, int]:
        return self.config.chunk_len, self.config.action_dim

    def _check_chunks(self, chunks) -> torch.Tensor:
        chunks = torch.as_tensor(chunks, dtype=torch.float32, device=self.encoder.fc.weight.device)
        if chunks.ndim != 3 or tuple(chunks.shape[1:]) != self.chunk_shape:
            raise ValueError(f"action chunks have shape {tuple(chunks.shape)}; expected (batch, {self.chunk_shape[0]}, "
                             f"{self.chunk_shape[1]}) normalised actions")
        if not torch.isfinite(chunks).all():
            raise ValueError("action chunks contain NaN/inf")
        return chunks

    def forward(self, chunks) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Training pass: reconstruction, codes and losses (L1 reconstruction + weighted commitment).

        In train mode the residual VQ updates its codebooks by EMA here; gradients reach only the MLPs.
        """
        scaled = self._check_chunks(chunks) / self.config.act_scale
        latent = self.encoder(scaled.flatten(1))
        quantized, codes, commitment = self.vq(latent[:, None])
        reconstruction = self.decoder(quantized[:, 0]).view_as(scaled)
        l1 = (reconstruction - scaled).abs().mean()
        commitment = commitment.sum()
        return (reconstruction * self.config.act_scale, codes[:, 0],
                {"loss": l1 + commitment, "l1": l1, "commitment": commitment})

    @torch.no_grad()
    def encode(self, chunks) -> torch.Tensor:
        """Normalised chunks (B, chunk_len, action_dim) → codes (B, num_codebooks), coarse first."""
        scaled = self._check_chunks(chunks) / self.config.act_scale
        training = self.vq.training
        self.vq.eval()  # encoding must never move the codebooks (the VQ updates its EMA in train mode)
        try:
            _, codes, _ = self.vq(self.encoder(scaled.flatten(1))[:, None])
        finally:
            self.vq.train(training)
        return codes[:, 0]

    @torch.no_grad()
    def decode(self, codes) -> torch.Tensor:
        """Codes (B, num_codebooks) → normalised chunks (B, chunk_len, action_dim)."""
        codes = torch.as_tensor(codes, dtype=torch.long, device=self.encoder.fc.weight.device)
        c = self.config
        if codes.ndim != 2 or codes.shape[1] != c.num_codebooks:
            raise ValueError(f"codes have shape {tuple(codes.shape)}; expected (batch, {c.num_codebooks})")
        if codes.numel() and (codes.min() < 0 or codes.max() >= c.codebook_size):
            raise ValueError(f"codes must lie in 0..{c.codebook_size - 1}")
        latent = self.vq.get_output_from_indices(codes[:, None])[:, 0]
        # the MLP row by row: a batched matmul may round differently with the batch size, and a chunk's actions
        # must not depend on what was decoded with it (a rollout must not depend on who shared its query)
        chunks = torch.cat([self.decoder(row[None]) for row in latent])
        return chunks.view(-1, *self.chunk_shape) * c.act_scale

    def codes_to_token_ids(self, codes, vocab_len: int) -> torch.Tensor:
        """Code c → token id vocab_len - 1 - c (code 0 is the last added token)."""
        return vocab_len - 1 - torch.as_tensor(codes, dtype=torch.long)

    def token_ids_to_codes(self, token_ids, vocab_len: int) -> torch.Tensor:
        codes = vocab_len - 1 - torch.as_tensor(token_ids, dtype=torch.long)
        if codes.numel() and (codes.min() < 0 or codes.max() >= self.config.codebook_size):
            raise ValueError(f"token ids outside the action range {vocab_len - self.config.codebook_size}.."
                             f"{vocab_len - 1} for a vocabulary of {vocab_len}")
        return codes

    # -- persistence ---------------------------------------------------------------------------

    _pretrained_kind = "action tokenizer"

    def _save_pretrained(self, directory: Path) -> None:
        """`config.json` + `model.safetensors` (save_pretrained writes them atomically, with a model card)."""
        (directory / "config.json").write_text(json.dumps(asdict(self.config), indent=2))
        save_file({k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()},
                  directory / "model.safetensors")

    @classmethod
    def load(cls, directory: Path, map_location: str = "cpu") -> ActionTokenizer:
        """Load our own format, or the released MiniVLA VQ folder (`config.json` + `checkpoints/model.pt`)."""
        directory = Path(directory)
        config_path = directory / "config.json"
        if not config_path.is_file():
            raise FileNotFoundError(f"action tokenizer directory {directory} has no config.json")
        data = read_json(config_path, "action tokenizer config")
        if (directory / "model.safetensors").is_file():
            tokenizer = cls(ActionTokenizerConfig.from_dict(data, str(config_path)))
            load_weights(tokenizer, directory / "model.safetensors")
            return tokenizer.to(map_location).eval()
        if (directory / "checkpoints" / "model.pt").is_file():
            return cls.load_released(directory, map_location)
        raise FileNotFoundError(f"{directory} holds neither model.safetensors nor checkpoints/model.pt")

    @classmethod
    def load_released(cls, directory: Path, map_location: str = "cpu") -> ActionTokenizer:
        directory = Path(directory)
        tokenizer = cls(ActionTokenizerConfig.from_released(json.loads((directory / "config.json").read_text())))
        checkpoint = torch.load(directory / "checkpoints" / "model.pt", map_location=map_location, weights_only=True)
        missing = {"encoder", "decoder", "vq_embedding"} - set(checkpoint)
        if missing:
            raise ValueError(f"{directory}/checkpoints/model.pt lacks {sorted(missing)}; expected encoder, decoder, "
                             "vq_embedding")
        state = {f"encoder.{k}": v for k, v in checkpoint["encoder"].items()}
        state |= {f"decoder.{k}": v for k, v in checkpoint["decoder"].items()}
        state |= {f"vq.{k}": v for k, v in checkpoint["vq_embedding"].items()}
        tokenizer._load_checked(state, directory)
        return tokenizer.eval()

    def _load_checked(self, state: dict[str, torch.Tensor], where: Path) -> None:
        expected = self.state_dict()
        buffers = {name for name, _ in self.named_buffers()}
        # VQ-BeT's vendored VQ: initted (1,)
        state = {k: v.reshape(expected[k].shape) if k in buffers and k in expected and v.shape != expected[k].shape
                 and v.numel() == expected[k].numel() else v for k, v in state.items()}
        missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        wrong = [f"{k}: {tuple(state[k].shape)} vs config {tuple(v.shape)}" for k, v in expected.items()
                 if k in state and state[k].shape != v.shape]
        if missing or unexpected or wrong:
            raise ValueError(f"action tokenizer weights in {where} do not match its config: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}, wrong shapes {wrong[:5]}")
        self.load_state_dict(state)
