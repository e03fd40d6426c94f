"""A scripted expert for gymnasium-robotics FetchPickAndPlace from its privileged observation.

Phases: above the block (open) → down to it → close → carry to the goal → hold. The action is
a position delta (±1 = ±0.05 m per step) and a gripper command (+1 opens, −1 closes).
"""

from __future__ import annotations

import numpy as np

OPEN, CLOSE = 1.0, -1.0


class FetchPickAndPlaceExpert:
    def __init__(self, gain: float = 10.0):
        self.gain, self.phase, self.hold = gain, 0, 0

    @property
    def finished(self) -> bool:
        return False  # runs until the env reports success or its step cap

    def act(self, observation: dict) -> np.ndarray:
        o = np.asarray(observation["observation"])
        grip, block, goal, fingers = o[:3], o[3:6], np.asarray(observation["desired_goal"]), o[9:11].sum()
        above = block + np.array([0.0, 0.0, 0.05])
        if self.phase == 0 and np.linalg.norm(grip - above) < 0.01:
            self.phase = 1
        if self.phase == 1 and np.linalg.norm(grip - block) < 0.01:
            self.phase, self.hold = 2, 0
        if self.phase == 2:
            self.hold += 1
            if self.hold > 4 and fingers < 0.06:
                self.phase = 3
        target, gripper = {0: (above, OPEN), 1: (block, OPEN), 2: (block, CLOSE), 3: (goal, CLOSE)}[self.phase]
        delta = np.clip(self.gain * (target - grip), -1, 1)
        return np.concatenate([delta, [gripper]])
