"""The one small environment interface every later part (rollouts, evaluation, demos) uses.

An episode is: `reset(init_state)` (wait steps included), then `step(action_or_chunk)` until
`done`. Images are rendered only when an observation is asked for (`render=True`), so a chunk
of actions costs physics only, plus one render at its end.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields

import numpy as np


@dataclass
class Observation:
    """What a policy sees: upright camera images by camera name, proprio, the instruction.

    `state` holds the simulator's low-dimensional observations (object poses included): privileged
    information for scripted experts and diagnostics, never a policy input.
    """

    images: dict[str, np.ndarray]
    proprio: np.ndarray
    instruction: str
    state: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class StepResult:
    """The outcome of executing one action or a chunk of actions.

    `steps` is how many actions were executed (fewer than given when the episode ended inside
    the chunk); `success_step` is the episode step (after the wait steps, 1-based) at which
    success was first reached, or None. `failure` names why an episode was cut short by the
    infrastructure (worker crash, timeout, exception); such an episode counts as unsuccessful.
    """

    observation: Observation | None
    reward: float
    success: bool
    done: bool
    steps: int
    success_step: int | None = None
    info: dict = field(default_factory=dict)
    failure: str | None = None


@dataclass
class EnvInfo:
    """What describes an env, set as attributes by every `RobotEnv` implementation and sent as this
    record from worker processes."""

    task_id: str  # unique per task, e.g. "libero_90/0"
    instruction: str
    action_dim: int
    max_steps: int  # the episode cap after the wait steps
    num_init_states: int | None  # None when init states are generated from seeds
    cameras: tuple[str, ...]  # the camera names rendered into observations
    reset_steps: int = 0  # simulator steps every reset runs before the episode (LIBERO: its 10 wait steps)

    @classmethod
    def of(cls, env: RobotEnv) -> EnvInfo:
        return cls(**{f.name: getattr(env, f.name) for f in fields(cls)})


class RobotEnv(ABC):
    """A robot environment behind the project's interface. Implementations set the attributes
    that `EnvInfo` lists (task_id, instruction, action_dim, max_steps, num_init_states, cameras;
    reset_steps when a reset runs the simulator)."""

    reset_steps = 0

    def __init__(self) -> None:
        self._begin_episode()

    def _begin_episode(self) -> None:
        self.step_count = 0
        self.success = False
        self.success_step: int | None = None
        self.terminated = False  # the env ended the episode itself (e.g. a gymnasium termination)

    @property
    def done(self) -> bool:
        return self.success or self.terminated or self.step_count >= self.max_steps

    @abstractmethod
    def reset(self, init_state: int | np.ndarray = 0, render: bool = True) -> Observation | None:
        """Start an episode from an init state (an index, or a raw simulator state)."""

    @abstractmethod
    def _step_one(self, action: np.ndarray) -> tuple[float, bool, dict]:
        """Advance the simulation by one validated action: (reward, success, info)."""

    @abstractmethod
    def observe(self) -> Observation:
        """Render the configured cameras and read proprio at the current state."""

    def _prepare_render(self, render_next: bool) -> None:
        """Hook: tell the simulator whether the next physics step's cameras will be consumed."""

    def close(self) -> None:
        """Release the simulator."""

    def validate_actions(self, actions: np.ndarray) -> np.ndarray:
        """Return actions as a float (k, action_dim) array or raise a ValueError saying why."""
        given = np.asarray(actions, dtype=np.float64)
        actions = given[None] if given.ndim == 1 else given
        if actions.ndim != 2 or actions.shape[1] != self.action_dim or len(actions) == 0:
            raise ValueError(
                f"action has shape {given.shape}; expected ({self.action_dim},) for one action "
                f"or (k, {self.action_dim}) for a chunk of k >= 1"
            )
        if not np.all(np.isfinite(actions)):
            bad = np.argwhere(~np.isfinite(actions))[0]
            raise ValueError(f"action contains NaN/inf at chunk index {bad[0]}, dim {bad[1]}")
        return actions

    def step(self, actions: np.ndarray, render: bool = True) -> StepResult:
        """Execute one action (shape (action_dim,)) or a chunk (k, action_dim) open loop.

        Stops early on success or at the step cap; a success inside the chunk counts at the step
        it happened. The cameras render only for the observation returned at the end.
        """
        actions = self.validate_actions(actions)
        if self.done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        total_reward, executed, info = 0.0, 0, {}
        for i, action in enumerate(actions):
            last = i == len(actions) - 1 or self.step_count + 1 >= self.max_steps
            self._prepare_render(render and last)
            reward, success, info = self._step_one(action)
            self.step_count += 1
            executed += 1
            total_reward += reward
            if success and not self.success:
                self.success, self.success_step = True, self.step_count
            if self.done:
                break
        observation = self.observe() if render else None
        return StepResult(observation, total_reward, self.success, self.done, executed, self.success_step, info)
