#!/bin/bash
# Issue 30's shuffled-reward control on task 28 at 5 seeds, from a task-28 SFT checkpoint rebuilt on this
# session's machine (2026-12-05, OMP_NUM_THREADS=1): the committed one (sha256 4d470228..., behind
# docs/ablation_rl_cpu_t28*.json) did not reproduce here at 1 or 2 threads with the same package versions
# and training code, so its 3 shuffled seeds cannot be extended (`ablate --merge` refuses another SFT).
# Arms: sparse (seed 0: RL's effect on this checkpoint, and a full-execution run for the outcome probe's
# test episodes) and shuffled (seeds 0-4: rewards deranged within groups, must not help); every checkpoint
# evaluated with the recipe's sampled protocol and greedily on validation states 0-49 (experiments/greedy.sh's
# `greedy`), with the guarded rows. The cells' replay stores feed experiments/proprio28.sh.
# Cells resume one by one: re-run to go on. PARALLEL as transfer.sh.
set -e
cd "$(dirname "$0")/.."
source .venv/bin/activate
export MUJOCO_GL=egl OMP_NUM_THREADS=1
GREEDY='{name: greedy, overrides: ["eval.temperature=0", "eval.samples_per_state=1", "eval.init_states=validation",
  "eval.first_trial=0", "eval.trials=50"]}'
minivla-wmrl ablate recipes/rl_cpu.yaml out=runs/rl_cpu_t28 'tasks=["28"]' 'demos.tasks=["28"]' 'ablation.seeds=[0,1,2,3,4]' \
  "ablation.arms=[{name: sparse, seeds: [0], overrides: []}, {name: shuffled, overrides: [grpo.shuffle_rewards=true]}]" \
  "ablation.protocols=[$GREEDY]" ablation.guard_protocol=greedy --parallel ${PARALLEL:-2} "$@"
