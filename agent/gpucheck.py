"""`python -m agent.gpucheck`: what the agent reads, publishes and measures on this machine's GPUs.

For a platform engineer on a GPU node, and for anyone asking whether tritonshare was run on a real
GPU. The agent's own NVML code (`agent.gpus.nvml`) reads every GPU (UUID, product, memory, health,
MIG mode, processes holding memory); the Node annotations are printed exactly as the agent writes
them (`agent.gpus.inventory.node_annotations`, `agent.gpus.memory.MemoryLedger.annotation`). With
`--measure BYTES` a stand-in model process (`agent.gpus.standin`: torch allocating BYTES on the
chosen GPU, a process with its own CUDA context as a Python-backend model's stub is) is loaded as
the agent loads a model: admitted by `admission_problem` on a fresh reading, measured as NVML growth
across the load into a `MemoryLedger`, observed by a poll, unloaded; the admission and
enforcement decisions the agent would take on those figures are shown, and the process's CUDA
context gives the `--gpu-mem-process-allowance` to set. With `--reserve` it reports what each GPU
holds with no model loaded and the `--gpu-mem-reserve` that covers it (`agent.gpus.reserve`): read
where Triton runs (`--gpu-source=triton`, through the NVML relay in Triton's container), the
figure has Triton's own context in it; a GPU no process holds memory on is counted with Triton's
measured context added, and said so.

It writes nothing (no API server, no Triton, no files) and needs only NVML (in its own container,
or with --gpu-source=triton the relay's in Triton's), and torch with CUDA for --measure. Its flags
shared with the agent (`--key-prefix`, `--gpu-mem-*`, `--gpu-source`) read the agent's variables,
so inside the agent's container it follows the agent's configuration.
"""

from __future__ import annotations

import bisect
import enum
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from agent.errors import NvmlUnavailableError
from agent.gpus.inventory import GpuInfo, GpuSnapshot, capacity_patch, node_annotations
from agent.gpus.memory import (
    TOLERANCE_MIN_BYTES,
    MemoryLedger,
    admission_problem,
    tolerance,
)
from agent.gpus.nvml import PYNVML, GpuDetails, GpuReader
from agent.gpus.relayclient import RelayedNvml
from agent.gpus.reserve import (
    BACKEND_ALLOWANCE,
    TRITON_CONTEXT,
    Baseline,
    suggested_allowance,
    suggested_reserve,
)
from agent.gpus.standin import StandIn, StandInError, TorchStandIn
from agent.settings import (
    gpu_mem_enforcement_flag,
    gpu_mem_reserve_flag,
    gpu_mem_tolerance_flag,
    gpu_source_flag,
    nvml_relay_socket_flag,
)
from common.backends import PROCESS_ALLOWANCE
from common.contract import Keys
from common.quantity import format_bytes
from common.settings import (
    Declaration,
    declared,
    keys_flag,
    quantity,
    seconds,
    setting,
    whole,
)

STAND_IN_MODEL = "gpucheck-stand-in"
"""The ledger's name for the stand-in; no real model id can be mistaken for it here."""


class Outcome(enum.IntEnum):
    """The exit codes; each problem's message says what to do."""

    OK = 0
    USAGE = 2
    NVML_UNUSABLE = 3
    NO_GPU = 4
    GPU_UNHEALTHY = 5
    STAND_IN_FAILED = 6
    REFUSED = 7
    MEASUREMENT_OFF = 8


class CheckSettingsError(ValueError):
    """A flag or variable the check cannot use; says which and what to write."""


@declared
class CheckSettings:
    """What the check can be told."""

    measure: int = setting(
        "measure",
        "bytes a stand-in model (torch) allocates on --gpu, measured as a load (a quantity)",
        quantity(minimum=1),
        default=0,
        env=None,
    )
    """Bytes the stand-in model allocates (a quantity); 0: no measurement."""
    request: int = setting(
        "request",
        "the stand-in pod's GPU memory request (a quantity); default: the --measure amount",
        quantity(minimum=1),
        default=0,
        env=None,
    )
    """The stand-in pod's request (tritonshare.io/gpu-mem), bytes; 0: the measured amount."""
    gpu: int = setting("gpu", "NVML index of the GPU to measure on", whole(), default="0", env=None)
    """NVML index of the GPU the stand-in runs on."""
    # The agent's own flags and variables, read as the agent reads them (tests/gpu checks it): the
    # GPU-memory ones are agent.settings' own declarations.
    key_prefix: Keys = keys_flag("annotation and resource key prefix")
    """The agent's --key-prefix."""
    gpu_mem_reserve: int = gpu_mem_reserve_flag()
    """The agent's --gpu-mem-reserve, bytes."""
    gpu_mem_tolerance: float = gpu_mem_tolerance_flag()
    """The agent's --gpu-mem-tolerance, a fraction of the request (at least 256Mi)."""
    gpu_mem_enforcement: str = gpu_mem_enforcement_flag()
    """The agent's --gpu-mem-enforcement: warn or evict."""
    gpu_source: str = gpu_source_flag()
    """The agent's --gpu-source: NVML here (`nvml`) or in Triton's container (`triton`)."""
    nvml_relay_socket: Path = nvml_relay_socket_flag()
    """The agent's --nvml-relay-socket."""
    gpu_mem_process_allowance: int = setting(
        "gpu-mem-process-allowance",
        "the binder's per-process allowance to judge the stand-in's CUDA context against (a "
        "quantity)",
        quantity(),
        default=f"{PROCESS_ALLOWANCE // 1024**2}Mi",
        env=None,
    )
    """The binder's --gpu-mem-process-allowance: what it books beyond the request of a model in
    a process of its own."""
    settle_seconds: float = setting(
        "settle-seconds",
        "seconds before a second reading that shows whether NVML's figure still moved",
        seconds(),
        default="1",
        env=None,
    )
    """Seconds between the agent's measurement and a second reading that shows whether NVML's
    figure was still moving."""
    step_timeout_seconds: float = setting(
        "step-timeout-seconds",
        "seconds the stand-in may take to start, allocate or free",
        seconds(positive=True),
        default="120",
        env=None,
    )
    """Seconds the stand-in may take to start, allocate or free."""
    reserve: bool = setting(
        "reserve",
        "report what each GPU holds with no model loaded and the --gpu-mem-reserve to give the "
        "binder (run it in the node pod's agent container while no model is loaded)",
        default=False,
        switch=True,
        env=None,
    )
    """Report each GPU's idle use and the reserve that covers it (agent.gpus.reserve)."""
    json: bool = setting("json", "print the report as JSON", default=False, switch=True, env=None)
    """Print the report as one JSON object instead of text."""


DECLARATION = Declaration.of(
    CheckSettings,
    "python -m agent.gpucheck",
    "Read this machine's GPUs with the tritonshare agent's NVML code, print what the agent would "
    "publish on its Node and, with --measure, measure a stand-in model as the agent measures a "
    "load. Exit codes: 0 read (and measured) without a problem; 2 a bad flag, or --gpu names no "
    "healthy GPU; 3 NVML unusable (run nvidia-smi; install the driver or use the NVIDIA runtime); "
    "4 NVML lists no GPU (give the container a GPU); 5 a GPU does not answer (check nvidia-smi -q "
    "and the kernel log for Xid); 6 no torch or CUDA for the stand-in, or a step timed out; 7 the "
    "agent would refuse the load; 8 the figure is off by more than the tolerance (enforcement "
    "would be wrong here).",
    error=CheckSettingsError,
)


def parse_settings(argv: Sequence[str], environ: Mapping[str, str]) -> CheckSettings:
    return CheckSettings(**DECLARATION.values(argv, environ))


@dataclass
class Measurement:
    """The stand-in's load as the agent saw it; bytes, and seconds where named so."""

    known: int
    request: int
    runs_on: str = ""
    idle_used: int = 0
    """The GPU's used memory before the stand-in process existed."""
    before_used: int = 0
    """...with its CUDA context, just before the load (the agent's `before` reading)."""
    suggested_allowance: int = 0
    """The --gpu-mem-process-allowance that covers the process's CUDA context."""
    admission: str = ""
    after_used: int = 0
    measured: int = 0
    """The ledger's figure for the load: NVML growth across it."""
    load_seconds: float = 0.0
    load_to_measure_seconds: float = 0.0
    """From the load's return to the ledger holding its figure (one NVML reading)."""
    settled_used: int = 0
    polled: int = 0
    """The ledger's figure after a poll (`MemoryLedger.observe`) at settle time."""
    process_used: int | None = None
    """What NVML's process list says the stand-in process holds (its CUDA context included)."""
    usage_annotation: str = ""
    second_admission: str = ""
    """Admission of another pod with the same request on this GPU, the stand-in loaded."""
    over: bool = False
    over_below: int = 0
    """Any request below this many bytes would have this figure over its request."""
    action: str = ""
    freed_used: int = 0
    unattributed_after_unload: int = 0
    exited_used: int = 0

    @property
    def error(self) -> int:
        return self.measured - self.known

    @property
    def context(self) -> int:
        """What the process's CUDA context holds on the GPU (a stub backend's own)."""
        return self.before_used - self.idle_used


@dataclass
class Report:
    """Everything the check found; what `--json` prints."""

    outcome: Outcome = Outcome.OK
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What a user should know that is not a failure (MIG enabled)."""
    driver: str = ""
    gpus: list[dict[str, Any]] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    capacity: dict[str, str] = field(default_factory=dict)
    measurement: Measurement | None = None
    baselines: list[Baseline] = field(default_factory=list)
    """With --reserve: each healthy GPU as read (with no model loaded, the user says)."""
    suggested_reserve: int | None = None
    """With --reserve: the --gpu-mem-reserve that covers the baselines."""

    def fail(self, outcome: Outcome, problem: str) -> None:
        if self.outcome == Outcome.OK:
            self.outcome = outcome
        self.problems.append(problem)

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["outcome"] = self.outcome.name.lower()
        data["exit_code"] = int(self.outcome)
        if self.measurement is not None:
            data["measurement"]["error"] = self.measurement.error
        return data


StandInFactory = Callable[[GpuInfo, int, float], StandIn]


def smallest_request_within(measured: int, fraction: float, minimum: int) -> int:
    """The smallest request that `measured` bytes are not over (the agent's `over` rule)."""

    def over(request: int) -> bool:
        return measured > request + tolerance(request, fraction, minimum)

    # `over` is true for small requests and false from some request on: find the first false.
    return bisect.bisect_left(range(measured + 1), True, key=lambda r: not over(r))


def read_inventory(reader: GpuReader, settings: CheckSettings, report: Report) -> GpuSnapshot:
    """The GPUs, their details and the Node's annotations, as the agent would publish them."""
    report.driver = reader.driver_version()
    snapshot = reader.read()
    keys = settings.key_prefix
    report.annotations = node_annotations(snapshot, keys)
    report.annotations[keys.gpu_usage] = MemoryLedger().annotation(snapshot)
    report.capacity = capacity_patch(snapshot, keys, {}) or {}
    for gpu in snapshot.gpus:
        details: GpuDetails = reader.details(gpu.index)
        report.gpus.append({**asdict(gpu), **asdict(details)})
        if not gpu.healthy:
            report.fail(
                Outcome.GPU_UNHEALTHY,
                f"GPU {gpu.index} ({gpu.uuid or 'unknown UUID'}) does not answer NVML "
                f"({gpu.reason}): the agent leaves it out of the node's GPU memory; run "
                f"`nvidia-smi -q -i {gpu.index}` and check the kernel log (dmesg) for Xid errors",
            )
        elif details.mig.startswith("enabled"):
            report.notes.append(
                f"GPU {gpu.index} has MIG enabled: the agent packs models by the whole GPU's "
                f"memory and pins them by GPU index, not by MIG instance"
            )
    if not snapshot.gpus:
        report.fail(
            Outcome.NO_GPU,
            "NVML works but lists no GPU: in a container, run it with the NVIDIA container "
            "runtime and a GPU (docker --gpus all; a pod with runtimeClassName nvidia and "
            "NVIDIA_VISIBLE_DEVICES=all); on a machine without GPUs run the agent with --cpu-only",
        )
    return snapshot


def read_baselines(snapshot: GpuSnapshot, report: Report) -> None:
    """Each healthy GPU's idle figures, from the readings the inventory just made, and the
    reserve that covers them."""
    details = {g["index"]: g for g in report.gpus}
    for gpu in (g for g in snapshot.gpus if g.healthy):
        held = [p["used"] for p in details[gpu.index]["processes"]]
        known = None if any(h is None for h in held) else sum(held)
        baseline = Baseline(gpu.index, gpu.uuid, gpu.memory_total, gpu.memory_used, known)
        report.baselines.append(baseline)
        if baseline.without_triton:
            report.notes.append(
                f"no process holds memory on GPU {gpu.index}, so Triton's CUDA context is not in "
                f"its figure: the suggestion adds the {TRITON_CONTEXT // 1024**2} MiB Triton "
                f"was measured to take; for this node's own figure run the check where Triton "
                f"runs (the node pod's agent container, --gpu-source=triton)"
            )
    if report.baselines:
        report.suggested_reserve = suggested_reserve(report.baselines)


def _used(reader: GpuReader, uuid: str) -> GpuInfo:
    gpu = reader.read().by_uuid(uuid)
    if gpu is None or not gpu.healthy:
        raise StandInError(f"GPU {uuid} stopped answering NVML during the measurement")
    return gpu


def measure(
    reader: GpuReader,
    gpu: GpuInfo,
    stand_in: StandIn,
    settings: CheckSettings,
    report: Report,
    *,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> Measurement:
    """Load, measure, poll and unload the stand-in as `agent.models.nodemodels` and `agent.app`
    do."""
    known, reserve = settings.measure, settings.gpu_mem_reserve
    m = Measurement(known=known, request=settings.request or known)
    report.measurement = m
    fraction, minimum = settings.gpu_mem_tolerance, TOLERANCE_MIN_BYTES
    ledger = MemoryLedger(tolerance_fraction=fraction, tolerance_min=minimum)
    uuid = gpu.uuid
    m.idle_used = _used(reader, uuid).memory_used
    try:
        m.runs_on = stand_in.start()
        # agent.models.gpuadmission.GpuAdmission.load_measured: the GPU is marked loading, read,
        # admitted, loaded, read.
        ledger.loading.add(uuid)
        before = _used(reader, uuid)
        m.before_used = before.memory_used
        m.suggested_allowance = suggested_allowance(m.context)
        if m.context > settings.gpu_mem_process_allowance:
            report.notes.append(
                f"the stand-in process's CUDA context takes {m.context} bytes, more than the "
                f"{settings.gpu_mem_process_allowance}-byte --gpu-mem-process-allowance: give "
                f"the binder --gpu-mem-process-allowance={m.suggested_allowance // 1024**2}Mi, "
                f"or a Python model within its request is measured over it"
            )
        m.admission = admission_problem(before, m.request, [], reserve)
        if m.admission:
            report.fail(
                Outcome.REFUSED,
                f"the agent would refuse this load: {m.admission}; measure less, or free the GPU",
            )
            return m
        started = clock()
        stand_in.allocate()
        loaded = clock()
        after = _used(reader, uuid)
        entry, _ = ledger.record_load(
            STAND_IN_MODEL, uuid, m.request, m.before_used, after.memory_used, None
        )
        m.load_to_measure_seconds = clock() - loaded
        m.load_seconds = loaded - started
        ledger.loading.discard(uuid)
        m.after_used, m.measured = after.memory_used, entry.bytes
        for process in reader.details(gpu.index).processes:
            if process.pid == stand_in.pid:
                m.process_used = process.used
        sleep(settings.settle_seconds)
        # agent.app._apply_memory: each poll feeds the ledger, which may revise the figure.
        polled = reader.read()
        ledger.observe(polled)
        settled = polled.by_uuid(uuid)
        m.settled_used = settled.memory_used if settled is not None else 0
        m.polled = ledger.measured(STAND_IN_MODEL)
        m.usage_annotation = ledger.annotation(polled)
        if settled is not None:
            booked = [max(m.request, m.polled)]
            m.second_admission = admission_problem(settled, m.request, booked, reserve)
        excess = next((o for o in ledger.over() if o.model.model_id == STAND_IN_MODEL), None)
        m.over = excess is not None
        m.over_below = smallest_request_within(m.polled, fraction, minimum)
        sure = excess is not None and excess.sure(ledger.allowed(m.request))
        m.action = _action(m.over, sure, settings.gpu_mem_enforcement)
        # agent.models.nodemodels._unload_locked: unload, then forget; the next poll shows what is
        # left.
        stand_in.free()
        ledger.forget(STAND_IN_MODEL)
        freed = reader.read()
        ledger.observe(freed)
        m.freed_used = _used(reader, uuid).memory_used
        m.unattributed_after_unload = ledger.unattributed(uuid)
    finally:
        stand_in.stop()
    m.exited_used = _used(reader, uuid).memory_used
    allowed = tolerance(known, fraction, minimum)
    if abs(m.error) > allowed:
        report.fail(
            Outcome.MEASUREMENT_OFF,
            f"the agent measured {m.measured} bytes for a load of exactly {known}: off by "
            f"{m.error}, more than the {allowed}-byte tolerance, so its enforcement would judge "
            f"models on wrong figures on this GPU; another process may have allocated during "
            f"the load (see the process list)",
        )
    return m


def _action(over: bool, sure: bool, enforcement: str) -> str:
    """What the agent does about the figure (agent.models.overrequest: evict only on a sure
    excess)."""
    if not over:
        return "none: the model is within its request and the tolerance"
    if enforcement == "evict" and sure:
        return "evict: unload the model and mark its pod Failed (GPUMemoryExceeded)"
    if enforcement == "evict":
        return "warn: over its request, but another model may have caused part of it; no eviction"
    return "warn: a GPUMemoryOverRequest Event on the pod and a metric; the model stays"


def run(
    settings: CheckSettings,
    reader: GpuReader,
    stand_in: StandInFactory,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Report:
    report = Report()
    try:
        snapshot = read_inventory(reader, settings, report)
        if settings.reserve:
            read_baselines(snapshot, report)
        if not settings.measure or report.outcome == Outcome.NO_GPU:
            return report
        gpu = next((g for g in snapshot.gpus if g.index == settings.gpu), None)
        if gpu is None or not gpu.healthy:
            count = len(snapshot.gpus)
            report.fail(
                Outcome.USAGE,
                f"--gpu {settings.gpu}: NVML lists {count} GPUs (indexes 0 to {count - 1}) and "
                f"the stand-in needs a healthy one; choose another --gpu",
            )
            return report
        try:
            measure(
                reader,
                gpu,
                stand_in(gpu, settings.measure, settings.step_timeout_seconds),
                settings,
                report,
                clock=clock,
                sleep=sleep,
            )
        except StandInError as e:
            report.fail(Outcome.STAND_IN_FAILED, f"{e}; the inventory above is still valid")
    except NvmlUnavailableError as e:
        report.fail(
            Outcome.NVML_UNUSABLE,
            f"{e}. Run `nvidia-smi`: if it fails too, install or load the NVIDIA driver; if it "
            f"works, this process does not see libnvidia-ml.so.1 (in a container: the NVIDIA "
            f"container runtime, or NVIDIA_DRIVER_CAPABILITIES including utility)",
        )
    return report


def render(report: Report, settings: CheckSettings, out: TextIO) -> None:
    """The report as text for a person."""
    write = out.write
    if report.driver:
        count = len(report.gpus)
        write(
            f"NVIDIA driver {report.driver}; NVML lists {count} GPU{'' if count == 1 else 's'}.\n"
        )
    for g in report.gpus:
        state = "healthy" if g["healthy"] else f"UNHEALTHY ({g['reason']})"
        write(
            f"GPU {g['index']}: {g['uuid']} {g['product']}, {g['memory_total']} bytes "
            f"({format_bytes(g['memory_total'])}), {g['memory_used']} used; {state}; "
            f"MIG {g['mig']}\n"
        )
        for p in g["processes"]:
            used = "an amount the driver does not say" if p["used"] is None else p["used"]
            write(f"  process {p['pid']} holds {used} bytes\n")
    if report.annotations:
        write("\nThe agent would write these Node annotations:\n")
        for key, value in report.annotations.items():
            write(f"  {key}: {value}\n")
        for key, value in report.capacity.items():
            write(f"and with --advertise-gpu-mem, status.capacity {key}: {value}\n")
    if report.suggested_reserve is not None:
        _render_reserve(report, write)
    m = report.measurement
    if m is not None:
        _render_measurement(m, settings, write)
    for note in report.notes:
        write(f"\nNote: {note}.\n")
    for problem in report.problems:
        write(f"\nProblem: {problem}.\n")
    write(f"\nResult: {report.outcome.name.lower()} (exit code {int(report.outcome)}).\n")


def _render_reserve(report: Report, write: Callable[[str], Any]) -> None:
    write("\nGPU memory held with no model loaded (valid only if none is):\n")
    for b in report.baselines:
        held = "not said" if b.held_by_processes is None else f"{b.held_by_processes} bytes"
        triton = f"; with Triton's context: {b.idle} bytes" if b.without_triton else ""
        write(
            f"  GPU {b.index} ({b.uuid}): {b.used} bytes ({format_bytes(b.used)}) of "
            f"{format_bytes(b.total)}; by the processes NVML lists: {held}{triton}\n"
        )
    reserve = report.suggested_reserve or 0
    write(
        f"Suggested --gpu-mem-reserve: {reserve // 1024**2}Mi ({reserve} bytes): the most any "
        f"GPU holds with Triton running, plus {format_bytes(BACKEND_ALLOWANCE)} for the backend "
        f"libraries a GPU's first model loads, rounded up to 256Mi. Give it to the binder (the "
        f"chart's binder.gpuMemReserve) and keep the largest figure over your GPU nodes.\n"
    )


def _render_measurement(
    m: Measurement, settings: CheckSettings, write: Callable[[str], Any]
) -> None:
    write(f"\nStand-in model on GPU {settings.gpu}: {m.runs_on or 'not started'}.\n")
    write(
        f"  GPU used before the process: {m.idle_used} bytes; with its CUDA context: "
        f"{m.before_used} (the context: {m.context})\n"
    )
    write(
        f"  Per-process allowance: a model in its own process (Python backend) holds such a "
        f"context beyond its request; suggested --gpu-mem-process-allowance: "
        f"{m.suggested_allowance // 1024**2}Mi (now {settings.gpu_mem_process_allowance})\n"
    )
    write(
        f"  Admission of a {m.request}-byte request, reserve {settings.gpu_mem_reserve}: "
        f"{m.admission or 'admitted'}\n"
    )
    if m.admission:
        return
    share = m.error / m.known if m.known else 0.0
    write(
        f"  Known allocation {m.known} bytes; the agent measured {m.measured} "
        f"(error {m.error:+d} bytes, {share:+.3%})\n"
    )
    write(
        f"  Load took {m.load_seconds * 1000:.2f} ms; load-to-measure "
        f"{m.load_to_measure_seconds * 1000:.2f} ms\n"
    )
    write(
        f"  After {settings.settle_seconds:g} s: GPU used {m.settled_used} (at measurement "
        f"{m.after_used}); the ledger's figure after a poll: {m.polled}\n"
    )
    process = "not listed" if m.process_used is None else f"{m.process_used} bytes"
    write(f"  NVML's process list for the stand-in: {process}\n")
    write(f"  gpu-usage annotation with it loaded: {m.usage_annotation}\n")
    write(
        f"  Admission of a second {m.request}-byte pod on this GPU: "
        f"{m.second_admission or 'admitted'}\n"
    )
    write(
        f"  Enforcement ({settings.gpu_mem_enforcement}): {'over' if m.over else 'within'} "
        f"its request; action: {m.action}; any request below {m.over_below} bytes would be "
        f"over\n"
    )
    write(
        f"  After unload: GPU used {m.freed_used} (unattributed by the ledger: "
        f"{m.unattributed_after_unload}); after the process exited: {m.exited_used}\n"
    )


def main(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    nvml: Any = None,
    stand_in: StandInFactory = TorchStandIn,
    out: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Run the check; `nvml` stands in for the pynvml module (the mock NVML in tests)."""
    out = out or sys.stdout
    try:
        settings = parse_settings(
            sys.argv[1:] if argv is None else argv, os.environ if environ is None else environ
        )
    except CheckSettingsError as e:
        print(f"gpucheck: {e}", file=sys.stderr)
        return Outcome.USAGE
    # Where the agent reads NVML, the check does: in the node pod, Triton's container's relay.
    if settings.gpu_source == "triton":
        reader = GpuReader(nvml=RelayedNvml(settings.nvml_relay_socket))
    else:
        reader = GpuReader(nvml=PYNVML if nvml is None else nvml)
    try:
        report = run(settings, reader, stand_in, sleep=sleep)
    finally:
        reader.close()
    if settings.json:
        out.write(json.dumps(report.as_json(), indent=2, sort_keys=True) + "\n")
        # The JSON is for a program; a person running it still reads what is wrong.
        for problem in report.problems:
            print(f"gpucheck: {problem}.", file=sys.stderr)
    else:
        render(report, settings, out)
    return int(report.outcome)


if __name__ == "__main__":
    sys.exit(main())
