#!/bin/bash
# The Python packages experiments/gpu35.sh needs beyond the GPU machines' image (KINDS.md of the device
# tool: Python 3.12, torch 2.11, transformers 5.17, huggingface_hub 1.33, timm, peft, h5py, tensorboard),
# as wheels in .whl/ (git-ignored): transformers >= 5.24 (the `cache` argument) with the hub it needs,
# and the action tokenizer's vector-quantize-pytorch (18 MB). Run here (pip reaches PyPI); then on the
# device (its $OUT is where gpu35.sh writes, so the JSON comes back), with timeout_s 600:
#   carry [".whl"]; command: python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
#     --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && experiments/gpu35.sh
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qxF /.whl/ .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
rm -rf .whl && mkdir .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  transformers==5.25.0 huggingface_hub==2.4.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 idna==3.20 \
  kernels==0.19.1 tomlkit==0.15.3 vector-quantize-pytorch==1.32.0 einx==0.4.3 loguru==0.7.3 torch-einops-utils==0.2.0 \
  frozendict==2.5.1 gymnasium==1.4.0 farama-notifications==0.0.6
du -sh .whl
