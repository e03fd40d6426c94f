# One-command set-up and tests. Torch goes in first, with the torchvision build that matches it:
# timm imports torchvision, PyPI's torchvision only imports beside the torch build it was made for
# (the CPU torch 2.13.0 wheel with PyPI's torchvision 0.28 fails: "torchvision::nms does not
# exist"), and a bare requirement would let pip pick both. Override for your CUDA version, e.g.
#   make setup TORCH="torch==2.13.0 torchvision==0.28.0"
PYTHON ?= python3
TORCH ?= torch==2.14.1 torchvision==0.29.1
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

export MUJOCO_GL ?= egl
export PYOPENGL_PLATFORM ?= egl

.PHONY: setup lint test test-fast demo clean

setup: $(STAMP)
	$(VENV)/bin/minivla-wmrl assets

# constraints.txt: the exact versions the README's figures were measured with
$(STAMP): pyproject.toml Makefile constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q --no-deps -c constraints.txt libero==0.1.1
	$(PY) -m pip install -q -c constraints.txt -e ".[dev,lerobot]"
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check minivla_wmrl world_models envs tests

test: setup lint
	$(VENV)/bin/pytest -q tests

test-fast: setup
	$(VENV)/bin/pytest -q -m "not simulator" tests

demo: setup
	$(VENV)/bin/minivla-wmrl run recipes/demo.yaml

clean:
	rm -rf $(VENV)
