"""Scripted demonstrations of a gymnasium robot env, written in the LIBERO hdf5 layout.

Same groups and keys as `demos.py` (`data/demo_N/{actions, obs/*, rewards, dones}`, file
attributes with the instruction), with `macros_image_convention = "upright"` (gymnasium renders
upright) and `gripper_convention = "none"` (actions are trained and executed as stored).
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
from tqdm import tqdm

from envs.fetch_expert import FetchPickAndPlaceExpert
from envs.gym_env import GymRobotEnv
from minivla_wmrl.infra.atomic import atomic_file
from minivla_wmrl.infra.outputs import create_output_dir

EXPERTS = {"FetchPickAndPlace-v4": FetchPickAndPlaceExpert}
IMAGE_KEY = "image_rgb"


def generate_gym_demos(env_id: str, instruction: str, num: int, out: Path, init_states: list[int],
                       resolution: int = 224) -> dict:
    """Run the env's scripted expert from each init state (reset seed) until `num` episodes succeed."""
    if env_id not in EXPERTS:
        raise ValueError(f"no scripted expert for {env_id!r}; experts exist for {sorted(EXPERTS)}")
    create_output_dir(out, "demos")
    env = GymRobotEnv(env_id, instruction, resolution=resolution)
    successes, tried = [], 0
    try:
        for init_state in tqdm(init_states, desc=env_id):
            tried += 1
            observation, expert = env.reset(init_state), EXPERTS[env_id]()
            frames, proprio, actions = [], [], []
            while not env.done:
                action = expert.act(observation.state)
                frames.append(observation.images["image"])
                proprio.append(observation.proprio)
                actions.append(action)
                observation = env.step(action).observation
            if env.success:
                successes.append((init_state, np.stack(frames), np.stack(proprio), np.stack(actions)))
                if len(successes) == num:
                    break
    finally:
        env.close()
    path = out / f"{env_id}_demo.hdf5"
    if successes:
        with atomic_file(path) as tmp, h5py.File(tmp, "w") as f:
            data = f.create_group("data")
            data.attrs.update(env_name=env_id, problem_info=json.dumps({"language_instruction": instruction}),
                              macros_image_convention="upright", gripper_convention="none",
                              env_args=json.dumps({"env_id": env_id, "resolution": resolution}),
                              num_demos=len(successes), total=sum(len(a) for *_, a in successes))
            for i, (init_state, frames, proprio, actions) in enumerate(successes):
                demo = data.create_group(f"demo_{i}")
                demo.attrs.update(num_samples=len(actions), init_state=init_state)
                demo["actions"] = actions
                rewards = np.zeros(len(actions))
                rewards[-1] = 1
                demo["rewards"], demo["dones"] = rewards, rewards.astype(np.uint8)
                demo["obs/" + IMAGE_KEY], demo["obs/proprio"] = frames, proprio
    return {"env_id": env_id, "file": str(path) if successes else None, "tried": tried, "succeeded": len(successes),
            "success_rate": len(successes) / max(tried, 1)}
