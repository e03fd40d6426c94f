"""LIBERO tasks behind the `RobotEnv` interface, with render-on-demand and soft resets.

Rendering is >90% of a rendered LIBERO step on a CPU (each camera ~55 ms against ~7 ms of
control), so cameras render only for steps whose observation is consumed. The camera
observables stay registered with robosuite (their sampling timers run exactly as in an
always-rendering env) but their sensors skip the render unless asked, which makes an on-demand
frame pixel-identical to the always-render frame of the same step.
"""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
import tempfile
import types
import zipfile
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable

import numpy as np

from envs.base import Observation, RobotEnv
from envs.gl import prepare_gl
from envs.libero_assets import configure_libero

SUITES = ("libero_90", "libero_10", "libero_spatial", "libero_object", "libero_goal")
# The protocol's step caps after the wait steps (longest training demo: 373/505/193/254/270).
SUITE_MAX_STEPS = {"libero_90": 400, "libero_10": 520, "libero_spatial": 220, "libero_object": 280, "libero_goal": 300}
NUM_WAIT_STEPS = 10
CONTROL_HZ = 20  # LIBERO's OSC_POSE control rate: one env step per control step
WAIT_ACTION = np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float64)
CAMERAS = {"agentview": "agentview", "wrist": "robot0_eye_in_hand"}
ARM_INIT_NOISE = 0.02  # rad, Gaussian per arm joint: robosuite's "default" initialization_noise, the published states'
ARM_NOISE_SALT = 7_000_003  # keeps a drawn state's arm noise apart from its placement draws


@dataclass(frozen=True)
class ImageConvention:
    """How raw (OpenGL, upside-down) frames become the images a checkpoint was trained on."""

    name: str
    resolution: int
    transform: str  # "flipud" or "rot180"

    def apply(self, frame: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(frame[::-1] if self.transform == "flipud" else frame[::-1, ::-1])


IMAGE_CONVENTIONS = {
    "minivla": ImageConvention("minivla", 224, "flipud"),
    "openvla": ImageConvention("openvla", 256, "rot180"),
}


class _NumpyArrayUnpickler(pickle.Unpickler):
    """Unpickles a numpy array and nothing else."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a numpy array")
        return super().find_class(module, name)


def read_init_states(bench, task_index: int) -> np.ndarray:
    """A task's published init states. LIBERO stores them with `torch.save` of a numpy array (a zip
    holding one pickle); reading that pickle directly gives the same array without torch, which
    would otherwise be the only reason an env worker loads it (~0.5 GB resident)."""
    from libero.libero import get_libero_path  # libero: prompts for a config until configure_libero() ran

    task = bench.get_task(task_index)
    path = os.path.join(get_libero_path("init_states"), task.problem_folder, task.init_states_file)
    try:
        with zipfile.ZipFile(path) as archive:
            (name,) = [n for n in archive.namelist() if n.endswith("data.pkl")]
            states = _NumpyArrayUnpickler(io.BytesIO(archive.read(name))).load()
    except (OSError, ValueError, zipfile.BadZipFile, pickle.UnpicklingError) as error:
        raise ValueError(f"LIBERO init states {path} cannot be read ({error})") from None
    if not isinstance(states, np.ndarray) or states.ndim != 2:
        raise ValueError(f"LIBERO init states {path}: expected a 2-d array, got {type(states).__name__}")
    return states


class _TorchOnDemand(types.ModuleType):
    """Stands in for torch inside LIBERO's benchmark module: the real torch is imported on the first
    attribute the module uses (it uses none of ours: see `read_init_states`)."""

    def __getattr__(self, name: str):
        if sys.modules.get("torch") is self:  # used while standing in: the real torch takes its place
            del sys.modules["torch"]
        import torch  # the point of this class: torch (~1 s, ~0.5 GB) only when LIBERO uses it

        return getattr(torch, name)


# compiles MJCF text from stdin; writes the binary model (MJB) to argv[1] and MuJoCo's saved XML of it to argv[2]
_COMPILER = ("import sys, mujoco; model = mujoco.MjModel.from_xml_string(sys.stdin.read()); "
             "mujoco.mj_saveModel(model, sys.argv[1], None); mujoco.mj_saveLastXML(sys.argv[2], model)")


def compile_apart(xml: str, where: str):
    """(MjModel, saved XML) of `xml`, compiled in a short-lived child process, the model loaded from
    its binary. The saved XML is what `sim.model.get_xml()` gives after an in-process compile.

    Compiling a LIBERO scene leaves ~420 MB behind in the compiling process (MuJoCo's decoded
    meshes and textures, and allocations it keeps for later compiles) on top of the model itself;
    an env that compiles once has no use for them. Loading the binary gives the identical model.
    """
    import mujoco  # simulator (~0.2 s): only when a scene is compiled; env-free commands import this module

    scratch = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=scratch, prefix="minivla_wmrl_mjb_") as tmp:
        binary, saved = os.path.join(tmp, "model.mjb"), os.path.join(tmp, "model.xml")
        done = subprocess.run([sys.executable, "-c", _COMPILER, binary, saved], input=xml, text=True,
                              capture_output=True)
        if done.returncode != 0:
            raise RuntimeError(f"{where}: compiling the MuJoCo model in a child process failed:\n{done.stderr[-2000:]}")
        with open(saved) as file:
            return mujoco.MjModel.from_binary_path(binary), file.read()


@contextmanager
def compiled_apart(where: str, on_compiled: Callable[[str], None]):
    """While robosuite builds a sim (a LIBERO env, or a hard reset), compile it with `compile_apart`
    and hand its saved XML to `on_compiled`. robosuite has no hook for it, so its XML-to-sim
    constructor is wrapped for the duration."""
    import robosuite.utils.binding_utils as binding  # robosuite: ~0.5 s, and reads MUJOCO_GL: after prepare_gl()

    def from_xml_string(cls, xml: str):
        model, saved_xml = compile_apart(xml, where)
        on_compiled(saved_xml)
        return cls(model)

    compile_here = binding.MjSim.__dict__["from_xml_string"]
    binding.MjSim.from_xml_string = classmethod(from_xml_string)
    try:
        yield
    finally:
        binding.MjSim.from_xml_string = compile_here


def _import_benchmark():
    """LIBERO's benchmark module, imported without loading torch when torch is not loaded yet:
    its `import torch` (for `torch.load` of init states only) would put ~0.5 GB of torch into
    every env worker. A placeholder answers that import and is removed right after."""
    if "torch" in sys.modules or "libero.libero.benchmark" in sys.modules:
        from libero.libero import benchmark  # after configure_libero(), with torch stood in for (below)

        return benchmark
    placeholder = sys.modules["torch"] = _TorchOnDemand("torch")
    try:
        from libero.libero import benchmark  # the placeholder must be in place first
    finally:
        if sys.modules.get("torch") is placeholder:
            del sys.modules["torch"]
    return benchmark


def get_suite(suite: str):
    if suite not in SUITES:
        raise ValueError(f"unknown LIBERO suite {suite!r}; expected one of {', '.join(SUITES)}")
    configure_libero()
    return _import_benchmark().get_benchmark_dict()[suite]()


def resolve_task(bench, task: int | str) -> int:
    """Task index from an index or a task name (e.g. 'KITCHEN_SCENE10_close_the_top_drawer_of_the_cabinet')."""
    names = [bench.get_task(i).name for i in range(bench.n_tasks)]
    if isinstance(task, str) and not task.lstrip("-").isdigit():
        if task not in names:
            raise ValueError(f"unknown task {task!r} in {bench.name}; expected an index 0..{len(names) - 1} or one "
                             f"of the task names, e.g. {names[0]!r}")
        return names.index(task)
    if isinstance(task, bool) or not isinstance(task, (int, np.integer, str)):  # 1.7 once became task 1
        raise ValueError(f"task {task!r} is neither a task index (int) nor a task name of {bench.name}")
    index = int(task)
    if not 0 <= index < len(names):
        raise ValueError(f"task index {index} out of range for {bench.name}: expected 0..{len(names) - 1}")
    return index


class LiberoEnv(RobotEnv):
    """One LIBERO task: reset to one of its 50 init states (or a raw state), step actions or chunks.

    Args:
        suite: libero_90, libero_10, libero_spatial, libero_object or libero_goal.
        task: index into the suite, or the task name.
        cameras: camera keys to render, from "agentview" and "wrist".
        image_convention: "minivla" (224 px, vertical flip) or "openvla" (256 px, 180° rotation).
        resolution: overrides the convention's resolution.
        max_steps: overrides the suite's protocol cap (steps after the wait steps).
        soft_reset: reuse the simulation between episodes instead of rebuilding it.
        render_every_step: render cameras on every physics step (the reference loops' cost;
            used as the baseline in benchmarks and tests).
        seed: seeds the fixture placement drawn at every reset (the protocol uses 0).
        compile_apart: compile the scene in a child process and load the binary model, so this
            process does not keep what compiling leaves behind (~420 MB); None: with soft resets
            (hard resets recompile every episode, faster in-process with MuJoCo's asset cache).
            With soft resets, a scene compiled apart renders through a GL context shared with the
            other envs of the same scene in this process, and its model's texture pixels are
            released after upload (`envs.render_context`); otherwise, or for frames larger than the
            model's offscreen buffer (640x480), it gets a private context, as in robosuite.

    LIBERO draws fixture positions (e.g. the cabinet's) from numpy's global RNG at each reset; they
    are not part of the init state. The reference loops seed once at creation, so trial i's
    fixtures depend on every earlier draw in the process. Here every reset draws them from an RNG
    seeded with `seed` (the caller's global RNG is left untouched), so an episode depends only on
    its init state: identical to the first episode of a freshly built env, in any order, in any
    worker. The gripper's internal command state is also cleared, as in a fresh env.
    """

    action_dim = 7

    def __init__(self, suite: str, task: int | str = 0, cameras=("agentview",), image_convention: str = "minivla",
                 resolution: int | None = None, max_steps: int | None = None, soft_reset: bool = True,
                 render_every_step: bool = False, num_wait_steps: int = NUM_WAIT_STEPS, seed: int = 0,
                 compile_apart: bool | None = None):
        super().__init__()
        if image_convention not in IMAGE_CONVENTIONS:
            raise ValueError(f"unknown image_convention {image_convention!r}; "
                             f"expected one of {list(IMAGE_CONVENTIONS)}")
        unknown = [c for c in cameras if c not in CAMERAS]
        if unknown:
            raise ValueError(f"unknown camera(s) {unknown}; expected a subset of {list(CAMERAS)}")
        if max_steps is not None and max_steps < 1:  # -3 once started done, 0 became the suite's cap
            raise ValueError(f"max_steps must be >= 1 (None: the suite's protocol cap), got {max_steps}")
        bench = get_suite(suite)
        self.suite, self.task_index = suite, resolve_task(bench, task)
        self.task = bench.get_task(self.task_index)
        self.task_id = f"{suite}/{self.task_index}"
        self.init_states = read_init_states(bench, self.task_index)
        self.num_init_states = len(self.init_states)
        self.instruction = self.task.language
        self.cameras = tuple(cameras)
        self.convention = IMAGE_CONVENTIONS[image_convention]
        self.resolution = self.convention.resolution if resolution is None else resolution
        if self.resolution < 1:  # 0 once fell back to the convention's 224 px
            raise ValueError(f"camera resolution must be >= 1 pixel, got {resolution}")
        self.max_steps = max_steps or SUITE_MAX_STEPS[suite]
        self.num_wait_steps = self.reset_steps = num_wait_steps
        self.render_every_step = render_every_step
        self._render_next = render_every_step
        self._rendered_last_step = False

        prepare_gl()
        from libero.libero import get_libero_path  # simulator (robosuite, ~0.5 s): after configure and prepare_gl()
        from libero.libero.envs import OffScreenRenderEnv

        bddl = os.path.join(get_libero_path("bddl_files"), self.task.problem_folder, self.task.bddl_file)
        self.bddl_file = bddl
        self.soft_reset = soft_reset
        self.compile_apart = soft_reset if compile_apart is None else compile_apart
        self._model_xml: str | None = None
        with self._compiling(), self._rendering():
            self._env = OffScreenRenderEnv(
                bddl_file_name=bddl, camera_names=[CAMERAS[c] for c in self.cameras] or ["agentview"],
                camera_heights=self.resolution, camera_widths=self.resolution,
                use_camera_obs=bool(self.cameras), hard_reset=not soft_reset,
            )
        self.problem_name = self._env.problem_name
        self.seed = seed
        self._make_camera_sensors_lazy()
        self._raw_obs: dict = {}
        from envs.render_context import release_current  # imports robosuite (~0.5 s): only built envs need it

        release_current()  # robosuite's first render left the context current in this thread

    def _make_camera_sensors_lazy(self) -> None:
        shape = (self.resolution, self.resolution, 3)
        for camera in self.cameras:
            observable = self._env.env._observables[f"{CAMERAS[camera]}_image"]
            render = observable._sensor

            def lazy(obs_cache, render=render):
                if not self._render_next:
                    return np.zeros(shape, np.uint8)
                with self._gl_current():
                    return render(obs_cache)

            lazy.__modality__ = render.__modality__
            observable.set_sensor(lazy)

    @property
    def sim(self):
        return self._env.sim

    @contextmanager
    def _gl_current(self):
        """This env's GL context current for the duration, and none after. robosuite renders into, and
        frees GL objects of, whichever context is current (another env's, built or rendered since);
        released, the context can be made current next by any thread."""
        from envs.render_context import release_current  # imports robosuite (~0.5 s): only built envs need it

        context = self.sim._render_context_offscreen
        if context is not None:
            context.gl_ctx.make_current()
        try:
            yield
        finally:
            release_current()

    def _compiling(self):
        return compiled_apart(self.task_id, self._keep_xml) if self.compile_apart else nullcontext()

    def _rendering(self):
        """The render contexts robosuite makes for this env's sims (at build, and at every hard reset):
        envs of one scene compiled apart share its GL upload; otherwise each gets a private context
        (`envs.render_context`)."""
        from envs.render_context import render_context_factory, rendering_through, scene_digest  # robosuite, ~0.5 s

        shared = self.compile_apart and self.soft_reset
        return rendering_through(render_context_factory(
            (lambda: scene_digest(self._model_xml)) if shared else None, self.resolution))

    def _keep_xml(self, xml: str) -> None:
        self._model_xml = xml

    @property
    def model_xml(self) -> str:
        """The compiled scene as MuJoCo saves it (LIBERO's hdf5 `model_file`); compiled apart, it is saved
        right after compiling, before robosuite's visual changes to the model (e.g. hidden sites)."""
        return self._model_xml if self.compile_apart else self.sim.model.get_xml()

    def reset(self, init_state: int | np.ndarray = 0, render: bool = True) -> Observation | None:
        """Reset, restore the init state (index 0..49 or a raw flattened MuJoCo state), run the wait steps."""
        if getattr(self, "_env", None) is None:
            raise RuntimeError(f"{self.task_id}: reset after close(); make a new LiberoEnv")
        if isinstance(init_state, (bool, np.bool_)):
            raise ValueError(f"init state {init_state!r}: expected an index 0..{self.num_init_states - 1} or a raw "
                             "MuJoCo state")
        if isinstance(init_state, (int, np.integer)):
            if not 0 <= init_state < self.num_init_states:
                raise ValueError(f"init-state index {init_state} out of range for {self.suite} task "
                                 f"{self.task_index}: expected 0..{self.num_init_states - 1}")
            state = self.init_states[init_state]
        else:
            state = np.asarray(init_state, dtype=np.float64)
            expected = self.init_states.shape[1]
            if state.shape != (expected,) or not np.all(np.isfinite(state)):
                raise ValueError(f"raw init state has shape {state.shape}; "
                                 f"expected a finite ({expected},) MuJoCo state")
        self._render_next = self.render_every_step
        self._seeded_reset(self.seed)
        for robot in self._env.env.robots:
            robot.gripper.current_action = np.zeros_like(robot.gripper.current_action)
        self._raw_obs = self._env.set_init_state(state)
        self._rendered_last_step = self.render_every_step
        for i in range(self.num_wait_steps):
            self._prepare_render(render and i == self.num_wait_steps - 1)
            self._raw_obs, _, _, _ = self._env.step(WAIT_ACTION)
        self._begin_episode()
        return self.observe() if render else None

    def sample_init_state(self, seed: int) -> np.ndarray:
        """A new raw init state drawn by LIBERO's own placement samplers from an RNG seeded with `seed`.

        The published 50 init states were drawn by the same samplers; new draws give RL training
        states disjoint from the evaluation states (see `minivla_wmrl.rl.init_states`). The published
        states also start the arm off its nominal pose (robosuite's default initialisation noise:
        ~0.02 rad per joint, measured on libero_90 tasks 0 and 28), which LIBERO's resets here do
        not apply: without it every drawn state would start the arm at exactly the same pose.
        """
        self._render_next = False
        self._seeded_reset(seed)
        robot = self._env.env.robots[0]
        joints = robot._ref_joint_pos_indexes
        arm_rng = np.random.default_rng([seed, ARM_NOISE_SALT])
        self.sim.data.qpos[joints] += arm_rng.normal(0.0, ARM_INIT_NOISE, len(joints))
        self.sim.forward()
        return self.get_state()

    def _seeded_reset(self, seed: int) -> None:
        """LIBERO's reset, its placement draws taken from numpy's global RNG seeded with `seed`
        (the caller's global RNG is left as it was)."""
        if not self.soft_reset:
            # LIBERO's model loading appends the scene's open/close and on/off samplers to a list it
            # never clears: the k-th hard reset would draw from k + 1 of each and place the fixtures
            # elsewhere. Cleared, a hard reset draws exactly what a soft reset does.
            self._env.env.object_property_initializers.clear()
        global_rng = np.random.get_state()
        np.random.seed(seed)
        try:
            hard = nullcontext() if self.soft_reset else self._rendering()  # a hard reset makes a new sim
            with self._compiling(), hard, self._gl_current():
                self._env.reset()
            if not self.soft_reset:  # robosuite gave the new sim's cameras their own sensors again
                self._make_camera_sensors_lazy()
        finally:
            np.random.set_state(global_rng)

    def published_init_states(self) -> np.ndarray:
        """The task's 50 published init states (the evaluation protocol's)."""
        return self.init_states

    def _prepare_render(self, render_next: bool) -> None:
        self._render_next = render_next or self.render_every_step
        self._rendered_last_step = self._render_next

    def _step_one(self, action: np.ndarray) -> tuple[float, bool, dict]:
        self._raw_obs, reward, done, info = self._env.step(action)
        return float(reward), bool(done), info

    def observe(self) -> Observation:
        """The observation at the current step. After a step that rendered (the last of a chunk) it
        is robosuite's own; after one that did not (an episode ending inside a chunk), the
        cameras render now, at the end-of-step state."""
        if not self._rendered_last_step and self.cameras:
            self._render_next = True
            self._raw_obs = self._env.env._get_observations(force_update=True)
            self._rendered_last_step = True
        obs = self._raw_obs
        images = {c: self.convention.apply(obs[f"{CAMERAS[c]}_image"]) for c in self.cameras}
        return Observation(images=images, proprio=libero_proprio(obs), instruction=self.instruction,
                           state={k: np.asarray(v) for k, v in obs.items() if not k.endswith("_image")})

    def eef_pos(self) -> np.ndarray:
        """End-effector position at the current step (no rendering)."""
        return np.array(self._raw_obs["robot0_eef_pos"])

    def check_success(self) -> bool:
        return bool(self._env.check_success())

    def get_state(self) -> np.ndarray:
        return self._env.get_sim_state()

    def close(self) -> None:
        if getattr(self, "_env", None) is not None:
            with self._gl_current():  # robosuite frees its GL objects in whichever context is current
                self._env.close()
            self._env = None


def libero_proprio(obs: dict) -> np.ndarray:
    """End-effector position (3), axis-angle orientation (3), gripper joint positions (2)."""
    from robosuite.utils.transform_utils import quat2axisangle  # robosuite: ~0.5 s; only with a live env

    return np.concatenate([obs["robot0_eef_pos"], quat2axisangle(np.array(obs["robot0_eef_quat"])),
                           obs["robot0_gripper_qpos"]]).astype(np.float32)
