"""The rollout engine on the real LIBERO simulator: batched queries, records, determinism, mid-chunk success."""

import functools
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from envs.libero_env import LiberoEnv
from envs.vector_env import VectorEnv
from minivla_wmrl.evaluation.prefix_auroc import probe_episode
from minivla_wmrl.rl.rollout import EpisodeSpec, RolloutConfig, RolloutEngine
from tests.conftest import TASK0
from tests.tiny_policy import make_policy

pytestmark = pytest.mark.simulator

MAX_STEPS = 24


@pytest.fixture(scope="module")
def short_envs():
    """Two workers on libero_90 task 0 with a 24-step cap (random policies never succeed; keep it short)."""
    envs = VectorEnv([functools.partial(LiberoEnv, *TASK0, cameras=("agentview",), max_steps=MAX_STEPS)] * 2)
    yield envs
    envs.close()


@pytest.fixture(scope="module")
def policy():
    return make_policy(seed=5)


class ReplayPolicy:
    """Pure-logic stand-in that plays recorded actions in chunks: the k-th query of every row gets
    actions[k*8:(k+1)*8]. Lets a real episode succeed at a known step."""

    def __init__(self, actions: np.ndarray):
        self.actions, self.calls = actions, 0
        self.config = SimpleNamespace(num_images=1, num_action_tokens=7)
        self.action_tokenizer = SimpleNamespace(config=SimpleNamespace(chunk_len=8, action_dim=7))

    def generate(self, images, instructions, temperature=0.0, generator=None, uniforms=None):
        chunk = self.actions[self.calls * 8:(self.calls + 1) * 8]
        chunk = np.concatenate([chunk, np.repeat(self.actions[-1:], 8 - len(chunk), axis=0)])
        self.calls += 1
        batch = len(instructions)
        return SimpleNamespace(token_ids=torch.zeros(batch, 7, dtype=torch.long), log_probs=torch.zeros(batch, 7),
                               actions=np.repeat(chunk[None], batch, axis=0))


def test_success_inside_a_chunk_counts_at_its_step(drawer_actions):
    actions, success_step = drawer_actions
    assert success_step % 8 != 0, "the expert's success must fall inside a chunk for this test to mean anything"
    with VectorEnv([functools.partial(LiberoEnv, *TASK0, cameras=("agentview",))]) as envs:
        engine = RolloutEngine(ReplayPolicy(np.asarray(actions)), envs, RolloutConfig(execute_steps=8))
        (trajectory,) = engine.run([EpisodeSpec(envs.infos[0].task_id, 0)], progress=False)
    assert trajectory.success and trajectory.failure is None
    assert trajectory.success_step == success_step
    assert trajectory.length == success_step  # the episode stopped at the success, mid-chunk
    assert trajectory.executed[-1] == success_step % 8
    assert list(trajectory.query_steps) == list(range(0, success_step, 8))


def test_queries_are_batched_and_recorded(short_envs, policy):
    calls = []
    generate = policy.generate

    def counting_generate(images, instructions, **kwargs):
        calls.append(len(instructions))
        return generate(images, instructions, **kwargs)

    policy.generate = counting_generate
    try:
        task_id = short_envs.infos[0].task_id
        specs = [EpisodeSpec(task_id, i, seed=i, tag=i) for i in range(3)]
        trajectories = RolloutEngine(policy, short_envs, RolloutConfig(execute_steps=8, temperature=1.0)).run(
            specs, progress=False)
    finally:
        del policy.generate
    # 3 episodes of 3 queries each on 2 envs: the first two run together, the third alone.
    assert calls == [2, 2, 2, 1, 1, 1]
    assert [t.spec.tag for t in trajectories] == [0, 1, 2]
    for t in trajectories:
        assert t.length == MAX_STEPS and not t.success and t.failure is None
        assert t.frames.shape == (3, 224, 224, 3) and t.frames.dtype == np.uint8
        assert t.final_frame.shape == (224, 224, 3)
        assert t.token_ids.shape == t.log_probs.shape == (3, 7)
        assert list(t.query_steps) == [0, 8, 16] and list(t.executed) == [8, 8, 8]
        assert np.all(t.log_probs <= 0) and np.all(np.isfinite(t.log_probs))
        # what an outcome probe reads: the actions sent, the proprioception (eef position, axis-angle, gripper
        # joints) and the simulator state (objects and robot)
        assert t.actions.shape == (3, 8, 7) and t.privileged.ndim == 2 and t.privileged.shape[0] == 3
        assert t.proprio.shape == (3, 8) and not np.allclose(t.proprio[0, :3], t.proprio[-1, :3])
        assert probe_episode(t, "proprio").features.shape == (3, 5 + 8)
        assert t.privileged.shape[1] > 10 and not np.allclose(t.privileged[0], t.privileged[-1])  # the arm moved
        assert probe_episode(t).features.shape == (3, 5) and probe_episode(t, "privileged").features.shape[0] == 3
    decoded = policy.decode_tokens(torch.as_tensor(trajectories[0].token_ids),
                                   torch.zeros(3, 7)).actions  # the chunk each query decoded to
    np.testing.assert_allclose(trajectories[0].actions, np.asarray(decoded)[:, :8], atol=1e-5)
    # The RL contract: re-scoring the recorded frames and tokens gives the recorded log-probs.
    t = trajectories[0]
    log_probs, _ = policy.score(t.frames, [t.instruction] * 3, torch.as_tensor(t.token_ids), temperature=1.0)
    np.testing.assert_allclose(log_probs.detach().numpy(), t.log_probs, atol=1e-4)


def test_rollouts_are_deterministic_and_independent_of_batching(short_envs, policy):
    task_id = short_envs.infos[0].task_id
    config = RolloutConfig(execute_steps=8, temperature=1.0, seed=3)
    engine = RolloutEngine(policy, short_envs, config)
    specs = [EpisodeSpec(task_id, 0, seed=s) for s in (0, 1)]
    first = engine.run(specs, progress=False)
    again = engine.run([EpisodeSpec(task_id, 0, seed=s) for s in (0, 1)], progress=False)
    alone = engine.run([EpisodeSpec(task_id, 0, seed=1)], progress=False)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
        np.testing.assert_array_equal(a.frames, b.frames)
    np.testing.assert_array_equal(alone[0].token_ids, first[1].token_ids)
    assert not np.array_equal(first[0].token_ids, first[1].token_ids)  # different episode seeds sample differently
    other_seed = RolloutEngine(policy, short_envs, RolloutConfig(execute_steps=8, temperature=1.0, seed=4))
    assert not np.array_equal(other_seed.run(specs[:1], progress=False)[0].token_ids, first[0].token_ids)


def test_the_overlapped_engine_equals_the_plain_one_trajectory_by_trajectory(short_envs, policy):
    task_id = short_envs.infos[0].task_id
    specs = lambda: [EpisodeSpec(task_id, s % 2, seed=s) for s in range(5)]  # noqa: E731  (more than the envs)
    runs = {groups: RolloutEngine(policy, short_envs, RolloutConfig(execute_steps=4, temperature=1.0, seed=7,
                                                                    overlap_groups=groups)).run(specs(), progress=False)
            for groups in (1, 2)}
    for plain, overlapped in zip(runs[1], runs[2]):
        assert plain.spec.seed == overlapped.spec.seed
        np.testing.assert_array_equal(plain.token_ids, overlapped.token_ids)
        np.testing.assert_array_equal(plain.frames, overlapped.frames)
        np.testing.assert_array_equal(plain.final_frame, overlapped.final_frame)
        np.testing.assert_array_equal(plain.query_steps, overlapped.query_steps)
        np.testing.assert_allclose(plain.log_probs, overlapped.log_probs, atol=1e-5)  # batches of 2 vs 1
        assert (plain.success, plain.length, plain.failure) == (overlapped.success, overlapped.length, None)
    assert len({r.token_ids.tobytes() for r in runs[2]}) == 5  # five different episodes, not one repeated
    with pytest.raises(ValueError, match=r"overlap_groups must be in 1..2"):
        RolloutEngine(policy, short_envs, RolloutConfig(overlap_groups=3))


def test_bad_rollout_settings_are_errors(short_envs, policy):
    with pytest.raises(ValueError, match="execute_steps 9 exceeds"):
        RolloutEngine(policy, short_envs, RolloutConfig(execute_steps=9))
    with pytest.raises(ValueError, match="needs \\['wrist'\\]"):
        RolloutEngine(policy, short_envs, RolloutConfig(), cameras=("agentview", "wrist"))
    with pytest.raises(ValueError, match="envs run"):
        RolloutEngine(policy, short_envs, RolloutConfig()).run([EpisodeSpec("libero_10/3", 0)], progress=False)


def test_a_horizon_cuts_the_episode_and_the_prefix_of_the_whole_one_matches_it(short_envs, policy):
    from minivla_wmrl.data.trajectories import trajectory_frames

    task_id = short_envs.infos[0].task_id
    engine = RolloutEngine(policy, short_envs, RolloutConfig(execute_steps=8, temperature=1.0, seed=3))
    whole, cut = engine.run([EpisodeSpec(task_id, 1, seed=7), EpisodeSpec(task_id, 1, seed=7, horizon=12)],
                            progress=False)
    assert (whole.length, whole.truncated) == (MAX_STEPS, False)
    assert (cut.length, cut.truncated, cut.success) == (16, True, False)  # the chunk that crosses step 12 finishes
    np.testing.assert_array_equal(cut.token_ids, whole.token_ids[:2])
    np.testing.assert_array_equal(trajectory_frames(whole, 12), trajectory_frames(cut))
    np.testing.assert_array_equal(trajectory_frames(whole, MAX_STEPS), trajectory_frames(whole))


def test_a_gated_episode_ends_when_the_gate_says_and_the_gate_reads_its_prefix(short_envs, policy):
    """After each chunk the gate gets the running gated episodes' prefixes (no frames); the one it cuts
    at 16 steps equals the whole episode's prefix; an episode that is not gated runs to the cap."""
    task_id = short_envs.infos[0].task_id
    engine = RolloutEngine(policy, short_envs, RolloutConfig(execute_steps=8, temperature=1.0, seed=3))
    seen = []

    def cut(prefixes):
        seen.extend((p.length, p.num_queries, len(p.frames)) for p in prefixes)
        return [p.length >= 16 for p in prefixes]

    whole, gated = engine.run([EpisodeSpec(task_id, 1, seed=7), EpisodeSpec(task_id, 1, seed=7, gated=True)],
                              progress=False, cut=cut)
    assert seen == [(8, 1, 0), (16, 2, 0)]  # only the gated episode, after each of its chunks
    assert (whole.length, whole.truncated) == (MAX_STEPS, False)
    assert (gated.length, gated.truncated, gated.success) == (16, True, False)
    np.testing.assert_array_equal(gated.token_ids, whole.token_ids[:2])
    np.testing.assert_array_equal(gated.actions, whole.actions[:2])
