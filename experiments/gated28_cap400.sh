#!/bin/bash
# Issue 31 at the protocol's episode cap: gated execution beside sparse GRPO on task 28 with every training
# rollout capped at libero_90's 400 steps instead of the CPU recipe's 120 (where an oracle that cut every
# failure at step 24 saves at most 1.68-1.82x: the cap, not the predictor, bounded the saving). Held-out
# protocol as the recipe's (states 25-49 x 2 samples, cap 120: the SFT policy's successes end by step ~80),
# checkpoints at GRPO steps 5, 10 and 14, so each arm's success-against-real-steps curve has three points.
# Every query of a 400-step rollout is trained on (queries_per_rollout 50, as 25 covers the recipe's 200).
# The task-28 SFT checkpoint is the one experiments/control28.sh rebuilt (OMP_NUM_THREADS=1, kernel v1272).
# Arms, in this order (arm i's GRPO seeds are s + 1000 x i, so the order is part of the evidence):
#   sparse400: full execution, seeds $SPARSE_SEEDS (default [0, 1]); its rollouts are also the predictor's
#     replay and `gate-report`'s data (experiments/gate_report28_cap400.sh)
#   gated400, gated400_time: the gated arms' gate (min_steps 24, patience 1, wrong-cut rate 0.2) with the
#     outcome probe on policy signals + proprioception, seeds $GATED_SEEDS (default [0]; empty: both arms left
#     out), and with time alone, seeds $TIME_SEEDS (default $GATED_SEEDS). The predictor is refit every step
#     on the wm stage's collection, sparse400 seeds 0-1 and the run's own earlier steps; the gate is first calibrated on those replay episodes, cross-fitted
#     (gate.warm_start: offline, on sparse400 seed 1, the time gate opened at step 7 without it and saved
#     1.35x; from step 1 with it, 2.09x).
#   gated400_cut10: gated400 at a wrong-cut rate of 0.1, seeds $CUT10_SEEDS (default none; needs GATED_SEEDS set,
#     as its arm index, hence its GRPO seeds s + 3000, assumes the three arms before it). Offline on sparse400
#     seed 1 the probe then cuts 4 of 57 successes instead of 9, for 1.79x fewer real steps instead of 2.08x.
#   gated400_long: gated400 for 28 GRPO steps instead of 14 (~61k real steps, about sparse400's 67k budget, where
#     its 14 steps end at ~31k), so its curve can reach sparse400's final success; seeds $LONG_SEEDS (default none;
#     needs CUT10_SEEDS set: arm index 4, GRPO seeds s + 4000).
#   oracle400: sparse400 whose update a perfect gate would have made (grpo.oracle_cut_steps 24: every failure
#     except a quarter of each group, picked regardless of outcome as the gated arms' anchors are, trains on its
#     first 3 queries alone); full execution, so it saves nothing: does a perfect predictor close the gated arms'
#     gap, or does cutting itself cost learning? Seeds $ORACLE_SEEDS (default none; needs LONG_SEEDS set: arm
#     index 5, GRPO seeds s + 5000).
#   gated400_zero: gated400 whose cut rollouts are rewarded 0 (gate.cut_reward=failure) instead of the predictor's
#     P(success): with std-scaled group advantages the predictions grade groups whose rollouts all failed (sparse
#     runs leave ~32% of groups without advantage, gated400 ~1%). Seeds $ZERO_SEEDS (default none; needs
#     ORACLE_SEEDS set: arm index 6, GRPO seeds s + 6000).
#   gated400_zero_long: gated400_zero for 28 GRPO steps (its 14 end just short of sparse400's final: the headline
#     ratio needs the curve to reach it), seeds $ZLONG_SEEDS (default none; needs ZERO_SEEDS set: arm index 7, GRPO
#     seeds s + 7000).
#   shuffled400: sparse400 with its rewards deranged within each group (grpo.shuffle_rewards), the control that must
#     not help at this cap; seeds $SHUFFLED_SEEDS (default none; needs ZLONG_SEEDS set: arm index 8, GRPO seeds
#     s + 8000).
# More episodes where the comparison is decided: MORE_ARMS (default none; e.g. "sparse400, gated400_zero", sparse400
# first) adds the protocol `samplesN` (N: MORE_SAMPLES, default 8): each listed arm's final checkpoints and SFT on the
# same 25 held-out states x N samples (the first 2 samples are the recipe protocol's 50 episodes again), its report in
# $R/ablation/eval_samplesN/.
# Cells resume one by one: re-run to go on. Further arguments go to `ablate` (e.g. --dry-run).
set -e
cd "$(dirname "$0")/.."
source .venv/bin/activate
export MUJOCO_GL=egl OMP_NUM_THREADS=1
R=runs/rl_cpu_t28
CAP="grpo.max_real_steps=400, grpo.queries_per_rollout=50, grpo.save_every=5"
REPLAY="[$R/wm/replay, $R/ablation/sparse400/seed0/replay, $R/ablation/sparse400/seed1/replay]"
GATE="grpo.execution=gated, grpo.anchor_fraction=0.25, 'gate.replay=$REPLAY', gate.min_steps=24, gate.patience=1, gate.wrong_cut_rate=0.2, gate.warm_start=true"
SPARSE_SEEDS=${SPARSE_SEEDS:-[0, 1]}
GATED_SEEDS=${GATED_SEEDS-[0]}
TIME_SEEDS=${TIME_SEEDS:-$GATED_SEEDS}
CUT10_SEEDS=${CUT10_SEEDS:-}
LONG_SEEDS=${LONG_SEEDS:-}
ORACLE_SEEDS=${ORACLE_SEEDS:-}
ZERO_SEEDS=${ZERO_SEEDS:-}
ZLONG_SEEDS=${ZLONG_SEEDS:-}
SHUFFLED_SEEDS=${SHUFFLED_SEEDS:-}
# Arms in order: an arm without seeds ends the list (arm i's GRPO seeds are s + 1000 x i, so none runs without the
# arms before it)
ARMS="{name: sparse400, seeds: $SPARSE_SEEDS, overrides: [$CAP]}"
ENDED=
arm() {  # NAME SEEDS OVERRIDES
  if [ -z "$2" ]; then
    ENDED=${ENDED:-$1}
  elif [ -n "$ENDED" ]; then
    echo "$1 has seeds but $ENDED, an arm before it, has none: the arms' order sets their GRPO seeds" >&2
    exit 2
  else
    ARMS="$ARMS, {name: $1, seeds: $2, overrides: [$3]}"
  fi
}
arm gated400 "$GATED_SEEDS" "$CAP, $GATE, gate.predictor=proprio"
arm gated400_time "$TIME_SEEDS" "$CAP, $GATE, gate.predictor=time"
arm gated400_cut10 "$CUT10_SEEDS" "$CAP, $GATE, gate.predictor=proprio, gate.wrong_cut_rate=0.1"
arm gated400_long "$LONG_SEEDS" "$CAP, $GATE, gate.predictor=proprio, grpo.steps=28"
arm oracle400 "$ORACLE_SEEDS" "$CAP, grpo.oracle_cut_steps=24, grpo.anchor_fraction=0.25"
arm gated400_zero "$ZERO_SEEDS" "$CAP, $GATE, gate.predictor=proprio, gate.cut_reward=failure"
arm gated400_zero_long "$ZLONG_SEEDS" "$CAP, $GATE, gate.predictor=proprio, gate.cut_reward=failure, grpo.steps=28"
arm shuffled400 "$SHUFFLED_SEEDS" "$CAP, grpo.shuffle_rewards=true"
MORE_ARMS=${MORE_ARMS:-}
MORE_SAMPLES=${MORE_SAMPLES:-8}
PROTOCOLS=()
if [ -n "$MORE_ARMS" ]; then
  PROTOCOLS=("ablation.protocols=[{name: samples$MORE_SAMPLES, overrides: [eval.samples_per_state=$MORE_SAMPLES], \
final_only: true, arms: [$MORE_ARMS]}]")
fi
minivla-wmrl ablate recipes/rl_cpu.yaml out=$R 'tasks=["28"]' 'demos.tasks=["28"]' 'ablation.seeds=[0,1,2,3,4]' \
  ablation.eval_every=5 "ablation.arms=[$ARMS]" "${PROTOCOLS[@]}" --parallel ${PARALLEL:-2} "$@"
