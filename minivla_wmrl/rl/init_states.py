"""The split of each task's init states into evaluation, RL training and validation states.

Evaluation uses the protocol's states: trial i starts from LIBERO's published init state i
(0..49). RL must not train on them (peers do, and their RL numbers leak the test set), so RL
training states are new draws of LIBERO's own placement samplers, from seeds
`TRAIN_SEED_BASE + k`, checked to differ from every evaluation state. Training on evaluation
states needs `allow_eval_states=True`, and says so in the run's logs. Validation states (GRPO's
checks of its own checkpoints) are further draws, from seeds `VALIDATION_SEED_BASE + k`, checked
to differ from both.
"""

from __future__ import annotations

import numpy as np

TRAIN_SEED_BASE = 100_000  # RL training init state k of a task is drawn with seed TRAIN_SEED_BASE + k
VALIDATION_SEED_BASE = 200_000  # validation init state k with seed VALIDATION_SEED_BASE + k


def evaluation_init_states(num_trials: int, num_init_states: int | None, first_trial: int = 0) -> list[int]:
    """Trial i ↔ init state i, as the protocol has it (trials first_trial .. first_trial + num_trials - 1)."""
    if num_trials < 1 or first_trial < 0:
        raise ValueError(f"need trials >= 1 and first_trial >= 0, got {num_trials} and {first_trial}")
    if num_init_states is not None and first_trial + num_trials > num_init_states:
        raise ValueError(f"trials {first_trial}..{first_trial + num_trials - 1} requested but the task has "
                         f"{num_init_states} evaluation init states (0..{num_init_states - 1})")
    return list(range(first_trial, first_trial + num_trials))


def check_disjoint(train_states: np.ndarray, eval_states: np.ndarray, task_id: str, atol: float = 1e-6,
                   names: tuple[str, str] = ("RL training", "evaluation")) -> None:
    """Raise if any state of the first set equals one of the second (same simulator state within atol)."""
    train_states, eval_states = np.atleast_2d(train_states), np.atleast_2d(eval_states)
    if train_states.shape[1] != eval_states.shape[1]:
        raise ValueError(f"{task_id}: {names[0]} states have {train_states.shape[1]} dims, {names[1]} states "
                         f"{eval_states.shape[1]}")
    for k, state in enumerate(train_states):
        hits = np.flatnonzero(np.all(np.abs(eval_states - state) <= atol, axis=1))
        if len(hits):
            raise ValueError(f"{task_id}: {names[0]} init state {k} equals {names[1]} init state {hits[0]}; RL must "
                             f"keep them apart (set allow_eval_states to train on evaluation states on purpose)")


def training_init_states(sample, published: np.ndarray | None, count: int, task_id: str, first: int = 0,
                         base: int = TRAIN_SEED_BASE, avoid: list | None = None) -> list:
    """`count` RL training (or, with `base=VALIDATION_SEED_BASE`, validation) init states of a task.

    Envs with published states (LIBERO): `sample(seed)` draws a new raw state for seeds
    base + first + k, checked disjoint from `published` and from the states in `avoid`. Envs whose
    init states are reset seeds (`published` None): the indices base + first + k themselves
    (disjoint from the protocol's 0..49 and from the other base's range by construction).
    """
    seeds = [base + first + k for k in range(count)]
    if published is None:
        return seeds
    states = np.stack([sample(seed) for seed in seeds])
    what = "RL training" if base == TRAIN_SEED_BASE else "validation"
    check_disjoint(states, published, task_id, names=(what, "evaluation"))
    if avoid is not None and len(avoid) and np.ndim(avoid[0]) == 1:
        check_disjoint(states, np.stack(avoid), task_id, names=(what, "RL training"))
    return list(states)


def vector_training_init_states(envs, env_index: int, count: int, base: int = TRAIN_SEED_BASE,
                                avoid: list | None = None) -> list:
    """`training_init_states` for the task of env `env_index` of a `VectorEnv` (sampled in its worker)."""
    info = envs.infos[env_index]
    published = envs.call("published_init_states", envs=[env_index])[0] if info.num_init_states else None
    return training_init_states(lambda seed: envs.call("sample_init_state", seed, envs=[env_index])[0], published,
                                count, info.task_id, base=base, avoid=avoid)


def select_rl_init_states(indices: list[int] | None, num_eval_states: int | None, allow_eval_states: bool,
                          task_id: str) -> list[int] | None:
    """Validate an explicit list of protocol init-state indices for RL; None means generated states."""
    if indices is None:
        return None
    if num_eval_states is not None and not allow_eval_states:
        raise ValueError(f"{task_id}: RL on init states {indices[:5]}... of the evaluation set leaks the test set; "
                         "leave rl init states unset (new states are drawn) or set allow_eval_states=true")
    return list(indices)
