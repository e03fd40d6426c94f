#!/bin/bash
# Issue 31: which gate setting to run on LIBERO, chosen offline. `minivla-wmrl gate-report` replays task
# 28's sparse seed 4 (14 steps, 224 rollouts, run to their end) through the gate, the predictor
# starting from what experiments/gated28.sh gives it (the wm collection and sparse seeds 0-3). Time-only
# settings are cheap (a grid); each policy-probe setting refits the probe 14 times (~10 min alone).
# Writes runs/gate_report28/*.json and their union docs/gate_report_task28.json.
# Needs runs/rl_cpu_t28 from experiments/transfer.sh.
set -e
cd "$(dirname "$0")/.."
source .venv/bin/activate
R=runs/rl_cpu_t28
O=runs/gate_report28
mkdir -p $O
G="minivla-wmrl gate-report $R/ablation/sparse/seed4/replay --time-scale 120 --replay $R/wm/replay $R/ablation/sparse/seed0/replay $R/ablation/sparse/seed1/replay $R/ablation/sparse/seed2/replay $R/ablation/sparse/seed3/replay"
$G --predictor time --min-steps 16 32 --patience 1 2 --wrong-cut-rate 0.05 0.2 --json $O/time.json
$G --predictor policy --min-steps 32 --patience 2 --wrong-cut-rate 0.05 --json $O/policy_32_2_005.json
$G --predictor policy --min-steps 24 --patience 1 --wrong-cut-rate 0.2 --json $O/policy_24_1_02.json
$G --predictor policy --min-steps 32 --patience 2 --wrong-cut-rate 0.2 --json $O/policy_32_2_02.json
python - "$O" docs/gate_report_task28.json <<'PY'
import json, sys
from pathlib import Path
parts = [json.loads((Path(sys.argv[1]) / f"{name}.json").read_text())
         for name in ("time", "policy_32_2_005", "policy_24_1_02", "policy_32_2_02")]
union = {"run": parts[0]["run"], "extra": parts[0]["extra"], "command": "experiments/gate_report28.sh",
         "reports": [report for part in parts for report in part["reports"]]}
Path(sys.argv[2]).write_text(json.dumps(union, indent=1))
PY
