"""Frames are real pictures in every env mode the package offers.

Each mode (soft/hard reset × one/two cameras × shared/private GL context, frames larger than the
offscreen buffer) runs one episode inline, from another thread, and in a worker process hosting
all the modes at once; every frame must equal the frame LIBERO's own env renders for the same
episode (robosuite's unmodified render context, nothing of ours between), and two cameras never
give the same picture.
"""

import functools
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from envs.gl import prepare_gl
from envs.libero_env import (
    CAMERAS,
    IMAGE_CONVENTIONS,
    NUM_WAIT_STEPS,
    WAIT_ACTION,
    LiberoEnv,
    get_suite,
    read_init_states,
)
from envs.vector_env import VectorEnv
from tests.conftest import TASK0

pytestmark = pytest.mark.simulator

INIT_STATE = 3
CHUNKS = np.random.default_rng(11).uniform(-0.5, 0.5, (2, 8, 7))
LARGE = 512  # larger than the scene's 640x480 offscreen buffer: only a private context can grow to it

MODES = {
    "soft, 1 camera, shared context": dict(cameras=("agentview",)),
    "soft, 2 cameras, shared context": dict(cameras=("agentview", "wrist")),
    "soft, 2 cameras, private context": dict(cameras=("agentview", "wrist"), compile_apart=False),
    "hard, 1 camera, private context": dict(cameras=("agentview",), soft_reset=False),
    "hard, 2 cameras, private context, every step": dict(cameras=("agentview", "wrist"), soft_reset=False,
                                                         render_every_step=True),
    "soft, 1 camera, larger than the buffer": dict(cameras=("agentview",), resolution=LARGE),
}


def reference_episode(resolution: int, cameras=("agentview", "wrist")) -> list[dict[str, np.ndarray]]:
    """Frames after the reset and after each chunk, rendered by LIBERO's own env as its evaluation
    scripts build it: robosuite's private render context, current in this thread, every step
    rendered; the episode reset as `LiberoEnv` resets (fixtures drawn from seed 0)."""
    bench = get_suite(TASK0[0])  # configures LIBERO's paths before its modules are imported
    from libero.libero import get_libero_path
    from libero.libero.envs import OffScreenRenderEnv

    task = bench.get_task(TASK0[1])
    bddl = os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file)
    state = read_init_states(bench, TASK0[1])[INIT_STATE]
    prepare_gl()
    reference = OffScreenRenderEnv(bddl_file_name=bddl, camera_names=[CAMERAS[c] for c in cameras],
                                   camera_heights=resolution, camera_widths=resolution, hard_reset=False)
    context = reference.env.sim._render_context_offscreen.gl_ctx
    upright = IMAGE_CONVENTIONS["minivla"].apply

    def frames(obs):
        return {c: upright(obs[f"{CAMERAS[c]}_image"]) for c in cameras}

    try:
        context.make_current()
        np.random.seed(0)
        reference.reset()
        reference.set_init_state(state)
        for _ in range(NUM_WAIT_STEPS):
            obs, _, _, _ = reference.step(WAIT_ACTION)
        episode = [frames(obs)]
        for chunk in CHUNKS:
            for action in chunk:
                obs, _, _, _ = reference.step(action)
            episode.append(frames(obs))
    finally:
        context.make_current()
        reference.close()
    return episode


@pytest.fixture(scope="module")
def references():
    return {224: reference_episode(224), LARGE: reference_episode(LARGE, cameras=("agentview",))}


def run_episode(env) -> list[dict[str, np.ndarray]]:
    episode = [env.reset(INIT_STATE).images]
    for chunk in CHUNKS:
        episode.append(env.step(chunk).observation.images)
    return episode


def assert_real_pictures(mode: str, where: str, episode, reference) -> None:
    for t, (frames, expected) in enumerate(zip(episode, reference)):
        for camera, frame in frames.items():
            difference = np.abs(frame.astype(int) - expected[camera]).mean()
            assert difference == 0, (f"{mode}, {where}: the {camera} frame at chunk boundary {t} differs from "
                                     f"LIBERO's own render by {difference:.2f} grey levels on average")
        if len(frames) == 2:
            apart = np.abs(frames["agentview"].astype(int) - frames["wrist"]).mean()
            assert apart > 20, f"{mode}, {where}: agentview and wrist frames are nearly equal ({apart:.2f})"


def test_the_reference_is_a_picture_of_the_scene(references):
    """LIBERO's own frames: two different views with structure, the same at any buffer size."""
    first = references[224][0]
    assert np.abs(first["agentview"].astype(int) - first["wrist"]).mean() > 20
    assert all(frame.std() > 30 for frame in first.values())
    for later in references[224][1:]:
        assert np.abs(later["wrist"].astype(int) - first["wrist"]).mean() > 1  # the arm moved the wrist camera
    assert references[LARGE][0]["agentview"].shape == (LARGE, LARGE, 3)


def test_every_env_mode_renders_libero_frames_inline_from_a_thread_and_in_a_worker(references):
    envs = {mode: LiberoEnv(*TASK0, **options) for mode, options in MODES.items()}
    try:
        for mode, env in envs.items():
            reference = references[env.resolution]
            assert_real_pictures(mode, "inline", run_episode(env), reference)
            with ThreadPoolExecutor(max_workers=1) as thread:
                assert_real_pictures(mode, "from a thread", thread.submit(run_episode, env).result(), reference)
        first = next(iter(MODES))
        assert_real_pictures(first, "inline, after the other modes ran", run_episode(envs[first]), references[224])
    finally:
        for env in envs.values():
            env.close()
    factories = [functools.partial(LiberoEnv, *TASK0, **options) for options in MODES.values()]
    with VectorEnv(factories, envs_per_worker=len(factories)) as workers:
        episodes = [[{c: o.images[c] for c in o.images} for o in workers.reset([INIT_STATE] * len(MODES))]]
        for chunk in CHUNKS:
            episodes.append([r.observation.images for r in workers.step([chunk] * len(MODES))])
    for i, (mode, options) in enumerate(MODES.items()):
        assert_real_pictures(mode, "in a worker hosting every mode", [step[i] for step in episodes],
                             references[options.get("resolution", 224)])


def test_a_process_with_every_kind_of_context_exits_without_gl_errors():
    """robosuite's render contexts, collected after EGL is terminated at exit, print 'Exception
    ignored ... EGLError'; ours are freed before, in order, whether closed or not."""
    code = ("import numpy as np\nfrom envs.libero_env import LiberoEnv\n"
            "shared = LiberoEnv('libero_90', 0, cameras=('agentview',))\n"
            "hard = LiberoEnv('libero_90', 0, cameras=('agentview', 'wrist'), soft_reset=False)\n"
            "for env in (shared, hard):\n    env.reset(1)\n"
            "hard.reset(2)\n"  # a second hard reset: the first sim's context is collected
            "print('rendered', hard.step(np.zeros(7)).observation.images['wrist'].std() > 30)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "rendered True"
    assert "Exception ignored" not in done.stderr and "EGLError" not in done.stderr, done.stderr[-3000:]
