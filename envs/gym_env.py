"""Any registered gymnasium robot environment behind the `RobotEnv` interface.

This is how users swap in non-LIBERO robots: the env id, where the image and proprio come from,
and the instruction are settings; success is `info["is_success"]` when the env reports it, else
`terminated`. Init state i is the reset seed `seed + i`.
"""

from __future__ import annotations

import numpy as np

from envs.base import Observation, RobotEnv
from envs.gl import prepare_gl


def register_known_packages() -> None:
    """gymnasium-robotics' envs (when installed) and our PointReach learning-check env."""
    import gymnasium as gym  # ~0.2 s, point_reach too: all envs users import this module

    from envs.point_reach import register

    register()
    try:
        import gymnasium_robotics  # optional, ~0.2 s on top of gymnasium: only to register its envs

        gym.register_envs(gymnasium_robotics)
    except ImportError:
        pass


class GymRobotEnv(RobotEnv):
    """A gymnasium env as a `RobotEnv`.

    Args:
        env_id: a registered id, e.g. "FetchPickAndPlace-v4".
        instruction: the task's language instruction (gymnasium envs have none).
        image_key: observation key holding the camera image; None renders with `render()`.
        proprio_keys: observation keys concatenated into proprio (for dict observations);
            None takes "observation" when present, else the whole (array) observation.
        resolution: image width and height passed to `gymnasium.make` when rendering.
        max_steps: episode cap; None uses the env's registered `max_episode_steps`.
        seed: init state i resets with seed `seed + i`.
        make_kwargs: extra keyword arguments for `gymnasium.make`.
    """

    cameras = ("image",)

    def __init__(self, env_id: str, instruction: str, image_key: str | None = None,
                 proprio_keys: tuple[str, ...] | None = None, resolution: int = 224, max_steps: int | None = None,
                 seed: int = 0, make_kwargs: dict | None = None):
        super().__init__()
        import gymnasium as gym  # ~0.2 s: all envs users import this module, only gym envs need it

        register_known_packages()
        if env_id not in gym.registry:
            raise ValueError(f"unknown gymnasium env id {env_id!r}; is the package that registers it installed?")
        kwargs = dict(make_kwargs or {})
        prepare_gl()
        if image_key is None:
            kwargs.update(render_mode="rgb_array", width=resolution, height=resolution)
        self._env = gym.make(env_id, **kwargs)
        space = self._env.action_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise ValueError(f"{env_id} has action space {space}; GymRobotEnv needs a 1-D Box")
        self.env_id, self.task_id, self.instruction, self.image_key = env_id, env_id, instruction, image_key
        self.proprio_keys, self.seed = proprio_keys, seed
        self.action_dim = space.shape[0]
        self.action_low, self.action_high = space.low.astype(np.float64), space.high.astype(np.float64)
        self.max_steps = max_steps or self._env.spec.max_episode_steps
        if not self.max_steps:
            raise ValueError(f"{env_id} registers no max_episode_steps; pass max_steps")
        self.num_init_states = None
        self._obs = None

    def reset(self, init_state: int | np.ndarray = 0, render: bool = True) -> Observation | None:
        if isinstance(init_state, (int, np.integer)):
            if init_state < 0:
                raise ValueError(f"init-state index {init_state} must be >= 0 (it selects reset seed seed + index)")
            self._obs, _ = self._env.reset(seed=self.seed + int(init_state))
        else:
            unwrapped = self._env.unwrapped
            if not hasattr(unwrapped, "set_state"):
                raise ValueError(f"{self.env_id} cannot restore a raw state (no set_state); pass an init-state index")
            self._obs, _ = self._env.reset(seed=self.seed)
            state = np.asarray(init_state, dtype=np.float64)
            nq = unwrapped.model.nq
            unwrapped.set_state(state[:nq], state[nq:])
        self._begin_episode()
        return self.observe() if render else None

    def _step_one(self, action: np.ndarray) -> tuple[float, bool, dict]:
        self._obs, reward, terminated, truncated, info = self._env.step(action.astype(np.float32))
        success = bool(info["is_success"]) if "is_success" in info else bool(terminated)
        self.terminated = bool(terminated or truncated)
        return float(reward), success, info

    def observe(self) -> Observation:
        obs = self._obs
        image = obs[self.image_key] if self.image_key else self._env.render()
        if isinstance(obs, dict):
            keys = self.proprio_keys or (("observation",) if "observation" in obs
                                         else tuple(k for k in obs if k != self.image_key))
            proprio = np.concatenate([np.ravel(obs[k]) for k in keys])
            state = {k: np.asarray(v) for k, v in obs.items() if k != self.image_key}
        else:
            proprio, state = np.ravel(obs), {}
        return Observation(images={"image": np.ascontiguousarray(image)}, proprio=proprio.astype(np.float32),
                           instruction=self.instruction, state=state)

    def close(self) -> None:
        if getattr(self, "_env", None) is not None:
            self._env.close()
            self._env = None
