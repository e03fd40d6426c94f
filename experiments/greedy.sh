#!/bin/bash
# Issue 30, "report per task, greedy and sampled": the checkpoints of the three tasks' ablations
# (experiments/transfer.sh and recipes/rl_cpu.yaml; task 0 with its controls) evaluated again with the
# protocol's greedy decoding and at the training temperature, on 50 drawn validation init states: disjoint
# from the states RL trains on and from the published ones, and never seen by these runs (they have no
# guard). Only evaluates: every cell is finished already. Reports:
# runs/rl_cpu*/ablation/eval_{greedy,sampled_val,greedy_pub}/ablation.json, and the sampled reports
# (runs/rl_cpu*/ablation/ablation.json) with guarded rows: each seed's final checkpoint where it beat SFT
# greedily on the validation states (exact McNemar p <= 0.05, the recipes' validation.accept_p), else SFT's.
# PARALLEL as transfer.sh; TASKS (default "0 28 47") chooses the tasks.
set -e
cd "$(dirname "$0")/.."
source .venv/bin/activate
export MUJOCO_GL=egl
SEEDS='ablation.seeds=[0,1,2,3,4]'
# Three protocols beside the recipe's (sampled at the training temperature, published states 25-49 x 2):
# greedy and sampled on the same 50 validation states (decoding apart), and greedy on the published
# states 25-49 (the states apart: with the recipe's, the 2 x 2 of decoding and states).
# PROTOCOL_SET=greedy: the first alone (what the guarded rows need).
GREEDY='{name: greedy, overrides: ["eval.temperature=0", "eval.samples_per_state=1", "eval.init_states=validation",
  "eval.first_trial=0", "eval.trials=50"]}'
SAMPLED_VAL='{name: sampled_val, overrides: ["eval.samples_per_state=1", "eval.init_states=validation",
  "eval.first_trial=0", "eval.trials=50"]}'
GREEDY_PUB='{name: greedy_pub, overrides: ["eval.temperature=0", "eval.samples_per_state=1"]}'
if [ "${PROTOCOL_SET:-all}" = greedy ]; then
  PROTOCOLS="ablation.protocols=[$GREEDY]"
else
  PROTOCOLS="ablation.protocols=[$GREEDY, $SAMPLED_VAL, $GREEDY_PUB]"
fi
SPARSE='{name: sparse, overrides: []}'
SHUFFLED='{name: shuffled, overrides: ["grpo.shuffle_rewards=true"]}'
GUARD='ablation.guard_protocol=greedy'  # each report's guarded rows: the recipes' guard (accept_p 0.05) after the fact
ablate() { minivla-wmrl ablate recipes/rl_cpu.yaml "$SEEDS" "$PROTOCOLS" "$GUARD" "$@" --parallel ${PARALLEL:-2}; }
t0() { ablate "ablation.arms=[$SPARSE, {name: lr0, overrides: [grpo.lr=0, grpo.steps=1], seeds: [0]}, $SHUFFLED]"; }
t28() { ablate out=runs/rl_cpu_t28 'tasks=["28"]' 'demos.tasks=["28"]' \
  "ablation.arms=[$SPARSE, {name: shuffled, seeds: [0, 1, 2], overrides: [grpo.shuffle_rewards=true]}]"; }
t47() { ablate out=runs/rl_cpu_t47 'tasks=["47"]' 'demos.tasks=["47"]' grpo.grpo.max_real_steps=200 eval.max_steps=200 \
  "ablation.arms=[$SPARSE]"; }
for task in ${TASKS:-0 28 47}; do "t$task"; done  # e.g. TASKS="28 47": those tasks only
