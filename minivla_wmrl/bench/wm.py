"""`minivla-wmrl bench wm`: trajectories scored per second by the world model vs real rollouts per second.

Both in one run on this machine: the world model scores batches of rollout-shaped trajectories
(query frames at 224 px, `--queries` per trajectory); the real side runs full LIBERO episodes
with the rollout engine (random tiny policy, `--envs` workers, the suite's step cap).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from minivla_wmrl.bench.rollout import random_policy
from minivla_wmrl.infra.outputs import write_json_output
from minivla_wmrl.rl.env_setup import EnvSetup
from minivla_wmrl.rl.rollout import EpisodeSpec, RolloutConfig, RolloutEngine
from world_models.progress_model import ProgressModelConfig, ProgressWorldModel


def bench_wm(trajectories: int = 64, queries: int = 66, repeats: int = 3, suite: str = "libero_10", task: str = "0",
             episodes: int = 2, num_envs: int = 2, execute_steps: int = 8, seed: int = 0) -> dict:
    model = ProgressWorldModel(ProgressModelConfig()).eval()
    rng = np.random.default_rng(seed)
    frames = [rng.integers(0, 256, (queries, 224, 224, 3), dtype=np.uint8) for _ in range(trajectories)]
    instructions = ["put both the alphabet soup and the tomato sauce in the basket"] * trajectories
    model.score(frames[:2], instructions[:2])  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.score(frames, instructions)
        times.append(time.perf_counter() - start)
    scored_per_s = trajectories / float(np.median(times))

    policy = random_policy("tiny", seed)
    setup = EnvSetup(suite=suite, tasks=[task])
    with setup.pool([setup.factory(task)] * num_envs) as envs:
        engine = RolloutEngine(policy, envs, RolloutConfig(execute_steps=execute_steps, record_frames=False))
        specs = [EpisodeSpec(envs.infos[0].task_id, i, seed=i) for i in range(episodes)]
        start = time.perf_counter()
        steps = sum(t.length for t in engine.run(specs, desc="real rollouts"))
        real_s = time.perf_counter() - start
    real_per_s = episodes / real_s
    return {"trajectories": trajectories, "queries_per_trajectory": queries, "scored_per_s": scored_per_s,
            "suite": suite, "task": task, "episodes": episodes, "envs": num_envs, "real_steps": steps,
            "real_rollouts_per_s": real_per_s, "ratio": scored_per_s / real_per_s,
            "world_model_parameters": sum(p.numel() for p in model.parameters())}


def main(args) -> None:
    result = bench_wm(args.trajectories, args.queries, args.repeats, args.suite, args.task, args.episodes, args.envs)
    print(f"world model: {result['scored_per_s']:.2f} trajectories scored/s; real {result['suite']} rollouts "
          f"({result['envs']} envs): {result['real_rollouts_per_s']:.3f}/s; ratio {result['ratio']:.0f}x")
    if args.json:
        write_json_output(Path(args.json), result)
