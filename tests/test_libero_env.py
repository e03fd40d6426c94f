"""LiberoEnv on the real simulator: suites, the drawer task, render on demand, soft resets, bad input."""

import mmap
import re

import numpy as np
import pytest

from envs.libero_env import IMAGE_CONVENTIONS, SUITE_MAX_STEPS, SUITES, LiberoEnv
from tests.conftest import TASK0


@pytest.mark.simulator
@pytest.mark.parametrize("suite", SUITES)
def test_task0_of_every_suite_builds_resets_and_steps(suite):
    env = LiberoEnv(suite, 0, cameras=("agentview",))
    try:
        observation = env.reset(0)
        assert observation.images["agentview"].shape == (224, 224, 3)
        assert observation.images["agentview"].std() > 5, "the frame should show a scene, not a blank image"
        assert observation.proprio.shape == (8,) and observation.instruction == env.task.language
        assert env.max_steps == SUITE_MAX_STEPS[suite] and env.step_count == 0
        result = env.step(np.zeros((4, 7)), render=False)
        assert result.steps == 4 and env.step_count == 4 and result.observation is None
    finally:
        env.close()


@pytest.mark.simulator
def test_scripted_drawer_closing_succeeds_and_the_episode_stops(libero_env, drawer_actions):
    actions, success_step = drawer_actions
    assert success_step == len(actions) < SUITE_MAX_STEPS["libero_90"]
    libero_env.reset(0, render=False)
    for action in actions[:-1]:
        assert not libero_env.step(action, render=False).done
    last = libero_env.step(actions[-1])
    assert last.success and last.done and last.success_step == success_step and last.reward == 1.0
    with pytest.raises(RuntimeError, match="finished episode"):
        libero_env.step(actions[-1])


@pytest.mark.simulator
def test_success_inside_a_chunk_counts_at_its_step(libero_env, drawer_actions):
    actions, success_step = drawer_actions
    padded = np.concatenate([np.stack(actions), np.zeros((16, 7))])  # actions that would run past the success
    libero_env.reset(0, render=False)
    executed = 0
    while not libero_env.done:
        result = libero_env.step(padded[executed:executed + 8])
        executed += result.steps
    assert result.success and result.success_step == success_step == executed
    assert result.steps == (success_step - 1) % 8 + 1, "the chunk must stop at the success step"
    assert result.observation.images["agentview"].std() > 5


@pytest.mark.simulator
def test_on_demand_frames_equal_always_render_frames(libero_env, libero_env_always_render):
    actions = np.random.default_rng(0).uniform(-1, 1, (20, 7))
    lazy_first, always_first = libero_env.reset(2), libero_env_always_render.reset(2)
    np.testing.assert_array_equal(lazy_first.images["agentview"], always_first.images["agentview"])
    for begin in (0, 8, 16):
        chunk = actions[begin:begin + 8]
        lazy = libero_env.step(chunk)
        for action in chunk:
            always = libero_env_always_render.step(action)
        np.testing.assert_array_equal(lazy.observation.images["agentview"], always.observation.images["agentview"])
        np.testing.assert_array_equal(lazy.observation.proprio, always.observation.proprio)


@pytest.mark.simulator
def test_soft_reset_observation_equals_a_fresh_env_that_compiled_its_scene_itself(libero_env):
    """The default env (scene compiled apart, GL upload shared with the other envs of its scene) is
    identical to one that compiles in-process and renders through a private context of its own."""
    from envs.render_context import SharedRenderContext, live_uploads

    libero_env.reset(5)
    libero_env.step(np.random.default_rng(1).uniform(-1, 1, (12, 7)))
    soft = libero_env.reset(3)
    uploads = live_uploads()
    other = LiberoEnv(*TASK0, cameras=("agentview",))  # a second env of the scene, rendering in between
    fresh_env = LiberoEnv(*TASK0, cameras=("agentview",), compile_apart=False)
    assert libero_env.compile_apart and not fresh_env.compile_apart  # the model from a child's binary, and not
    shared = [env.sim._render_context_offscreen for env in (libero_env, other)]
    assert all(isinstance(c, SharedRenderContext) for c in shared) and shared[0].upload is shared[1].upload
    assert live_uploads() == uploads and not isinstance(fresh_env.sim._render_context_offscreen, SharedRenderContext)
    # the shared envs' models gave their texture pixels back after the upload (all but partial pages)
    page = mmap.PAGESIZE
    assert np.count_nonzero(other.sim.model._model.tex_data) < 2 * page < np.count_nonzero(fresh_env.sim.model.tex_data)
    try:
        other.reset(9)
        fresh = fresh_env.reset(3)
        np.testing.assert_array_equal(soft.images["agentview"], fresh.images["agentview"])
        np.testing.assert_array_equal(soft.proprio, fresh.proprio)
        np.testing.assert_array_equal(libero_env.get_state(), fresh_env.get_state())
        chunk = np.random.default_rng(2).uniform(-1, 1, (16, 7))
        after = [env.step(chunk).observation.images["agentview"] for env in (libero_env, other, fresh_env)]
        np.testing.assert_array_equal(after[0], after[2])  # the same physics and rendering from there on
        np.testing.assert_array_equal(libero_env.get_state(), fresh_env.get_state())
        fresh_env.reset(9)
        np.testing.assert_array_equal(after[1], fresh_env.step(chunk).observation.images["agentview"])
        # what LIBERO's hdf5 stores as model_file: the same elements (values may differ where robosuite changes
        # the model after compiling, e.g. hiding sites, which the in-process save reflects)
        names = [re.findall(r' name="([^"]+)"', env.model_xml) for env in (libero_env, fresh_env)]
        assert names[0] == names[1] and len(names[0]) > 100
    finally:
        fresh_env.close()
        other.close()
    again = libero_env.reset(3)  # other envs built and closed in this process must not spoil rendering
    np.testing.assert_array_equal(again.images["agentview"], soft.images["agentview"])


@pytest.mark.simulator
def test_raw_init_state_equals_its_index(libero_env):
    by_index = libero_env.reset(7)
    by_state = libero_env.reset(libero_env.init_states[7])
    np.testing.assert_array_equal(by_index.images["agentview"], by_state.images["agentview"])


@pytest.mark.simulator
def test_reset_leaves_the_callers_numpy_rng_alone(libero_env):
    np.random.seed(123)
    expected = np.random.rand()
    np.random.seed(123)
    libero_env.reset(0, render=False)
    assert np.random.rand() == expected


@pytest.mark.simulator
def test_episode_stops_at_the_step_cap(libero_env):
    libero_env.reset(0, render=False)
    cap, libero_env.max_steps = libero_env.max_steps, 12
    try:
        first, second = libero_env.step(np.zeros((8, 7)), render=False), libero_env.step(np.zeros((8, 7)), render=False)
        assert not first.done and second.done and second.steps == 4 and libero_env.step_count == 12
        assert not second.success
    finally:
        libero_env.max_steps = cap


def test_image_conventions():
    frame = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    np.testing.assert_array_equal(IMAGE_CONVENTIONS["minivla"].apply(frame), frame[::-1])
    np.testing.assert_array_equal(IMAGE_CONVENTIONS["openvla"].apply(frame), np.rot90(frame, 2))
    assert IMAGE_CONVENTIONS["minivla"].resolution == 224 and IMAGE_CONVENTIONS["openvla"].resolution == 256


@pytest.mark.parametrize("kwargs, message", [
    (dict(suite="libero_100", task=0), "unknown LIBERO suite 'libero_100'"),
    (dict(suite="libero_10", task=10), r"task index 10 out of range for libero_10: expected 0..9"),
    (dict(suite="libero_10", task="no_such_task"), "unknown task 'no_such_task' in libero_10"),
    (dict(suite="libero_10", task=0, cameras=("frontview",)), "unknown camera"),
    (dict(suite="libero_10", task=0, image_convention="rgb"), "unknown image_convention"),
    (dict(suite="libero_10", task=1.7), "neither a task index"),  # once silently task 1
    (dict(suite="libero_10", task=0, max_steps=-3), "max_steps must be >= 1"),  # once started done
    (dict(suite="libero_10", task=0, max_steps=0), "max_steps must be >= 1"),
])
def test_bad_env_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LiberoEnv(**kwargs)


@pytest.mark.simulator
def test_bad_init_states_and_actions_are_named(libero_env):
    with pytest.raises(ValueError, match=r"init-state index 50 out of range .* expected 0..49"):
        libero_env.reset(50)
    with pytest.raises(ValueError, match=r"raw init state has shape \(3,\)"):
        libero_env.reset(np.zeros(3))
    with pytest.raises(ValueError, match="init state True: expected an index"):  # once a pybind TypeError
        libero_env.reset(True)
    libero_env.reset(0, render=False)
    with pytest.raises(ValueError, match=r"action has shape \(6,\); expected \(7,\)"):
        libero_env.step(np.zeros(6))
    with pytest.raises(ValueError, match=r"shape \(2, 8, 7\)"):
        libero_env.step(np.zeros((2, 8, 7)))
    with pytest.raises(ValueError, match="NaN/inf at chunk index 3, dim 2"):
        chunk = np.zeros((8, 7))
        chunk[3, 2] = np.nan
        libero_env.step(chunk)
    assert libero_env.step_count == 0, "a rejected action must not advance the episode"


@pytest.mark.simulator
def test_reset_after_close_is_named():
    env = LiberoEnv("libero_90", 0, cameras=("agentview",), max_steps=8)
    env.close()
    with pytest.raises(RuntimeError, match="reset after close"):  # once an AttributeError
        env.reset(0)


def test_init_states_are_read_without_torch_and_equal_torch_load():
    """LIBERO's benchmark module is imported without loading torch (env workers stay lean), its
    init-state files read as torch.load reads them, and the module's own torch still works."""
    import subprocess
    import sys

    code = ("import sys\nfrom envs.libero_env import get_suite, read_init_states\n"
            "bench = get_suite('libero_spatial')\nstates = read_init_states(bench, 3)\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\nprint(states.shape)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1].startswith("(50, ")
    from envs.libero_env import get_suite, read_init_states

    for suite in ("libero_10", "libero_90"):
        bench = get_suite(suite)
        np.testing.assert_array_equal(read_init_states(bench, 0), bench.get_task_init_states(0))  # torch.load


def test_a_scene_that_does_not_compile_apart_is_named():
    from envs.libero_env import compile_apart

    model, saved = compile_apart('<mujoco><worldbody><geom name="ball" size="0.1"/></worldbody></mujoco>', "tiny")
    assert model.ngeom == 1 and 'name="ball"' in saved
    with pytest.raises(RuntimeError, match=r"libero_10/3: compiling the MuJoCo model in a child process failed:"
                                           r"(.|\n)*Schema violation"):
        compile_apart("<mujoco><nonsense/></mujoco>", "libero_10/3")


@pytest.mark.simulator
def test_an_env_renders_from_any_thread(libero_env):
    """An EGL context is current in one thread at a time; an env releases its own after each render,
    so the main thread and a rollout engine's simulator thread (a new one per run) can take turns."""
    from concurrent.futures import ThreadPoolExecutor

    main = libero_env.reset(2).images["agentview"]
    for _ in range(2):
        with ThreadPoolExecutor(max_workers=1) as thread:
            np.testing.assert_array_equal(thread.submit(lambda: libero_env.reset(2).images["agentview"]).result(), main)
    np.testing.assert_array_equal(libero_env.reset(2).images["agentview"], main)
