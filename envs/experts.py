"""Scripted experts that use privileged simulator state to solve LIBERO tasks.

An expert follows end-effector waypoints computed at reset from the task's BDDL goal and the
simulator's sites, with a proportional controller on the OSC_POSE delta action (±1 = ±0.05 m).
They make demonstrations (no LIBERO dataset can be downloaded here) and known-good action
sequences for tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envs.libero_env import LiberoEnv

GRIPPER_OPEN, GRIPPER_CLOSED = -1.0, 1.0
POSITION_SCALE = 0.05  # metres per unit of OSC_POSE delta action


@dataclass
class Waypoint:
    position: np.ndarray
    gripper: float
    max_steps: int
    tolerance: float = 0.01
    gain: float = 2.0


class WaypointExpert:
    """Drive the end effector through waypoints; each ends when reached or after its max_steps."""

    def __init__(self, waypoints: list[Waypoint]):
        self.waypoints, self._index, self._steps = waypoints, 0, 0

    @property
    def finished(self) -> bool:
        return self._index >= len(self.waypoints)

    def act(self, eef_pos: np.ndarray) -> np.ndarray:
        while not self.finished:
            waypoint = self.waypoints[self._index]
            error = waypoint.position - eef_pos
            if np.linalg.norm(error) >= waypoint.tolerance and self._steps < waypoint.max_steps:
                break
            self._index, self._steps = self._index + 1, 0
        if self.finished:
            return np.array([0, 0, 0, 0, 0, 0, self.waypoints[-1].gripper])
        self._steps += 1
        action = np.zeros(7)
        action[:3] = np.clip(error / POSITION_SCALE * waypoint.gain, -1, 1)
        action[6] = waypoint.gripper
        return action


def _site_pos(env: LiberoEnv, name: str) -> np.ndarray:
    return np.array(env.sim.data.site_xpos[env.sim.model.site_name2id(name)])


def close_drawer(env: LiberoEnv, region: str) -> WaypointExpert:
    """Close a drawer: open fingers straddle its handle from the front, then push it home."""
    site = _site_pos(env, region)
    cabinet = region.rsplit("_", 2)[0]  # e.g. wooden_cabinet_1_top_region -> wooden_cabinet_1
    body = np.array(env.sim.data.body_xpos[env.sim.model.body_name2id(f"{cabinet}_main")])
    inward = np.r_[body[:2] - site[:2], 0]  # from the open drawer towards the cabinet: the closing direction
    inward /= np.linalg.norm(inward)
    front = site - 0.16 * inward + [0, 0, 0.02]  # level with the handle, in front of the open drawer
    return WaypointExpert([
        Waypoint(front + [0, 0, 0.03], GRIPPER_OPEN, max_steps=40),
        Waypoint(front, GRIPPER_OPEN, max_steps=20),
        Waypoint(front + 0.46 * inward, GRIPPER_OPEN, max_steps=80, gain=1.0),
    ])


def _target_pos(env: LiberoEnv, name: str) -> np.ndarray:
    """A goal target: a site (e.g. 'basket_1_contain_region') or an object (e.g. 'plate_1')."""
    if name in [env.sim.model.site_id2name(i) for i in range(env.sim.model.nsite)]:
        return _site_pos(env, name)
    return np.array(env._raw_obs[f"{name}_pos"])


def pick_and_place(env: LiberoEnv, obj: str, target: str, lift: float = 0.20,
                   place_height: float = 0.10) -> WaypointExpert:
    """Grasp an object from above at its centre, lift, carry over the target, lower, release."""
    grasp, goal = np.array(env._raw_obs[f"{obj}_pos"]), _target_pos(env, target)
    above_goal = np.r_[goal[:2], goal[2] + place_height]
    return WaypointExpert([
        Waypoint(grasp + [0, 0, 0.10], GRIPPER_OPEN, max_steps=40),
        Waypoint(grasp, GRIPPER_OPEN, max_steps=30, tolerance=0.005),
        Waypoint(grasp, GRIPPER_CLOSED, max_steps=12, tolerance=0.0),  # hold still while the fingers close
        Waypoint(grasp + [0, 0, lift], GRIPPER_CLOSED, max_steps=40),
        Waypoint(np.r_[goal[:2], grasp[2] + lift], GRIPPER_CLOSED, max_steps=60),
        Waypoint(above_goal, GRIPPER_CLOSED, max_steps=30),
        Waypoint(above_goal, GRIPPER_OPEN, max_steps=10, tolerance=0.0),
        Waypoint(above_goal + [0, 0, 0.10], GRIPPER_OPEN, max_steps=30),
    ])


GOAL_EXPERTS = {"close": close_drawer, "in": pick_and_place, "on": pick_and_place}


def goal_predicates(env: LiberoEnv) -> list[list[str]]:
    return env._env.env.parsed_problem["goal_state"]


def expert_for(env: LiberoEnv) -> WaypointExpert:
    """The scripted expert for the env's current episode (call after `env.reset`)."""
    goals = goal_predicates(env)
    if len(goals) != 1 or goals[0][0].lower() not in GOAL_EXPERTS:
        raise ValueError(f"no scripted expert for {env.suite} task {env.task_index} ({env.instruction!r}): goal "
                         f"{goals}; experts exist for goals {sorted(GOAL_EXPERTS)}")
    predicate, *args = goals[0]
    return GOAL_EXPERTS[predicate.lower()](env, *args)


def run_expert(env: LiberoEnv, init_state: int, render: bool = False) -> list[np.ndarray]:
    """Run the scripted expert for one episode from `init_state`; returns the executed actions."""
    env.reset(init_state, render=render)
    expert, actions = expert_for(env), []
    while not env.done and not expert.finished:
        actions.append(expert.act(env.eef_pos()))
        env.step(actions[-1], render=render)
    return actions
