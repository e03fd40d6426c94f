#!/bin/bash
# Issue 31, gated WMRL on LIBERO: task 28 with the CPU evidence recipe (recipes/rl_cpu.yaml), beside the
# 5 sparse seeds of experiments/transfer.sh (same SFT checkpoint, same held-out states).
# Gated execution and its predictor: experiments/gate28_settings.sh.
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
source experiments/gate28_settings.sh  # R, GATE, GATE24
OLD="$GATE, gate.min_steps=32, gate.patience=2"
SEEDS=${SEEDS:-[0, 1, 2]}
TRUNCATED_SEEDS=${TRUNCATED_SEEDS-$SEEDS}
TRUNCATED='"grpo.reward_mode=dense_calib", "grpo.execution=truncated", "grpo.anchor_fraction=0.25", "grpo.wm_horizon=48", "grpo.wm_reduction=success", "world_model.train.prefix_target=final"'
ARMS="{name: sparse, overrides: []}, \
{name: gated, seeds: [0], overrides: [$OLD, gate.predictor=policy]}, \
{name: gated_time, seeds: [0], overrides: [$OLD, gate.predictor=time]}, \
{name: gated24, seeds: $SEEDS, overrides: [$GATE24, gate.predictor=policy]}, \
{name: gated24_time, seeds: $SEEDS, overrides: [$GATE24, gate.predictor=time]}"
if [ -n "$TRUNCATED_SEEDS" ]; then
  ARMS="$ARMS, {name: truncated, seeds: $TRUNCATED_SEEDS, overrides: [$TRUNCATED]}"
fi
minivla-wmrl ablate recipes/rl_cpu.yaml out=$R 'tasks=["28"]' 'demos.tasks=["28"]' 'ablation.seeds=[0,1,2,3,4]' \
  "ablation.arms=[$ARMS]" --parallel ${PARALLEL:-2} "$@"
