"""FSDP2 for MiniVLA under torchrun: parameters, gradients and optimiser state sharded over processes.

Units, each gathered only while it runs: every Qwen2 decoder layer and every ViT block. The rest
(the embeddings tied to the LM head, patch embeddings, norms, the projector) is the root unit,
gathered for each forward pass of the policy. Optimiser state follows its parameters' shards.

Checkpoints hold full, unsharded tensors keyed by parameter name (rank 0 writes them), so a
checkpoint loads anywhere: one process, DDP, or FSDP with another process count.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)  # gathered to rank 0, on the CPU


def shard_units(policy) -> list[torch.nn.Module]:
    """The decoder layers (transformers' `_no_split_modules`, as HF's FSDP wrapping uses) and the ViT blocks."""
    llm = policy.llm.get_base_model() if hasattr(policy.llm, "get_base_model") else policy.llm
    layer_types = set(llm._no_split_modules)
    vision = policy.vision
    return ([*vision.dino_featurizer.blocks, *vision.siglip_featurizer.blocks]
            + [m for m in llm.modules() if type(m).__name__ in layer_types])


def shard_policy(policy, sum_gradients: bool = False) -> None:
    """Shard `policy` in place (call before building its optimiser). Gradients are averaged over
    processes like DDP's, or summed when each process already scales its loss by the global count."""
    mesh = init_device_mesh(policy.device.type, (dist.get_world_size(),))  # where the policy is, not FSDP's guess
    for unit in shard_units(policy):
        fully_shard(unit, mesh=mesh)
    fully_shard(policy, mesh=mesh)
    register_fsdp_forward_method(policy, "generate")  # forward() is hooked already; generate reads the root's weights
    if sum_gradients:
        for module in sharded_modules(policy):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no pre-multiplied sum


def sharded_modules(policy) -> list[FSDPModule]:
    return [m for m in policy.modules() if isinstance(m, FSDPModule)]


def is_sharded(policy) -> bool:
    return isinstance(policy, FSDPModule)


@contextmanager
def full_parameters(policy):
    """Gather every unit and keep it gathered: inside, forward passes need no collectives, so
    processes may run different numbers of them (rollouts of different lengths, rank-0 validation).
    Every process must enter and leave together. A no-op for an unsharded policy."""
    if not is_sharded(policy):
        yield
        return
    modules = sharded_modules(policy)
    for module in modules:
        module.set_reshard_after_forward(False, recurse=False)
        module.unshard()
    try:
        yield
    finally:
        for module in modules:
            module.reshard()
            module.set_reshard_after_forward(module is not policy, recurse=False)  # FSDP2's defaults: not the root


def policy_weights(policy) -> dict[str, torch.Tensor] | None:
    """The full weights of a sharded policy (a collective; rank 0 gets them, others an empty dict);
    None for an unsharded one, whose own state dict is already full."""
    return get_model_state_dict(policy, options=FULL) if is_sharded(policy) else None


def optimizer_state(policy, optimizer: torch.optim.Optimizer) -> dict:
    """The optimiser's full state keyed by parameter name (a collective when sharded)."""
    return get_optimizer_state_dict(policy, optimizer, options=FULL)


def load_optimizer_state(policy, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a state from `optimizer_state`, taking this process's shard of each tensor. Parameters
    that never had a gradient (the ViTs' unused last blocks) have no saved state: not strict.
    Also reads the older `optimizer.state_dict()` form (keyed by position) into an unsharded policy."""
    if state["state"] and all(isinstance(key, int) for key in state["state"]):
        if is_sharded(policy):
            raise ValueError("this checkpoint's optimiser state is keyed by position (written before FSDP support); "
                             "resume it once without policy.fsdp to rewrite it")
        optimizer.load_state_dict(state)
        return
    set_optimizer_state_dict(policy, optimizer, state, options=StateDictOptions(full_state_dict=True, strict=False))


def clip_gradients(parameters: list[torch.nn.Parameter], max_norm: float) -> float:
    """`clip_grad_norm_`, returning the total norm as a float (over all shards when sharded)."""
    norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
