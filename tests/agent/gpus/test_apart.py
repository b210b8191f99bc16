"""Which model each of Triton's processes runs (its Python backend stubs, by their command line)
and what each model's processes hold on a GPU, read from a /proc laid out as Linux lays it out
and the mock NVML's per-process list."""

from __future__ import annotations

from pathlib import Path

from agent.gpus.apart import ApartMemory
from agent.gpus.nvml import GpuReader
from agent.gpus.processes import TritonProcesses
from sim.gpu.nvml import MockNvml, parse_spec
from tests.executors import CallerThread

MI = 1024**2
STUB = "/opt/tritonserver/backends/python/triton_python_backend_stub"


def _process(proc: Path, pid: int, parent: int, *argv: str) -> None:
    entry = proc / str(pid)
    entry.mkdir()
    (entry / "stat").write_text(f"{pid} (x y) S {parent} 1 1 0\n")
    (entry / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")


def test_each_models_stubs_and_their_children_hold_what_nvml_lists_for_them(
    tmp_path: Path,
) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    _process(proc, 1, 0, "/bin/sh")
    _process(proc, 10, 1, "tritonserver", "--model-repository=/models")
    _process(proc, 11, 10, STUB, "/models/ns-a.m1-x/1/model.py", "shm", "1048576")
    _process(proc, 12, 10, STUB, "/models/ns-a.m1-x/1/model.py", "shm2", "1048576")
    _process(proc, 13, 12, "python3", "-c", "worker")  # a child of the model's own code
    _process(proc, 14, 10, STUB, "/models/ns-b.m2-y/3/model.py", "shm3", "1048576")
    _process(proc, 20, 1, STUB, "/models/elsewhere/1/model.py")  # not under Triton
    pid_file = tmp_path / "pid"
    pid_file.write_text("10\n")
    processes = TritonProcesses(pid_file, proc=proc)
    assert processes.by_model() == {
        "ns-a.m1-x": frozenset({11, 12, 13}),
        "ns-b.m2-y": frozenset({14}),
    }
    mock = MockNvml(parse_spec("2xT4", seed="n"))
    for pid, used in ((11, 600 * MI), (13, 100 * MI), (14, 700 * MI), (10, 900 * MI)):
        mock.add_process(0, pid, used)
    mock.add_process(1, 12, 50 * MI)
    apart = ApartMemory(GpuReader(nvml=mock.as_module()), processes, executor=CallerThread())
    assert apart.held_now(0) == {"ns-a.m1-x": 700 * MI, "ns-b.m2-y": 700 * MI}
    assert apart.held_now(1) == {"ns-a.m1-x": 50 * MI}
    # How many of each model's processes are on each GPU: what the driver's share is split by.
    assert apart.listed_now(0) == {"ns-a.m1-x": 2, "ns-b.m2-y": 1}
    assert apart.listed_now(1) == {"ns-a.m1-x": 1}
    mock.add_process(0, 14, None)  # the driver does not say: the GPU cannot be told
    assert apart.held_now(0) is None
    assert (
        ApartMemory(
            GpuReader(nvml=mock.as_module()), TritonProcesses(None), executor=CallerThread()
        ).held_now(0)
        is None
    )
    assert (
        ApartMemory(
            GpuReader(nvml=mock.as_module()), TritonProcesses(None), executor=CallerThread()
        ).listed_now(0)
        is None
    )
