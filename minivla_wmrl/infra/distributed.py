"""torch.distributed set-up for runs launched with `torchrun` (one process per GPU, or CPU processes).

Outside torchrun (no WORLD_SIZE) everything is a single process and every helper is a no-op.
Backends: NCCL for CUDA tensors, gloo for CPU tensors (gathers of rollout summaries, logged means).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, requested: str) -> str:
        """`cuda` becomes this process's GPU (`cuda:LOCAL_RANK`)."""
        return f"cuda:{self.local_rank}" if requested == "cuda" and self.enabled else requested

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def mean(self, values: dict[str, float]) -> dict[str, float]:
        """The mean of each scalar over all processes."""
        if not self.enabled or not values:
            return values
        keys = sorted(values)
        tensor = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
        dist.all_reduce(tensor)
        return {k: v / self.world_size for k, v in zip(keys, tensor.tolist())}

    def gather(self, obj) -> list:
        """Every process's `obj`, in rank order (one-element list when not distributed)."""
        if not self.enabled:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def sum_gradients(self, parameters, scale: float = 1.0) -> None:
        """Sum each parameter's gradient over processes, times `scale` (a missing gradient counts as zero)."""
        if not self.enabled:
            return
        for p in parameters:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)
            p.grad.mul_(scale)

    def shard(self, global_batch: list[int]) -> list[int]:
        """This process's share of a global batch (equal shares; the batch size must divide)."""
        if len(global_batch) % self.world_size:
            raise ValueError(f"global batch of {len(global_batch)} does not split over {self.world_size} processes")
        return global_batch[self.rank::self.world_size]

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        """DistributedDataParallel around `module` when distributed, else the module itself."""
        if not self.enabled:
            return module
        device_ids = [module_device(module).index] if module_device(module).type == "cuda" else None
        # MiniVLA reads the ViTs' second-to-last block: their last block, norms and heads get no gradient
        return torch.nn.parallel.DistributedDataParallel(module, device_ids=device_ids, find_unused_parameters=True)


def module_device(module: torch.nn.Module) -> torch.device:
    return next(module.parameters()).device


def init_distributed(device: str = "cpu") -> Distributed:
    """Join the process group torchrun describes in the environment (once per process)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return Distributed()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        if device.startswith("cuda"):
            torch.cuda.set_device(local_rank)
            dist.init_process_group("cpu:gloo,cuda:nccl")  # gloo for the CPU-side gathers and means
        else:
            dist.init_process_group("gloo")
    return Distributed(rank, world_size, local_rank)
