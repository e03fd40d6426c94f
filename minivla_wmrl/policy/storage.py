"""The policy's directory format: `config.json`, `model.safetensors`, `dataset_statistics.json`,
`tokenizer/`, `action_tokenizer/` (callers write them into a temporary directory renamed into
place). Reading returns the parts a `MiniVLA` is built from; `MiniVLA.load` builds it, so this
module does not know the model class."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file, save_model
from torch import nn

from minivla_wmrl.infra.run_checkpoint import read_json
from minivla_wmrl.policy.action_tokenizer import ActionTokenizer
from minivla_wmrl.policy.config import MiniVLAConfig
from minivla_wmrl.policy.normalization import ActionStatistics, read_statistics, write_statistics

FORMAT = "minivla-wmrl-policy/1"
CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer", "action_tokenizer")


def write_policy(policy: nn.Module, directory: Path, dataset_name: str = "dataset",
                 weights: dict[str, torch.Tensor] | None = None) -> None:
    """Write the checkpoint files into an existing directory (callers make it atomic). `weights`:
    the full state dict of a sharded (FSDP) policy, whose own parameters are only this process's shards."""
    directory = Path(directory)
    meta = {"format": FORMAT, "policy": policy.config.to_dict(), "lora": getattr(policy, "lora", None),
            "dataset_name": dataset_name}
    (directory / "config.json").write_text(json.dumps(meta, indent=2))
    if weights is None:
        save_model(policy, str(directory / "model.safetensors"))  # handles Qwen's tied embeddings
    else:
        names: dict[int, list[str]] = {}  # tied parameters (Qwen's embeddings and LM head) by identity
        for name, parameter in policy.named_parameters(remove_duplicate=False):
            names.setdefault(id(parameter), []).append(name)
        tied = {name for group in names.values() for name in sorted(group)[1:]}  # save_model keeps the first
        save_file({k: v.contiguous() for k, v in weights.items() if k not in tied},
                  str(directory / "model.safetensors"), metadata={"format": "pt"})
    policy.tokenizer.save_pretrained(directory / "tokenizer")
    policy.action_tokenizer.save_pretrained(directory / "action_tokenizer")
    if policy.statistics is not None:
        write_statistics(directory / "dataset_statistics.json", {dataset_name: policy.statistics})


def read_dataset_statistics(path: Path, key: str | None) -> ActionStatistics | None:
    """The action statistics of dataset `key` in `path` (the only one when None); None without the file."""
    if not path.is_file():
        return None
    stats = read_statistics(path)
    if key is None and len(stats) == 1:
        return next(iter(stats.values()))
    if key not in stats:
        raise ValueError(f"{path} holds statistics for {sorted(stats)}; choose one with unnorm_key")
    return stats[key]


@dataclass
class PolicyFiles:
    """What a policy directory holds, read and checked; the weights stay on disk until loaded."""

    config: MiniVLAConfig
    tokenizer: object  # a transformers tokenizer with the action tokens
    action_tokenizer: ActionTokenizer
    statistics: ActionStatistics | None
    lora: dict | None  # the adapters' settings when the policy was saved with LoRA
    weights: Path


def read_policy(directory: Path) -> PolicyFiles:
    from transformers import AutoTokenizer  # transformers takes seconds to import; only readers need it

    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"policy checkpoint {directory} does not exist")
    missing = [name for name in CHECKPOINT_FILES if not (directory / name).exists()]
    if missing:
        raise FileNotFoundError(f"policy checkpoint {directory} lacks {', '.join(missing)}; a checkpoint holds "
                                f"{', '.join(CHECKPOINT_FILES)} (and dataset_statistics.json)")
    config_path = directory / "config.json"
    meta = read_json(config_path, "policy checkpoint config")
    if meta.get("format") != FORMAT:
        raise ValueError(f"{config_path} is not a {FORMAT} checkpoint "
                         "(a Prismatic run directory? use import_prismatic)")
    return PolicyFiles(MiniVLAConfig.from_dict(meta["policy"], str(config_path)),
                       AutoTokenizer.from_pretrained(directory / "tokenizer"),
                       ActionTokenizer.from_pretrained(directory / "action_tokenizer"),
                       read_dataset_statistics(directory / "dataset_statistics.json", meta.get("dataset_name")),
                       meta.get("lora") or None, directory / "model.safetensors")
