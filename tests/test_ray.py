"""Ray rollout workers on a local 2-CPU Ray cluster with the real LIBERO simulator."""

import functools

import numpy as np
import pytest
import ray

from envs.libero_env import LiberoEnv
from envs.ray_env import RayVectorEnv
from envs.vector_env import VectorEnv
from minivla_wmrl.rl.rollout import EpisodeSpec, RolloutConfig, RolloutEngine
from tests.conftest import TASK0
from tests.tiny_policy import make_policy

pytestmark = pytest.mark.simulator

FACTORY = functools.partial(LiberoEnv, *TASK0, cameras=("agentview",), max_steps=16)
CONFIG = RolloutConfig(execute_steps=8, temperature=1.0, seed=1)


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def policy():
    return make_policy(seed=17)


def specs(task_id):
    return [EpisodeSpec(task_id, i % 2, seed=i, tag=i) for i in range(3)]


@pytest.fixture(scope="module")
def local_trajectories(policy):
    with VectorEnv([FACTORY] * 2) as envs:
        return RolloutEngine(policy, envs, CONFIG).run(specs(envs.infos[0].task_id), progress=False)


def assert_same(a, b):
    assert [t.spec.tag for t in a] == [t.spec.tag for t in b]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.token_ids, y.token_ids)
        np.testing.assert_array_equal(x.frames, y.frames)
        assert (x.success, x.length, x.failure) == (y.success, y.length, y.failure)


def test_ray_backend_gives_the_local_results_for_the_same_seeds(ray_cluster, policy, local_trajectories):
    with RayVectorEnv([FACTORY] * 2) as envs:
        trajectories = RolloutEngine(policy, envs, CONFIG).run(specs(envs.infos[0].task_id), progress=False)
    assert_same(trajectories, local_trajectories)


def test_a_killed_actor_is_replaced_and_loses_no_episode(ray_cluster, policy, local_trajectories):
    with RayVectorEnv([FACTORY] * 2) as envs:
        generate, calls = policy.generate, []

        def generate_then_kill(*args, **kwargs):
            calls.append(1)
            if len(calls) == 2:  # mid-episode: both actors are between their first and second chunk
                envs.kill(0)
            return generate(*args, **kwargs)

        policy.generate = generate_then_kill
        try:
            trajectories = RolloutEngine(policy, envs, CONFIG).run(specs(envs.infos[0].task_id), progress=False)
        finally:
            del policy.generate
        assert envs.restarts == [1, 0]
    assert_same(trajectories, local_trajectories)
