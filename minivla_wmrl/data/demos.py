"""`minivla-wmrl demos`: scripted demonstrations in the real simulator, written as LIBERO hdf5
(or, with `--format lerobot`, converted to one LeRobot dataset: see `data.lerobot`).

Each task's file (`<TASK_NAME>_demo.hdf5`) has the original LIBERO layout: `data` attributes
(env_name, problem_info, macros_image_convention, bddl_file_name, bddl_file_content, env_args,
num_demos, total), one `data/demo_N` group per successful episode with `num_samples`,
`model_file`, `init_state`, and datasets `actions`, `obs/*`, `states`, `robot_states`,
`rewards`, `dones`. Observation t is the one action t was chosen from. Images are stored raw
(OpenGL, upside down), as LIBERO stores them.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import h5py
import numpy as np
from robosuite.utils.transform_utils import quat2axisangle
from tqdm import tqdm

from envs.experts import expert_for
from envs.libero_env import CONTROL_HZ, LiberoEnv, get_suite, resolve_task
from minivla_wmrl.data.lerobot import write_lerobot
from minivla_wmrl.infra.atomic import atomic_file
from minivla_wmrl.infra.config import Range, command_line_parser, config_from_dict
from minivla_wmrl.infra.outputs import check_output_dir, create_output_dir


@dataclass(kw_only=True)
class DemosCommand:
    """`minivla-wmrl demos`: its command-line flags are these fields (`config.command_line_parser`)."""

    suite: str = field(default="libero_90", metadata={"help": "LIBERO suite"})
    tasks: list[str] = field(metadata={"help": "task indices or names"})
    num: Annotated[int, Range(1)] = field(default=50, metadata={"help": "successful demos to write per task"})
    out: str = field(metadata={"help": "output directory"})
    first_init_state: Annotated[int, Range(0)] = 0
    max_episodes: Annotated[int, Range(1)] = field(default=50, metadata={"help": "init states tried per task at most"})
    resolution: Annotated[int, Range(8, high=1024)] = field(default=128, metadata={
        "help": "camera size stored (LIBERO's files: 128)"})
    format: Literal["hdf5", "lerobot"] = field(default="hdf5", metadata={
        "help": "hdf5: one LIBERO file per task; lerobot: one LeRobot dataset of all tasks in --out"})
    lerobot_version: Literal["v3.0", "v2.1"] = "v3.0"
    video: bool = field(default=False, metadata={"help": "lerobot: cameras as AV1 mp4 (lossy) instead of PNG"})
    overwrite: bool = field(default=False, metadata={
        "help": "write into --out although it holds files this command did not write (see outputs.py)"})


@dataclass
class Episode:
    init_state: int
    actions: list = field(default_factory=list)
    agentview: list = field(default_factory=list)
    wrist: list = field(default_factory=list)
    states: list = field(default_factory=list)
    low_dim: list = field(default_factory=list)
    success: bool = False


def record_episode(env: LiberoEnv, init_state: int) -> Episode:
    """Run the task's scripted expert from `init_state`, recording every observation before each action."""
    episode = Episode(init_state)
    observation = env.reset(init_state)
    expert = expert_for(env)
    while not env.done and not expert.finished:
        action = expert.act(env.eef_pos())
        episode.actions.append(action)
        episode.agentview.append(observation.images["agentview"][::-1])  # back to LIBERO's raw OpenGL frame
        episode.wrist.append(observation.images["wrist"][::-1])
        episode.states.append(env.get_state())
        episode.low_dim.append(observation.state)
        observation = env.step(action).observation
    episode.success = env.success
    return episode


def _write_task_file(path: Path, env: LiberoEnv, episodes: list[Episode]) -> None:
    bddl = Path(env.bddl_file)
    with atomic_file(path) as tmp, h5py.File(tmp, "w") as f:
        data = f.create_group("data")
        data.attrs.update(
            env_name=env.problem_name, problem_info=json.dumps({"problem_name": env.problem_name,
                                                                "language_instruction": env.instruction}),
            macros_image_convention="opengl", bddl_file_name=str(bddl), bddl_file_content=bddl.read_text(),
            env_args=json.dumps({"type": 1, "env_name": env.problem_name, "bddl_file": str(bddl),
                                 "env_kwargs": {"camera_heights": env.resolution, "camera_widths": env.resolution,
                                                "camera_names": ["agentview", "robot0_eye_in_hand"],
                                                "control_freq": CONTROL_HZ, "controller": "OSC_POSE"}}),
            num_demos=len(episodes), total=sum(len(e.actions) for e in episodes))
        for i, episode in enumerate(episodes):
            demo = data.create_group(f"demo_{i}")
            steps = len(episode.actions)
            demo.attrs.update(num_samples=steps, model_file=env.model_xml,
                              init_state=episode.states[0])
            low = {k: np.stack([s[k] for s in episode.low_dim]) for k in
                   ("robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos", "robot0_joint_pos")}
            axis_angle = np.stack([quat2axisangle(q) for q in low["robot0_eef_quat"]])
            demo["actions"] = np.stack(episode.actions)
            demo["states"] = np.stack(episode.states)
            demo["robot_states"] = np.concatenate([low["robot0_gripper_qpos"], low["robot0_eef_pos"],
                                                   low["robot0_eef_quat"]], axis=1)
            rewards = np.zeros(steps)
            rewards[-1] = 1
            demo["rewards"], demo["dones"] = rewards, rewards.astype(np.uint8)
            obs = demo.create_group("obs")
            obs["agentview_rgb"] = np.stack(episode.agentview)
            obs["eye_in_hand_rgb"] = np.stack(episode.wrist)
            obs["gripper_states"] = low["robot0_gripper_qpos"]
            obs["joint_states"] = low["robot0_joint_pos"]
            obs["ee_pos"], obs["ee_ori"] = low["robot0_eef_pos"], axis_angle
            obs["ee_states"] = np.concatenate([low["robot0_eef_pos"], axis_angle], axis=1)


def generate_demos(suite: str, task: int | str, num: int, out: Path, init_states: list[int] | None = None,
                   resolution: int = 128) -> dict:
    """Record scripted episodes until `num` succeed (or the init states run out); write the successes."""
    if num < 1:  # 0 once wrote one demo
        raise ValueError(f"demos: num must be >= 1 successful demos per task, got {num}")
    if not init_states:
        raise ValueError("demos: no init states to try (max_episodes must be >= 1)")
    create_output_dir(out, "demos")
    env = LiberoEnv(suite, task, cameras=("agentview", "wrist"), resolution=resolution)
    try:
        init_states = list(range(env.num_init_states)) if init_states is None else init_states
        successes, tried = [], []
        for init_state in tqdm(init_states, desc=env.task.name[:40]):
            episode = record_episode(env, init_state)
            tried.append(init_state)
            if episode.success:
                successes.append(episode)
                if len(successes) == num:
                    break
        path = out / f"{env.task.name}_demo.hdf5"
        if successes:
            _write_task_file(path, env, successes)
        return {"suite": suite, "task": env.task_index, "name": env.task.name, "file": str(path) if successes else None,
                "tried": len(tried), "succeeded": len(successes), "success_rate": len(successes) / len(tried),
                "failed_init_states": sorted(set(tried) - {e.init_state for e in successes})}
    finally:
        env.close()


def main(args) -> None:
    parser = command_line_parser(DemosCommand, "minivla-wmrl demos",
                                 "Record scripted demonstrations as LIBERO hdf5 files (or one LeRobot dataset).")
    command = config_from_dict(DemosCommand, vars(parser.parse_args(args.options)), "demos")
    out = Path(command.out)
    bench = get_suite(command.suite)
    for task in command.tasks:  # a bad task id is named before anything is written
        resolve_task(bench, task)
    check_output_dir(out, "demos", command.overwrite)
    init_states = list(range(command.first_init_state, command.first_init_state + command.max_episodes))
    if command.format == "lerobot":  # the hdf5 files are an intermediate, removed once converted
        from minivla_wmrl.data.dataset import iter_hdf5_demos  # imports torch (~1 s): only LeRobot output needs it

        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.hdf5.") as hdf5:
            reports = [generate_demos(command.suite, task, command.num, Path(hdf5), init_states, command.resolution)
                       for task in command.tasks]
            files = [Path(r["file"]) for r in reports if r["file"]]
            if not files:
                raise ValueError("demos: no scripted episode succeeded; nothing to write")
            write_lerobot(out, iter_hdf5_demos(files), fps=CONTROL_HZ, version=command.lerobot_version,
                          video=command.video, command="demos", overwrite=command.overwrite)
        for r in reports:
            r["file"] = str(out) if r["file"] else None
    else:
        create_output_dir(out, "demos", command.overwrite)
        reports = [generate_demos(command.suite, task, command.num, out, init_states, command.resolution)
                   for task in command.tasks]
    print("| task | name | scripted success | demos written |\n|---|---|---|---|")
    for r in reports:
        print(f"| {r['task']} | {r['name']} | {r['succeeded']}/{r['tried']} = {r['success_rate']:.0%} "
              f"| {r['succeeded']} |")
    (out / "demos_report.json").write_text(json.dumps(reports, indent=2))
