"""A tiny MiniVLA (real timm ViTs and transformers Qwen2 at test sizes) with random weights."""

import numpy as np
import torch

from minivla_wmrl.policy import MiniVLA, preset
from minivla_wmrl.policy.action_tokenizer import ActionTokenizer
from minivla_wmrl.policy.normalization import ActionStatistics
from minivla_wmrl.policy.tokenizer import tiny_qwen_style_tokenizer


def make_policy(seed=0, statistics=True):
    torch.manual_seed(seed)
    stats = None
    if statistics:
        actions = np.random.default_rng(seed).uniform(-1, 1, (200, 7))
        actions[:, 6] = actions[:, 6] > 0
        stats = ActionStatistics.from_actions(actions, num_trajectories=4)
    return MiniVLA(preset("tiny"), tiny_qwen_style_tokenizer(), ActionTokenizer(), stats).eval()
