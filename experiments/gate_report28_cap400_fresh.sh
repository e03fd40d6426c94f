#!/bin/bash
# Issue 31, offline, on experiments/gated28_cap400_fresh.sh's runs: does the outcome probe know more than time
# when all it has learnt from is the wm stage's collection (48 rollouts of the SFT policy to the 400-step cap)?
# 1. The probes fit on the collection alone, tested on sparse400 seeds 0 and 1 (448 rollouts of GRPO's
#    policies, never seen): docs/probe_report_task28_cap400_fresh.json.
# 2. The gated arms' gate (min_steps 24, patience 1, wrong-cut rate 0.2, warm-started on the collection)
#    replayed on each of those sparse runs with time alone, the probe on policy signals, the probe with
#    proprioception (gated400_collect's), and the oracle that cuts exactly the non-anchor failures at step 24:
#    docs/gate_report_task28_cap400_fresh_seed{0,1}.json.
set -e
cd "$(dirname "$0")/.."
source .venv/bin/activate
export OMP_NUM_THREADS=1
R=runs/rl_cpu_t28_fresh
minivla-wmrl probe-report $R/wm/replay --test $R/ablation/sparse400/seed{0,1}/replay \
  --steps 16 24 32 48 64 96 128 --time-scale 400 --json docs/probe_report_task28_cap400_fresh.json
for s in 0 1; do
  minivla-wmrl gate-report $R/ablation/sparse400/seed$s/replay --replay $R/wm/replay --warm-start \
    --predictor time policy proprio oracle --min-steps 24 --patience 1 --wrong-cut-rate 0.2 --time-scale 400 \
    --json docs/gate_report_task28_cap400_fresh_seed$s.json
done
