"""VectorEnv: parallel real LIBERO workers, crash and hang recovery."""

import functools
import os
import signal

import numpy as np
import pytest

from envs.libero_env import LiberoEnv
from envs.vector_env import EnvFailure, VectorEnv
from tests.conftest import TASK0
from tests.fake_envs import SleepyEnv


@pytest.fixture(scope="module")
def vector_env():
    env = VectorEnv([functools.partial(LiberoEnv, *TASK0, cameras=("agentview",))] * 2)
    yield env
    env.close()


@pytest.mark.simulator
def test_workers_step_in_parallel_like_a_local_env(vector_env, libero_env):
    actions = np.random.default_rng(3).uniform(-1, 1, (8, 7))
    first = vector_env.reset([4, 6])
    assert all(o.images["agentview"].shape == (224, 224, 3) for o in first)
    results = vector_env.step([actions, None])
    assert results[1] is None and results[0].steps == 8
    local_first = libero_env.reset(4)
    local = libero_env.step(actions)
    np.testing.assert_array_equal(first[0].images["agentview"], local_first.images["agentview"])
    np.testing.assert_array_equal(results[0].observation.images["agentview"], local.observation.images["agentview"])
    assert vector_env.infos[0].instruction == "close the top drawer of the cabinet"


@pytest.mark.simulator
def test_killed_worker_is_restarted_and_its_episode_reported(vector_env):
    vector_env.reset([0, 1], render=False)
    os.kill(vector_env.pids()[1], signal.SIGKILL)
    results = vector_env.step([np.zeros(7), np.zeros(7)], render=False)
    assert results[0].failure is None and results[0].steps == 1
    assert results[1].done and not results[1].success and results[1].failure.startswith("worker crash")
    assert vector_env.restarts == [0, 1]
    again = vector_env.reset([None, 2])
    assert again[0] is None and again[1].images["agentview"].shape == (224, 224, 3)
    assert vector_env.step([None, np.zeros((2, 7))])[1].steps == 2


@pytest.mark.simulator
def test_env_exception_is_reported_and_the_worker_lives_on(vector_env):
    results = vector_env.reset([99, 0], render=False)
    assert isinstance(results[0], EnvFailure) and "init-state index 99 out of range" in results[0].reason
    assert vector_env.restarts[0] == 0


def test_hung_worker_times_out_and_is_restarted():
    with VectorEnv([SleepyEnv] * 2, step_timeout_s=2.0) as env:
        env.reset([0, 0])
        results = env.step([np.array([0.0, 0.0]), np.array([30.0, 0.0])])
        assert results[0].failure is None
        assert results[1].failure.startswith("worker timeout") and results[1].done
        assert env.restarts == [0, 1]
        assert env.reset([None, 0])[1].proprio[0] == 0


def test_a_lost_worker_fails_all_its_envs_until_they_are_reset():
    with VectorEnv([SleepyEnv] * 4, step_timeout_s=2.0, envs_per_worker=2) as env:
        assert len(env.pids()) == 2 and env.num_envs == len(env.infos) == 4
        env.reset([0, 0, 0, 0])
        results = env.step([np.zeros(2), np.zeros(2), np.array([30.0, 0.0]), None])  # env 3 idle in the hung worker
        assert [r.failure is None for r in results[:2]] == [True, True] and results[3] is None
        assert results[2].failure.startswith("worker timeout")
        assert env.restarts == [0, 0, 1, 1]
        after = env.step([np.zeros(2)] * 4)
        assert [r.steps for r in after[:2]] == [1, 1]  # the other worker's envs go on
        assert all("restarted since its last reset" in r.failure for r in after[2:])
        (asked,) = env.call("published_init_states", envs=[3])  # needs no episode: reaches the env (which has none)
        assert "has no attribute 'published_init_states'" in asked.reason
        assert [o.proprio[0] for o in env.reset([None, None, 0, 0])[2:]] == [0, 0]
        assert [r.steps for r in env.step([None, None, np.zeros(2), np.zeros(2)])[2:]] == [1, 1]


@pytest.mark.simulator
def test_a_worker_hosting_two_envs_of_a_task_renders_them_like_a_local_env(libero_env):
    actions = np.random.default_rng(5).uniform(-1, 1, (8, 7))
    with VectorEnv([functools.partial(LiberoEnv, *TASK0, cameras=("agentview",))] * 2, envs_per_worker=2) as env:
        assert len(env.pids()) == 1
        first = env.reset([4, 6])
        stepped = env.step([actions, actions])
    for i, init_state in enumerate((4, 6)):
        np.testing.assert_array_equal(first[i].images["agentview"], libero_env.reset(init_state).images["agentview"])
        np.testing.assert_array_equal(stepped[i].observation.images["agentview"],
                                      libero_env.step(actions).observation.images["agentview"])


def test_wrong_number_of_actions_is_an_error():
    with VectorEnv([SleepyEnv]) as env:
        with pytest.raises(ValueError, match="got 2 entries for 1 envs"):
            env.step([np.zeros(2), np.zeros(2)])


def test_env_pool_puts_envs_per_worker_on_local_workers_only():
    from envs.factory import env_pool

    with env_pool([SleepyEnv] * 3, "local", envs_per_worker=2) as pool:
        assert len(pool.pids()) == 2 and pool.num_envs == 3
        assert [o.proprio[0] for o in pool.reset([0, 0, 0])] == [0, 0, 0]
        assert [r.steps for r in pool.step([np.zeros(2)] * 3)] == [1, 1, 1]
        pool.step([None, np.zeros(2), None])  # only env 1, the second slot of the first worker
        assert [r.observation.proprio[0] for r in pool.step([np.zeros(2)] * 3)] == [2, 3, 2]
    with pytest.raises(ValueError, match="envs_per_worker=2 needs the 'local' backend"):
        env_pool([SleepyEnv], "ray", envs_per_worker=2)
    with pytest.raises(ValueError, match="envs_per_worker must be >= 1, got 0"):
        env_pool([SleepyEnv], "local", envs_per_worker=0)
    with pytest.raises(ValueError, match="unknown rollout backend 'slurm'"):
        env_pool([SleepyEnv], "slurm")
