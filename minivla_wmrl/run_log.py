"""A training run's metrics (`metrics.jsonl` + TensorBoard, optional wandb) and its checkpoint list.

On resume from step N, what an interrupted run logged after N is dropped, so the resumed log
reads as one uninterrupted run.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path


def latest_checkpoint(out: Path) -> Path | None:
    """The highest `checkpoints/step_N` of a run directory, or None. Only exact `step_<digits>`
    directories count: `step_0000080.bak2` or `step_final` are someone's copies, not checkpoints."""
    found = [p for p in (Path(out) / "checkpoints").glob("step_*") if re.fullmatch(r"step_\d+", p.name) and p.is_dir()]
    return max(found, key=lambda p: int(p.name[len("step_"):])) if found else None


class MetricsLog:
    """Append records as JSON lines and TensorBoard scalars under `prefix/`; set WANDB_PROJECT to mirror to wandb."""

    def __init__(self, out: Path, prefix: str, resume_step: int = 0):
        from torch.utils.tensorboard import SummaryWriter

        self.path, self.prefix = Path(out) / "metrics.jsonl", prefix
        kept = [line for line in (self.path.read_text().splitlines() if self.path.exists() else [])
                if json.loads(line)["step"] <= resume_step]
        self.path.write_text("".join(line + "\n" for line in kept))
        self.history = [json.loads(line) for line in kept]
        self.file = open(self.path, "a")
        self.writer = SummaryWriter(Path(out) / "tensorboard")
        self.wandb = None
        if os.environ.get("WANDB_PROJECT"):
            import wandb  # optional: only when asked for

            self.wandb = wandb.init(project=os.environ["WANDB_PROJECT"], dir=str(out), resume="allow")

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        scalars = {k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float)) and math.isfinite(v)}
        for k, v in scalars.items():
            self.writer.add_scalar(f"{self.prefix}/{k}", v, record["step"])
        if self.wandb is not None:
            self.wandb.log({f"{self.prefix}/{k}": v for k, v in scalars.items()}, step=record["step"])
        self.history.append(record)

    def close(self) -> None:
        self.file.close()
        self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
