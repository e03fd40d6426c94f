#!/bin/bash
# Issue 31, gated WMRL on LIBERO: task 28 with the CPU evidence recipe (recipes/rl_cpu.yaml), beside the
# 5 sparse seeds of experiments/transfer.sh (same SFT checkpoint, same held-out states).
# Gated execution: 1 anchor in 4 runs to the cap; another is cut once the outcome predictor has said
# failure for `patience` chunks in a row after `min_steps`, under a threshold the anchors calibrate
# for `wrong_cut_rate`. The predictor is refit every step on the wm stage's collection, the run's own
# earlier steps and the sparse seeds 0-3 (earlier runs of the same task).
# Arms (in this order: arm i's GRPO seeds are s + 1000 × i, so the order is part of the evidence):
#   gated, gated_time (1 seed each, done): min_steps 32, patience 2, wrong-cut rate 0.05 - too timid
#   gated24, gated24_time: min_steps 24, patience 1, wrong-cut rate 0.2, the setting `gate-report`
#     chose offline on sparse seed 4's rollouts (docs/gate_report_task28.json), with the outcome probe
#     and with time alone (does the probe's information matter?); seeds $SEEDS (default [0, 1, 2])
#   truncated: the recipe's fixed-horizon truncation (every non-anchor cut at 48 steps); seeds
#     $TRUNCATED_SEEDS (default: $SEEDS; empty: the arm is left out of this invocation)
# Needs runs/rl_cpu_t28 from experiments/transfer.sh. Cells resume one by one: re-run to go on.
# Further arguments go to `ablate` (e.g. --dry-run).
set -e
cd "$(dirname "$0")/.."
source .venv/bin/activate
export MUJOCO_GL=egl
R=runs/rl_cpu_t28
REPLAY="[$R/wm/replay, $R/ablation/sparse/seed0/replay, $R/ablation/sparse/seed1/replay, $R/ablation/sparse/seed2/replay, $R/ablation/sparse/seed3/replay]"
GATE="grpo.execution=gated, grpo.anchor_fraction=0.25, 'gate.replay=$REPLAY'"
OLD="$GATE, gate.min_steps=32, gate.patience=2"
NEW="$GATE, gate.min_steps=24, gate.patience=1, gate.wrong_cut_rate=0.2"
SEEDS=${SEEDS:-[0, 1, 2]}
TRUNCATED_SEEDS=${TRUNCATED_SEEDS-$SEEDS}
TRUNCATED='"grpo.reward_mode=dense_calib", "grpo.execution=truncated", "grpo.anchor_fraction=0.25", "grpo.wm_horizon=48", "grpo.wm_reduction=success", "world_model.train.prefix_target=final"'
ARMS="{name: sparse, overrides: []}, \
{name: gated, seeds: [0], overrides: [$OLD, gate.predictor=policy]}, \
{name: gated_time, seeds: [0], overrides: [$OLD, gate.predictor=time]}, \
{name: gated24, seeds: $SEEDS, overrides: [$NEW, gate.predictor=policy]}, \
{name: gated24_time, seeds: $SEEDS, overrides: [$NEW, gate.predictor=time]}"
if [ -n "$TRUNCATED_SEEDS" ]; then
  ARMS="$ARMS, {name: truncated, seeds: $TRUNCATED_SEEDS, overrides: [$TRUNCATED]}"
fi
minivla-wmrl ablate recipes/rl_cpu.yaml out=$R 'tasks=["28"]' 'demos.tasks=["28"]' 'ablation.seeds=[0,1,2,3,4]' \
  "ablation.arms=[$ARMS]" --parallel ${PARALLEL:-2} "$@"
