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


def test_wrong_number_of_actions_is_an_error():
    with VectorEnv([SleepyEnv]) as env:
        with pytest.raises(ValueError, match="got 2 entries for 1 envs"):
            env.step([np.zeros(2), np.zeros(2)])
