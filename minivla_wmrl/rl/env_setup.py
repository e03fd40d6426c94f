"""Where episodes run: the env settings every consumer shares (GRPO, evaluation, world-model
collection), declared once, and the pool built from them.

Each consumer's section extends `EnvSetup` with what only it needs (GRPO its training states,
evaluation its protocol), so `backend: ray` or `envs_per_worker: 4` mean the same thing in every
recipe section and command. The help texts are also `minivla-wmrl eval`'s flag help.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from envs.factory import check_pool_settings, env_factory, env_pool
from minivla_wmrl.infra.config import RUNTIME, Range

Backend = Literal["local", "ray", "inline"]
ImageConvention = Literal["minivla", "openvla"]


def _help(text: str, **more) -> dict:
    return {"help": text, **more}


@dataclass(kw_only=True)
class EnvSetup:
    suite: str = field(default="libero_90", metadata=_help(
        "a LIBERO suite (libero_90, libero_10, ...) or gym (tasks are then gymnasium env ids)"))
    tasks: list[str] = field(default_factory=lambda: ["0"], metadata=_help("task indices or names (gym: env ids)"))
    gym: dict = field(default_factory=dict, metadata=_help(
        "suite gym: GymRobotEnv options (instruction, resolution, ...); set by recipes, not flags", cli=False))
    image_convention: ImageConvention = field(default="minivla", metadata=_help(
        "image orientation and size; must match the policy's training data"))
    backend: Annotated[Backend, RUNTIME] = field(default="local", metadata=_help(
        "simulator workers: local processes, Ray actors, or inline (in this process, for cheap envs)"))
    ray_address: Annotated[str | None, RUNTIME] = field(default=None, metadata=_help(
        "Ray cluster address (default: start a local Ray instance)"))
    envs_per_worker: Annotated[int, Range(1), RUNTIME] = field(default=1, metadata=_help(
        "envs per local worker process, sharing one GL context (~120 MB per further env instead of ~1.1 GB)"))
    # timeouts are RUNTIME: one that never fires changes nothing (one short enough to fire fails episodes)
    step_timeout_s: Annotated[float | None, Range(above=0), RUNTIME] = field(default=None, metadata=_help(
        "seconds a worker may stay silent per env of it before it is restarted (default: local 120, ray 300)"))
    start_timeout_s: Annotated[float | None, Range(above=0), RUNTIME] = field(default=None, metadata=_help(
        "seconds a local worker has to build its envs (default 600)"))

    def check_pool(self) -> None:
        """Refuse a pool that cannot be built, before any work."""
        check_pool_settings(self.backend, self.envs_per_worker)

    def factory(self, task: str | int, cameras=("agentview",), max_steps: int | None = None, seed: int = 0):
        """A picklable env factory for one task of this suite."""
        return env_factory(self.suite, task, cameras, self.image_convention, max_steps, seed, self.gym)

    def pool(self, factories: list):
        """The envs of `factories`, on this setup's workers (a context manager; close it)."""
        return env_pool(factories, self.backend, self.ray_address, self.envs_per_worker,
                        step_timeout_s=self.step_timeout_s, start_timeout_s=self.start_timeout_s)
