"""`minivla-wmrl bench rollout`: env steps per second of policy-driven LIBERO episodes, three ways.

- engine: the rollout engine: N worker envs, one batched KV-cache generation per query, soft
  resets, the policy's camera rendered only at query points;
- overlapped: the engine with its envs in two groups, one simulating while the policy generates
  for the other;
- naive: one env at a time in this process, both cameras rendered every step, hard resets, one
  unbatched generation per query that recomputes the whole sequence for every token.

All run the same random-weight policy (greedy) on the same task and init states, with the same
`execute_steps`, in one run; the ratios are printed only when all three saw the same frame at
every query (and the naive loop's wrist camera its own view). Building the envs is not timed.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from envs.libero_env import LiberoEnv
from minivla_wmrl.bench.policy import naive_query
from minivla_wmrl.bench.same_work import check_cameras_differ, check_same_frames
from minivla_wmrl.infra.outputs import write_json_output
from minivla_wmrl.policy import MiniVLA, preset
from minivla_wmrl.policy.action_tokenizer import ActionTokenizer
from minivla_wmrl.policy.normalization import ActionStatistics
from minivla_wmrl.policy.tokenizer import tiny_qwen_style_tokenizer
from minivla_wmrl.rl.env_setup import EnvSetup
from minivla_wmrl.rl.rollout import EpisodeSpec, RolloutConfig, RolloutEngine


def random_policy(preset_name: str, seed: int) -> MiniVLA:
    torch.manual_seed(seed)
    actions = np.random.default_rng(seed).uniform(-1, 1, (1000, 7))
    actions[:, 6] = actions[:, 6] > 0
    return MiniVLA(preset(preset_name), tiny_qwen_style_tokenizer(), ActionTokenizer(),
                   ActionStatistics.from_actions(actions, num_trajectories=10)).eval()


def _naive(policy: MiniVLA, suite: str, task: str, episodes: int, max_steps: int,
           execute_steps: int) -> tuple[float, int, list[list[dict]]]:
    """(seconds, env steps, the images of every query per episode)."""
    env = LiberoEnv(suite, task, cameras=("agentview", "wrist"), soft_reset=False, render_every_step=True,
                    max_steps=max_steps)
    try:
        start, steps, frames = time.perf_counter(), 0, []
        for init_state in tqdm(range(episodes), desc="naive"):
            observation = env.reset(init_state)
            frames.append([])
            while not env.done:
                frames[-1].append(observation.images)
                tokens = naive_query(policy, observation.images["agentview"], env.instruction)
                chunk = policy.decode_tokens(tokens, torch.zeros(tokens.shape)).actions[0]
                for action in chunk[:execute_steps]:
                    observation = env.step(action).observation
                    steps += 1
                    if env.done:
                        break
        return time.perf_counter() - start, steps, frames
    finally:
        env.close()


def _engine(policy: MiniVLA, suite: str, task: str, episodes: int, max_steps: int, execute_steps: int,
            num_envs: int, backend: str = "local", address: str | None = None,
            overlap_groups: tuple[int, ...] = (1,)) -> list[tuple[float, int, list[np.ndarray]]]:
    """(seconds, env steps, each episode's query frames) of the same episodes for each `overlap_groups`
    setting, on one pool of envs."""
    setup = EnvSetup(suite=suite, tasks=[task], backend=backend, ray_address=address)
    timings = []
    with setup.pool([setup.factory(task, ("agentview",), max_steps)] * num_envs) as envs:
        for groups in overlap_groups:
            engine = RolloutEngine(policy, envs, RolloutConfig(execute_steps=execute_steps, overlap_groups=groups))
            specs = [EpisodeSpec(envs.infos[0].task_id, i, seed=i, tag=i) for i in range(episodes)]
            start = time.perf_counter()
            trajectories = engine.run(specs, desc=f"engine x{num_envs} ({backend}, {groups} group(s))")
            seconds = time.perf_counter() - start
            frames = [t.frames for t in sorted(trajectories, key=lambda t: t.spec.tag)]
            timings.append((seconds, sum(t.length for t in trajectories), frames))
    return timings


def check_same_episodes(what: str, baseline: list, ours: list) -> int:
    """Every episode's query frames equal, pixel for pixel; returns how many frames were compared."""
    return sum(check_same_frames(f"bench rollout, {what}, episode {i}", list(theirs), list(mine))
               for i, (theirs, mine) in enumerate(zip(baseline, ours, strict=True)))


def bench_ray(preset_name: str = "small", workers: int = 2, episodes: int = 4, suite: str = "libero_90",
              task: str = "0", max_steps: int = 64, execute_steps: int = 8, address: str | None = None,
              seed: int = 0) -> dict:
    """The engine on Ray actors: 1 worker vs `workers` workers, same episodes, in one run."""
    policy = random_policy(preset_name, seed)
    (one_s, one_steps, _), = _engine(policy, suite, task, episodes, max_steps, execute_steps, 1, "ray", address)
    (many_s, many_steps, _), = _engine(policy, suite, task, episodes, max_steps, execute_steps, workers, "ray", address)
    return {"backend": "ray", "preset": preset_name, "episodes": episodes, "max_steps": max_steps,
            "execute_steps": execute_steps, "workers": workers, "one_worker_steps_per_s": one_steps / one_s,
            "workers_steps_per_s": many_steps / many_s, "ratio": (many_steps / many_s) / (one_steps / one_s)}


def bench_rollout(preset_name: str = "small", num_envs: int = 2, episodes: int = 4, suite: str = "libero_90",
                  task: str = "0", max_steps: int = 64, execute_steps: int = 8, seed: int = 0) -> dict:
    """The naive loop, the engine and the overlapped engine (envs in two groups), same episodes, one run;
    no ratio unless all three saw the same frames at every query."""
    policy = random_policy(preset_name, seed)
    (engine_s, engine_steps, engine_frames), (overlap_s, overlap_steps, overlap_frames) = _engine(
        policy, suite, task, episodes, max_steps, execute_steps, num_envs, overlap_groups=(1, 2))
    naive_s, naive_steps, naive_frames = _naive(policy, suite, task, episodes, max_steps, execute_steps)
    queries = [images for episode in naive_frames for images in episode]
    check_cameras_differ("bench rollout, naive loop", [i["agentview"] for i in queries], [i["wrist"] for i in queries])
    frames_compared = check_same_episodes("naive loop vs engine", [[i["agentview"] for i in episode]
                                                                   for episode in naive_frames], engine_frames)
    check_same_episodes("overlapped engine vs engine", overlap_frames, engine_frames)
    engine_rate, naive_rate, overlap_rate = engine_steps / engine_s, naive_steps / naive_s, overlap_steps / overlap_s
    return {"preset": preset_name, "envs": num_envs, "episodes": episodes, "suite": suite, "task": task,
            "max_steps": max_steps, "execute_steps": execute_steps, "engine_s": engine_s, "engine_steps": engine_steps,
            "engine_steps_per_s": engine_rate, "naive_s": naive_s, "naive_steps": naive_steps,
            "naive_steps_per_s": naive_rate, "ratio": engine_rate / naive_rate, "overlapped_s": overlap_s,
            "overlapped_steps": overlap_steps, "overlapped_steps_per_s": overlap_rate,
            "overlap_ratio": overlap_rate / engine_rate, "frames_compared": frames_compared}


def main(args) -> None:
    if args.backend == "ray":
        result = bench_ray(args.preset, args.workers, args.episodes, args.suite, args.task, args.max_steps,
                           args.execute_steps, args.ray_address)
        print(f"| Ray actors | env steps/s |\n|---|---|\n| 1 | {result['one_worker_steps_per_s']:.2f} |\n"
              f"| {result['workers']} | {result['workers_steps_per_s']:.2f} |\nratio: {result['ratio']:.2f}x  "
              f"(preset {result['preset']}, execute_steps {result['execute_steps']}, max_steps {result['max_steps']})")
    else:
        result = bench_rollout(args.preset, args.envs, args.episodes, args.suite, args.task, args.max_steps,
                               args.execute_steps)
        print(f"| mode | env steps | seconds | steps/s |\n|---|---|---|---|\n"
              f"| naive (1 env, 2 cameras every step, hard reset, no KV cache) | {result['naive_steps']} | "
              f"{result['naive_s']:.1f} | {result['naive_steps_per_s']:.2f} |\n"
              f"| engine ({result['envs']} envs, batched KV cache, render at queries) | {result['engine_steps']} | "
              f"{result['engine_s']:.1f} | {result['engine_steps_per_s']:.2f} |\n"
              f"| engine overlapped (2 groups: one simulates while the policy thinks for the other) | "
              f"{result['overlapped_steps']} | {result['overlapped_s']:.1f} | "
              f"{result['overlapped_steps_per_s']:.2f} |\n"
              f"ratio engine/naive: {result['ratio']:.1f}x, overlapped/engine: {result['overlap_ratio']:.2f}x; "
              f"the same frame at all {result['frames_compared']} queries  "
              f"(preset {result['preset']}, execute_steps {result['execute_steps']}, max_steps {result['max_steps']})")
    if args.json:
        write_json_output(Path(args.json), result)
