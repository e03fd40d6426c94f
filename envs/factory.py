"""Env factories from recipe settings (a LIBERO suite, or `suite: gym` with gymnasium env ids as
tasks), and the pool that runs them (`backend: local | ray`).

Factories are picklable zero-argument callables, called inside the workers or Ray actors.
"""

from __future__ import annotations

import functools
import inspect

from envs.gym_env import GymRobotEnv
from envs.libero_env import LiberoEnv
from envs.ray_env import RayVectorEnv
from envs.vector_env import InlineEnvs, VectorEnv

GYM = "gym"


def env_factory(suite: str, task: str | int, cameras=("agentview",), image_convention: str = "minivla",
                max_steps: int | None = None, seed: int = 0, gym: dict | None = None):
    """LIBERO: `LiberoEnv(suite, task, ...)`. Gym: `GymRobotEnv(task, **gym)` (gym holds its
    `instruction`, and optionally `resolution`, `image_key`, `proprio_keys`, `make_kwargs`)."""
    if suite == GYM:
        options = dict(gym or {})
        if "instruction" not in options:
            raise ValueError(f"gym env {task!r} needs gym.instruction (gymnasium envs have no language instruction)")
        allowed = set(inspect.signature(GymRobotEnv).parameters) - {"env_id", "max_steps", "seed"}
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise ValueError(f"gym options {unknown} are unknown; expected a subset of {sorted(allowed)}")
        return functools.partial(GymRobotEnv, str(task), max_steps=max_steps, seed=seed, **options)
    return functools.partial(LiberoEnv, suite, task, cameras=tuple(cameras), image_convention=image_convention,
                             max_steps=max_steps, seed=seed)


def check_pool_settings(backend: str, envs_per_worker: int = 1) -> None:
    """Refuse a pool `env_pool` cannot build; commands call it with their other checks, before any work."""
    if backend not in ("local", "ray", "inline"):
        raise ValueError(f"unknown rollout backend {backend!r}; expected 'local', 'ray' or 'inline'")
    if envs_per_worker != 1 and backend != "local":
        raise ValueError(f"envs_per_worker={envs_per_worker} needs the 'local' backend ({backend!r} runs one env "
                         "per actor or all in this process)")


def env_pool(factories, backend: str = "local", address: str | None = None, envs_per_worker: int = 1,
             step_timeout_s: float | None = None, start_timeout_s: float | None = None):
    """The pool that runs the envs: `local` worker processes (`VectorEnv`, `envs_per_worker` envs in
    each), Ray actors (`RayVectorEnv`, one env each), or `inline` in this process (`InlineEnvs`, for
    cheap envs). Timeouts None: the backend's defaults."""
    check_pool_settings(backend, envs_per_worker)
    if backend == "inline":
        return InlineEnvs(factories)
    if backend == "local":
        timeouts = {"step_timeout_s": step_timeout_s, "start_timeout_s": start_timeout_s}
        return VectorEnv(factories, envs_per_worker=envs_per_worker, **{k: v for k, v in timeouts.items() if v})
    return RayVectorEnv(factories, address=address, **({"step_timeout_s": step_timeout_s} if step_timeout_s else {}))
