#!/bin/bash
# Issue 30, "defaults that transfer": the CPU evidence recipe (recipes/rl_cpu.yaml, its GRPO defaults
# unchanged) on two more libero_90 tasks, 5 GRPO seeds each from one SFT checkpoint per task, seeds as
# the unit. Task 0 is the committed docs/ablation_rl_cpu.json. Task 28 ("close the top drawer of the
# cabinet", KITCHEN_SCENE5, never tuned on); task 47 ("pick up the cream cheese box and put it in the
# basket", a pick-and-place: its scripted demos take ~90 steps against the drawer's ~44, so its
# episode caps are 200 instead of 120). Each task's ablation resumes cell by cell: re-run to go on.
# Each task also runs the shuffled-reward control (5 seeds). PARALLEL=1 runs one cell at a time (default 2).
set -e
cd "$(dirname "$0")/.."
source .venv/bin/activate
export MUJOCO_GL=egl
SEEDS='ablation.seeds=[0,1,2,3,4]'
SPARSE='{name: sparse, overrides: []}'
SHUFFLED='{name: shuffled, overrides: ["grpo.shuffle_rewards=true"]}'  # rewards deranged within groups: must not help
t28() { minivla-wmrl ablate recipes/rl_cpu.yaml out=runs/rl_cpu_t28 'tasks=["28"]' 'demos.tasks=["28"]' "$SEEDS" "$@" --parallel ${PARALLEL:-2}; }
t47() { minivla-wmrl ablate recipes/rl_cpu.yaml out=runs/rl_cpu_t47 'tasks=["47"]' 'demos.tasks=["47"]' "$SEEDS" "$@" \
  grpo.grpo.max_real_steps=200 eval.max_steps=200 --parallel ${PARALLEL:-2}; }
# Sparse on both tasks first (the three-task table), then the shuffled control on each.
t28 "ablation.arms=[$SPARSE]"
t47 "ablation.arms=[$SPARSE]"
t28 "ablation.arms=[$SPARSE, $SHUFFLED]"
t47 "ablation.arms=[$SPARSE, $SHUFFLED]"
