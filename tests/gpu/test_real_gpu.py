"""The agent's NVML code and the check on a real GPU. Skipped without one; with
TRITONSHARE_REQUIRE_GPU=1 (tests/gpu/run_on_gpu.sh sets it) a missing GPU, driver or torch fails.

Self-contained: on a GPU machine that has only the check's dependencies (NVML, grpcio, torch,
pytest) it runs as tests/gpu/run_on_gpu.sh runs it: `pytest -c tests/gpu/pytest-gpu.ini --rootdir .
--noconftest tests/gpu/test_real_gpu.py`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest

from agent.gpus.inventory import GpuSnapshot
from agent.gpus.memory import TOLERANCE_MIN_BYTES, tolerance
from agent.gpus.nvml import PYNVML, GpuReader
from tests.gpu.hardware import real_gpus, require

MIB = 1024**2
KNOWN = 1024**3


@pytest.fixture(scope="module")
def gpus() -> GpuSnapshot:
    return real_gpus()


def test_every_gpu_reads_as_nvidia_smi_shows_it(gpus: GpuSnapshot) -> None:
    for gpu in gpus.gpus:
        assert gpu.healthy, gpu.reason
        assert gpu.uuid.startswith(("GPU-", "MIG-")), gpu.uuid
        assert 0 <= gpu.memory_used <= gpu.memory_total
    smi = shutil.which("nvidia-smi")
    require(smi is not None, "nvidia-smi is not installed beside the driver")
    assert smi is not None
    lines = subprocess.run(
        [smi, "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.splitlines()
    seen = [tuple(part.strip() for part in line.split(",")) for line in lines if line.strip()]
    assert seen == [
        (str(g.index), g.uuid, g.product, str(g.memory_total // MIB)) for g in gpus.gpus
    ]


def test_mig_mode_and_processes_read_without_an_nvml_error(gpus: GpuSnapshot) -> None:
    reader = GpuReader(nvml=PYNVML)
    try:
        for gpu in gpus.gpus:
            details = reader.details(gpu.index)
            assert details.reason == ""
            assert details.mig.split(",")[0] in ("enabled", "disabled", "not supported")
            assert all(p.pid > 0 for p in details.processes)
    finally:
        reader.close()


def run_check(*argv: str) -> tuple[int, dict[str, Any]]:
    result = subprocess.run(
        [sys.executable, "-m", "agent.gpucheck", "--json", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=os.environ,
    )
    report = json.loads(result.stdout)
    print(result.stdout)  # the figures, for the run's log
    return result.returncode, report


def test_the_check_prints_the_inventory_the_agent_would_publish(gpus: GpuSnapshot) -> None:
    code, report = run_check()
    assert code == 0, report["problems"]
    assert [g["uuid"] for g in report["gpus"]] == [g.uuid for g in gpus.gpus]
    listed = json.loads(report["annotations"]["tritonshare.io/gpus"])
    assert [g["memory"] for g in listed] == [g.memory_total for g in gpus.gpus]


def test_a_known_allocation_is_measured_within_the_tolerance_and_freed(
    gpus: GpuSnapshot,
) -> None:
    require(importlib.util.find_spec("torch") is not None, "torch is not installed")
    code, report = run_check("--measure", str(KNOWN))
    m = report["measurement"]
    assert code == 0, report["problems"]
    assert abs(m["error"]) <= tolerance(KNOWN, 0.05, TOLERANCE_MIN_BYTES)
    assert m["before_used"] >= m["idle_used"]  # the stand-in's CUDA context
    assert m["freed_used"] - m["before_used"] < KNOWN // 2, "the allocation was not given back"
    assert m["exited_used"] <= m["before_used"], "the process's CUDA context was not given back"
