#!/bin/bash
# Issue 31 at the protocol's episode cap: experiments/gated28.sh's probe gate and time-only gate beside
# sparse GRPO, every rollout capped at libero_90's 400 steps instead of the CPU recipe's 120 (where an
# oracle that cut every failure at step 24 saves at most 1.68x: the cap, not the predictor, bounded the
# saving). Same task-28 SFT checkpoint, world model and held-out protocol (states 25-49 x 2 samples, cap
# 120: the SFT policy's successes end by step ~80) as gated28.sh. Checkpoints at GRPO steps 5, 10 and 14
# are evaluated, so each arm's success-against-real-steps curve has three points after SFT's.
# Seeds: $SEEDS (default [0, 1, 2]); cells resume one by one: re-run to go on. Needs runs/rl_cpu_t28 from
# experiments/transfer.sh (and its sparse seeds 0-3 for the predictor's replay). Further arguments go to
# `ablate` (e.g. --dry-run).
set -e
cd "$(dirname "$0")/.."
source .venv/bin/activate
export MUJOCO_GL=egl
source experiments/gate28_settings.sh  # R, GATE24: the same gate as gated28.sh's gated24 arms
CAP="grpo.max_real_steps=400, grpo.save_every=5"
SEEDS=${SEEDS:-[0, 1, 2]}
ARMS="{name: sparse400, seeds: $SEEDS, overrides: [$CAP]}, \
{name: gated400, seeds: $SEEDS, overrides: [$CAP, $GATE24, gate.predictor=policy]}, \
{name: gated400_time, seeds: $SEEDS, overrides: [$CAP, $GATE24, gate.predictor=time]}"
minivla-wmrl ablate recipes/rl_cpu.yaml out=$R 'tasks=["28"]' 'demos.tasks=["28"]' ablation.eval_every=5 \
  "ablation.arms=[$ARMS]" --parallel ${PARALLEL:-2} "$@"
