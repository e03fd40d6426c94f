"""Trainers: the action tokenizer (vq), SFT, GRPO. They compose envs, data and models; nothing imports them."""
