"""`minivla-wmrl eval`: the standard LIBERO protocol for one checkpoint.

Trial i of a task starts from the task's published init state i, after 10 wait steps, and runs
until the first success or the suite's step cap; an exception or crashed worker counts as a
failure. Results go to `OUT/`: `episodes.jsonl` (one line per finished (task, trial), appended
as episodes finish, which is what makes an interrupted evaluation resume without re-running
anything), `eval_info.json` and `eval_table.md` (per task, per suite, overall, with every setting
that changes results), and `videos/` (one mp4 per episode, or a chosen sample).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

import torch

from envs.factory import GYM, env_factory, env_pool
from envs.libero_env import IMAGE_CONVENTIONS, SUITE_MAX_STEPS, LiberoEnv, get_suite, resolve_task
from minivla_wmrl.init_states import evaluation_init_states
from minivla_wmrl.policy.checkpoint import load_policy
from minivla_wmrl.rollout import EpisodeSpec, RolloutConfig, RolloutEngine, Trajectory
from minivla_wmrl.video import write_episode_video

VIDEO_CHOICES = ("all", "failures", "successes", "none")
CONTROL_HZ = 20


@dataclass
class EvalConfig:
    checkpoint: str
    suite: str
    out: str
    tasks: list[str] = field(default_factory=list)  # indices or names; empty: every task of the suite
    trials: int = 50  # per task; trial i uses init state i
    first_trial: int = 0  # run trials first_trial .. first_trial + trials - 1 (e.g. states a policy did not train on)
    envs: int = 2  # parallel simulator workers (~2.4 GB RAM each)
    execute_steps: int = 1  # 1: MiniVLA's protocol (re-query every step); 8: OpenVLA-OFT's
    temperature: float = 0.0  # 0: greedy, the protocol's
    seed: int = 0  # fixture placement seed (the protocol's env.seed(0)) and sampling seed
    max_steps: int | None = None  # None: the suite's protocol cap
    image_convention: str = "minivla"  # must match the checkpoint's training data
    videos: str = "all"  # all | failures | successes | none
    videos_per_task: int | None = None  # keep at most this many videos per task (the first trials)
    device: str = "cpu"
    dtype: str = "float32"
    gym: dict = field(default_factory=dict)  # suite "gym": GymRobotEnv options (instruction, resolution, ...)
    backend: str = "local"  # simulator workers: "local" processes or "ray" actors
    ray_address: str | None = None


def checkpoint_hash(directory: Path) -> str:
    """sha256 over the checkpoint's files (names and contents), training state excluded."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(directory).rglob("*") if p.is_file() and p.name != "training_state.pt"):
        digest.update(str(path.relative_to(directory)).encode())
        with open(path, "rb") as f:
            for block in iter(functools.partial(f.read, 1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def settings(config: EvalConfig, tasks: list[int]) -> dict:
    """Everything that changes the numbers; a resumed evaluation must match it exactly."""
    protocol_cap = SUITE_MAX_STEPS.get(config.suite)
    max_steps = config.max_steps or protocol_cap or "env default"
    convention = IMAGE_CONVENTIONS[config.image_convention]
    return {
        "checkpoint": str(Path(config.checkpoint).resolve()), "checkpoint_sha256": checkpoint_hash(Path(config.checkpoint)),
        "suite": config.suite, "tasks": tasks, "trials": config.trials, "first_trial": config.first_trial,
        "seed": config.seed,
        "sampling": "greedy" if config.temperature == 0 else f"temperature {config.temperature}",
        "execute_steps": config.execute_steps, "max_steps": max_steps,
        "protocol_max_steps": max_steps == protocol_cap, "num_wait_steps": 10 if protocol_cap else 0,
        "image_convention": convention.name, "resolution": convention.resolution, "image_transform": convention.transform,
        "renderer": {"MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "PYOPENGL_PLATFORM": os.environ.get("PYOPENGL_PLATFORM")},
        "gym": config.gym, "device": config.device, "dtype": config.dtype, "torch": torch.__version__, "python": platform.python_version(),
    }


def _check_policy(policy, checkpoint: str, env_action_dim: int | None) -> None:
    """Before any env starts: statistics that fit the action tokenizer, and (when known up front,
    as for LIBERO) the env's action size; the rollout engine checks gym envs once they are built."""
    tokenizer = policy.action_tokenizer.config
    if env_action_dim is not None and tokenizer.action_dim != env_action_dim:
        raise ValueError(f"checkpoint {checkpoint}: its action tokenizer makes {tokenizer.action_dim}-dim actions; "
                         f"the env needs {env_action_dim}")
    if policy.statistics is None:
        raise ValueError(f"checkpoint {checkpoint} has no dataset_statistics.json; actions cannot be un-normalised")
    if len(policy.statistics.q01) != tokenizer.action_dim:
        raise ValueError(f"checkpoint {checkpoint}: dataset_statistics.json has {len(policy.statistics.q01)} action "
                         f"dims but its action tokenizer {tokenizer.action_dim}")


def read_episodes(path: Path) -> dict[tuple[int, int], dict]:
    """Finished episodes by (task, trial); a line cut off by a kill is ignored, duplicates keep the first."""
    records: dict[tuple[int, int], dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            records.setdefault((record["task"], record["trial"]), record)
    return records


def _wants_video(config: EvalConfig, success: bool, videos_so_far: int) -> bool:
    if config.videos_per_task is not None and videos_so_far >= config.videos_per_task:
        return False
    return {"all": True, "none": False, "successes": success, "failures": not success}[config.videos]


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def summarize(records: dict[tuple[int, int], dict], names: dict[int, tuple[str, str]], run_settings: dict) -> dict:
    per_task = []
    for task in run_settings["tasks"]:
        episodes = sorted((r for (t, _), r in records.items() if t == task), key=lambda r: r["trial"])
        successes = sum(r["success"] for r in episodes)
        per_task.append({"task": task, "name": names[task][0], "instruction": names[task][1],
                         "successes": successes, "trials": len(episodes),
                         "success_rate": successes / len(episodes) if episodes else None, "episodes": episodes})
    successes, trials = sum(t["successes"] for t in per_task), sum(t["trials"] for t in per_task)
    overall = {"successes": successes, "trials": trials, "success_rate": successes / trials if trials else None}
    return {"per_task": per_task, "per_suite": {run_settings["suite"]: overall}, "overall": overall,
            "complete": trials == len(run_settings["tasks"]) * run_settings["trials"], "settings": run_settings}


def markdown_table(info: dict) -> str:
    s = info["settings"]
    lines = [f"# {s['suite']}: {info['overall']['successes']}/{info['overall']['trials']} = "
             f"{100 * (info['overall']['success_rate'] or 0):.1f}%", "",
             f"{s['sampling']}, execute_steps {s['execute_steps']}, max_steps {s['max_steps']}, "
             f"{s['image_convention']} {s['resolution']} px, seed {s['seed']}, {s['device']}", "",
             "| task | instruction | success | rate |", "|---|---|---|---|"]
    for t in info["per_task"]:
        rate = "-" if t["success_rate"] is None else f"{100 * t['success_rate']:.1f}%"
        lines.append(f"| {t['task']} | {t['instruction']} | {t['successes']}/{t['trials']} | {rate} |")
    return "\n".join(lines) + "\n"


def evaluate(config: EvalConfig, progress: bool = True) -> dict:
    if config.videos not in VIDEO_CHOICES:
        raise ValueError(f"videos must be one of {VIDEO_CHOICES}, got {config.videos!r}")
    if config.image_convention not in IMAGE_CONVENTIONS:
        raise ValueError(f"unknown image_convention {config.image_convention!r}; expected one of {list(IMAGE_CONVENTIONS)}")
    if config.suite == GYM:  # tasks are env ids; trial i resets with seed i
        if not config.tasks:
            raise ValueError("suite gym needs tasks: the gymnasium env ids to evaluate")
        tasks, names = list(config.tasks), {t: (t, config.gym.get("instruction", "")) for t in config.tasks}
        trial_ids = {t: evaluation_init_states(config.trials, None, config.first_trial) for t in tasks}
        action_dim = None
    else:
        bench = get_suite(config.suite)
        tasks = [resolve_task(bench, t) for t in config.tasks] if config.tasks else list(range(bench.n_tasks))
        names = {t: (bench.get_task(t).name, bench.get_task(t).language) for t in tasks}
        trial_ids = {task: evaluation_init_states(config.trials, len(bench.get_task_init_states(task)),
                                                  config.first_trial) for task in tasks}
        action_dim = LiberoEnv.action_dim
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[config.dtype]
    policy = load_policy(Path(config.checkpoint), device=config.device, dtype=dtype)
    _check_policy(policy, config.checkpoint, action_dim)

    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    run_settings = settings(config, tasks)
    settings_path = out / "eval_settings.json"
    if settings_path.exists():
        previous = json.loads(settings_path.read_text())
        changed = sorted(k for k in run_settings if previous.get(k) != run_settings[k] and k not in ("torch", "python"))
        if changed:
            raise ValueError(f"{out} holds an evaluation with other settings ({', '.join(changed)}); "
                             "resume with the same settings or choose another --out")
    else:
        _write_atomic(settings_path, json.dumps(run_settings, indent=2))

    episodes_path = out / "episodes.jsonl"
    records = read_episodes(episodes_path)
    rollout = RolloutConfig(config.execute_steps, config.temperature, config.seed, record_frames=config.videos != "none")
    cameras = ("agentview", "wrist")[:policy.config.num_images] if config.suite != GYM else None
    with open(episodes_path, "a") as log:
        for task in tasks:
            todo = [i for i in trial_ids[task] if (task, i) not in records]
            if not todo:
                continue
            videos_so_far = sum(1 for (t, _), r in records.items() if t == task and r.get("video"))
            factory = env_factory(config.suite, task, cameras or (), config.image_convention, config.max_steps,
                                  config.seed, config.gym)

            def on_episode(trajectory: Trajectory, task=task) -> None:
                nonlocal videos_so_far
                trial = trajectory.spec.tag
                record = {"task": task, "trial": trial, "init_state": trial, "success": trajectory.success,
                          "length": trajectory.length, "success_step": trajectory.success_step,
                          "failure": trajectory.failure, "video": None}
                if trajectory.num_queries and _wants_video(config, trajectory.success, videos_so_far):
                    record["video"] = str(Path("videos") / f"task{str(task).zfill(3)}_trial{trial:02d}.mp4")
                    _episode_video(out / record["video"], trajectory, f"task {task} trial {trial}", config.execute_steps)
                    videos_so_far += 1
                log.write(json.dumps(record) + "\n")
                log.flush()
                os.fsync(log.fileno())
                records[(task, trial)] = record

            with env_pool([factory] * min(config.envs, len(todo)), config.backend, config.ray_address) as envs:
                task_id = envs.infos[0].task_id
                specs = [EpisodeSpec(task_id, i, seed=i, tag=i) for i in todo]
                RolloutEngine(policy, envs, rollout, cameras).run(specs, on_episode, progress,
                                                                  desc=f"{config.suite} task {task}")
    info = summarize(records, names, run_settings)
    _write_atomic(out / "eval_info.json", json.dumps(info, indent=2))
    _write_atomic(out / "eval_table.md", markdown_table(info))
    return info


def _episode_video(path: Path, trajectory: Trajectory, title: str, execute_steps: int) -> None:
    first_camera = (lambda f: f) if trajectory.frames.ndim == 4 else (lambda f: f[0])
    frames = [first_camera(f) for f in trajectory.frames]
    steps = list(trajectory.query_steps)
    if trajectory.final_frame is not None:
        frames.append(first_camera(trajectory.final_frame))
        steps.append(trajectory.length)
    write_episode_video(path, frames, steps, trajectory.success, title, fps=CONTROL_HZ / execute_steps)


def main(args) -> None:
    config = EvalConfig(checkpoint=args.checkpoint, suite=args.suite, out=args.out, tasks=args.tasks or [],
                        trials=args.trials, first_trial=args.first_trial, envs=args.envs, execute_steps=args.execute_steps,
                        temperature=args.temperature, seed=args.seed, max_steps=args.max_steps,
                        image_convention=args.image_convention, videos=args.videos,
                        videos_per_task=args.videos_per_task, device=args.device, dtype=args.dtype,
                        backend=args.backend, ray_address=args.ray_address)
    info = evaluate(config)
    print(markdown_table(info))
    print(f"results: {Path(config.out) / 'eval_info.json'}")
