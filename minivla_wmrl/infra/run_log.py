"""A training run's metrics (`metrics.jsonl` + TensorBoard, optional wandb) and `versions.json`.

On resume from step N, what an interrupted run logged after N is dropped (from metrics.jsonl and,
with `purge_step`, from TensorBoard), so the resumed log reads as one uninterrupted run; wandb
continues the same run (its id is kept in the run directory); a run that starts over is a new one.
"""

from __future__ import annotations

import json
import math
import os
import sys
import uuid
from pathlib import Path

from minivla_wmrl.infra.versions import record_versions


def _read_records(path: Path) -> list[tuple[str, dict]]:
    """(line, record) of each line of a metrics file. A last line cut short by a kill is dropped,
    saying so; an unreadable line elsewhere is an error naming it."""
    lines = path.read_text().splitlines() if path.exists() else []
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or "step" not in record:
                raise ValueError("not a record with a step")
        except ValueError as error:
            if number == len(lines):
                print(f"{path}: dropping its last line, cut short ({error})", file=sys.stderr)
                break
            raise ValueError(f"{path} line {number} is not a metrics record ({error}): {line[:80]!r}") from None
        records.append((line, record))
    return records


def run_id(out: Path, new: bool = False) -> str:
    """The run directory's id for wandb (`run_id` file): made when a run starts over (`new`) or on
    first use, kept by resumes."""
    path = out / "run_id"
    if new or not path.exists():
        path.write_text(uuid.uuid4().hex[:12])
    return path.read_text().strip()


class MetricsLog:
    """Append records as JSON lines and TensorBoard scalars under `prefix/`; set WANDB_PROJECT to mirror to wandb."""

    def __init__(self, out: Path, prefix: str, resume_step: int = 0):
        from torch.utils.tensorboard import SummaryWriter  # ~1.3 s (torch, tensorboard): only a training run logs

        self.path, self.prefix = Path(out) / "metrics.jsonl", prefix
        record_versions(Path(out))  # a resumed run records what it continues with
        kept = [(line, record) for line, record in _read_records(self.path) if record["step"] <= resume_step]
        self.path.write_text("".join(line + "\n" for line, _ in kept))
        self.history = [record for _, record in kept]
        self.file = open(self.path, "a")
        # purge_step: TensorBoard drops what an earlier run in this directory logged after the resumed
        # step (all of it when starting over)
        self.writer = SummaryWriter(Path(out) / "tensorboard", purge_step=resume_step + 1)
        self.wandb = None
        if os.environ.get("WANDB_PROJECT"):
            import wandb  # optional, not a dependency: only when WANDB_PROJECT asks for it

            # a resume continues the same run: the steps it logs again after the checkpoint are the ones
            # the interrupted run logged (resume is exact), which wandb keeps; starting over is a new run
            self.wandb = wandb.init(project=os.environ["WANDB_PROJECT"], dir=str(out),
                                    id=run_id(Path(out), new=not resume_step), resume="allow")

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
