#!/usr/bin/env bash
# The GPU check on a machine with an NVIDIA GPU (docs/agent.md, "Checking on a real GPU").
#
#   bash tests/gpu/run_on_gpu.sh            on the GPU machine, from the repository root: the
#                                           check, three measured loads, the real-GPU tests;
#                                           results in $OUT (default ./gpucheck-out)
#   bash tests/gpu/run_on_gpu.sh pack-triton  here: the Triton server's files the Python backend
#                                           needs, as .tritoncarry/triton.tar.xz (24 MiB; in
#                                           .gitignore, so it travels only when carried)
#   bash tests/gpu/run_on_gpu.sh triton     on the GPU machine, with .tritoncarry carried: unpack
#                                           Triton, start it on the GPU, report what it says
#
# Needs there: python3 (3.11+) with nvidia-ml-py, grpcio and pytest; torch with CUDA for the
# measured loads. Nothing else of the project's dependencies is imported.
set -uo pipefail
cd "$(dirname "$0")/../.."
python="${PYTHON:-python3}"
out="${OUT:-gpucheck-out}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

check() {
  { nvidia-smi; nvidia-smi -q -d MEMORY,COMPUTE; } >"$out/nvidia-smi.txt" 2>&1
  "$python" -m agent.gpucheck 2>&1 | tee "$out/gpucheck.txt"
  echo "exit code ${PIPESTATUS[0]}" | tee -a "$out/gpucheck.txt"
  runs=$(mktemp -d)
  # A small, a medium and a large model; then one that asked for less than it uses.
  for amount in 256Mi 1Gi 10Gi; do
    "$python" -m agent.gpucheck --measure "$amount" --json >"$runs/measure-$amount.json"
    echo "--measure $amount: exit code $?" | tee -a "$out/gpucheck.txt"
  done
  "$python" -m agent.gpucheck --measure 2Gi --request 1Gi --gpu-mem-enforcement evict \
    2>&1 | tee -a "$out/gpucheck.txt"
  tar czf "$out/measure-json.tgz" -C "$runs" .
  TRITONSHARE_REQUIRE_GPU=1 "$python" -m pytest --noconftest -p no:cacheprovider -v -s \
    tests/gpu/test_real_gpu.py 2>&1 | tee "$out/pytest.txt"
}

# The files tritonserver, its Python backend and the Python 3.12 stub load (readelf NEEDED,
# followed through nvidia_pytriton.libs): 105 MiB as files, over the 64 MiB a device call carries,
# 24 MiB as tar.xz. libpython3.13 (31 MiB) is in the wheel but none of these needs it.
pack_triton() {
  site=$("$python" -c 'import pytriton, pathlib; print(pathlib.Path(pytriton.__file__).parent.parent)')
  list=$(mktemp)
  (cd "$site" && "$python" - >"$list" <<'EOF'
import os, subprocess
libs = "nvidia_pytriton.libs"
todo = [
    "pytriton/tritonserver/bin/tritonserver",
    "pytriton/tritonserver/backends/python/libtriton_python.so",
    "pytriton/tritonserver/python_backend_stubs/3.12/triton_python_backend_stub",
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
  du -b .tritoncarry/triton.tar.xz
}

triton() {
  root=/tmp/triton
  mkdir -p "$root/repository" "$root/backends/python"
  tar xJf .tritoncarry/triton.tar.xz -C "$root"
  server="$root/pytriton/tritonserver"
  cp "$server/backends/python/"* "$server/python_backend_stubs/3.12/triton_python_backend_stub" \
    "$root/backends/python/"
  export LD_LIBRARY_PATH="$root/nvidia_pytriton.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  ldd "$root/backends/python/triton_python_backend_stub" "$server/bin/tritonserver" \
    >"$out/triton-ldd.txt" 2>&1
  "$server/bin/tritonserver" --model-repository="$root/repository" \
    --model-control-mode=explicit --backend-directory="$root/backends" \
    --http-port 18000 --grpc-port 18001 --metrics-port 18002 >"$out/triton.log" 2>&1 &
  pid=$!
  "$python" - <<'EOF' | tee "$out/triton.txt"
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
    print("Triton did not become ready within 120 s: see triton.log")
with urllib.request.urlopen("http://127.0.0.1:18002/metrics", timeout=5) as r:
    print("\n".join(l for l in r.read().decode().splitlines() if l.startswith("nv_gpu_memory")))
EOF
  kill "$pid"
  wait "$pid"
}

case "${1:-check}" in
  check) check ;;
  pack-triton) pack_triton ;;
  triton) triton ;;
  *) echo "usage: $0 [check|pack-triton|triton]" >&2; exit 2 ;;
esac
