"""N environments in spawned worker processes, stepped in parallel, that survive worker failures.

Written by hand rather than on gymnasium's AsyncVectorEnv because rollouts need what it does not
give: per-env init states and chunks, stepping any subset of envs, and a worker that crashes or
hangs being restarted with its episode reported failed (AsyncVectorEnv raises and leaves the
whole vector unusable). Workers start with `spawn`: forking after a GL context exists hangs.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable, Sequence

import numpy as np

from envs import gl
from envs.base import EnvInfo, Observation, RobotEnv, StepResult

EnvFactory = Callable[[], RobotEnv]


@dataclass
class EnvFailure:
    """An env whose worker crashed, hung past the timeout, or raised; the worker has been restarted."""

    reason: str


FORWARDED_ENV_PREFIXES = ("LIBERO_", "MUJOCO_", "PYOPENGL_", "MESA_", "MINIVLA_WMRL_")


def forwarded_env_vars() -> dict[str, str]:
    """The environment variables a worker needs to find the assets and renderer this process uses."""
    return {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}


def _worker(factory: EnvFactory, conn, env_vars: dict[str, str]) -> None:
    os.environ.update(env_vars)
    gl.torch_free_process = True
    try:
        env = factory()
        conn.send(("ok", EnvInfo.of(env)))
    except BaseException:  # noqa: BLE001 - reported to the parent, which decides
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            command, args = conn.recv()
        except (EOFError, KeyboardInterrupt):
            break
        if command == "close":
            break
        try:
            conn.send(("ok", getattr(env, command)(*args)))
        except Exception:  # noqa: BLE001 - the episode fails, the worker lives on
            conn.send(("error", traceback.format_exc()))
    env.close()
    conn.close()


class _Worker:
    def __init__(self, ctx, factory: EnvFactory, env_vars: dict[str, str]):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker, args=(factory, child, env_vars), daemon=True)
        self.process.start()
        child.close()
        self.info: EnvInfo | None = None

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


class EnvPool:
    """What every pool of envs offers the rollout engine: `reset`/`step`/`call` on many envs at once,
    `infos`, `num_envs`; subclasses run commands in parallel (`_run`) and restart lost workers."""

    num_envs: int

    def _run(self, command: str, args_per_env: dict[int, tuple]) -> dict[int, Any]:
        raise NotImplementedError

    def reset(self, init_states: Sequence[int | np.ndarray | None],
              render: bool = True) -> list[Observation | EnvFailure | None]:
        """Reset every env whose init state is not None; returns its first observation or a failure."""
        self._check_len(init_states)
        results = self._run("reset", {i: (s, render) for i, s in enumerate(init_states) if s is not None})
        return [results.get(i) for i in range(self.num_envs)]

    def step(self, actions: Sequence[np.ndarray | None], render: bool = True) -> list[StepResult | None]:
        """Step every env whose action (or chunk) is not None. A failed env's result is a finished,
        unsuccessful StepResult with `failure` set to the reason."""
        self._check_len(actions)
        results = self._run("step", {i: (a, render) for i, a in enumerate(actions) if a is not None})
        out: list[StepResult | None] = []
        for i in range(self.num_envs):
            r = results.get(i)
            if isinstance(r, EnvFailure):
                r = StepResult(None, 0.0, False, True, 0, failure=r.reason)
            out.append(r)
        return out

    def call(self, method: str, *args, envs: Sequence[int] | None = None) -> list[Any]:
        """Call a method of every env, or of the envs listed (e.g. 'get_state'); failures come back as EnvFailure."""
        indices = range(self.num_envs) if envs is None else list(envs)
        results = self._run(method, {i: args for i in indices})
        return [results[i] for i in indices]

    def _check_len(self, items: Sequence) -> None:
        if len(items) != self.num_envs:
            raise ValueError(f"got {len(items)} entries for {self.num_envs} envs; pass None for envs to leave alone")

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class InlineEnvs(EnvPool):
    """The envs in this process, stepped one after another: for envs so cheap (pure-Python toys,
    learning checks) that worker processes would cost more than they save. An exception inside an
    env is reported as for workers; there is no worker to lose."""

    def __init__(self, factories: Sequence[EnvFactory]):
        if not factories:
            raise ValueError("InlineEnvs needs at least one env factory")
        self.envs = [factory() for factory in factories]

    @property
    def num_envs(self) -> int:
        return len(self.envs)

    @property
    def infos(self) -> list[EnvInfo]:
        return [EnvInfo.of(env) for env in self.envs]

    def _run(self, command: str, args_per_env: dict[int, tuple]) -> dict[int, Any]:
        results: dict[int, Any] = {}
        for i, args in args_per_env.items():
            try:
                results[i] = getattr(self.envs[i], command)(*args)
            except Exception:  # noqa: BLE001 - the episode fails, the env lives on
                error = traceback.format_exc()
                results[i] = EnvFailure(f"exception in env: {error.strip().splitlines()[-1]}\n{error}")
        return results

    def close(self) -> None:
        for env in self.envs:
            env.close()


class VectorEnv(EnvPool):
    """Run one env per worker process; `reset`/`step` act on many envs at once.

    Args:
        factories: one picklable zero-argument callable per env (e.g. `functools.partial(LiberoEnv,
            "libero_90", 0)`), called inside the worker.
        step_timeout_s: a worker that does not answer a command in time is killed and restarted.
        start_timeout_s: time allowed for a worker to build its env.
        egl_device_ids: optional EGL device per worker (MUJOCO_EGL_DEVICE_ID) on multi-GPU hosts.
    """

    def __init__(self, factories: Sequence[EnvFactory], step_timeout_s: float = 120.0,
                 start_timeout_s: float = 600.0, egl_device_ids: Sequence[int] | None = None):
        if not factories:
            raise ValueError("VectorEnv needs at least one env factory")
        self._ctx = mp.get_context("spawn")
        self.factories = list(factories)
        self.step_timeout_s, self.start_timeout_s = step_timeout_s, start_timeout_s
        self._env_vars = []
        for i in range(len(self.factories)):
            env_vars = forwarded_env_vars()
            if egl_device_ids is not None:
                env_vars["MUJOCO_EGL_DEVICE_ID"] = str(egl_device_ids[i % len(egl_device_ids)])
            self._env_vars.append(env_vars)
        self.restarts = [0] * len(self.factories)
        self._workers = [_Worker(self._ctx, f, v) for f, v in zip(self.factories, self._env_vars)]
        for i in range(self.num_envs):
            self._await_ready(i, restart_on_failure=False)

    @property
    def num_envs(self) -> int:
        return len(self._workers)

    @property
    def infos(self) -> list[EnvInfo]:
        return [self._await_ready(i) for i in range(self.num_envs)]

    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    def _await_ready(self, i: int, restart_on_failure: bool = True) -> EnvInfo:
        worker = self._workers[i]
        if worker.info is None:
            if not worker.conn.poll(self.start_timeout_s):
                worker.kill()
                raise RuntimeError(f"env worker {i} did not build its env within {self.start_timeout_s} s")
            try:
                status, payload = worker.conn.recv()
            except EOFError:
                status, payload = "error", "worker process died while building its env"
            if status != "ok":
                worker.kill()
                raise RuntimeError(f"env worker {i} failed to build its env:\n{payload}")
            worker.info = payload
        return worker.info

    def _restart(self, i: int) -> None:
        self._workers[i].kill()
        self.restarts[i] += 1
        self._workers[i] = _Worker(self._ctx, self.factories[i], self._env_vars[i])

    def _run(self, command: str, args_per_env: dict[int, tuple]) -> dict[int, Any]:
        """Send `command` to the given envs in parallel; failed envs map to EnvFailure."""
        results: dict[int, Any] = {}
        pending = {}
        for i, args in args_per_env.items():
            try:
                self._await_ready(i)
            except RuntimeError as error:  # a restarted worker could not rebuild its env
                results[i] = EnvFailure(f"worker crash: {error}")
                continue
            try:
                self._workers[i].conn.send((command, args))
                pending[i] = self._workers[i]
            except (BrokenPipeError, OSError) as error:
                results[i] = EnvFailure(f"worker crash: {error!r}")
        deadline = time.monotonic() + self.step_timeout_s
        while pending:
            handles = {w.conn: i for i, w in pending.items()} | {w.process.sentinel: i for i, w in pending.items()}
            ready = wait(list(handles), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                for i in pending:
                    results[i] = EnvFailure(f"worker timeout: no answer to {command!r} within {self.step_timeout_s} s")
                break
            for handle in ready:
                i = handles[handle]
                if i not in pending:
                    continue
                worker = pending.pop(i)
                try:
                    status, payload = worker.conn.recv() if worker.conn.poll() else ("crash", None)
                except (EOFError, OSError):
                    status, payload = "crash", None
                if status == "ok":
                    results[i] = payload
                elif status == "error":
                    results[i] = EnvFailure(f"exception in env: {payload.strip().splitlines()[-1]}\n{payload}")
                else:
                    results[i] = EnvFailure(f"worker crash: process exited with code {worker.process.exitcode}")
        for i, result in results.items():
            if isinstance(result, EnvFailure) and not result.reason.startswith("exception"):
                self._restart(i)
        return results

    def close(self) -> None:
        for worker in self._workers:
            try:
                worker.conn.send(("close", ()))
            except (BrokenPipeError, OSError):
                pass
        for worker in self._workers:
            worker.process.join(timeout=10)
            worker.kill()
