"""`minivla-wmrl bench env`: one LIBERO episode timed three ways in one process, and the memory of
one env worker process.

- naive: hard reset, both cameras rendered every step (what the reference evaluation loops do);
  its agentview frames at every chunk boundary must equal the engine's, and its wrist frames differ
  from them, or no ratio is reported (`same_work`);
- engine: soft reset, one camera rendered on demand at chunk boundaries (what our rollouts do);
- floor: no rendering at all (the physics + control cost no rollout can beat);
- worker memory: a rollout worker (`envs.VectorEnv`, engine settings) after a reset and 5 chunks:
  resident (RSS) and private (USS: what the process alone holds, freed when it exits) memory, as
  it runs; side by side, compiling its MuJoCo scene itself (as before `compile_apart`, which also
  gives it a private GL context); and a worker hosting several envs of the task (one GL context).
"""

from __future__ import annotations

import functools
import statistics
import time
from pathlib import Path

import numpy as np
import psutil
from tqdm import tqdm

from envs.libero_env import LiberoEnv
from envs.vector_env import VectorEnv
from minivla_wmrl.bench.same_work import check_cameras_differ, check_same_frames
from minivla_wmrl.infra.outputs import write_json_output

MODES = {
    "naive": dict(cameras=("agentview", "wrist"), soft_reset=False, render_every_step=True),
    "engine": dict(cameras=("agentview",), soft_reset=True),
    "floor": dict(cameras=(), soft_reset=True),
}


def _episode(env: LiberoEnv, mode: str, actions: np.ndarray, chunk: int) -> tuple[float, list[dict]]:
    """Seconds for one episode, and the frames rendered at the reset and at every chunk boundary."""
    frames = []
    start = time.perf_counter()
    observation = env.reset(0, render=mode != "floor")
    frames.append(observation.images if observation else {})
    if mode == "naive":
        for step, action in enumerate(actions, 1):
            if env.done:
                break
            observation = env.step(action, render=True).observation
            if step % chunk == 0 or env.done:
                frames.append(observation.images)
    else:
        for begin in range(0, len(actions), chunk):
            if env.done:
                break
            observation = env.step(actions[begin:begin + chunk], render=mode == "engine").observation
            frames.append(observation.images if observation else {})
    return time.perf_counter() - start, frames


def check_naive_does_the_work(naive: list[dict], engine: list[dict]) -> int:
    """The naive loop renders the frames the engine renders (agentview at every chunk boundary) and
    a wrist view of its own; returns how many frames were compared."""
    check_cameras_differ("bench env, naive loop", [f["agentview"] for f in naive], [f["wrist"] for f in naive])
    return check_same_frames("bench env, naive loop vs engine", [f["agentview"] for f in naive],
                             [f["agentview"] for f in engine])


def worker_memory(suite: str, task: int | str, chunk: int, image_convention: str, envs: int = 1,
                  **env_options) -> dict:
    """RSS and private memory (MB) of one env worker process hosting `envs` envs of the task, after
    a reset and 5 chunks of each."""
    pool = VectorEnv([functools.partial(LiberoEnv, suite, task, image_convention=image_convention,
                                        **MODES["engine"], **env_options)] * envs, envs_per_worker=envs)
    try:
        pool.reset(list(range(envs)))
        for _ in range(5):
            pool.step([np.zeros((chunk, LiberoEnv.action_dim))] * envs)
        (pid,) = pool.pids()
        memory = psutil.Process(pid).memory_full_info()
        loaded = {Path(m.path).name.split(".")[0] for m in psutil.Process(pid).memory_maps()}
    finally:
        pool.close()
    return {"worker_rss_mb": memory.rss / 2**20, "worker_private_mb": memory.uss / 2**20,
            "worker_has_torch": "libtorch_cpu" in loaded or "libtorch" in loaded}


def bench_env(suite: str = "libero_10", task: int | str = 0, steps: int = 520, chunk: int = 8, repeats: int = 3,
              image_convention: str = "minivla", seed: int = 0, envs_per_worker: int = 4) -> dict:
    """Median wall time of one `steps`-step episode per mode (env creation excluded)."""
    rng = np.random.default_rng(seed)
    actions = np.concatenate([rng.uniform(-0.3, 0.3, (steps, 6)), np.sign(rng.uniform(-1, 1, (steps, 1)))], axis=1)
    times: dict[str, list[float]] = {}
    frames: dict[str, list[dict]] = {}
    with tqdm(total=len(MODES) * repeats, desc="bench env") as progress:
        for mode, settings in MODES.items():
            env = LiberoEnv(suite, task, image_convention=image_convention, max_steps=steps, **settings)
            try:
                times[mode] = []
                for _ in range(repeats):
                    seconds, frames[mode] = _episode(env, mode, actions, chunk)
                    times[mode].append(seconds)
                    progress.update()
            finally:
                env.close()
    frames_compared = check_naive_does_the_work(frames["naive"], frames["engine"])
    result = {f"{mode}_s": statistics.median(t) for mode, t in times.items()}
    result.update(worker_memory(suite, task, chunk, image_convention))
    # the same worker compiling its scene itself, as before: side by side
    compiled_here = worker_memory(suite, task, chunk, image_convention, compile_apart=False)
    result.update(worker_rss_mb_compiled_in_worker=compiled_here["worker_rss_mb"],
                  worker_private_mb_compiled_in_worker=compiled_here["worker_private_mb"])
    shared = worker_memory(suite, task, chunk, image_convention, envs=envs_per_worker)
    result.update(shared_worker_envs=envs_per_worker, shared_worker_rss_mb=shared["worker_rss_mb"],
                  shared_worker_private_mb=shared["worker_private_mb"],
                  shared_worker_rss_mb_per_env=shared["worker_rss_mb"] / envs_per_worker)
    result["speedup"] = result["naive_s"] / result["engine_s"]
    result["frames_compared"] = frames_compared
    result["floor_ratio"] = result["engine_s"] / result["floor_s"]
    result.update(suite=suite, task=task, steps=steps, chunk=chunk, repeats=repeats, wait_steps=10,
                  image_convention=image_convention, repeats_s=times)
    return result


def format_table(result: dict) -> str:
    rows = [("naive", "hard reset, 2 cameras every step"),
            ("engine", f"soft reset, 1 camera every {result['chunk']} steps"),
            ("floor", "no rendering")]
    lines = [f"LIBERO {result['suite']} task {result['task']}: one {result['steps']}-step episode "
             f"(+10 wait steps), median of {result['repeats']}",
             "| mode   | seconds | x engine | what |", "|---|---|---|---|"]
    for mode, what in rows:
        lines.append(f"| {mode:6s} | {result[mode + '_s']:7.2f} | "
                     f"{result[mode + '_s'] / result['engine_s']:8.2f} | {what} |")
    lines.append(f"speedup (naive / engine) = {result['speedup']:.1f}x; the naive loop rendered the engine's frames "
                 f"({result['frames_compared']} chunk boundaries, pixel for pixel) and its own wrist view")
    lines.append(f"one env worker: {result['worker_rss_mb']:.0f} MB resident, {result['worker_private_mb']:.0f} MB "
                 f"private{' (torch loaded)' if result['worker_has_torch'] else ''}; compiling its scene itself: "
                 f"{result['worker_rss_mb_compiled_in_worker']:.0f} MB resident, "
                 f"{result['worker_private_mb_compiled_in_worker']:.0f} MB private")
    lines.append(f"one worker hosting {result['shared_worker_envs']} envs: {result['shared_worker_rss_mb']:.0f} MB "
                 f"resident ({result['shared_worker_rss_mb_per_env']:.0f} MB per env), "
                 f"{result['shared_worker_private_mb']:.0f} MB private")
    return "\n".join(lines)


def main(args) -> None:
    result = bench_env(args.suite, args.task, args.steps, args.chunk, args.repeats, args.image_convention,
                       envs_per_worker=args.envs_per_worker)
    print(format_table(result))
    if args.json:
        write_json_output(Path(args.json), result)
        print(f"wrote {args.json}")
