#!/bin/bash
# Issue 31 at the protocol's cap, offline: how much the prefix holds and what the gate would save when task
# 28's training rollouts run to 400 steps (experiments/gated28_cap400.sh's sparse400 seeds 0 and 1). The
# probes are fit on the wm stage's collection and sparse400 seed 0, and tested on seed 1 (other weights,
# never seen); then the gated arms' gate (min_steps 24, patience 1, wrong-cut rate 0.2) replayed on seed 1,
# starting from the same episodes: time alone cold (calibrated on anchors only) and warm-started
# (gate.warm_start), and the probe on policy signals + proprioception warm-started (the live gated400 arm);
# both warm-started at a wrong-cut rate of 0.1 too (the gated400_cut10 arm); and the oracle, which cuts exactly
# the non-anchor failures at step 24 (the most any predictor could save with these anchors and horizon).
# Writes runs/gate_report28_cap400/*.json and their union docs/gate_report_task28_cap400.json; and, for
# comparison, the oracle at the CPU recipe's 120-step cap on the same SFT checkpoint's sparse seed 0 (cap 120,
# experiments/control28.sh) in docs/gate_report_task28_oracle120.json. Last, with every sparse400 seed there (5 seeds,
# SPARSE_SEEDS of experiments/gated28_cap400.sh), the probes fit on four times the data: the collection and seeds
# 0-3, tested on seed 4 (docs/probe_report_task28_cap400_seeds.json).
set -e
cd "$(dirname "$0")/.."
source .venv/bin/activate
export OMP_NUM_THREADS=1
R=runs/rl_cpu_t28
O=runs/gate_report28_cap400
mkdir -p $O
TRAIN="$R/wm/replay $R/ablation/sparse400/seed0/replay"
TEST=$R/ablation/sparse400/seed1/replay
minivla-wmrl probe-report $TRAIN --test $TEST --steps 16 24 32 48 64 96 128 --time-scale 400 \
  --json docs/probe_report_task28_cap400.json
G="minivla-wmrl gate-report $TEST --replay $TRAIN --min-steps 24 --patience 1 --time-scale 400"
$G --predictor time --wrong-cut-rate 0.2 --json $O/time_cold.json
$G --predictor time proprio --warm-start --wrong-cut-rate 0.2 --json $O/warm.json
$G --predictor time proprio --warm-start --wrong-cut-rate 0.1 --json $O/warm_cut10.json
$G --predictor oracle --json $O/oracle.json
python - "$O" docs/gate_report_task28_cap400.json <<'PY'
import json, sys
from pathlib import Path
parts = [json.loads((Path(sys.argv[1]) / f"{name}.json").read_text())
         for name in ("time_cold", "warm", "warm_cut10", "oracle")]
union = {"run": parts[0]["run"], "extra": parts[0]["extra"], "command": "experiments/gate_report28_cap400.sh",
         "reports": [report for part in parts for report in part["reports"]]}
Path(sys.argv[2]).write_text(json.dumps(union, indent=1))
PY
minivla-wmrl gate-report $R/ablation/sparse/seed0/replay --predictor oracle --min-steps 24 32 --time-scale 120 \
  --json docs/gate_report_task28_oracle120.json
minivla-wmrl probe-report $R/wm/replay $R/ablation/sparse400/seed{0,1,2,3}/replay --test $R/ablation/sparse400/seed4/replay \
  --steps 16 24 32 48 64 96 128 --time-scale 400 --json docs/probe_report_task28_cap400_seeds.json
