"""FSDP2 sharding of MiniVLA on CPU processes (gloo): gathered inference and full checkpoints."""

from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from minivla_wmrl.infra.fsdp import full_parameters, policy_weights, shard_policy, shard_units
from minivla_wmrl.policy.minivla import MiniVLA
from minivla_wmrl.policy.storage import write_policy
from tests.tiny_policy import make_policy

INSTRUCTIONS = ["open the top drawer of the cabinet"] * 3


def images(policy) -> np.ndarray:
    size = policy.config.image_size
    return np.random.default_rng(1).integers(0, 256, (3, size, size, 3), dtype=np.uint8)


def queries(policy, count: int) -> list[np.ndarray]:
    return [policy.generate(images(policy), INSTRUCTIONS, 1.0,
                            uniforms=np.full((3, 7), (i + 1) / (count + 1))).token_ids.numpy()
            for i in range(count)]


def sharded_worker(rank: int, world: int, root: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{root}/rendezvous", rank=rank, world_size=world)
    torch.set_num_threads(1)
    policy = make_policy(seed=3)
    policy.configure_training(lora=True, lora_r=4, lora_alpha=8)
    shard_policy(policy)
    with full_parameters(policy):  # unequal numbers of forward passes: no collective may be waiting
        tokens = queries(policy, 3 if rank == 0 else 1)
    weights = policy_weights(policy)
    if rank == 0:
        np.save(f"{root}/tokens.npy", np.stack(tokens))
        (Path(root) / "checkpoint").mkdir()
        write_policy(policy, Path(root) / "checkpoint", weights=weights)
    dist.barrier()
    dist.destroy_process_group()


def test_a_sharded_policy_generates_like_the_full_one_and_saves_full_weights(tmp_path):
    reference = make_policy(seed=3)
    reference.configure_training(lora=True, lora_r=4, lora_alpha=8)
    assert len(shard_units(reference)) == 8  # the tiny preset: 2 Qwen layers, 3 + 3 ViT blocks
    mp.spawn(sharded_worker, args=(2, str(tmp_path)), nprocs=2)

    np.testing.assert_array_equal(np.load(tmp_path / "tokens.npy"), np.stack(queries(reference, 3)))
    from safetensors.torch import load_file

    saved = load_file(tmp_path / "checkpoint" / "model.safetensors")
    reference.save_pretrained(tmp_path / "unsharded")
    unsharded = load_file(tmp_path / "unsharded" / "model.safetensors")
    assert saved.keys() == unsharded.keys()  # the tied embeddings under the name save_model keeps
    loaded = MiniVLA.from_pretrained(tmp_path / "checkpoint")  # strict
    expected = reference.state_dict()
    assert loaded.state_dict().keys() == expected.keys()
    for name, tensor in loaded.state_dict().items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0, msg=name)


def test_optimizer_state_is_keyed_by_name_and_older_positional_states_still_load():
    from minivla_wmrl.infra.fsdp import load_optimizer_state, optimizer_state

    def trained():
        policy = make_policy(seed=3)
        policy.configure_training(lora=True, lora_r=4, lora_alpha=8)
        optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-3)
        policy.score(images(policy), INSTRUCTIONS, torch.full((3, 7), policy.vocab_len - 1), 1.0)[0].sum().backward()
        optimizer.step()
        policy.zero_grad(set_to_none=True)
        return policy, optimizer

    policy, optimizer = trained()
    expected = optimizer.state_dict()["state"]
    for state in (optimizer_state(policy, optimizer), optimizer.state_dict()):
        fresh, new_optimizer = trained()
        new_optimizer.state.clear()
        load_optimizer_state(fresh, new_optimizer, state)
        loaded = new_optimizer.state_dict()["state"]
        assert loaded.keys() >= expected.keys()
        for index, moments in expected.items():
            torch.testing.assert_close(loaded[index]["exp_avg_sq"], moments["exp_avg_sq"], rtol=0, atol=0)
        for index in loaded.keys() - expected.keys():  # never had a gradient (the ViTs' last blocks): zero moments
            assert not loaded[index]["exp_avg"].any() and not loaded[index]["exp_avg_sq"].any()
    assert all(isinstance(key, str) for key in optimizer_state(policy, optimizer)["state"])
