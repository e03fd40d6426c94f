"""Robot environments behind one small interface (`RobotEnv`): LIBERO, any gymnasium env, and a
vectorised worker pool. Never imports the trainers."""

from envs.base import Observation, RobotEnv, StepResult
from envs.gym_env import GymRobotEnv
from envs.libero_env import SUITE_MAX_STEPS, SUITES, LiberoEnv
from envs.vector_env import EnvFailure, VectorEnv

__all__ = ["Observation", "RobotEnv", "StepResult", "LiberoEnv", "GymRobotEnv", "VectorEnv", "EnvFailure",
           "SUITES", "SUITE_MAX_STEPS"]
