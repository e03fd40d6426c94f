"""`minivla-wmrl vq`: train the residual-VQ action tokenizer on demonstration action chunks.

Raw LIBERO actions → no-op filtering → training gripper convention (`read_episodes`) → BOUNDS_Q99 statistics →
normalised chunks (reference padding) → episodes split into train and held-out → Adam on L1 +
commitment (codebooks move by EMA). Writes the tokenizer, `dataset_statistics.json` and metrics.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Annotated

import numpy as np
import torch
from tqdm import tqdm

from minivla_wmrl.data.chunks import episode_chunks
from minivla_wmrl.data.dataset import read_episodes
from minivla_wmrl.infra.config import (
    InputPath,
    Range,
    Seed,
    check_config,
    check_input_paths,
    command_line_parser,
    config_from_dict,
)
from minivla_wmrl.infra.outputs import check_output_dir, create_output_dir
from minivla_wmrl.policy.action_tokenizer import ActionTokenizer, ActionTokenizerConfig
from minivla_wmrl.policy.normalization import ActionStatistics, write_statistics


@dataclass
class VQTrainConfig:
    """Training settings; defaults from the reference VQ-BeT/MiniVLA recipe (Adam 1e-3, wd 1e-4, batch ~1024)."""

    steps: Annotated[int, Range(1)] = 3000
    batch_size: Annotated[int, Range(1)] = 1024
    lr: Annotated[float, Range(0)] = 1e-3
    weight_decay: Annotated[float, Range(0)] = 1e-4
    # fraction of episodes held out for the reconstruction error
    val_fraction: Annotated[float, Range(0, below=1)] = 0.1
    seed: Seed = 0
    device: str = "cpu"


@dataclass(kw_only=True)
class VQCommand(VQTrainConfig):
    """`minivla-wmrl vq`: its command-line flags are these fields (`config.command_line_parser`)."""

    data: Annotated[list[str], InputPath("either")] = field(metadata={
        "help": "LIBERO hdf5 demonstration files, directories of them, or LeRobot datasets"})
    out: str = field(metadata={"help": "output directory (action_tokenizer/, dataset_statistics.json)"})
    chunk_len: Annotated[int, Range(1)] = field(default=8, metadata={"help": "actions per chunk"})
    dataset_name: str = field(default="libero", metadata={"help": "key in dataset_statistics.json"})


def split_episodes(num_episodes: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.random.default_rng(seed).permutation(num_episodes)
    num_val = int(round(val_fraction * num_episodes)) if num_episodes > 1 else 0
    num_val = min(max(num_val, 1 if val_fraction > 0 and num_episodes > 1 else 0), num_episodes - 1)
    return np.sort(order[num_val:]), np.sort(order[:num_val])


def reconstruction_l1(tokenizer: ActionTokenizer, chunks: torch.Tensor) -> float:
    """Mean absolute error of encode → decode on normalised chunks."""
    with torch.no_grad():
        return float((tokenizer.decode(tokenizer.encode(chunks)) - chunks).abs().mean())


def train_action_tokenizer(train_chunks: np.ndarray, val_chunks: np.ndarray | None, config: ActionTokenizerConfig,
                           train: VQTrainConfig, log=None, progress: bool = True) -> tuple[ActionTokenizer, list[dict]]:
    torch.manual_seed(train.seed)
    tokenizer = ActionTokenizer(config).to(train.device)
    train_t = torch.as_tensor(train_chunks, dtype=torch.float32, device=train.device)
    val_t = (torch.as_tensor(val_chunks, dtype=torch.float32, device=train.device)
             if val_chunks is not None and len(val_chunks) else None)
    optimizer = torch.optim.Adam([p for p in tokenizer.parameters() if p.requires_grad], lr=train.lr,
                                 weight_decay=train.weight_decay)
    generator = torch.Generator(device="cpu").manual_seed(train.seed)
    history = []
    for step in tqdm(range(1, train.steps + 1), desc="vq", disable=not progress):
        batch = train_t[torch.randint(len(train_t), (min(train.batch_size, len(train_t)),), generator=generator)]
        tokenizer.train()
        _, _, losses = tokenizer(batch)
        optimizer.zero_grad(set_to_none=True)
        losses["loss"].backward()
        optimizer.step()
        if step == 1 or step % max(1, train.steps // 20) == 0 or step == train.steps:
            tokenizer.eval()
            record = {"step": step, **{k: v.item() for k, v in losses.items()}}
            if val_t is not None:
                record["val_l1"] = reconstruction_l1(tokenizer, val_t)
            history.append(record)
            if log:
                log(record)
    tokenizer.eval()
    return tokenizer, history


def run_vq(paths: list[str], out: Path, train_config: VQTrainConfig, chunk_len: int = 8,
           dataset_name: str = "libero") -> dict:
    """Train the action tokenizer on demo files; write `action_tokenizer/`, statistics and metrics into `out`."""
    check_config(train_config, "vq settings")  # once: --steps -3 wrote an untrained tokenizer, then IndexError
    Range(1).check(chunk_len, "vq chunk_len")
    check_output_dir(Path(out), "vq")
    episodes = [e.actions for e in read_episodes(paths, chunk_len, image_key=None)]
    config = ActionTokenizerConfig(chunk_len=chunk_len, action_dim=episodes[0].shape[1])
    train_ids, val_ids = split_episodes(len(episodes), train_config.val_fraction, train_config.seed)
    stats = ActionStatistics.from_actions(np.concatenate([episodes[i] for i in train_ids]),
                                          num_trajectories=len(train_ids))

    def chunks(ids):
        return (np.concatenate([episode_chunks(stats.normalize(episodes[i]), config.chunk_len) for i in ids])
                if len(ids) else None)

    out = create_output_dir(Path(out), "vq")
    with open(out / "vq_metrics.jsonl", "w") as metrics:
        def log(record):
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()

        tokenizer, history = train_action_tokenizer(chunks(train_ids), chunks(val_ids), config, train_config, log)
    tokenizer.save_pretrained(out / "action_tokenizer")
    write_statistics(out / "dataset_statistics.json", {dataset_name: stats})
    (out / "vq_train_config.json").write_text(json.dumps(asdict(train_config), indent=2))
    return {"train": len(train_ids), "held_out": len(val_ids), "first": history[0], "last": history[-1],
            "action_tokenizer": str(out / "action_tokenizer")}


def main(args) -> None:
    parser = command_line_parser(VQCommand, "minivla-wmrl vq",
                                 "Train the residual-VQ action tokenizer on demonstration files.")
    command = config_from_dict(VQCommand, vars(parser.parse_args(args.options)), "vq")
    check_input_paths(command, "vq")
    train_config = VQTrainConfig(**{f.name: getattr(command, f.name) for f in fields(VQTrainConfig)})
    result = run_vq(command.data, Path(command.out), train_config, command.chunk_len, command.dataset_name)
    first, last = result["first"], result["last"]
    print(f"episodes: {result['train']} train, {result['held_out']} held out; steps: {train_config.steps}")
    if "val_l1" in last:
        print(f"held-out reconstruction L1 (normalised): {first['val_l1']:.4f} -> {last['val_l1']:.4f}")
    print(f"wrote {result['action_tokenizer']} and {Path(command.out) / 'dataset_statistics.json'}")
