"""Envs as Ray actors, behind the `VectorEnv` interface, so rollouts spread over a Ray cluster.

Each actor owns one env (built inside the actor, so its GL context lives there). `reset`/`step`
go to all addressed actors at once and are gathered with `ray.get`. An actor that dies (node
lost, process killed, OOM) is replaced by a fresh one and its episode comes back as a failure
naming the reason; the rollout engine re-queues such episodes (`RolloutConfig.retry_failures`),
and since an episode depends only on its init state and its own seed, the re-run gives the same
trajectory it would have given.

Connects to `address` (e.g. "auto" or "ray://head:10001"), or starts a local Ray instance.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from envs import gl
from envs.base import EnvInfo
from envs.vector_env import EnvFactory, EnvFailure, EnvPool, forwarded_env_vars


class _EnvActor:
    def __init__(self, factory: EnvFactory, env_vars: dict[str, str]):
        os.environ.update(env_vars)
        gl.torch_free_process = True
        self.env = factory()

    def info(self) -> EnvInfo:
        return EnvInfo.of(self.env)

    def pid(self) -> int:
        return os.getpid()

    def run(self, command: str, args: tuple) -> Any:
        return getattr(self.env, command)(*args)


class RayVectorEnv(EnvPool):
    """One env per Ray actor; the same `reset`/`step`/`call`/`infos` as `VectorEnv`.

    Args:
        factories: one picklable zero-argument env constructor per env.
        address: a Ray cluster address; None starts (or joins) a local instance.
        num_cpus: CPUs each actor reserves (LIBERO: physics + software rendering ≈ 1).
        step_timeout_s: an actor that does not answer in time is killed and replaced.
    """

    def __init__(self, factories: Sequence[EnvFactory], address: str | None = None, num_cpus: float = 1.0,
                 step_timeout_s: float = 300.0):
        import ray  # optional extra, ~0.25 s: only for a Ray pool

        if not factories:
            raise ValueError("RayVectorEnv needs at least one env factory")
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": forwarded_env_vars()})
        self._ray, self.factories, self.step_timeout_s = ray, list(factories), step_timeout_s
        self._actor_class = ray.remote(num_cpus=num_cpus)(_EnvActor)
        self._env_vars = forwarded_env_vars()
        self.restarts = [0] * len(self.factories)
        self._actors = [self._actor_class.remote(f, self._env_vars) for f in self.factories]
        self._infos = ray.get([a.info.remote() for a in self._actors])

    @property
    def num_envs(self) -> int:
        return len(self._actors)

    @property
    def infos(self) -> list[EnvInfo]:
        return list(self._infos)

    def pids(self) -> list[int]:
        return self._ray.get([a.pid.remote() for a in self._actors])

    def kill(self, i: int) -> None:
        """Kill actor i without restarting it (what a lost node does); the next command notices."""
        self._ray.kill(self._actors[i], no_restart=True)

    def _restart(self, i: int) -> None:
        self._ray.kill(self._actors[i], no_restart=True)
        self.restarts[i] += 1
        self._actors[i] = self._actor_class.remote(self.factories[i], self._env_vars)

    def _run(self, command: str, args_per_env: dict[int, tuple]) -> dict[int, Any]:
        ray = self._ray
        refs = {i: self._actors[i].run.remote(command, args) for i, args in args_per_env.items()}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=self.step_timeout_s)
        ready = set(ready)
        results: dict[int, Any] = {}
        for i, ref in refs.items():
            if ref not in ready:
                results[i] = EnvFailure(f"worker timeout: no answer to {command!r} within {self.step_timeout_s} s")
                self._restart(i)
                continue
            try:
                results[i] = ray.get(ref)
            except ray.exceptions.RayActorError as error:
                results[i] = EnvFailure(f"worker crash: Ray actor lost ({type(error).__name__})")
                self._restart(i)
            except ray.exceptions.RayTaskError as error:
                results[i] = EnvFailure(f"exception in env: {error.cause!r}")
        return results

    def close(self) -> None:
        for actor in self._actors:
            self._ray.kill(actor, no_restart=True)
        self._actors = []
