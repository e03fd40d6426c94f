"""The outcome probe: P(final real success | the rollout so far), from signals a rollout produces at
no extra simulator cost (in the manner of ActProbe, arXiv 2606.08508).

Per policy query q, `policy_signals` makes one feature row from what the rollout engine records:
the sampled action tokens' mean and lowest log-probability (the policy's own confidence), the
executed chunk's mean per-step norm, how far its mean action moved from the previous query's
(chunk-to-chunk disagreement) and its gripper command. A GRU reads the rows
of queries 0..q with the absolute time (step / `time_scale`), starting from a hashed embedding of
the instruction; its output at q is the logit of the episode's final outcome. `fit_outcome_probe`
trains it on every prefix with the episode's final real label, so the output at q estimates
P(success | prefix up to q).

The same model on the simulator's object and robot state (`Observation.state`) instead of the
policy's signals is the privileged probe: an upper bound on what a prefix holds, for diagnostics.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model, save_model
from torch import nn

from world_models.pretrained import Pretrained

FORMAT = "minivla-wmrl-outcome-probe-v1"


@dataclass
class ProbeEpisode:
    """One real-labelled episode as the probe reads it."""

    features: np.ndarray  # (Q, F) float32: one row per policy query
    query_steps: np.ndarray  # (Q,) env steps executed before each query
    instruction: str
    success: bool
    length: int  # env steps the episode ran


def policy_signals(query_steps: np.ndarray, log_probs: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """(Q, 5) features: the sampled tokens' mean and lowest log-prob, the chunk's mean per-step
    action norm, the change of its mean action from the previous query's (0 at the first), and its
    mean gripper command (the last action dimension). Few on purpose: a probe fit on tens of
    episodes learns the noise of many."""
    log_probs, actions = np.asarray(log_probs, np.float32), np.asarray(actions, np.float32)
    q = len(query_steps)
    if log_probs.shape[0] != q or actions.shape[0] != q:
        raise ValueError(f"policy signals of {q} queries need as many log-prob and action rows; got "
                         f"{log_probs.shape[0]} and {actions.shape[0]}")
    mean_action = actions.mean(axis=1)
    change = np.zeros(q, np.float32)
    change[1:] = np.linalg.norm(np.diff(mean_action, axis=0), axis=1)
    norm = np.linalg.norm(actions, axis=2).mean(axis=1)
    return np.stack([log_probs.mean(1), log_probs.min(1), norm, change, mean_action[:, -1]], axis=1).astype(np.float32)


@dataclass
class OutcomeProbeConfig:
    num_features: int
    hidden: int = 32
    buckets: int = 64  # hashed instructions: tasks share a probe
    time_scale: float = 520.0  # absolute time enters as step / time_scale


class OutcomeProbe(nn.Module, Pretrained):
    _pretrained_kind = "outcome probe"

    def __init__(self, config: OutcomeProbeConfig):
        super().__init__()
        self.config = config
        self.task = nn.Embedding(config.buckets, config.hidden)
        self.gru = nn.GRU(config.num_features + 1, config.hidden, batch_first=True)
        self.head = nn.Linear(config.hidden, 1)
        self.register_buffer("mean", torch.zeros(config.num_features))
        self.register_buffer("std", torch.ones(config.num_features))

    def _batch(self, episodes: list[ProbeEpisode]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Padded inputs (B, Q, F + 1), the mask of real queries (B, Q) and the task ids (B,)."""
        width = self.config.num_features
        wrong = [k for k, e in enumerate(episodes) if e.features.ndim != 2 or e.features.shape[1] != width]
        if wrong:
            raise ValueError(f"episode(s) {wrong[:5]} have features {episodes[wrong[0]].features.shape}; the probe "
                             f"reads {width} per query")
        longest = max(len(e.query_steps) for e in episodes)
        inputs = torch.zeros(len(episodes), longest, width + 1)
        mask = torch.zeros(len(episodes), longest, dtype=torch.bool)
        for k, e in enumerate(episodes):
            q = len(e.query_steps)
            inputs[k, :q, :width] = (torch.as_tensor(e.features) - self.mean) / self.std
            inputs[k, :q, width] = torch.as_tensor(e.query_steps, dtype=torch.float32) / self.config.time_scale
            mask[k, :q] = True
        tasks = torch.tensor([zlib.crc32(e.instruction.lower().encode()) % self.config.buckets for e in episodes])
        return inputs, mask, tasks

    def forward(self, inputs: torch.Tensor, tasks: torch.Tensor) -> torch.Tensor:
        """inputs (B, Q, F + 1), tasks (B,) → the outcome logit after each query (B, Q)."""
        hidden, _ = self.gru(inputs, self.task(tasks)[None])
        return self.head(hidden)[..., 0]

    @torch.no_grad()
    def predict(self, episodes: list[ProbeEpisode]) -> list[np.ndarray]:
        """P(success | queries 0..q) for every query of every episode."""
        if not episodes:
            return []
        self.eval()
        inputs, mask, tasks = self._batch(episodes)
        probabilities = torch.sigmoid(self(inputs, tasks)).numpy()
        return [probabilities[k, :int(mask[k].sum())] for k in range(len(episodes))]

    def _save_pretrained(self, directory: Path) -> None:
        (Path(directory) / "config.json").write_text(json.dumps({"format": FORMAT, "config": asdict(self.config)}))
        save_model(self, str(Path(directory) / "model.safetensors"))

    @classmethod
    def load(cls, directory: Path, device: str = "cpu") -> OutcomeProbe:
        directory = Path(directory)
        try:
            meta = json.loads((directory / "config.json").read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"outcome probe {directory}: config.json cannot be read ({error})") from None
        if meta.get("format") != FORMAT:
            raise ValueError(f"outcome probe {directory}: config.json is not a {FORMAT} model")
        probe = cls(OutcomeProbeConfig(**meta["config"]))
        load_model(probe, str(directory / "model.safetensors"), strict=True)
        return probe.to(device).eval()


def fit_outcome_probe(episodes: list[ProbeEpisode], hidden: int = 16, epochs: int = 400, lr: float = 3e-3,
                      weight_decay: float = 1e-3, time_scale: float = 520.0, held_out: float = 0.25,
                      seed: int = 0) -> OutcomeProbe:
    """Train on every prefix of every episode, each labelled with its episode's final outcome (full
    batch Adam: a few hundred episodes train in seconds on a CPU). A `held_out` share of the
    episodes is kept apart and the weights with its lowest loss are returned: on tens of episodes
    the probe otherwise learns the noise of the training ones."""
    if len(episodes) < 4:
        raise ValueError(f"the outcome probe needs at least 4 real-labelled episodes to train on; got {len(episodes)}")
    torch.manual_seed(seed)
    order = np.random.default_rng(seed).permutation(len(episodes))
    cut = max(1, int(round(held_out * len(episodes)))) if held_out > 0 else 0
    fit = [episodes[k] for k in order[cut:]]
    check = [episodes[k] for k in order[:cut]] or fit
    probe = OutcomeProbe(OutcomeProbeConfig(episodes[0].features.shape[1], hidden, time_scale=time_scale))
    rows = np.concatenate([e.features for e in fit])
    probe.mean.copy_(torch.as_tensor(rows.mean(0)))
    probe.std.copy_(torch.as_tensor(rows.std(0) + 1e-6))

    def batch_of(episodes):  # padded once: the normalisation is fixed above
        inputs, mask, tasks = probe._batch(episodes)
        labels = torch.tensor([float(e.success) for e in episodes])[:, None].expand_as(mask)
        return inputs, mask, tasks, labels[mask]

    def loss_of(batch):
        inputs, mask, tasks, labels = batch
        return nn.functional.binary_cross_entropy_with_logits(probe(inputs, tasks)[mask], labels)

    fit_batch, check_batch = batch_of(fit), batch_of(check)
    optimizer = torch.optim.Adam(probe.parameters(), lr=lr, weight_decay=weight_decay)
    best, best_state = float("inf"), None
    for epoch in range(epochs):
        probe.train()
        loss = loss_of(fit_batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if epoch % 10 == 9 or epoch == epochs - 1:
            probe.eval()
            with torch.no_grad():
                checked = loss_of(check_batch).item()
            if checked < best:
                best, best_state = checked, {k: v.clone() for k, v in probe.state_dict().items()}
    probe.load_state_dict(best_state)
    return probe.eval()
