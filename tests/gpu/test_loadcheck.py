"""`python -m tests.gpu.loadcheck`, the GPU check's load through the agent's path, run here against
a real Triton on the CPU and the mock NVML: the figures it prints are the ones NVML read around
the load and the unload, and a wrong answer is a failure."""

from __future__ import annotations

import io
import json
import urllib.request
from pathlib import Path

import pytest

from sim.gpu.nvml import MockNvml, parse_spec
from sim.triton import TritonServer
from tests.gpu import loadcheck

pytestmark = pytest.mark.triton

MIB = 1024**2
CONTEXT = 600 * MIB


def stub_process(triton: TritonServer, allocated: int) -> dict[int, int]:
    """The mock GPU 0 holds the model's allocation and its process's context while Triton has
    it loaded, as a real GPU does."""
    request = urllib.request.Request(
        f"http://{triton.http_url}/v2/repository/index", data=b"{}", method="POST"
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        index = json.loads(response.read())
    loaded = any(m["name"] == loadcheck.MODEL and m.get("state") == "READY" for m in index)
    return {0: allocated + CONTEXT} if loaded else {}


def test_the_load_is_installed_pinned_measured_answered_and_unloaded(
    triton: TritonServer, model_repository: Path, tmp_path: Path
) -> None:
    mock = MockNvml(parse_spec("1xH200", seed="loadcheck"))
    mock.set_used(0, 1206 * MIB)  # the driver's share and Triton's context
    mock.set_workload(lambda: stub_process(triton, 256 * MIB))
    out = io.StringIO()
    argv = [
        "--triton-http", triton.http_url, "--triton-grpc", triton.grpc_url,
        "--repository", str(model_repository), "--cpu", "--json", str(tmp_path / "load.json"),
    ]  # fmt: skip
    assert loadcheck.main(argv, nvml=mock.as_module(), out=out) == 0, out.getvalue()
    figures = json.loads((tmp_path / "load.json").read_text())
    assert figures["answer"] == [2.0, 3.0, 4.0, 5.0]
    assert figures["measured"] == 256 * MIB + CONTEXT
    assert figures["beyond_allocation"] == CONTEXT
    assert figures["booked"] == 256 * MIB + 640 * MIB and not figures["over_booking"]
    assert figures["used_before"] == figures["used_after_unload"] == 1206 * MIB
    assert figures["load_seconds"] > 0 and figures["unload_seconds"] > 0
    text = out.getvalue()
    assert "+600 MiB beyond the allocation" in text and "within it" in text, text
    # Installed as the agent installs: the model directory holds its manifest.
    assert (model_repository / loadcheck.MODEL / "1" / "model.py").is_file()


def test_an_allowance_below_the_context_is_over_the_booking(
    triton: TritonServer, model_repository: Path
) -> None:
    mock = MockNvml(parse_spec("1xH200", seed="loadcheck"))
    mock.set_workload(lambda: stub_process(triton, 256 * MIB))
    out = io.StringIO()
    argv = [
        "--triton-http", triton.http_url, "--triton-grpc", triton.grpc_url,
        "--repository", str(model_repository), "--cpu", "--allowance", "0",
    ]  # fmt: skip
    assert loadcheck.main(argv, nvml=mock.as_module(), out=out) == 0
    assert "OVER it" in out.getvalue()
