"""`python -m tests.gpu.loadcheck`: a model pinned to a GPU answers through the agent's load path.

The agent's own code does each step: it installs a Python model through `agent.installs.repository`
(staged, committed by rename), pins it with `agent.installs.modelconfig.pinned_config`, loads it
through `agent.triton.TritonClient`, measures it into an `agent.gpus.memory.MemoryLedger` from NVML
readings (`agent.gpus.nvml.GpuReader`) taken around the load, as `agent.models.nodemodels` does,
asks it a KServe v2 request, unloads it and waits until Triton reports it UNAVAILABLE. The model
(`sim.gpu.cudamodel`) creates a CUDA context through the driver library (`libcuda.so.1`, no torch)
and allocates `--allocate` bytes in it, so its figure shows what a stub process costs beyond what it
allocates: the per-process allowance.

It prints (and with --json writes) the load, first-answer and unload times, the measured figure
against the request and the request plus the allowance, and the GPU's memory before the load and
after the unload. A wrong answer (the stub's numpy 2: "output tensor shape does not match size of
output") is a failure. `tests/gpu/run_on_gpu.sh` runs it against the Triton it starts on the GPU;
with --cpu the model runs on the CPU (no CUDA), for a test against a CPU Triton and the mock NVML.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from agent.gpus.memory import MemoryLedger
from agent.gpus.nvml import PYNVML, GpuReader
from agent.installs.modelconfig import override_json, parse_config, pinned_config
from agent.installs.repository import Repository, build_manifest
from agent.triton import READY, TritonClient
from common.backends import PROCESS_ALLOWANCE
from common.manifest import ManifestEntry
from common.quantity import parse_quantity
from sim.gpu.cudamodel import ANSWER, REQUEST, model_files

MIB = 1024**2
MODEL = "gpucheck_cuda_context"


@dataclass
class LoadReport:
    """The figures of one load, unload and answer; bytes and seconds."""

    gpu: int | None
    allocated: int
    request: int
    booked: int
    """The request plus the per-process allowance: what the binder books for it."""
    used_before: int = 0
    used_after_load: int = 0
    measured: int = 0
    over_booking: bool = False
    load_seconds: float = 0.0
    first_answer_seconds: float = 0.0
    answer: list[float] | None = None
    unload_seconds: float = 0.0
    used_after_unload: int = 0
    problem: str = ""

    @property
    def beyond_allocation(self) -> int:
        """What the model's process holds beyond what it allocated: its CUDA context."""
        return self.measured - self.allocated


def install(repository: Repository, files: dict[str, bytes]) -> None:
    """Install the files as the agent installs what a loader streams: staged, then renamed."""
    entries = [
        ManifestEntry(path, len(data), hashlib.sha256(data).hexdigest())
        for path, data in sorted(files.items())
    ]
    staging = repository.begin(MODEL, build_manifest(MODEL, entries))
    for path, data in files.items():
        staging.write(path, 0, data)
    staging.finish()
    repository.commit(staging)


def _used(reader: GpuReader, gpu: int) -> int:
    return reader.read().gpus[gpu].memory_used


def _infer(http_url: str, timeout: float) -> list[float]:
    request = urllib.request.Request(
        f"{http_url}/v2/models/{MODEL}/infer",
        data=json.dumps(REQUEST).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer = json.loads(response.read())
    return [float(v) for v in answer["outputs"][0]["data"]]


async def check(
    triton: TritonClient,
    http_url: str,
    reader: GpuReader,
    repository: Repository,
    *,
    gpu: int | None,
    allocate: int,
    allowance: int,
    time_limit: float = 300.0,
) -> LoadReport:
    """Install, load pinned, measure, answer, unload: the agent's path, timed."""
    index = 0 if gpu is None else gpu
    report = LoadReport(gpu, allocate, allocate, allocate + allowance)
    files = model_files(MODEL, allocate)
    install(repository, files)
    config = parse_config(files["config.pbtxt"].decode(), MODEL)
    override = override_json(pinned_config(config, MODEL, gpu))
    ledger = MemoryLedger()
    uuid = reader.read().gpus[index].uuid
    report.used_before = _used(reader, index)
    started = time.monotonic()
    await triton.load(MODEL, override)
    report.load_seconds = time.monotonic() - started
    entry = await triton.state(MODEL)
    if entry is None or entry.state != READY:
        report.problem = f"Triton reports the model {entry.state if entry else 'absent'}"
        return report
    report.used_after_load = _used(reader, index)
    measured, _ = ledger.record_load(
        MODEL, uuid, report.booked, report.used_before, report.used_after_load, None
    )
    report.measured = measured.bytes
    report.over_booking = bool(ledger.over())
    started = time.monotonic()
    try:
        report.answer = _infer(http_url, time_limit)
    except OSError as e:
        report.problem = f"the model did not answer ({e}); see Triton's log"
    report.first_answer_seconds = time.monotonic() - started
    if report.answer is not None and report.answer != ANSWER:
        report.problem = f"the model answered {report.answer}, not [2, 3, 4, 5]"
    started = time.monotonic()
    await triton.unload(MODEL)
    await triton.wait_unloaded(MODEL, time_limit)
    report.unload_seconds = time.monotonic() - started
    report.used_after_unload = _used(reader, index)
    return report


def render(report: LoadReport, out: TextIO) -> None:
    where = "the CPU" if report.gpu is None else f"GPU {report.gpu}"
    out.write(
        f"Model {MODEL} pinned to {where}: READY in {report.load_seconds:.2f} s; first answer "
        f"in {report.first_answer_seconds * 1000:.1f} ms ({report.answer}); unloaded in "
        f"{report.unload_seconds:.2f} s.\n"
        f"  GPU used before the load {report.used_before} bytes, after it "
        f"{report.used_after_load}, after the unload {report.used_after_unload} (back by "
        f"{report.used_after_unload - report.used_before:+d}).\n"
        f"  Allocated {report.allocated} bytes; the agent measured {report.measured} "
        f"({report.beyond_allocation / MIB:+.0f} MiB beyond the allocation: the process's CUDA "
        f"context); booked with the per-process allowance: {report.booked}, "
        f"{'OVER it' if report.over_booking else 'within it'}.\n"
    )
    if report.problem:
        out.write(f"Problem: {report.problem}.\n")


async def _main(args: argparse.Namespace, nvml: Any) -> LoadReport:
    repository = Repository(args.repository)
    repository.prepare()
    reader = GpuReader(nvml=PYNVML if nvml is None else nvml)
    triton = TritonClient(args.triton_http, args.triton_grpc)
    try:
        return await check(
            triton,
            triton.base,
            reader,
            repository,
            gpu=None if args.cpu else args.gpu,
            allocate=args.allocate,
            allowance=args.allowance,
        )
    finally:
        await triton.close()
        reader.close()


def main(argv: Sequence[str] | None = None, *, nvml: Any = None, out: TextIO | None = None) -> int:
    """0 when the model answered right; 1 otherwise. `nvml` stands in for pynvml (tests)."""
    out = out or sys.stdout
    parser = argparse.ArgumentParser(prog="python -m tests.gpu.loadcheck", description=__doc__)
    parser.add_argument("--triton-http", required=True, help="Triton's HTTP host:port")
    parser.add_argument("--triton-grpc", required=True, help="Triton's gRPC host:port")
    parser.add_argument("--repository", type=Path, required=True, help="its model repository")
    parser.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU to pin to")
    parser.add_argument("--cpu", action="store_true", help="run the model on the CPU instead")
    parser.add_argument("--allocate", type=parse_quantity, default=256 * MIB)
    parser.add_argument("--allowance", type=parse_quantity, default=PROCESS_ALLOWANCE)
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args(argv)
    report = asyncio.run(_main(args, nvml))
    render(report, out)
    if args.json is not None:
        figures = {**asdict(report), "beyond_allocation": report.beyond_allocation}
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 1 if report.problem else 0


if __name__ == "__main__":
    sys.exit(main())
