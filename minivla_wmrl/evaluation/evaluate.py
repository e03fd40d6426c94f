"""`minivla-wmrl eval`: the standard LIBERO protocol for one checkpoint.

Trial i of a task starts from the task's published init state i, after 10 wait steps, and runs
until the first success or the suite's step cap; an exception or crashed worker counts as a
failure. WMRL's protocol is an option: `samples_per_state` K > 1 with a temperature runs each init
state K times with sampling and reports `avg`, `best_at_k` (at least one success of K) and
`all_at_k` (all K succeed) besides the per-episode success. Results go to `OUT/`: `episodes.jsonl`
(one line per finished (task, trial, sample), appended as episodes finish, which is what makes an
interrupted evaluation resume without re-running anything), `eval_info.json` and `eval_table.md`
(per task, per suite, overall, each rate with its count and 95% Wilson interval, and every setting
that changes results), and `videos/` (one mp4 per episode, or a chosen sample).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import torch
from tqdm import tqdm

from envs.factory import GYM
from envs.gl import prepare_gl
from envs.libero_env import (
    CONTROL_HZ,
    IMAGE_CONVENTIONS,
    SUITE_MAX_STEPS,
    LiberoEnv,
    get_suite,
    read_init_states,
    resolve_task,
)
from minivla_wmrl.evaluation.statistics import rate
from minivla_wmrl.evaluation.video import write_episode_video
from minivla_wmrl.infra.atomic import atomic_file
from minivla_wmrl.infra.config import (
    InputPath,
    Range,
    Seed,
    check_config,
    check_input_paths,
    command_line_parser,
    config_from_dict,
)
from minivla_wmrl.infra.outputs import check_output_dir, create_output_dir
from minivla_wmrl.infra.run_checkpoint import RUN_FILES
from minivla_wmrl.infra.versions import record_versions
from minivla_wmrl.policy.config import DTYPES, PolicyDtype
from minivla_wmrl.policy.decoding import Decoding
from minivla_wmrl.policy.minivla import MiniVLA
from minivla_wmrl.rl.env_setup import EnvSetup
from minivla_wmrl.rl.init_states import (
    TRAIN_SEED_BASE,
    VALIDATION_SEED_BASE,
    evaluation_init_states,
    vector_training_init_states,
)
from minivla_wmrl.rl.rollout import EpisodeSpec, RolloutConfig, RolloutEngine, Trajectory
from world_models.pretrained import pretrained_directory

DRAWN_BASES = {"training": TRAIN_SEED_BASE, "validation": VALIDATION_SEED_BASE}
SAMPLE_SEED_STRIDE = 1_000_000  # sample k of trial i samples with episode seed i + k × stride (k = 0: seed i)


def _help(text: str, **more) -> dict:
    return {"help": text, **more}


@dataclass(kw_only=True)
class EvalProtocol(EnvSetup):
    """How each checkpoint is evaluated, and where its episodes run: what a pipeline recipe's `eval:`
    section shares with `minivla-wmrl eval` (which adds the checkpoint and output; in a pipeline the
    suite, tasks and image convention are the recipe's)."""

    trials: Annotated[int, Range(1)] = field(default=50, metadata=_help("trials per task; trial i uses init state i"))
    first_trial: Annotated[int, Range(0)] = field(default=0, metadata=_help(
        "run trials first_trial .. first_trial + trials - 1 (e.g. init states a policy did not train on)"))
    envs: Annotated[int, Range(1)] = field(default=2, metadata=_help(
        "parallel simulator envs (a LIBERO worker process holds ~1.1 GB)"))
    execute_steps: Annotated[int, Range(1)] = field(default=1, metadata=_help(
        "actions executed per query: 1 = MiniVLA's protocol (re-query every step), 8 = OpenVLA-OFT's"))
    temperature: Annotated[float, Range(0)] = field(default=0.0, metadata=_help("0 = greedy (the protocol's)"))
    samples_per_state: Annotated[int, Range(1)] = field(default=1, metadata=_help(
        "K > 1 (with temperature > 0): each init state K times; reports avg, best@K and all@K (WMRL's protocol)"))
    seed: Seed = field(default=0, metadata=_help(
        "fixture placement seed (the protocol's env.seed(0)) and sampling seed"))
    max_steps: Annotated[int | None, Range(1)] = field(default=None, metadata=_help(
        "episode step cap (default: the suite's protocol cap)"))
    videos: Literal["all", "failures", "successes", "none"] = field(default="all", metadata=_help(
        "which episodes get a video"))
    videos_per_task: Annotated[int | None, Range(0)] = field(default=None, metadata=_help(
        "keep at most this many videos per task (the first trials)"))
    dtype: PolicyDtype = field(default="float32", metadata=_help("policy weights and compute dtype"))
    init_states: Literal["published", "training", "validation"] = field(default="published", metadata=_help(
        "the protocol's published init states, or RL's drawn training or validation states (trial i: the "
        "i-th draw): how a policy does where GRPO trains and checks it, beside where it is tested"))

    def check(self, where: str = "eval settings") -> None:
        """Refuse settings that cannot run, before anything is written."""
        check_config(self, where)
        if self.samples_per_state > 1 and self.temperature <= 0:
            raise ValueError(f"{where}: samples_per_state {self.samples_per_state}: expected 1, or K > 1 with a "
                             "temperature > 0 (greedy samples would all be the same episode)")
        self.check_pool()


@dataclass(kw_only=True)
class EvalConfig(EvalProtocol):
    """`minivla-wmrl eval`: its command-line flags are these fields (`config.command_line_parser`)."""

    checkpoint: Annotated[str, InputPath("dir")] = field(metadata=_help("policy checkpoint directory"))
    suite: str = field(metadata=_help("a LIBERO suite (libero_90, libero_10, ...) or gym"))
    out: str = field(default="runs/eval", metadata=_help("output directory"))
    tasks: list[str] = field(default_factory=list, metadata=_help(
        "task indices or names (default: every task of the suite)"))
    device: str = field(default="cpu", metadata=_help("torch device"))
    decoding: Decoding = field(default="dynamic", metadata=_help(
        "the policy's decode steps: dynamic, static (preallocated KV cache) or compiled (+ torch.compile); "
        "the same tokens in float32, in bfloat16 up to rounding"))


HASH_PROGRESS_BYTES = 256 << 20  # checkpoints larger than this hash behind a progress bar (MiniVLA-1B: ~5 GB)


def checkpoint_hash(directory: Path, progress: bool = False) -> str:
    """sha256 over the checkpoint's files (names and contents), training state and recipe excluded."""
    paths = sorted(p for p in Path(directory).rglob("*") if p.is_file() and p.name not in RUN_FILES)
    total = sum(p.stat().st_size for p in paths)
    digest = hashlib.sha256()
    with tqdm(total=total, unit="B", unit_scale=True, desc="checkpoint sha256",
              disable=not progress or total < HASH_PROGRESS_BYTES) as bar:
        for path in paths:
            digest.update(str(path.relative_to(directory)).encode())
            with open(path, "rb") as f:
                for block in iter(functools.partial(f.read, 1 << 20), b""):
                    digest.update(block)
                    bar.update(len(block))
    return digest.hexdigest()


class SettingsChanged(ValueError):
    """An output directory holds an evaluation with other settings than the ones asked for now."""


# settings recorded later: what evaluations written before them ran with
SETTING_DEFAULTS = {"center_crop": False, "init_states": "published"}


def setting(recorded: dict, key: str):
    value = recorded.get(key, SETTING_DEFAULTS.get(key))
    if key == "renderer" and isinstance(value, dict) and value.get("PYOPENGL_PLATFORM") is None:
        # recorded before `renderer()` called `prepare_gl`, which every env worker calls all the same
        value = {**value, "PYOPENGL_PLATFORM": value.get("MUJOCO_GL")}
    return value


def renderer() -> dict:
    """The headless renderer the envs use, as they will set it up (`envs.gl.prepare_gl`): recorded the
    same whether or not an env was built in this process before."""
    prepare_gl()
    return {"MUJOCO_GL": os.environ["MUJOCO_GL"], "PYOPENGL_PLATFORM": os.environ["PYOPENGL_PLATFORM"]}


def settings(config: EvalConfig, checkpoint: Path, tasks: list[int], progress: bool = False) -> dict:
    """Everything that changes the numbers; a resumed evaluation must match it exactly. `checkpoint`:
    the local directory `config.checkpoint` names (a Hub repo id's downloaded snapshot)."""
    protocol_cap = SUITE_MAX_STEPS.get(config.suite)
    max_steps = config.max_steps or protocol_cap or "env default"
    convention = IMAGE_CONVENTIONS[config.image_convention]
    return {
        "checkpoint": str(checkpoint.resolve()),
        "checkpoint_sha256": checkpoint_hash(checkpoint, progress),
        "suite": config.suite, "tasks": tasks, "trials": config.trials, "first_trial": config.first_trial,
        "init_states": config.init_states, "seed": config.seed,
        "sampling": "greedy" if config.temperature == 0 else f"temperature {config.temperature}",
        "samples_per_state": config.samples_per_state,
        "execute_steps": config.execute_steps, "max_steps": max_steps,
        "protocol_max_steps": max_steps == protocol_cap, "num_wait_steps": 10 if protocol_cap else 0,
        "image_convention": convention.name, "resolution": convention.resolution,
        "image_transform": convention.transform,
        "renderer": renderer(),
        "gym": config.gym, "device": config.device, "dtype": config.dtype, "torch": torch.__version__,
        "python": platform.python_version(),
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


def read_episodes(path: Path) -> dict[tuple, dict]:
    """Finished episodes by (task, trial, sample); a line cut off by a kill is ignored, duplicates keep the first."""
    records: dict[tuple, dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            records.setdefault((record["task"], record["trial"], record.get("sample", 0)), record)
    return records


def _wants_video(config: EvalConfig, success: bool, videos_so_far: int) -> bool:
    if config.videos_per_task is not None and videos_so_far >= config.videos_per_task:
        return False
    return {"all": True, "none": False, "successes": success, "failures": not success}[config.videos]


def _write_atomic(path: Path, text: str) -> None:
    with atomic_file(path) as tmp:
        tmp.write_text(text)


def success_rates(episodes: list[dict], samples_per_state: int) -> dict:
    """Per-episode success with its Wilson interval; with K samples per state also `avg` (the
    same per-episode rate), `best_at_k` and `all_at_k` over the states with all K samples done."""
    result = rate(sum(r["success"] for r in episodes), len(episodes))
    if samples_per_state > 1:
        by_state: dict = {}
        for r in episodes:
            by_state.setdefault((r["task"], r["trial"]), []).append(r["success"])
        complete = [s for s in by_state.values() if len(s) == samples_per_state]
        result.update(avg=result["success_rate"], states=len(complete),
                      best_at_k=rate(sum(any(s) for s in complete), len(complete)),
                      all_at_k=rate(sum(all(s) for s in complete), len(complete)))
    return result


def lerobot_aggregate(episodes: list[dict], video_dir: str = "") -> dict:
    """LeRobot's aggregate keys for these episodes. A LIBERO episode's reward is 1 at success, where
    it stops, so its sum and its max are both its success."""
    successes = [bool(e["success"]) for e in episodes]
    rate_ = float(np.mean(successes)) if successes else float("nan")
    return {"avg_sum_reward": rate_, "avg_max_reward": rate_, "pc_success": 100 * rate_, "n_episodes": len(episodes),
            "video_paths": [str(Path(video_dir) / e["video"]) for e in episodes if e.get("video")]}


def summarize(records: dict[tuple, dict], names: dict[int, tuple[str, str]], run_settings: dict,
              eval_s: float = float("nan"), out: str = "") -> dict:
    """eval_info.json: our keys (counts, rates and Wilson intervals per task, suite and overall) and,
    beside them, LeRobot's (`per_task[i].task_group/task_id/metrics`, `per_group`, and `pc_success`,
    `n_episodes`, `eval_s`, `video_paths`, ... in `overall`), so tools that read LeRobot's eval files
    read ours."""
    k, suite = run_settings["samples_per_state"], run_settings["suite"]
    per_task = []
    for task in run_settings["tasks"]:
        episodes = sorted((r for key, r in records.items() if key[0] == task),
                          key=lambda r: (r["trial"], r.get("sample", 0)))
        successes = [bool(e["success"]) for e in episodes]
        metrics = {"sum_rewards": [float(x) for x in successes], "max_rewards": [float(x) for x in successes],
                   "successes": successes, "video_paths": lerobot_aggregate(episodes, out)["video_paths"]}
        per_task.append({"task": task, "name": names[task][0], "instruction": names[task][1],
                         **success_rates(episodes, k), "episodes": episodes,
                         "task_group": suite, "task_id": task, "metrics": metrics})
    everything = [e for t in per_task for e in t["episodes"]]
    overall = success_rates(everything, k)
    lerobot = lerobot_aggregate(everything, out)
    return {"per_task": per_task, "per_suite": {suite: overall}, "per_group": {suite: lerobot},
            "overall": {**overall, **lerobot, "eval_s": eval_s, "eval_ep_s": eval_s / max(len(everything), 1)},
            "complete": overall["trials"] == len(run_settings["tasks"]) * run_settings["trials"] * k,
            "settings": run_settings}


def format_rate(r: dict) -> str:
    """`12/30 = 40.0% [24.6, 57.7]`: count, rate and 95% Wilson interval."""
    if not r["trials"]:
        return "-"
    low, high = r["ci95"]
    return f"{r['successes']}/{r['trials']} = {100 * r['success_rate']:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"


def markdown_table(info: dict) -> str:
    s, k = info["settings"], info["settings"]["samples_per_state"]
    sampled = k > 1
    header = "| task | instruction | success (95% Wilson) |" + (f" best@{k} | all@{k} |" if sampled else "")
    lines = [f"# {s['suite']}: {format_rate(info['overall'])}", "",
             f"{s['sampling']}, {k} sample(s) per init state, execute_steps {s['execute_steps']}, "
             f"max_steps {s['max_steps']}, {s['image_convention']} {s['resolution']} px, seed {s['seed']}, "
             f"{s['device']}",
             "", header, "|---|---|---|" + ("---|---|" if sampled else "")]
    for t in [*info["per_task"], {"task": "all", "instruction": "", **info["overall"]}]:
        extra = f" {format_rate(t['best_at_k'])} | {format_rate(t['all_at_k'])} |" if sampled else ""
        lines.append(f"| {t['task']} | {t['instruction']} | {format_rate(t)} |{extra}")
    return "\n".join(lines) + "\n"


def evaluate(config: EvalConfig, progress: bool = True) -> dict:
    start = time.perf_counter()
    config.check()  # before anything is written: a refused evaluation leaves no trace
    check_input_paths(config, "eval settings")
    check_output_dir(Path(config.out), "eval")
    if config.suite == GYM:  # tasks are env ids; trial i resets with seed i
        if not config.tasks:
            raise ValueError("suite gym needs tasks: the gymnasium env ids to evaluate")
        tasks, names = list(config.tasks), {t: (t, config.gym.get("instruction", "")) for t in config.tasks}
        trial_ids = {t: evaluation_init_states(config.trials, None, config.first_trial) for t in tasks}
        action_dim = None
    else:
        bench = get_suite(config.suite)
        tasks = [resolve_task(bench, t) for t in config.tasks] if config.tasks else list(range(bench.n_tasks))
        if len(set(tasks)) != len(tasks):
            raise ValueError(f"tasks {config.tasks} name the same task more than once ({tasks}); "
                             "each task is evaluated once")
        names = {t: (bench.get_task(t).name, bench.get_task(t).language) for t in tasks}
        published = config.init_states == "published"  # drawn states have no count to stay within
        trial_ids = {task: evaluation_init_states(config.trials, len(read_init_states(bench, task)) if published
                                                  else None, config.first_trial) for task in tasks}
        action_dim = LiberoEnv.action_dim
    checkpoint = pretrained_directory(config.checkpoint, "policy checkpoint")
    policy = MiniVLA.from_pretrained(checkpoint, device=config.device, dtype=DTYPES[config.dtype])
    policy.set_decoding(config.decoding)
    _check_policy(policy, config.checkpoint, action_dim)

    out = create_output_dir(Path(config.out), "eval")
    run_settings = settings(config, checkpoint, tasks, progress) | {"center_crop": policy.config.center_crop}
    settings_path = out / "eval_settings.json"
    if settings_path.exists():
        previous = json.loads(settings_path.read_text())
        changed = sorted(k for k in run_settings
                         if setting(previous, k) != run_settings[k] and k not in ("torch", "python"))
        if changed:
            raise SettingsChanged(f"{out} holds an evaluation with other settings ({', '.join(changed)}); "
                                  "resume with the same settings or choose another --out")
    else:
        _write_atomic(settings_path, json.dumps(run_settings, indent=2))
    record_versions(out)

    episodes_path, info_path = out / "episodes.jsonl", out / "eval_info.json"
    records = read_episodes(episodes_path)
    rollout = RolloutConfig(config.execute_steps, config.temperature, config.seed,
                            record_frames=config.videos != "none")
    cameras = ("agentview", "wrist")[:policy.config.num_images] if config.suite != GYM else None
    with open(episodes_path, "a") as log:
        for task in tasks:
            todo = [(i, k) for i in trial_ids[task] for k in range(config.samples_per_state)
                    if (task, i, k) not in records]
            if not todo:
                continue
            videos_so_far = sum(1 for key, r in records.items() if key[0] == task and r.get("video"))
            factory = config.factory(task, cameras or (), config.max_steps, config.seed)

            def on_episode(trajectory: Trajectory, task=task) -> None:
                nonlocal videos_so_far
                trial, sample = trajectory.spec.tag
                record = {"task": task, "trial": trial, "sample": sample, "init_state": trial,
                          "success": trajectory.success, "length": trajectory.length,
                          "success_step": trajectory.success_step, "failure": trajectory.failure, "video": None}
                if trajectory.num_queries and _wants_video(config, trajectory.success, videos_so_far):
                    name = f"task{str(task).zfill(3)}_trial{trial:02d}" + (f"_sample{sample}" if sample else "")
                    record["video"] = str(Path("videos") / f"{name}.mp4")
                    _episode_video(out / record["video"], trajectory, f"task {task} trial {trial}",
                                   config.execute_steps)
                    videos_so_far += 1
                log.write(json.dumps(record) + "\n")
                log.flush()
                os.fsync(log.fileno())
                records[(task, trial, sample)] = record

            with config.pool([factory] * min(config.envs, len(todo))) as envs:
                task_id = envs.infos[0].task_id
                count = max(trial_ids[task]) + 1
                starts = (list(range(count)) if config.init_states == "published" else
                          vector_training_init_states(envs, 0, count, DRAWN_BASES[config.init_states]))
                specs = [EpisodeSpec(task_id, starts[i], seed=i + SAMPLE_SEED_STRIDE * k, tag=(i, k)) for i, k in todo]
                RolloutEngine(policy, envs, rollout, cameras).run(specs, on_episode, progress,
                                                                  desc=f"{config.suite} task {task}")
    previous = json.loads(info_path.read_text())["overall"].get("eval_s", 0.0) if info_path.exists() else 0.0
    info = summarize(records, names, run_settings, previous + time.perf_counter() - start, str(out))
    _write_atomic(info_path, json.dumps(info, indent=2))
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
    parser = command_line_parser(EvalConfig, "minivla-wmrl eval",
                                 "Evaluate a policy checkpoint with the standard LIBERO protocol.")
    config = config_from_dict(EvalConfig, vars(parser.parse_args(args.options)), "eval")
    info = evaluate(config)
    print(markdown_table(info))
    print(f"results: {Path(config.out) / 'eval_info.json'}")
