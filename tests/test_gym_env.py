"""GymRobotEnv on a real gymnasium robot env (gymnasium-robotics FetchPickAndPlace, MuJoCo)."""

import numpy as np
import pytest

from envs.gym_env import GymRobotEnv


@pytest.fixture(scope="module")
def fetch():
    env = GymRobotEnv("FetchPickAndPlace-v4", instruction="put the block on the target", resolution=96)
    yield env
    env.close()


def test_fetch_episode_runs_to_its_cap(fetch):
    first = fetch.reset(0)
    assert first.images["image"].shape == (96, 96, 3) and first.images["image"].std() > 5
    assert first.proprio.shape == (25,) and fetch.action_dim == 4 and fetch.max_steps == 50
    actions = np.random.default_rng(0).uniform(-1, 1, (fetch.max_steps, 4))
    steps = 0
    while not fetch.done:
        result = fetch.step(actions[steps:steps + 8], render=False)
        steps += result.steps
    assert steps == 50 and result.done and not result.success
    assert fetch.observe().instruction == "put the block on the target"


def test_init_state_index_is_a_reproducible_seed(fetch):
    a, b, c = fetch.reset(3), fetch.reset(4), fetch.reset(3)
    np.testing.assert_array_equal(a.proprio, c.proprio)
    assert not np.array_equal(a.state["desired_goal"], b.state["desired_goal"])


def test_success_comes_from_is_success(fetch):
    fetch.reset(0)
    assert not fetch.step(np.zeros(4)).success
    fetch._env.unwrapped.goal = fetch.observe().state["achieved_goal"].copy()  # the block is now at the goal
    result = fetch.step(np.zeros(4))
    assert result.success and result.done and result.success_step == 2


def test_bad_gym_input_is_named(fetch):
    with pytest.raises(ValueError, match="unknown gymnasium env id 'NoSuchRobot-v0'"):
        GymRobotEnv("NoSuchRobot-v0", instruction="x")
    fetch.reset(0)
    with pytest.raises(ValueError, match=r"expected \(4,\)"):
        fetch.step(np.zeros(7))


def test_unknown_gym_options_are_named_before_any_env_is_built():
    from envs.factory import env_factory

    with pytest.raises(ValueError, match=r"gym options \['resolutoin'\] are unknown; expected a subset of"):
        env_factory("gym", "FetchReach-v4", gym={"instruction": "reach", "resolutoin": 64})
    with pytest.raises(ValueError, match="needs gym.instruction"):
        env_factory("gym", "FetchReach-v4", gym={"resolution": 64})
