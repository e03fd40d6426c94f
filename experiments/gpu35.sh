#!/bin/bash
# Issue 35, the GPU figures in one run (about 6 minutes on one H100/H200): MiniVLA-1B generation in bf16
# at batch 64 and 256 (dynamic, static and compiled decoding side by side, the same tokens checked; the
# stages of one call; the per-op profile at 64), fp32 at 64, and the peak memory of an SFT step at batch
# 64 and of the product's GRPO update (recipes/libero_90.yaml's LoRA minibatch), each with and without
# activation checkpointing. Writes JSON under OUT (default runs/bench/gpu35).
# Needs torch with CUDA and the policy's Python dependencies: on the device tool's machines, the wheels
# experiments/gpu35_wheels.sh gathers here (its header has the device command). Checked on the CPU with
# the tiny preset, in the project's venv and in one that has the machines' transformers 5.17 and
# huggingface_hub 1.33 under those wheels:
#   PRESET=tiny DEVICE=cpu BATCHES="8 16" SFT_BATCH=2 RECIPE=recipes/rl_cpu.yaml experiments/gpu35.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PRESET=${PRESET:-minivla-1b}
DEVICE=${DEVICE:-cuda}
BATCHES=${BATCHES:-64 256}
SFT_BATCH=${SFT_BATCH:-64}
RECIPE=${RECIPE:-recipes/libero_90.yaml}
OUT=${OUT:-runs/bench/gpu35}
mkdir -p "$OUT"
failed=0
bench() {  # one measurement; a failure is reported and the rest still run (one device session for all)
  "${PYTHON:-python3}" -m minivla_wmrl.cli bench "$@" || { echo "FAILED: bench $*"; failed=1; }
}
bench train-memory --preset "$PRESET" --device "$DEVICE" --dtype bfloat16 --setting sft --batch "$SFT_BATCH" \
  --json "$OUT/train_memory_sft_b$SFT_BATCH.json"
bench train-memory --recipe "$RECIPE" --setting grpo --device "$DEVICE" --json "$OUT/train_memory_grpo_recipe.json"
profile=--profile
for batch in $BATCHES; do
  bench policy --preset "$PRESET" --device "$DEVICE" --dtype bfloat16 --batch "$batch" --repeats 5 \
    --naive-queries 4 --decoding static compiled $profile --json "$OUT/policy_bf16_b$batch.json"
  profile=
done
bench policy --preset "$PRESET" --device "$DEVICE" --dtype float32 --batch "${BATCHES%% *}" --repeats 3 \
  --naive-queries 2 --decoding compiled --json "$OUT/policy_fp32_b${BATCHES%% *}.json"
exit $failed
