#!/bin/bash
# Issue 31: does the robot's proprioception make the outcome probe informative sooner? On task 28's episodes
# from experiments/control28.sh (recorded with proprioception): the probes are fit on the wm stage's
# collection and the shuffled control's 5 seeds, and tested on sparse seed 0's rollouts (other weights,
# never seen). Then the gate replayed offline on sparse seed 0 (`gate-report`, the setting of the gated
# arms: min_steps 24, patience 1, wrong-cut rate 0.2), per predictor.
set -e
cd "$(dirname "$0")/.."
source .venv/bin/activate
export OMP_NUM_THREADS=1
R=runs/rl_cpu_t28
TRAIN="$R/wm/replay $(echo $R/ablation/shuffled/seed{0,1,2,3,4}/replay)"
minivla-wmrl probe-report $TRAIN --test $R/ablation/sparse/seed0/replay --steps 16 24 32 48 64 --time-scale 120 \
  --json docs/probe_report_task28_proprio.json
minivla-wmrl gate-report $R/ablation/sparse/seed0/replay --replay $TRAIN --predictor policy proprio privileged time \
  --min-steps 24 --patience 1 --wrong-cut-rate 0.2 --time-scale 120 --json docs/gate_report_task28_proprio.json
