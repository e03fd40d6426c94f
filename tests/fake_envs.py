"""A pure-logic RobotEnv for worker-pool tests that need a worker to hang on demand."""

import time

import numpy as np

from envs.base import Observation, RobotEnv


class SleepyEnv(RobotEnv):
    """Counts steps; an action whose first entry is > 0 makes the step sleep that many seconds."""

    task_id, instruction, action_dim, max_steps, num_init_states, cameras = "sleepy", "wait", 2, 100, None, ()

    def reset(self, init_state=0, render=True):
        self._begin_episode()
        return self.observe()

    def _step_one(self, action):
        if action[0] > 0:
            time.sleep(float(action[0]))
        return 0.0, False, {}

    def observe(self):
        return Observation(images={}, proprio=np.array([self.step_count], np.float32), instruction=self.instruction)
