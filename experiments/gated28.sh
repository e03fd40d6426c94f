#!/bin/bash
# Issue 31, gated WMRL on LIBERO: task 28 with the CPU evidence recipe (recipes/rl_cpu.yaml), beside the
# 5 sparse seeds of experiments/transfer.sh (same SFT checkpoint, same held-out states). Arms: gated (the
# outcome probe) and gated_time (the same rule with time alone: does the probe's information matter?).
# Gated execution: 1 anchor in 4 runs to the cap; the others are cut once the outcome probe on the
# policy's own signals predicts failure for 2 chunks in a row after 32 steps, under a threshold the
# anchors calibrate (5% of successes wrongly cut). The probe is refit every step on the wm stage's
# collection, the run's own earlier steps and the sparse seeds 0-3 (earlier runs of the same task).
# Needs runs/rl_cpu_t28 from experiments/transfer.sh.
set -e
cd "$(dirname "$0")/.."
source .venv/bin/activate
export MUJOCO_GL=egl
R=runs/rl_cpu_t28
REPLAY="[$R/wm/replay, $R/ablation/sparse/seed0/replay, $R/ablation/sparse/seed1/replay, $R/ablation/sparse/seed2/replay, $R/ablation/sparse/seed3/replay]"
GATE="grpo.execution=gated, grpo.anchor_fraction=0.25, gate.min_steps=32, gate.patience=2, 'gate.replay=$REPLAY'"
GATED="{name: gated, seeds: [0, 1], overrides: [$GATE, gate.predictor=policy]}"
TIME="{name: gated_time, seeds: [0, 1], overrides: [$GATE, gate.predictor=time]}"
minivla-wmrl ablate recipes/rl_cpu.yaml out=$R 'tasks=["28"]' 'demos.tasks=["28"]' 'ablation.seeds=[0,1,2,3,4]' \
  "ablation.arms=[{name: sparse, overrides: []}, $GATED, $TIME]" --parallel ${PARALLEL:-2}
