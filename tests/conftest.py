"""Shared fixtures: each real LIBERO env is built once per test session (creation costs seconds)."""

import os

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

import pytest  # noqa: E402

from envs.libero_env import LiberoEnv  # noqa: E402

TASK0 = ("libero_90", 0)  # "close the top drawer of the cabinet"


@pytest.fixture(scope="session")
def libero_env():
    """libero_90 task 0, agent-view camera rendered on demand, soft resets."""
    env = LiberoEnv(*TASK0, cameras=("agentview",))
    yield env
    env.close()


@pytest.fixture(scope="session")
def libero_env_always_render():
    """The same task rendering its camera on every physics step (the reference loops' behaviour)."""
    env = LiberoEnv(*TASK0, cameras=("agentview",), render_every_step=True)
    yield env
    env.close()


@pytest.fixture(scope="session")
def drawer_actions(libero_env):
    """The scripted expert's actions that close the drawer from init state 0, and the success step."""
    from envs.experts import run_expert

    actions = run_expert(libero_env, 0)
    assert libero_env.success, "the scripted drawer expert must solve libero_90 task 0 from init state 0"
    return actions, libero_env.success_step


@pytest.fixture(scope="session")
def demos(tmp_path_factory):
    """Three scripted demos of libero_90 task 0 recorded in the real simulator (both cameras, 128 px)."""
    from minivla_wmrl.data.demos import generate_demos

    out = tmp_path_factory.mktemp("demos")
    report = generate_demos("libero_90", 0, num=3, out=out, init_states=[0, 1, 2, 3])
    assert report["succeeded"] == 3 and report["success_rate"] == 1.0
    return out / f"{report['name']}_demo.hdf5"
