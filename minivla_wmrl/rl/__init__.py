"""Rollouts and WMRL's corrections: the engine that runs a policy in vector envs (used by GRPO,
evaluation and world-model collection), the split of init states, GRPO group advantages, Online
Debiasing and Inverse-Variance Denoising. Nothing here trains or writes a run."""
