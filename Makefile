# The two commands a newcomer runs: `make demo` and `make test`. Both set themselves up.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (whole files each, tests/parallel.py); 0 runs in one process.
# Three on two cores: the suite waits on real servers far more than it computes.
PYTEST_WORKERS ?= 3

.PHONY: demo sim-up sim-down test lint types imports unit proto proto-check native clean venv

# Said before it is done: the first install takes about a minute, and pip is kept quiet.
$(STAMP): pyproject.toml
	@test -x $(PY) || { echo "Creating the virtual environment $(VENV) with $(PYTHON)."; $(PYTHON) -m venv $(VENV); }
	@echo "Installing tritonshare and what its demo and tests use into $(VENV) (about a minute the"
	@echo "first time, about 900 MB: a real Triton server (nvidia-pytriton), gRPC, Kubernetes, test tools)."
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@echo "Installed; $(VENV) is reused until pyproject.toml changes."
	@touch $(STAMP)

venv: $(STAMP)

## make demo: the product end to end on the simulated cluster, with a real Triton on the CPU;
## make demo GPU=real: on this machine's GPU, printing what a GPU check needs (docs/sim.md).
demo: $(STAMP)
	$(PY) -m sim.demo $(if $(filter real,$(GPU)),--real-gpu)

## make sim-up: the simulated cluster left running in the background for kubectl and tritonshare;
## its last line is the `export KUBECONFIG=...` to run. make sim-down stops it and removes .sim.
sim-up: $(STAMP)
	@$(PY) -m sim.up start

sim-down:
	@$(PY) -m sim.up stop

## make test: lint, format, types, import boundaries, then the whole pytest suite.
test: $(STAMP) lint types imports unit

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

types: $(STAMP)
	$(VENV)/bin/mypy .

imports: $(STAMP)
	$(VENV)/bin/lint-imports

unit: $(STAMP)
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

## make proto: regenerate protos/agent_pb2*.py from protos/agent.proto (the result is committed).
proto: $(STAMP)
	$(PY) -m protos.generate

## make native: the proxy's hot modules compiled with mypyc into build/native (optional; needs gcc and
## Python's headers); run it with PYTHONPATH=build/native python -m proxy (or -m proxy.gateway).
## Rebuilt only when the sources changed; the working tree stays pure Python.
native: $(STAMP)
	$(PY) -m proxy.native

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
