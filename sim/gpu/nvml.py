"""A mock NVML that stands in for the `pynvml` module itself, so the agent's real GPU code runs.

`MockNvml(spec).as_module()` returns a module with the same function names, constants and
`NVMLError` classes (with the same codes, and the same subclass per code, such as
`NVMLError_GpuIsLost`) as `pynvml` from nvidia-ml-py. `install(spec)` puts that module in
`sys.modules["pynvml"]`. This module only simulates hardware; it knows nothing of the agent.

A spec is a preset (`8xA100-80GB`, `2xT4`, `1xH100-80GB`, or `N x` any preset product such as
`4xT4`) or a JSON/YAML file:

    gpus:                       # one entry per GPU, in index order
      - product: Tesla T4
        memory: 15Gi            # a Kubernetes quantity or bytes
        used: 300Mi             # optional, default 0
        uuid: GPU-...           # optional, derived from the seed and the index
    events:                     # optional: what changes over time, seconds after start
      - {at: 5, gpu: 0, used: 2Gi}
      - {at: 10, gpu: 1, fault: lost}          # NVML_ERROR_GPU_IS_LOST for that GPU
      - {at: 20, gpu: 1, fault: recovered}
      - {at: 30, fault: nvml_not_loaded}       # nvmlInit and every call: LIBRARY_NOT_FOUND
      - {at: 40, fault: nvml_loaded}

A file given only for `events` (the `--faults` file of `sim.gpu.agent_node`) has the same `events`
list. Tests drive it directly too: `set_used`, `lose_gpu`, `recover_gpu`, `set_library_loaded`,
and `add_process` / `remove_process` for a process holding memory on a GPU, listed by
`nvmlDeviceGetComputeRunningProcesses` (or `...GraphicsRunningProcesses`) as pynvml lists one
(`pid`, `usedGpuMemory`, `gpuInstanceId`, `computeInstanceId`) and counted in the GPU's used
memory.
`set_workload(fn, processes)` adds what processes on the GPUs allocate: `fn()` returns extra used
bytes by GPU index, read on every memory query, and `processes()` processes by GPU index, each
PID with its bytes, listed as compute processes and counted in the GPU's used memory
(`sim.gpu.load` models Triton's loaded models this way).
"""

from __future__ import annotations

import string
import sys
import threading
import time
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from sim.gpu.spec import (
    FAULTS,
    PRODUCTS,
    Event,
    GpuState,
    Product,
    Spec,
    SpecError,
    load_events,
    parse_spec,
)

__all__ = [
    "FAULTS",
    "PRODUCTS",
    "Event",
    "GpuState",
    "MockNvml",
    "NVMLError",
    "Product",
    "Spec",
    "SpecError",
    "install",
    "load_events",
    "parse_spec",
]

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_UNKNOWN = 999

_ERROR_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
    NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
    NVML_ERROR_IN_USE: "In use by another client",
    NVML_ERROR_MEMORY: "Insufficient Memory",
    NVML_ERROR_NO_DATA: "No data",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """pynvml's error: `NVMLError(code)` builds the subclass registered for that code."""

    _value_class: dict[int, type[NVMLError]] = {}
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._value_class.get(value, NVMLError)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return _ERROR_STRINGS.get(self.value, f"NVML Error with code {self.value}")


def _error_classes() -> dict[str, type[NVMLError]]:
    """One subclass per code, named as pynvml names them (NVML_ERROR_GPU_IS_LOST ->
    NVMLError_GpuIsLost)."""
    classes: dict[str, type[NVMLError]] = {}
    for name, value in list(globals().items()):
        if not name.startswith("NVML_ERROR_"):
            continue
        words = name.removeprefix("NVML_ERROR_")
        class_name = "NVMLError_" + string.capwords(words, "_").replace("_", "")

        def make_new(code: int) -> Callable[..., NVMLError]:
            def new(cls: type[NVMLError], *args: object) -> NVMLError:
                obj = Exception.__new__(cls)
                obj.value = code
                return obj

            return new

        error_class = type(class_name, (NVMLError,), {"__new__": make_new(value)})
        error_class.__module__ = "pynvml"
        NVMLError._value_class[value] = error_class
        classes[class_name] = error_class
    return classes


ERROR_CLASSES = _error_classes()


@dataclass(frozen=True)
class MemoryInfo:
    """What nvmlDeviceGetMemoryInfo returns: total, free and used bytes."""

    total: int
    free: int
    used: int


NVML_VALUE_NOT_AVAILABLE_uint = 0xFFFFFFFF
"""What NVML reports as a process's GPU and compute instance outside MIG."""


@dataclass(frozen=True)
class ProcessInfo:
    """One entry of nvmlDeviceGetComputeRunningProcesses, with pynvml's attribute names
    (nvmlProcessInfo_v3_t); `usedGpuMemory` is None where the driver does not say."""

    pid: int
    usedGpuMemory: int | None  # noqa: N815
    gpuInstanceId: int = NVML_VALUE_NOT_AVAILABLE_uint  # noqa: N815
    computeInstanceId: int = NVML_VALUE_NOT_AVAILABLE_uint  # noqa: N815


@dataclass(frozen=True)
class Handle:
    """An opaque device handle, as pynvml's is."""

    index: int


class MockNvml:
    """The simulated library; thread-safe, since tests drive it while the agent reads it."""

    def __init__(self, spec: Spec, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._gpus = [replace(g) for g in spec.gpus]
        self._events = list(spec.events)
        self._clock = clock
        self._start = clock()
        self._lock = threading.Lock()
        self._library_loaded = True
        self._init_count = 0
        self.calls = 0
        self._workload: Callable[[], Mapping[int, int]] | None = None
        self._workload_processes: Callable[[], Mapping[int, Mapping[int, int]]] | None = None
        self._processes: dict[tuple[int, str], dict[int, ProcessInfo]] = {}

    def add_process(self, index: int, pid: int, used: int | None, *, kind: str = "compute") -> None:
        """A process (`kind` compute or graphics) holding `used` bytes on GPU `index` (None: the
        driver does not say); its memory counts in the GPU's used memory."""
        with self._lock:
            self._processes.setdefault((index, kind), {})[pid] = ProcessInfo(pid, used)

    def remove_process(self, index: int, pid: int) -> None:
        """The process is gone from GPU `index`."""
        with self._lock:
            for (gpu, _), listed in self._processes.items():
                if gpu == index:
                    listed.pop(pid, None)

    # Test controls.
    def set_used(self, index: int, used: int) -> None:
        with self._lock:
            self._gpus[index].used = used

    def set_workload(
        self,
        workload: Callable[[], Mapping[int, int]] | None,
        processes: Callable[[], Mapping[int, Mapping[int, int]]] | None = None,
    ) -> None:
        """What the GPUs' processes allocate, by GPU index, on top of each GPU's own `used`;
        `processes`: processes of their own (PID -> bytes, by GPU index), listed as such."""
        with self._lock:
            self._workload = workload
            self._workload_processes = processes

    def lose_gpu(self, index: int) -> None:
        with self._lock:
            self._gpus[index].lost = True

    def recover_gpu(self, index: int) -> None:
        with self._lock:
            self._gpus[index].lost = False

    def set_library_loaded(self, loaded: bool) -> None:
        with self._lock:
            self._library_loaded = loaded
            if not loaded:
                self._init_count = 0

    @property
    def gpus(self) -> list[GpuState]:
        with self._lock:
            return [replace(g) for g in self._gpus]

    def _apply_due_events(self) -> None:
        now = self._clock() - self._start
        while self._events and self._events[0].at <= now:
            event = self._events.pop(0)
            targets = self._gpus if event.gpu is None else [self._gpus[event.gpu]]
            if event.used is not None:
                for gpu in targets:
                    gpu.used = event.used
            if event.fault == "lost":
                for gpu in targets:
                    gpu.lost = True
            elif event.fault == "recovered":
                for gpu in targets:
                    gpu.lost = False
            elif event.fault == "nvml_not_loaded":
                self._library_loaded = False
                self._init_count = 0
            elif event.fault == "nvml_loaded":
                self._library_loaded = True

    def _enter(self) -> None:
        """Every call: apply the timeline, then fail as the real library does when unusable."""
        self.calls += 1
        self._apply_due_events()
        if not self._library_loaded:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        if self._init_count == 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _device(self, handle: Handle) -> GpuState:
        if not isinstance(handle, Handle) or not 0 <= handle.index < len(self._gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._gpus[handle.index]
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return gpu

    # The pynvml functions the agent uses, with pynvml's names.
    def nvmlInit(self) -> None:  # noqa: N802
        with self._lock:
            self._apply_due_events()
            if not self._library_loaded:
                raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
            self._init_count += 1

    def nvmlInitWithFlags(self, flags: int) -> None:  # noqa: N802
        self.nvmlInit()

    def nvmlShutdown(self) -> None:  # noqa: N802
        with self._lock:
            self._enter()
            self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        with self._lock:
            self._enter()
            return "550.54.15-mock"

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        with self._lock:
            self._enter()
            return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:  # noqa: N802
        with self._lock:
            self._enter()
            if not 0 <= index < len(self._gpus):
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
            if self._gpus[index].lost:
                raise NVMLError(NVML_ERROR_GPU_IS_LOST)
            return Handle(index)

    def nvmlDeviceGetIndex(self, handle: Handle) -> int:  # noqa: N802
        with self._lock:
            self._enter()
            self._device(handle)
            return handle.index

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:  # noqa: N802
        with self._lock:
            self._enter()
            return self._device(handle).uuid

    def nvmlDeviceGetName(self, handle: Handle) -> str:  # noqa: N802
        with self._lock:
            self._enter()
            return self._device(handle).product

    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: int | None = None) -> MemoryInfo:  # noqa: N802
        with self._lock:
            self._enter()
            gpu = self._device(handle)
            workload, listed = self._workload, self._workload_processes
        # Outside the lock: the workload may take a moment (sim.gpu.load asks Triton).
        extra = workload().get(handle.index, 0) if workload is not None else 0
        if listed is not None:
            extra += sum(listed().get(handle.index, {}).values())
        with self._lock:
            extra += sum(
                p.usedGpuMemory or 0
                for (gpu_index, _), listed in self._processes.items()
                if gpu_index == handle.index
                for p in listed.values()
            )
        used = min(gpu.used + extra, gpu.memory)
        return MemoryInfo(total=gpu.memory, free=gpu.memory - used, used=used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[ProcessInfo]:  # noqa: N802
        return self._running(handle, "compute")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Handle) -> list[ProcessInfo]:  # noqa: N802
        return self._running(handle, "graphics")

    def _running(self, handle: Handle, kind: str) -> list[ProcessInfo]:
        with self._lock:
            self._enter()
            self._device(handle)
            found = list(self._processes.get((handle.index, kind), {}).values())
            listed = self._workload_processes if kind == "compute" else None
        if listed is not None:  # outside the lock, as the workload's memory
            held = listed().get(handle.index, {})
            found += [ProcessInfo(pid, used) for pid, used in held.items()]
        return found

    def nvmlErrorString(self, code: int) -> str:  # noqa: N802
        return _ERROR_STRINGS.get(code, f"NVML Error with code {code}")

    def as_module(self) -> types.ModuleType:
        """A module object that looks like `pynvml` to its importers."""
        module = types.ModuleType("pynvml", "Mock NVML from tritonshare's sim/gpu/nvml.py")
        for name, value in globals().items():
            if name.startswith("NVML_"):
                setattr(module, name, value)
        module.NVMLError = NVMLError  # type: ignore[attr-defined]
        for name, error_class in ERROR_CLASSES.items():
            setattr(module, name, error_class)
        for name in dir(self):
            if name.startswith("nvml"):
                setattr(module, name, getattr(self, name))
        module.mock = self  # type: ignore[attr-defined]
        return module


def install(spec: Spec, *, clock: Callable[[], float] = time.monotonic) -> MockNvml:
    """Put a mock built from `spec` into `sys.modules["pynvml"]`; import the agent after this."""
    mock = MockNvml(spec, clock=clock)
    sys.modules["pynvml"] = mock.as_module()
    return mock
