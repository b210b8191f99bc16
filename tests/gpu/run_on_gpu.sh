#!/usr/bin/env bash
# The GPU check on a machine with an NVIDIA GPU (docs/agent.md, "Checking on a real GPU").
#
#   bash tests/gpu/run_on_gpu.sh            on the GPU machine, from the repository root: the
#                                           check, three measured loads, the environment of the
#                                           Python backend's stub, Triton on the GPU with the
#                                           reserve read through the NVML relay, a model pinned to
#                                           the GPU through the agent's load path, the real-GPU
#                                           tests; results in $OUT (default ./gpucheck-out)
#   bash tests/gpu/run_on_gpu.sh pack-triton  here: the Triton server's files the Python backend
#                                           needs, as .tritoncarry/triton.tar.xz (24 MiB), and the
#                                           wheels of the check's environment in .tritoncarry/wheels
#                                           (in .gitignore: they travel only when carried)
#   bash tests/gpu/run_on_gpu.sh env        build the check's environment only and say what it is
#   bash tests/gpu/run_on_gpu.sh triton     start Triton on the GPU in that environment, report
#                                           what it says, stop it
#
# Needs there: python3 (3.11+) with nvidia-ml-py, grpcio and pytest; torch with CUDA for the
# measured loads. The rest (numpy 1.26, tritonclient, protobuf, aiohttp) goes into a venv built on
# that python3 ($GPU_ROOT/venv, default /tmp/tritonshare-gpu), from .tritoncarry/wheels when
# carried, else from the package index. The venv is first on PATH for Triton: the Python backend's
# stub ignores PYTHONPATH and takes its packages from the `python3` first on PATH, and
# nvidia-pytriton 0.7's stub needs numpy<2 there (with numpy 2 every answer fails "output tensor
# shape does not match size of output"). pytest runs with tests/gpu/pytest-gpu.ini and no conftest,
# so neither the project's pytest configuration nor its plugins are needed.
#
# DRY_RUN=1 prints the commands that would install packages or start Triton instead of running
# them (tests/gpu/test_run_on_gpu.py); CARRY names the carried folder (default .tritoncarry).
set -uo pipefail
cd "$(dirname "$0")/../.."
python="${PYTHON:-python3}"
# A relative path is made absolute: pack-triton runs it from another folder.
case "$python" in */*) python="$(cd "$(dirname "$python")" && pwd)/$(basename "$python")" ;; esac
out="${OUT:-gpucheck-out}"
root="${GPU_ROOT:-/tmp/tritonshare-gpu}"
venv="$root/venv"
dry="${DRY_RUN:-}"
carry="${CARRY:-.tritoncarry}"
mkdir -p "$out" "$root"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# pyproject.toml's ranges, pinned to versions the project's tests run with; grpcio and nvidia-ml-py
# come from the machine's python3 (the venv sees its site-packages).
PACKAGES=('numpy==1.26.4' 'tritonclient==2.73.0' 'protobuf==6.33.6' 'aiohttp==3.14.5')
# What the stub and the agent's load path import, checked in the venv's python3.
PROBE='
import importlib, sys
missing = []
for name in ("numpy", "tritonclient.grpc", "google.protobuf", "aiohttp", "pynvml"):
    try:
        importlib.import_module(name)
    except ImportError as e:
        missing.append(f"{name} ({e})")
import_ok = not missing
if import_ok:
    import numpy
    if int(numpy.__version__.split(".")[0]) >= 2:
        missing.append(f"numpy<2 (it has numpy {numpy.__version__})")
if missing:
    sys.exit("missing: " + ", ".join(missing))
print(f"numpy {numpy.__version__}, python {sys.version_info[0]}.{sys.version_info[1]}")
'

# The site-packages of a python that runs in a venv (none for a base interpreter, conda's
# included, whose packages --system-site-packages already reaches); and the venv's own.
SITES='
import site, sys, sysconfig
if sys.prefix != sys.base_prefix:
    paths = [*site.getsitepackages(), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    print("\n".join(dict.fromkeys(paths)))
'
SITES_HERE='import sysconfig; print(sysconfig.get_paths()["purelib"])'

run() {
  if [ -n "$dry" ]; then echo "would run: $*"; else "$@"; fi
}

# The venv on $python (its site-packages seen: nvidia-ml-py, grpcio, pytest, torch), with what
# the stub and the load path need, first on PATH.
build_env() {
  if [ ! -x "$venv/bin/python3" ]; then
    "$python" -m venv --system-site-packages "$venv" || {
      echo "cannot create a venv with $python: install its venv module (python3-venv)" >&2
      return 1
    }
    # --system-site-packages reaches the base interpreter's packages only: where $python is
    # itself a venv's (or uv's), its own site-packages are listed in a .pth after the venv's.
    local sites
    sites=$("$python" -c "$SITES") || return 1
    if [ -n "$sites" ]; then
      echo "$sites" >"$("$venv/bin/python3" -c "$SITES_HERE")/zz-tritonshare-launcher.pth"
      echo "The venv also sees the packages of $python: ${sites//$'\n'/, }"
    fi
  fi
  if ! "$venv/bin/python3" -c "$PROBE" >/dev/null 2>&1; then
    local from=()
    [ -d "$carry/wheels" ] && from=(--no-index --find-links "$carry/wheels")
    run "$venv/bin/python3" -m pip install -q "${from[@]}" "${PACKAGES[@]}" || {
      echo "cannot install ${PACKAGES[*]} into $venv: carry $carry/wheels (pack-triton)" >&2
      return 1
    }
  fi
  export PATH="$venv/bin:$PATH"
  if [ -n "$dry" ]; then
    echo "python3 first on PATH: $(command -v python3)"
    return 0
  fi
  found=$(python3 -c "$PROBE") || { echo "the stub's environment in $venv: $found" >&2; return 1; }
  echo "The Python backend's stub takes its packages from $(command -v python3): $found" \
    | tee "$out/stub-env.txt"
}

start_triton() {
  local server="$root/triton/pytriton/tritonserver" version
  version=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  if [ ! -f "$carry/triton.tar.xz" ]; then
    echo "no $carry/triton.tar.xz: run pack-triton where nvidia-pytriton is installed" >&2
    return 1
  fi
  mkdir -p "$root/triton" "$root/repository" "$root/backends/python"
  run tar xJf "$carry/triton.tar.xz" -C "$root/triton"
  if [ -z "$dry" ] && [ ! -f "$server/python_backend_stubs/$version/triton_python_backend_stub" ]; then
    echo "the carried Triton has no Python backend stub for python $version (STUB_PYTHON)" >&2
    return 1
  fi
  run cp "$server/backends/python/libtriton_python.so" \
    "$server/backends/python/triton_python_backend_utils.py" \
    "$server/python_backend_stubs/$version/triton_python_backend_stub" "$root/backends/python/"
  export LD_LIBRARY_PATH="$root/triton/nvidia_pytriton.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if [ -n "$dry" ]; then
    echo "would start: $server/bin/tritonserver --model-repository=$root/repository" \
      "--model-control-mode=explicit --backend-directory=$root/backends (PATH starts $venv/bin)"
    echo "would start: python3 agent/gpus/relay.py --socket $root/nvml.sock"
    return 0
  fi
  "$server/bin/tritonserver" --model-repository="$root/repository" \
    --model-control-mode=explicit --backend-directory="$root/backends" \
    --http-port 18000 --grpc-port 18001 --metrics-port 18002 >"$out/triton.log" 2>&1 &
  triton_pid=$!
  # The NVML relay as the node pod runs it beside Triton: the agent reads the GPU through it.
  python3 agent/gpus/relay.py --socket "$root/nvml.sock" 2>"$out/nvmlrelay.log" &
  relay_pid=$!
  python3 - <<'EOF' | tee "$out/triton.txt"
import time, urllib.request
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    try:
        with urllib.request.urlopen("http://127.0.0.1:18000/v2/health/ready", timeout=2) as r:
            print("Triton is ready:", r.status)
            break
    except OSError:
        time.sleep(0.5)
else:
    raise SystemExit("Triton did not become ready within 120 s: see triton.log")
with urllib.request.urlopen("http://127.0.0.1:18002/metrics", timeout=5) as r:
    print("\n".join(l for l in r.read().decode().splitlines() if l.startswith("nv_gpu_memory")))
EOF
}

stop_triton() {
  [ -n "${relay_pid:-}" ] && kill "$relay_pid" && wait "$relay_pid"
  [ -n "${triton_pid:-}" ] && kill "$triton_pid" && wait "$triton_pid"
  relay_pid="" triton_pid=""
}

check() {
  { nvidia-smi; nvidia-smi -q -d MEMORY,COMPUTE; } >"$out/nvidia-smi.txt" 2>&1
  build_env || exit 1
  python3 -m agent.gpucheck 2>&1 | tee "$out/gpucheck.txt"
  echo "exit code ${PIPESTATUS[0]}" | tee -a "$out/gpucheck.txt"
  runs=$(mktemp -d)
  # A small, a medium and a large model; then one that asked for less than it uses.
  for amount in 256Mi 1Gi 10Gi; do
    python3 -m agent.gpucheck --measure "$amount" --json >"$runs/measure-$amount.json"
    echo "--measure $amount: exit code $?" | tee -a "$out/gpucheck.txt"
  done
  python3 -m agent.gpucheck --measure 2Gi --request 1Gi --gpu-mem-enforcement evict \
    2>&1 | tee -a "$out/gpucheck.txt"
  tar czf "$out/measure-json.tgz" -C "$runs" .
  if start_triton; then
    # The reserve as the node pod measures it: Triton running, NVML read through its relay.
    python3 -m agent.gpucheck --reserve --gpu-source=triton \
      --nvml-relay-socket="$root/nvml.sock" 2>&1 | tee "$out/reserve.txt"
    for amount in 256Mi 1Gi; do
      python3 -m tests.gpu.loadcheck --triton-http 127.0.0.1:18000 --triton-grpc 127.0.0.1:18001 \
        --repository "$root/repository" --allocate "$amount" --json "$out/load-$amount.json" \
        2>&1 | tee -a "$out/load.txt"
    done
    stop_triton
  fi
  TRITONSHARE_REQUIRE_GPU=1 python3 -m pytest -c tests/gpu/pytest-gpu.ini --rootdir . \
    --noconftest -p no:cacheprovider -v -s tests/gpu/test_real_gpu.py 2>&1 | tee "$out/pytest.txt"
}

# The files tritonserver, its Python backend and the stub for STUB_PYTHON (default 3.12) load
# (readelf NEEDED, followed through nvidia_pytriton.libs): 105 MiB as files, over the 64 MiB a
# device call carries, 24 MiB as tar.xz; and the wheels of the check's environment for that
# Python. libpython3.13 (31 MiB) is in the wheel but none of these needs it.
pack_triton() {
  stub="${STUB_PYTHON:-3.12}"
  site=$("$python" -c 'import pytriton, pathlib; print(pathlib.Path(pytriton.__file__).parent.parent)')
  list=$(mktemp)
  (cd "$site" && STUB="$stub" "$python" - >"$list" <<'EOF'
import os, subprocess
libs = "nvidia_pytriton.libs"
todo = [
    "pytriton/tritonserver/bin/tritonserver",
    "pytriton/tritonserver/backends/python/libtriton_python.so",
    f"pytriton/tritonserver/python_backend_stubs/{os.environ['STUB']}/triton_python_backend_stub",
]
files = set(todo) | {"pytriton/tritonserver/backends/python/triton_python_backend_utils.py"}
while todo:
    dynamic = subprocess.run(["readelf", "-d", todo.pop()], capture_output=True, text=True).stdout
    for line in dynamic.splitlines():
        if "(NEEDED)" in line:
            path = os.path.join(libs, line.split("[")[1].split("]")[0])
            if os.path.exists(path) and path not in files:
                files.add(path)
                todo.append(path)
print("\n".join(sorted(files)))
EOF
  )
  mkdir -p .tritoncarry
  (cd "$site" && tar cf - -T "$list") | xz -9 -T2 >.tritoncarry/triton.tar.xz
  run "$python" -m pip download -q -d .tritoncarry/wheels --only-binary=:all: \
    --python-version "$stub" --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux1_x86_64 "${PACKAGES[@]}"
  du -bs .tritoncarry/triton.tar.xz .tritoncarry/wheels
}

case "${1:-check}" in
  check) check ;;
  pack-triton) pack_triton ;;
  env) build_env ;;
  triton) build_env && start_triton && { [ -n "$dry" ] || stop_triton; } ;;
  *) echo "usage: $0 [check|pack-triton|env|triton]" >&2; exit 2 ;;
esac
