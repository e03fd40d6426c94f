#!/bin/bash
# Issue 30 cause study, task 28 (runs/task28b: arm-noise draws, the guard): SFT and GRPO's last step
# (step 5, unguarded) on the published held-out states (14-49) and on RL's own training draws (the
# 32 of the pool), greedy and sampled (T=1, 2 samples per state).
set -e
# Needs the earlier runs it names under runs/ (runs/task28b: the demo recipe on task 28; runs/demo_guard and
# runs/task28_guard: copies of runs/demo and runs/task28b holding only demos/ vq/ sft/ wm/).
cd "$(dirname "$0")/.."
source .venv/bin/activate
export MUJOCO_GL=egl
for ckpt in sft:runs/task28b/sft/final grpo5:runs/task28b/grpo/checkpoints/step_0000005; do
  name=${ckpt%%:*}; path=${ckpt#*:}
  for states in published:14:36 training:0:32; do
    kind=${states%%:*}; rest=${states#*:}; first=${rest%%:*}; trials=${rest#*:}
    minivla-wmrl eval --checkpoint $path --suite libero_90 --tasks 28 --init-states $kind --first-trial $first \
      --trials $trials --execute-steps 8 --max-steps 120 --envs 2 --videos none --temperature 0 \
      --out runs/cause28/${name}_${kind}_greedy
    minivla-wmrl eval --checkpoint $path --suite libero_90 --tasks 28 --init-states $kind --first-trial $first \
      --trials $trials --execute-steps 8 --max-steps 120 --envs 2 --videos none --temperature 1.0 \
      --samples-per-state 2 --out runs/cause28/${name}_${kind}_sampled
  done
done
