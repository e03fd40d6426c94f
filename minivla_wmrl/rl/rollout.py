"""The rollout engine: a batched policy drives a pool of envs, one generation call per query.

Every query batches all live envs into one `policy.generate` call; each env then runs the first
`execute_steps` actions of its chunk open loop (1: re-query every step, MiniVLA's protocol;
8: the whole chunk, OpenVLA-OFT's). Envs render only at query points, and only the cameras the
policy reads. When an env's episode ends it starts the next pending episode of its task, so the
pool stays full. An episode whose spec sets a `horizon` is cut once it has run that many steps,
and a `gated` one whenever the caller's `cut` says so after a chunk (`Trajectory.truncated`):
GRPO's truncated and gated executions let a predictor stand in for the rest. Each
episode samples from its own RNG (seeded by the run seed and the episode seed), so a trajectory
does not depend on which env ran it or what else was in the batch; that is what lets
`overlap_groups` split the envs so one group simulates while the policy generates for another.
"""

from __future__ import annotations

import functools
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import numpy as np
from tqdm import tqdm

from envs.base import Observation, StepResult
from envs.vector_env import EnvFailure


class Policy(Protocol):
    """What the engine needs from a policy (MiniVLA has it): `config.num_images`,
    `config.num_action_tokens`, `action_tokenizer.config.chunk_len` and `generate`."""

    config: Any
    action_tokenizer: Any

    def generate(self, images, instructions: list[str], temperature: float = 0.0, generator=None,
                 uniforms: np.ndarray | None = None):
        """→ an object with `token_ids` (B, n), `log_probs` (B, n) and `actions` (B, chunk, action_dim)."""


@dataclass
class RolloutConfig:
    execute_steps: int = 1  # actions executed per query before re-querying (1: MiniVLA, 8: OpenVLA-OFT)
    temperature: float = 0.0  # 0: greedy (evaluation); > 0: sampling (RL)
    seed: int = 0  # run seed; with each episode's seed it fixes the episode's sampling noise
    record_frames: bool = True  # keep the images of every query (GRPO re-scores them; the world model reads them)
    retry_failures: int = 2  # re-run an episode cut short by a lost worker (crash, timeout) up to this many times
    # envs split into this many groups: while one group's envs simulate (in a thread), the policy generates for
    # another's (RLinf-style pipelining). 1: the plain engine, all envs step, then the policy thinks for all.
    # Trajectories are the same either way (each episode samples from its own RNG); only the batches differ.
    overlap_groups: int = 1


@dataclass
class EpisodeSpec:
    """One episode to run: which task, from which init state, with which sampling seed."""

    task_id: str
    init_state: int | np.ndarray
    seed: int = 0
    tag: Any = None  # the caller's key, e.g. (task, trial); returned unchanged
    horizon: int | None = None  # cut the episode once it has run this many env steps (None: to the env's cap)
    gated: bool = False  # after each chunk, `RolloutEngine.run`'s `cut` may end it


@dataclass
class Trajectory:
    """One finished episode. Query q saw `frames[q]` after `query_steps[q]` env steps."""

    spec: EpisodeSpec
    instruction: str
    success: bool
    length: int  # env steps executed after the wait steps
    success_step: int | None  # 1-based step at which success was first reached
    failure: str | None  # why the infrastructure cut the episode short (worker crash, timeout, exception)
    frames: np.ndarray  # (Q, [num_cameras,] H, W, 3) uint8, or an empty array when frames are not recorded
    final_frame: np.ndarray | None  # the images after the last step
    token_ids: np.ndarray  # (Q, n) int64
    log_probs: np.ndarray  # (Q, n) float32, under the sampling distribution
    query_steps: np.ndarray  # (Q,) int64
    executed: np.ndarray  # (Q,) actions executed from each query's chunk
    truncated: bool = False  # cut (at `spec.horizon`, or by the gate) before the episode ended
    # what an outcome probe reads at no simulator cost (world_models.outcome_probe), per query: the actions
    # sent (Q, execute_steps, action_dim), the robot's proprioception (Q, P; what a real robot also has) and the
    # simulator's privileged state flattened (Q, S; object poses included: for diagnostics and the gate's
    # `privileged` predictor, never a policy input)
    actions: np.ndarray = field(default_factory=lambda: np.zeros((0,), np.float32))
    proprio: np.ndarray = field(default_factory=lambda: np.zeros((0,), np.float32))
    privileged: np.ndarray = field(default_factory=lambda: np.zeros((0,), np.float32))

    @property
    def num_queries(self) -> int:
        return len(self.token_ids)


@dataclass
class _Running:
    spec: EpisodeSpec
    instruction: str
    rng: np.random.Generator
    observation: Observation
    steps: int = 0
    frames: list = field(default_factory=list)
    token_ids: list = field(default_factory=list)
    log_probs: list = field(default_factory=list)
    query_steps: list = field(default_factory=list)
    executed: list = field(default_factory=list)
    actions: list = field(default_factory=list)
    proprio: list = field(default_factory=list)
    privileged: list = field(default_factory=list)

    def finish(self, result: StepResult | None, failure: str | None, cameras, record_frames: bool,
               truncated: bool = False) -> Trajectory:
        final = None
        if result is not None and result.observation is not None:
            final = _policy_images([result.observation], cameras)[0]
        n = len(self.token_ids[0]) if self.token_ids else 0
        return Trajectory(
            spec=self.spec, instruction=self.instruction,
            success=bool(result is not None and result.success and failure is None), length=self.steps,
            success_step=result.success_step if result is not None and failure is None else None, failure=failure,
            frames=np.stack(self.frames) if record_frames and self.frames else np.zeros((0,), np.uint8),
            final_frame=final,
            token_ids=np.asarray(self.token_ids, np.int64).reshape(-1, n),
            log_probs=np.asarray(self.log_probs, np.float32).reshape(-1, n),
            query_steps=np.asarray(self.query_steps, np.int64), executed=np.asarray(self.executed, np.int64),
            truncated=truncated, actions=np.asarray(self.actions, np.float32),
            proprio=np.asarray(self.proprio, np.float32), privileged=np.asarray(self.privileged, np.float32))

    def prefix(self) -> Trajectory:
        """What has run so far, without frames: what a gate reads."""
        return self.finish(None, None, (), record_frames=False)


def _policy_images(observations: Sequence[Observation], cameras: tuple[str, ...]) -> np.ndarray:
    """(B, H, W, 3) for one camera, (B, num_cameras, H, W, 3) for several."""
    if len(cameras) == 1:
        return np.stack([o.images[cameras[0]] for o in observations])
    return np.stack([np.stack([o.images[c] for c in cameras]) for o in observations])


def _call(function: Callable, *args):
    return function(*args)


def _call_on(executor: ThreadPoolExecutor, function: Callable, *args):
    return executor.submit(function, *args).result()


def episode_rng(run_seed: int, episode_seed: int) -> np.random.Generator:
    return np.random.default_rng([run_seed, episode_seed])


class RolloutEngine:
    """Run episodes with `policy` on `envs` (a `VectorEnv`, or anything with its reset/step/infos API).

    Args:
        cameras: the env cameras the policy reads, in its image order; default: the first
            `policy.config.num_images` cameras the envs render.
    """

    def __init__(self, policy: Policy, envs, config: RolloutConfig, cameras: tuple[str, ...] | None = None):
        if config.execute_steps < 1:
            raise ValueError(f"execute_steps must be >= 1, got {config.execute_steps}")
        if config.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {config.temperature}")
        if not 1 <= config.overlap_groups <= envs.num_envs:
            raise ValueError(f"overlap_groups must be in 1..{envs.num_envs} (the number of envs), "
                             f"got {config.overlap_groups}")
        self.policy, self.envs, self.config = policy, envs, config
        infos = envs.infos
        if cameras is None:
            cameras = infos[0].cameras[:policy.config.num_images]
        for i, info in enumerate(infos):
            missing = [c for c in cameras if c not in info.cameras]
            if missing:
                raise ValueError(f"env {i} ({info.task_id}) renders {list(info.cameras)}; the policy needs {missing}")
        self.cameras = tuple(cameras)
        action_dim = policy.action_tokenizer.config.action_dim
        wrong = [info.task_id for info in infos if info.action_dim != action_dim]
        if wrong:
            raise ValueError(f"the policy makes {action_dim}-dim actions; "
                             f"env(s) {wrong} take {infos[0].action_dim}-dim ones")
        chunk_len = policy.action_tokenizer.config.chunk_len
        if config.execute_steps > chunk_len:
            raise ValueError(f"execute_steps {config.execute_steps} exceeds the policy's chunk length {chunk_len}")
        self.num_tokens = policy.config.num_action_tokens

    def run(self, specs: Sequence[EpisodeSpec], on_episode: Callable[[Trajectory], None] | None = None,
            progress: bool = True, desc: str = "rollouts",
            cut: Callable[[list[Trajectory]], list[bool]] | None = None) -> list[Trajectory]:
        """Run every spec once; trajectories come back in the order of `specs`. `cut` gets the
        prefixes of the `gated` episodes still running after a chunk and says which to end now."""
        infos = self.envs.infos
        tasks = {info.task_id for info in infos}
        unknown = sorted({s.task_id for s in specs} - tasks)
        if unknown:
            raise ValueError(f"episodes for task(s) {unknown} but the envs run {sorted(tasks)}")
        order = {id(s): k for k, s in enumerate(specs)}
        pending: dict[str, deque] = {t: deque(s for s in specs if s.task_id == t) for t in tasks}
        running: dict[int, _Running] = {}
        done: list[Trajectory | None] = [None] * len(specs)
        c = self.config
        bar = tqdm(total=len(specs), desc=desc, disable=not progress, leave=False)
        retries: dict[int, int] = {}

        def finish(i: int, result: StepResult | None, failure: str | None, truncated: bool = False) -> None:
            spec = running[i].spec
            lost = failure is not None and failure.startswith(("worker crash", "worker timeout"))
            if lost and retries.get(id(spec), 0) < c.retry_failures:
                # the episode depends only on its init state and seed: re-running it loses nothing
                retries[id(spec)] = retries.get(id(spec), 0) + 1
                running.pop(i)
                pending[spec.task_id].appendleft(spec)
                return
            trajectory = running.pop(i).finish(result, failure, self.cameras, c.record_frames, truncated)
            done[order[id(trajectory.spec)]] = trajectory
            bar.update(1)
            if on_episode is not None:
                on_episode(trajectory)

        def start(members: list[int]) -> None:
            """Start the next pending episode of its task on every free env among `members`."""
            starts: list = [None] * self.envs.num_envs
            for i in members:
                if i not in running and pending[infos[i].task_id]:
                    starts[i] = pending[infos[i].task_id].popleft()
            if not any(s is not None for s in starts):
                return
            observations = on_envs(self.envs.reset, [s.init_state if s is not None else None for s in starts])
            for i, (spec, observation) in enumerate(zip(starts, observations)):
                if spec is None:
                    continue
                running[i] = _Running(spec, infos[i].instruction, episode_rng(c.seed, spec.seed), observation)
                if isinstance(observation, EnvFailure):
                    finish(i, None, observation.reason)

        def query(members: list[int]) -> list | None:
            """One batched generation for the live envs among `members`; their actions (None: none live)."""
            live = [i for i in members if i in running]
            if not live:
                return None
            images = _policy_images([running[i].observation for i in live], self.cameras)
            uniforms = np.stack([running[i].rng.random(self.num_tokens) for i in live]) if c.temperature > 0 else None
            result = self.policy.generate(images, [running[i].instruction for i in live], temperature=c.temperature,
                                          uniforms=uniforms)
            # one copy per query
            token_ids, log_probs = result.token_ids.cpu().numpy(), result.log_probs.float().cpu().numpy()
            actions: list = [None] * self.envs.num_envs
            for j, i in enumerate(live):
                actions[i] = result.actions[j, :c.execute_steps]
                episode = running[i]
                if c.record_frames:
                    episode.frames.append(images[j])
                episode.token_ids.append(token_ids[j])
                episode.log_probs.append(log_probs[j])
                episode.query_steps.append(episode.steps)
                episode.actions.append(np.asarray(actions[i], np.float32))
                episode.proprio.append(np.ravel(episode.observation.proprio).astype(np.float32))
                state = episode.observation.state
                episode.privileged.append(np.concatenate([np.ravel(state[k]) for k in sorted(state)]) if state
                                          else np.zeros(0, np.float32))
            return actions

        def apply(results: list[StepResult | None]) -> None:
            gated = {}
            for i, result in enumerate(results):
                if result is None:
                    continue
                episode = running[i]
                episode.executed.append(result.steps)
                episode.steps += result.steps
                if result.failure is not None or result.done:
                    finish(i, result, result.failure)
                elif episode.spec.horizon is not None and episode.steps >= episode.spec.horizon:
                    finish(i, result, None, truncated=True)
                else:
                    episode.observation = result.observation
                    if episode.spec.gated and cut is not None:
                        gated[i] = result
            if gated:
                for (i, result), stop in zip(gated.items(), cut([running[i].prefix() for i in gated])):
                    if stop:
                        finish(i, result, None, truncated=True)

        groups = [list(range(self.envs.num_envs))[g::c.overlap_groups] for g in range(c.overlap_groups)]
        if len(groups) == 1:  # plain: all envs step, then the policy thinks for all of them
            on_envs = _call
            while running or any(pending.values()):
                start(groups[0])
                actions = query(groups[0])
                if actions is not None:
                    apply(self.envs.step(actions))
        else:  # overlapped: one group's envs step (in a thread) while the policy thinks for another's
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="env-steps") as simulator:
                on_envs = functools.partial(_call_on, simulator)  # every env command from that one thread
                stepping: dict[int, Future] = {}
                while running or any(pending.values()) or stepping:
                    for g, members in enumerate(groups):
                        if g in stepping:
                            apply(stepping.pop(g).result())
                        start(members)
                        actions = query(members)
                        if actions is not None:
                            stepping[g] = simulator.submit(self.envs.step, actions)
        bar.close()
        return done  # type: ignore[return-value]
