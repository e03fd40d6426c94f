# One-command set-up and tests. Torch goes in first (a bare `torch` requirement would pull a
# multi-GB CUDA build on a CPU machine); CUDA users override TORCH.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

export MUJOCO_GL ?= egl
export PYOPENGL_PLATFORM ?= egl

.PHONY: setup test demo clean

setup: $(STAMP)
	$(VENV)/bin/minivla-wmrl assets

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q --no-deps libero==0.1.1
	$(PY) -m pip install -q -e .
	touch $(STAMP)

test: setup
	$(VENV)/bin/pytest -q tests

demo: setup
	$(VENV)/bin/minivla-wmrl bench env --suite libero_10 --task 0 --steps 520 --chunk 8 --json runs/bench_env.json

clean:
	rm -rf $(VENV)
