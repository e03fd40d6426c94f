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
# LeRobot's own package, beside (not in) the venv: its torch pin conflicts with ours, so it goes in
# without dependencies, with only the pure-Python packages its dataset module imports; the interop
# tests (tests/test_lerobot_client.py) put it on sys.path. Nothing else imports it.
LEROBOT_SITE := .lerobot-site
LEROBOT_PACKAGES := lerobot==0.4.4 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 pandas==2.2.3 \
	python-dateutil==4.0.0 pytz==2026.6 tzdata==2026.6 xxhash==4.1.0

export MUJOCO_GL ?= egl
export PYOPENGL_PLATFORM ?= egl

.PHONY: setup lint test test-fast demo clean

setup: $(STAMP) $(LEROBOT_SITE)/.installed
	$(VENV)/bin/minivla-wmrl assets

# constraints.txt: the exact versions the README's figures were measured with
$(STAMP): pyproject.toml Makefile constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q --no-deps -c constraints.txt libero==0.1.1
	$(PY) -m pip install -q -c constraints.txt -e ".[dev,lerobot]"
	touch $(STAMP)

$(LEROBOT_SITE)/.installed: $(STAMP)
	rm -rf $(LEROBOT_SITE) && $(PY) -m pip install -q --no-deps --target $(LEROBOT_SITE) $(LEROBOT_PACKAGES)
	touch $@

lint: $(STAMP)
	$(VENV)/bin/ruff check minivla_wmrl world_models envs tests

test: setup lint
	$(VENV)/bin/pytest -q tests

test-fast: setup
	$(VENV)/bin/pytest -q -m "not simulator" tests

demo: setup
	$(VENV)/bin/minivla-wmrl run recipes/demo.yaml

clean:
	rm -rf $(VENV) $(LEROBOT_SITE)
