# Sourced by gated28.sh: task 28's ablation directory and the gated arms' settings (cap 120).
# Gated execution: 1 anchor in 4 runs to the cap; another is cut once the outcome predictor has said
# failure for `patience` chunks in a row after `min_steps`, under a threshold the anchors calibrate for
# `wrong_cut_rate`. The predictor is refit every step on the wm stage's collection, the run's own earlier
# steps and the sparse seeds 0-3 (earlier runs of the same task).
R=runs/rl_cpu_t28
REPLAY="[$R/wm/replay, $R/ablation/sparse/seed0/replay, $R/ablation/sparse/seed1/replay, $R/ablation/sparse/seed2/replay, $R/ablation/sparse/seed3/replay]"
GATE="grpo.execution=gated, grpo.anchor_fraction=0.25, 'gate.replay=$REPLAY'"
# the setting `gate-report` chose offline on sparse seed 4's rollouts (docs/gate_report_task28.json)
GATE24="$GATE, gate.min_steps=24, gate.patience=1, gate.wrong_cut_rate=0.2"
