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


# commands a rebuilt env answers as well as its predecessor would, with no episode begun
EPISODE_FREE_COMMANDS = ("reset", "sample_init_state", "published_init_states")

FORWARDED_ENV_PREFIXES = ("LIBERO_", "MUJOCO_", "PYOPENGL_", "MESA_", "MINIVLA_WMRL_")


def forwarded_env_vars() -> dict[str, str]:
    """The environment variables a worker needs to find the assets and renderer this process uses."""
    return {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}


def _worker(factories: Sequence[EnvFactory], conn, env_vars: dict[str, str]) -> None:
    """Build the worker's envs, then run commands on them: (command, {slot: args}) is answered with
    {slot: ("ok", result) | ("error", traceback)}, the slots run one after another."""
    os.environ.update(env_vars)
    gl.torch_free_process = True
    envs = []
    try:
        for factory in factories:
            envs.append(factory())
        conn.send(("ok", [EnvInfo.of(env) for env in envs]))
    except BaseException:  # noqa: BLE001 - reported to the parent, which decides
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            command, args_per_slot = conn.recv()
        except (EOFError, KeyboardInterrupt):
            break
        if command == "close":
            break
        results = {}
        for slot, args in args_per_slot.items():
            try:
                results[slot] = ("ok", getattr(envs[slot], command)(*args))
            except Exception:  # noqa: BLE001 - the episode fails, the worker lives on
                results[slot] = ("error", traceback.format_exc())
        conn.send(("ok", results))
    for env in reversed(envs):
        env.close()
    conn.close()


class _Worker:
    """A worker process hosting the envs `first .. first + len(factories) - 1` of the pool."""

    def __init__(self, ctx, first: int, factories: Sequence[EnvFactory], env_vars: dict[str, str]):
        self.first, self.factories, self.env_vars = first, list(factories), env_vars
        self.envs = range(first, first + len(self.factories))
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker, args=(self.factories, child, env_vars), daemon=True)
        self.process.start()
        child.close()
        self.infos: list[EnvInfo] | None = None

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
    """Run the envs in worker processes, `envs_per_worker` each; `reset`/`step` act on many envs at once.

    A worker hosting several LIBERO envs of one task (soft resets, the default) renders them all
    through one GL context (`envs.render_context`): a process per env costs ~1.1 GB, each further
    env in it ~120 MB.
    The envs of one worker run one after another, so use at least as many workers as cores.

    Args:
        factories: one picklable zero-argument callable per env (e.g. `functools.partial(LiberoEnv,
            "libero_90", 0)`), called inside the workers; consecutive ones share a worker, so list
            the envs of one task together.
        step_timeout_s: a worker that does not answer a command in time (this long per env of it
            in the command) is killed and restarted.
        start_timeout_s: time allowed for a worker to build its envs.
        egl_device_ids: optional EGL device per worker (MUJOCO_EGL_DEVICE_ID) on multi-GPU hosts.
        envs_per_worker: envs each worker process hosts.

    A worker that crashes or hangs is restarted with fresh envs: the envs in the failed command
    report an `EnvFailure`, and all its envs report one for any command that needs their episode
    until they are reset (`EPISODE_FREE_COMMANDS` still run).
    """

    def __init__(self, factories: Sequence[EnvFactory], step_timeout_s: float = 120.0,
                 start_timeout_s: float = 600.0, egl_device_ids: Sequence[int] | None = None,
                 envs_per_worker: int = 1):
        if not factories:
            raise ValueError("VectorEnv needs at least one env factory")
        if envs_per_worker < 1:
            raise ValueError(f"envs_per_worker must be >= 1, got {envs_per_worker}")
        self._ctx = mp.get_context("spawn")
        self.factories = list(factories)
        self.step_timeout_s, self.start_timeout_s = step_timeout_s, start_timeout_s
        self.restarts = [0] * len(self.factories)
        self._lost: set[int] = set()  # envs whose episode went with a restarted worker, until reset
        self._workers = []
        for w, first in enumerate(range(0, len(self.factories), envs_per_worker)):
            env_vars = forwarded_env_vars()
            if egl_device_ids is not None:
                env_vars["MUJOCO_EGL_DEVICE_ID"] = str(egl_device_ids[w % len(egl_device_ids)])
            self._workers.append(_Worker(self._ctx, first, self.factories[first:first + envs_per_worker], env_vars))
        self._worker_of = [w for w, worker in enumerate(self._workers) for _ in worker.envs]
        try:
            for w in range(len(self._workers)):
                self._await_ready(w)
        except RuntimeError:
            self.close()
            raise

    @property
    def num_envs(self) -> int:
        return len(self.factories)

    @property
    def infos(self) -> list[EnvInfo]:
        return [info for w in range(len(self._workers)) for info in self._await_ready(w)]

    def pids(self) -> list[int]:
        """The worker processes' ids, one per worker."""
        return [w.process.pid for w in self._workers]

    def _await_ready(self, w: int) -> list[EnvInfo]:
        worker = self._workers[w]
        if worker.infos is None:
            if not worker.conn.poll(self.start_timeout_s):
                worker.kill()
                raise RuntimeError(f"env worker {w} did not build its envs within {self.start_timeout_s} s")
            try:
                status, payload = worker.conn.recv()
            except EOFError:
                status, payload = "error", "worker process died while building its envs"
            if status != "ok":
                worker.kill()
                raise RuntimeError(f"env worker {w} failed to build its envs:\n{payload}")
            worker.infos = payload
        return worker.infos

    def _restart(self, w: int) -> None:
        """Replace worker w; its envs' episodes are lost with it."""
        old = self._workers[w]
        old.kill()
        for i in old.envs:
            self.restarts[i] += 1
        self._lost.update(old.envs)
        self._workers[w] = _Worker(self._ctx, old.first, old.factories, old.env_vars)

    def _run(self, command: str, args_per_env: dict[int, tuple]) -> dict[int, Any]:
        """Send `command` to the given envs' workers in parallel; failed envs map to EnvFailure."""
        results: dict[int, Any] = {}
        per_worker: dict[int, dict[int, tuple]] = {}
        for i, args in args_per_env.items():
            if command == "reset":
                self._lost.discard(i)
            elif i in self._lost and command not in EPISODE_FREE_COMMANDS:
                results[i] = EnvFailure(f"worker crash: env {i}'s worker was restarted since its last reset")
                continue
            per_worker.setdefault(self._worker_of[i], {})[i] = args
        pending, crashed = {}, set()
        for w, args in per_worker.items():
            worker = self._workers[w]
            try:
                self._await_ready(w)
                worker.conn.send((command, {i - worker.first: a for i, a in args.items()}))
                pending[w] = worker
            except (RuntimeError, BrokenPipeError, OSError) as error:  # e.g. a restart could not rebuild its envs
                crashed.add(w)
                results.update({i: EnvFailure(f"worker crash: {error}") for i in args})
        envs_in_turn = max((len(args) for args in per_worker.values()), default=1)  # a worker's envs run in turn
        timeout_s = self.step_timeout_s * envs_in_turn
        deadline = time.monotonic() + timeout_s
        while pending:
            handles = {w.conn: k for k, w in pending.items()} | {w.process.sentinel: k for k, w in pending.items()}
            ready = wait(list(handles), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                for w in pending:
                    results.update({i: EnvFailure(f"worker timeout: no answer to {command!r} within "
                                                  f"{timeout_s} s") for i in per_worker[w]})
                crashed.update(pending)
                break
            for handle in ready:
                w = handles[handle]
                if w not in pending:
                    continue
                worker = pending.pop(w)
                try:
                    status, payload = worker.conn.recv() if worker.conn.poll() else ("crash", None)
                except (EOFError, OSError):
                    status, payload = "crash", None
                if status != "ok":
                    crashed.add(w)
                    results.update({i: EnvFailure(f"worker crash: process exited with code "
                                                  f"{worker.process.exitcode}") for i in per_worker[w]})
                    continue
                for slot, (outcome, value) in payload.items():
                    results[worker.first + slot] = value if outcome == "ok" else EnvFailure(
                        f"exception in env: {value.strip().splitlines()[-1]}\n{value}")
        for w in crashed:
            self._restart(w)
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
