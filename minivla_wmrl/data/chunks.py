"""Action chunks with MiniVLA's padding near the end of an episode.

The chunk at step t is the normalised actions t .. t+chunk_len-1. Indices past the episode's last
step are "neutral": the first dims 0 (no motion, in normalised space), the gripper repeating the
episode's last value.
"""

from __future__ import annotations

import numpy as np


def episode_chunks(normalized_actions: np.ndarray, chunk_len: int = 8) -> np.ndarray:
    """All chunks of one episode: (T, action_dim) normalised actions → (T, chunk_len, action_dim)."""
    actions = np.asarray(normalized_actions, dtype=np.float32)
    if actions.ndim != 2 or len(actions) == 0:
        raise ValueError(f"episode actions have shape {actions.shape}; expected (T >= 1, action_dim)")
    neutral = np.zeros((chunk_len - 1, actions.shape[1]), np.float32)
    neutral[:, -1] = actions[-1, -1]
    padded = np.concatenate([actions, neutral])
    index = np.arange(len(actions))[:, None] + np.arange(chunk_len)[None]
    return padded[index]
