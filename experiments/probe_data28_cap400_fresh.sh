#!/bin/bash
# Issue 31, offline, on experiments/gated28_cap400_fresh.sh's sparse400 runs: is the outcome probe starved of data
# on a first run (fit on the wm collection's 48 episodes: docs/probe_report_task28_cap400_fresh.json)?
# 1. The probes fit on 224, 448 and 672 episodes of earlier runs of the task (sparse400 seeds 2; 2-3; 2-4), tested on
#    seeds 0-1 as the collection's fit was: docs/probe_report_task28_cap400_fresh_fit{2,23,234}.json; and the split
#    swapped (fit on seeds 0-2, tested on 3-4): docs/probe_report_task28_cap400_fresh_fit012.json.
# 2. The gate replayed on seeds 0 and 1 as a later run on the task would start it: predictor first fit on, and
#    warm-started from, the collection and seeds 2-4 (720 episodes), cutting from step 24 or 32, with time alone,
#    the probe with proprioception and the oracle: docs/gate_report_task28_cap400_fresh_later_seed{0,1}.json.
# 3. The most any predictor could save there, by the share of anchors: the oracle on seeds 0 and 1 with the recipe's
#    groups of 4 (at least 1 anchor each: 1 in 4 runs to its end; in docs/gate_report_task28_cap400_fresh_seed*.json)
#    against groups of 8 with 1 anchor and of 16 with 1: docs/gate_report_task28_cap400_fresh_oracle_g{8,16}_seed{0,1}.json.
# 4. The probe's later-run gate at lower wrong-cut rates, to set against time alone's at equal successes cut (seed 0):
#    docs/gate_report_task28_cap400_fresh_later_rates_seed0.json.
# 5. The later-run gate as experiments/gated28_cap400_fresh.sh's later arms run it (from step 32, wrong-cut rate 0.1), time alone
#    and the probe, on seeds 0 and 1: docs/gate_report_task28_cap400_fresh_later_rate01_seed{0,1}.json.
# 6. The same with gate.threshold_rule conformal (the threshold bounds the share of new successes cut):
#    docs/gate_report_task28_cap400_fresh_later_conformal_seed{0,1}.json.
set -e
cd "$(dirname "$0")/.."
source .venv/bin/activate
export OMP_NUM_THREADS=1
R=runs/rl_cpu_t28_fresh/ablation/sparse400
STEPS="--steps 16 24 32 40 48 64 96 --time-scale 400"
for fit in 2 23 234; do
  minivla-wmrl probe-report $(for s in $(echo $fit | grep -o .); do echo $R/seed$s/replay; done) \
    --test $R/seed{0,1}/replay $STEPS --json docs/probe_report_task28_cap400_fresh_fit$fit.json
done
minivla-wmrl probe-report $R/seed{0,1,2}/replay --test $R/seed{3,4}/replay $STEPS \
  --json docs/probe_report_task28_cap400_fresh_fit012.json
for s in 0 1; do
  minivla-wmrl gate-report $R/seed$s/replay --replay runs/rl_cpu_t28_fresh/wm/replay $R/seed{2,3,4}/replay \
    --warm-start --predictor time proprio oracle --min-steps 24 32 --patience 1 --wrong-cut-rate 0.2 \
    --time-scale 400 --json docs/gate_report_task28_cap400_fresh_later_seed$s.json
done
for s in 0 1; do
  minivla-wmrl gate-report $R/seed$s/replay --predictor oracle --min-steps 24 --group-size 8 --anchor-fraction 0.125 \
    --time-scale 400 --json docs/gate_report_task28_cap400_fresh_oracle_g8_seed$s.json
  minivla-wmrl gate-report $R/seed$s/replay --predictor oracle --min-steps 24 --group-size 16 --anchor-fraction 0.0625 \
    --time-scale 400 --json docs/gate_report_task28_cap400_fresh_oracle_g16_seed$s.json
done
minivla-wmrl gate-report $R/seed0/replay --replay runs/rl_cpu_t28_fresh/wm/replay $R/seed{2,3,4}/replay \
  --warm-start --predictor proprio --min-steps 32 --patience 1 --wrong-cut-rate 0.05 0.1 \
  --time-scale 400 --json docs/gate_report_task28_cap400_fresh_later_rates_seed0.json
for s in 0 1; do
  minivla-wmrl gate-report $R/seed$s/replay --replay runs/rl_cpu_t28_fresh/wm/replay $R/seed{2,3,4}/replay \
    --warm-start --predictor time proprio --min-steps 32 --patience 1 --wrong-cut-rate 0.1 \
    --time-scale 400 --json docs/gate_report_task28_cap400_fresh_later_rate01_seed$s.json
done
for s in 0 1; do
  minivla-wmrl gate-report $R/seed$s/replay --replay runs/rl_cpu_t28_fresh/wm/replay $R/seed{2,3,4}/replay \
    --warm-start --predictor time proprio --min-steps 32 --patience 1 --wrong-cut-rate 0.1 --threshold-rule conformal \
    --time-scale 400 --json docs/gate_report_task28_cap400_fresh_later_conformal_seed$s.json
done
