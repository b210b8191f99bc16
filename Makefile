# The two commands a newcomer runs: `make demo` and `make test`. Both set themselves up.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (whole files each, tests/parallel.py); 0 runs in one process.
# Three on two cores: the suite waits on real servers far more than it computes.
PYTEST_WORKERS ?= 3

.PHONY: demo sim-up sim-down test lint types imports unit proto proto-check native clean venv

# Said before it is done, and the installers kept quiet. `make demo` installs only what the demo
# runs (the `demo` extra); `make test` adds the test tools (the `test` extra, which includes it).
# uv (from PyPI, into the venv) installs them: it downloads in parallel, and resolves without
# the backtracking pip from PyPI does here through every boto3 release (docs/results.md, the demo).
# It compiles the bytecode as pip does, so that no process compiles a package's sources at its
# start (where PYTHONDONTWRITEBYTECODE is set, each one would). It reads PyPI (or UV_INDEX_URL),
# not pip's configuration. Where uv cannot be installed or fails, pip installs as before; the
# venv keeps its pip either way.
define install
	@test -x $(PY) || { echo "Creating the virtual environment $(VENV) with $(PYTHON)."; $(PYTHON) -m venv $(VENV); }
	@{ $(PY) -m uv --version >/dev/null 2>&1 || $(PY) -m pip install --quiet --disable-pip-version-check uv; } \
	  && $(PY) -m uv pip install --quiet --compile-bytecode --python $(PY) -e '.[$(1)]' \
	  || { echo "uv could not install it; pip does (slower)."; \
	       $(PY) -m pip install --quiet --upgrade pip && $(PY) -m pip install --quiet -e '.[$(1)]'; }
	@echo "Installed; $(VENV) is reused until pyproject.toml changes."
endef

$(DEMO_STAMP): pyproject.toml
	@echo "Installing tritonshare and what its demo runs into $(VENV) (about 630 MB: a real Triton"
	@echo "server (nvidia-pytriton), ONNX Runtime, gRPC, Kubernetes; under a minute with uv)."
	$(call install,demo)
	@touch $@

$(STAMP): pyproject.toml
	@echo "Installing tritonshare, its demo and its test tools into $(VENV) (about 1.2 GB: the demo's"
	@echo "630 MB and Helm's SDK, schema validators, S3 and GCS API servers, linters; a few minutes)."
	$(call install,test)
	@touch $@ $(DEMO_STAMP)

venv: $(STAMP)

## make demo: the product end to end on the simulated cluster, with a real Triton on the CPU;
## make demo GPU=real: on this machine's GPU, printing what a GPU check needs (docs/sim.md).
demo: $(DEMO_STAMP)
	$(PY) -m sim.demo $(if $(filter real,$(GPU)),--real-gpu)

## make sim-up: the simulated cluster left running in the background for kubectl and tritonshare;
## its last line is the `export KUBECONFIG=...` to run. make sim-down stops it and removes .sim.
sim-up: $(DEMO_STAMP)
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
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist loadfile --durations=30 $(PYTEST_ARGS)

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
