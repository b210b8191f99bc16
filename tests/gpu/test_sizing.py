"""The reserve and the per-process allowance as `python -m agent.gpucheck` measures them, on the
mock NVML with the figures a real H200 showed (docs/results.md): an idle GPU holds 615 MiB, Triton's
CUDA context 591 MiB more, a stub process's context 524 to 616 MiB."""

from __future__ import annotations

import io
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.gpucheck import Outcome, main
from agent.gpus.reserve import DEFAULT_RESERVE, DRIVER_SHARE, TRITON_CONTEXT, suggested_allowance
from common.backends import PROCESS_ALLOWANCE
from tests.agent.gpus.test_nvml_relay import relay
from tests.gpu import test_gpucheck
from tests.gpu.test_gpucheck import Gpus, check

MIB = 1024**2
TRITON_PID = 4000


def h200(*, triton: bool) -> Gpus:
    """One idle H200 as NVML read it; with Triton running, its process holds its context."""
    gpus = Gpus("1xH200")
    gpus.mock.set_used(0, DRIVER_SHARE + (TRITON_CONTEXT if triton else 0))
    gpus.processes[0] = {TRITON_PID: TRITON_CONTEXT} if triton else {}
    return gpus


def test_the_defaults_are_the_measured_figures_rounded_up() -> None:
    # 615 (driver) + 591 (Triton's context) + 256 (backends' libraries) = 1462 MiB -> 1536Mi.
    assert DEFAULT_RESERVE == 1536 * MIB
    # The largest stub context measured (616 MiB, torch) rounded up to 64 MiB.
    assert PROCESS_ALLOWANCE == 640 * MIB == suggested_allowance(616 * MIB)
    assert suggested_allowance(524 * MIB) == 576 * MIB


@pytest.fixture
def socket_path() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="nvml-", dir="/tmp"))
    yield directory / "nvml.sock"
    shutil.rmtree(directory, ignore_errors=True)


def test_the_reserve_is_measured_with_triton_running_through_the_relay(socket_path: Path) -> None:
    """As in the node pod: NVML read in Triton's container, Triton's context in the figure."""
    gpus = h200(triton=True)
    out = io.StringIO()
    argv = ["--reserve", "--gpu-source=triton", f"--nvml-relay-socket={socket_path}"]
    with relay(socket_path, gpus.module):
        assert main(argv, {}, nvml=None, out=out) == Outcome.OK
    text = out.getvalue()
    assert f"by the processes NVML lists: {TRITON_CONTEXT} bytes" in text, text
    assert "Suggested --gpu-mem-reserve: 1536Mi" in text, text
    assert "Triton's CUDA context is not in" not in text


def test_a_reading_without_triton_adds_tritons_measured_context() -> None:
    """Run where no process holds the GPU, the check used to suggest 1024Mi: 0.5 GiB short."""
    _, report = check(h200(triton=False), "--reserve")
    [baseline] = report["baselines"]
    assert baseline["used"] == DRIVER_SHARE and baseline["held_by_processes"] == 0
    assert report["suggested_reserve"] == DEFAULT_RESERVE
    [note] = report["notes"]
    assert "Triton's CUDA context is not in its figure" in note and "--gpu-source=triton" in note


def test_the_measurement_gives_the_stub_process_allowance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stand-in is a process with its own CUDA context, as a Python model's stub is: the
    check prints what that context takes and the allowance that covers it."""
    gpus = h200(triton=True)
    monkeypatch.setattr(test_gpucheck, "CONTEXT", 616 * MIB)
    code, report = check(gpus, "--measure", "1Gi")
    assert code == Outcome.OK
    measurement = report["measurement"]
    assert measurement["before_used"] - measurement["idle_used"] == 616 * MIB
    assert measurement["suggested_allowance"] == 640 * MIB
    assert report["notes"] == []
    # A context above the binder's allowance is said, with the flag to set.
    monkeypatch.setattr(test_gpucheck, "CONTEXT", 700 * MIB)
    _, report = check(h200(triton=True), "--measure", "1Gi")
    [note] = report["notes"]
    assert "--gpu-mem-process-allowance=704Mi" in note, note
    out = io.StringIO()
    monkeypatch.setattr(test_gpucheck, "CONTEXT", 524 * MIB)
    made: list[test_gpucheck.MockStandIn] = []

    def stand_in(gpu: object, amount: int, timeout: float) -> test_gpucheck.MockStandIn:
        made.append(test_gpucheck.MockStandIn(gpus, gpu, amount))  # type: ignore[arg-type]
        return made[-1]

    main(
        ["--measure", "256Mi", "--settle-seconds", "0"],
        {},
        nvml=gpus.module,
        stand_in=stand_in,
        out=out,
    )
    assert "suggested --gpu-mem-process-allowance: 576Mi (now 671088640)" in out.getvalue()
