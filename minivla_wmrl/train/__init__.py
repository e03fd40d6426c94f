"""Trainers: the action tokenizer (vq), SFT, the world model (wm) and GRPO with its validation guard.
They compose envs, data, policy and world models; only the pipeline, the ablation and the CLI import them."""
