#!/bin/bash
# Issue 30: the demo recipe on tasks 0 and 28 with the guard accepting only a significant validation
# gain (accept_p 0.05, the early stop's level) on 24 validation states; SFT and the other stages reused.
set -e
# Needs the earlier runs it names under runs/ (runs/task28b: the demo recipe on task 28; runs/demo_guard and
# runs/task28_guard: copies of runs/demo and runs/task28b holding only demos/ vq/ sft/ wm/).
cd "$(dirname "$0")/.."
source .venv/bin/activate
export MUJOCO_GL=egl
G="grpo.validation.accept_p=0.05 grpo.validation.states_per_task=24"
for stage in grpo eval; do
  minivla-wmrl run recipes/demo.yaml out=runs/demo_guard $G --stage $stage
done
for stage in grpo eval; do
  minivla-wmrl run recipes/demo.yaml out=runs/task28_guard 'tasks=["28"]' 'demos.tasks=["28"]' $G --stage $stage
done
