"""PointReach: a tiny registered gymnasium env on which RL must visibly learn within a minute of CPU.

A point starts at the left of a strip and must reach the goal line on the right within
`max_episode_steps` (24: three 8-action chunks). Only action dim 0 moves it (x += `speed` ×
clip(a₀, −1, 1)); the other dims are ignored, so any 7-dim robot policy (MiniVLA's action size)
drives it unchanged. Success (`terminated`, `info["is_success"]`) when x reaches the goal. The
image shows the point and the goal line, so a vision-language policy sees where it is. It is a
learning check (`tests/test_learning.py`), not a robot benchmark: fast and deterministic.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

ENV_ID = "MiniVLA/PointReach-v0"


class PointReach(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}

    def __init__(self, goal: float = 0.5, speed: float = 0.05, action_dim: int = 7, render_mode: str | None = None,
                 width: int = 64, height: int = 64):
        if not 0 < goal <= 1 or speed <= 0:
            raise ValueError(f"PointReach needs 0 < goal <= 1 and speed > 0, got goal={goal}, speed={speed}")
        self.goal, self.speed, self.render_mode, self.width, self.height = goal, speed, render_mode, width, height
        self.action_space = gym.spaces.Box(-1.0, 1.0, (action_dim,), np.float32)
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.x, self.y = 0.0, 0.0

    def _observation(self) -> np.ndarray:
        return np.array([self.x, self.y], np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.x, self.y = 0.0, float(self.np_random.uniform(-0.5, 0.5))  # the height varies, the task does not
        return self._observation(), {}

    def step(self, action):
        self.x = float(np.clip(self.x + self.speed * np.clip(action[0], -1.0, 1.0), -1.0, 1.0))
        success = self.x >= self.goal
        return self._observation(), float(success), success, False, {"is_success": success}

    def render(self) -> np.ndarray:
        """Grey strip, green goal line, red point."""
        image = np.full((self.height, self.width, 3), 96, np.uint8)
        column = lambda x: int(round((x + 1) / 2 * (self.width - 1)))  # noqa: E731
        image[:, column(self.goal)] = (0, 200, 0)
        row, col = int(round((self.y + 1) / 2 * (self.height - 1))), column(self.x)
        image[max(row - 2, 0):row + 3, max(col - 2, 0):col + 3] = (220, 30, 30)
        return image


def register() -> None:
    if ENV_ID not in gym.registry:
        gym.register(ENV_ID, entry_point=PointReach, max_episode_steps=24)
