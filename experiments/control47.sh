#!/bin/bash
# Issue 30's shuffled-reward control on task 47 ("pick up the cream cheese box and put it in the basket", the
# pick-and-place of the three-task table), as experiments/transfer.sh would run it: the same recipe, episode caps
# 200, torch's default threads (2 on this machine). Built so, the demos, action tokenizer and SFT checkpoint
# reproduce the committed ones (SFT sha256 31c2f2c3..., behind docs/ablation_rl_cpu_t47*.json; on 2026-12-07's
# machine, kernel v1300; with OMP_NUM_THREADS=1 the SFT comes out another checkpoint, 0/50 held out), so the
# control pairs with the committed sparse seeds. Arms: sparse, seed 0 (a committed cell run again: a check that this
# machine repeats it episode for episode) and shuffled (rewards deranged within groups, must not help), seeds
# $SEEDS (a list, default "[0, 1, 2, 3, 4]", the committed report's); every checkpoint evaluated with the recipe's
# sampled protocol and greedily on validation states 0-49 (experiments/greedy.sh's `greedy`), with the guarded rows.
# Reports:
# runs/rl_cpu_t47/ablation/{,eval_greedy/}ablation.json (committed as docs/ablation_rl_cpu_t47_control{,_greedy}.json;
# `ablate --from-json docs/ablation_rl_cpu_t47.json docs/ablation_rl_cpu_t47_control.json --merge` pools the seeds).
# Cells resume one by one: re-run to go on. PARALLEL as transfer.sh.
set -e
cd "$(dirname "$0")/.."
source .venv/bin/activate
export MUJOCO_GL=egl
unset OMP_NUM_THREADS
GREEDY='{name: greedy, overrides: ["eval.temperature=0", "eval.samples_per_state=1", "eval.init_states=validation",
  "eval.first_trial=0", "eval.trials=50"]}'
minivla-wmrl ablate recipes/rl_cpu.yaml out=runs/rl_cpu_t47 'tasks=["47"]' 'demos.tasks=["47"]' \
  grpo.grpo.max_real_steps=200 eval.max_steps=200 \
  "ablation.arms=[{name: sparse, seeds: [0], overrides: []}, {name: shuffled, seeds: ${SEEDS:-[0, 1, 2, 3, 4]}, \
overrides: [grpo.shuffle_rewards=true]}]" \
  "ablation.protocols=[$GREEDY]" ablation.guard_protocol=greedy --parallel ${PARALLEL:-2} "$@"
