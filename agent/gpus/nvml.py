"""Reading the node's GPUs through NVML: the only module that imports `pynvml`.

It turns NVML answers into `GpuSnapshot`s, and, for diagnosis (`agent.gpucheck`), into
`GpuDetails` (MIG mode, processes holding memory), which the agent's inventory does not use. A
GPU whose calls fail with an NVML error (such as NVML_ERROR_GPU_IS_LOST) is reported unhealthy
with the error as its reason, keeping its last known UUID, product and memory so the Node still
lists it. NVML that cannot be loaded or initialised
raises `NvmlUnavailableError` with what to do. It must not write anywhere: `agent.status.node`
publishes.
"""

from __future__ import annotations

import logging
import types
from dataclasses import dataclass
from typing import Any

import pynvml

from agent.errors import NvmlUnavailableError
from agent.gpus.inventory import GpuInfo, GpuSnapshot

log = logging.getLogger(__name__)

# Errors that mean the library itself is unusable, not one GPU.
_LIBRARY_ERRORS = frozenset(
    {
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        pynvml.NVML_ERROR_NO_PERMISSION,
    }
)

# nvml.h's NVML_DEVICE_MIG_ENABLE (the mock NVML does not define the constant).
_MIG_ENABLED = 1


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU, as NVML lists it. Its PID is the host's: in a container
    without the host's PID namespace it names no process the container can see."""

    pid: int
    used: int | None
    """Bytes; None where the driver does not say (NVML_VALUE_NOT_AVAILABLE)."""


@dataclass(frozen=True)
class GpuDetails:
    """What NVML says of one GPU beyond the inventory: its MIG mode and compute processes."""

    index: int
    mig: str
    """`enabled`, `disabled`, `not supported`, or a pending change (`disabled, enabled after
    the next GPU reset`); `unknown` when the GPU did not answer."""
    processes: tuple[GpuProcess, ...] = ()
    reason: str = ""
    """The NVML error when the GPU did not answer."""


def _mig_word(mode: int) -> str:
    return "enabled" if mode == _MIG_ENABLED else "disabled"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


LOCAL_REMEDY = (
    "the NVIDIA driver and libnvidia-ml.so.1 must be visible to the agent (the NVIDIA container "
    "runtime provides them); on a machine without GPUs run the agent with --cpu-only"
)


PYNVML: types.ModuleType = pynvml
"""The `pynvml` module (the mock NVML where the simulator installed it as `pynvml`), for the
callers of `GpuReader` that read this machine's GPUs: only this module imports `pynvml`."""


class GpuReader:
    """Reads snapshots; `nvml` is the `pynvml` module (`PYNVML`), or a stand-in with the same API
    (the mock NVML, `agent.gpus.relayclient.RelayedNvml`), and `remedy` what to do when it is not
    usable."""

    def __init__(
        self,
        *,
        nvml: types.ModuleType | object,
        remedy: str = LOCAL_REMEDY,
        source: str = "NVML",
    ) -> None:
        self._nvml: Any = nvml
        self._remedy = remedy
        self.source = source
        """Where the GPUs are read, for messages: `NVML`, or NVML in Triton's container."""
        self._initialized = False
        self._last: dict[int, GpuInfo] = {}

    def _unavailable(self, error: Exception) -> NvmlUnavailableError:
        self._initialized = False
        return NvmlUnavailableError(f"NVML is not usable ({error}): {self._remedy}")

    def _init(self) -> None:
        if self._initialized:
            return
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as e:
            raise self._unavailable(e) from e
        self._initialized = True

    def read(self) -> GpuSnapshot:
        """One snapshot of every GPU; raises NvmlUnavailableError when NVML itself fails."""
        self._init()
        nvml = self._nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as e:
            raise self._unavailable(e) from e
        gpus = []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                product = _text(nvml.nvmlDeviceGetName(handle))
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                info = GpuInfo(
                    index=index,
                    uuid=uuid,
                    product=product,
                    memory_total=int(memory.total),
                    memory_used=int(memory.used),
                    healthy=True,
                )
            except nvml.NVMLError as e:
                if e.value in _LIBRARY_ERRORS:
                    raise self._unavailable(e) from e
                known = self._last.get(index)
                info = GpuInfo(
                    index=index,
                    uuid=known.uuid if known else "",
                    product=known.product if known else "",
                    memory_total=known.memory_total if known else 0,
                    memory_used=known.memory_used if known else 0,
                    healthy=False,
                    reason=f"{type(e).__name__}: {e}",
                )
            gpus.append(info)
            self._last[index] = info
        return GpuSnapshot(gpus=tuple(gpus))

    def driver_version(self) -> str:
        """The NVIDIA driver's version as NVML reports it."""
        self._init()
        try:
            return _text(self._nvml.nvmlSystemGetDriverVersion())
        except self._nvml.NVMLError as e:
            raise self._unavailable(e) from e

    def details(self, index: int) -> GpuDetails:
        """MIG mode and compute processes of GPU `index`; raises NvmlUnavailableError when NVML
        itself fails, and reports a failing GPU in `reason`."""
        self._init()
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            mig = self._mig_mode(handle)
            processes = self._running(handle, graphics=False)
        except nvml.NVMLError as e:
            if e.value in _LIBRARY_ERRORS:
                raise self._unavailable(e) from e
            return GpuDetails(index=index, mig="unknown", reason=f"{type(e).__name__}: {e}")
        return GpuDetails(index=index, mig=mig, processes=processes)

    def processes(self, index: int) -> tuple[GpuProcess, ...]:
        """The compute and graphics processes on GPU `index`, one entry per PID; raises
        NvmlUnavailableError when NVML itself fails, and returns none for a GPU that does not
        answer (its health is `read`'s to report)."""
        self._init()
        nvml = self._nvml
        try:
            return self._running(nvml.nvmlDeviceGetHandleByIndex(index), graphics=True)
        except nvml.NVMLError as e:
            if e.value in _LIBRARY_ERRORS:
                raise self._unavailable(e) from e
            return ()

    def _running(self, handle: Any, *, graphics: bool) -> tuple[GpuProcess, ...]:
        nvml = self._nvml
        listed = list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        if graphics:
            listed += nvml.nvmlDeviceGetGraphicsRunningProcesses(handle)
        seen: dict[int, GpuProcess] = {}
        for p in listed:
            used = None if p.usedGpuMemory is None else int(p.usedGpuMemory)
            seen.setdefault(int(p.pid), GpuProcess(pid=int(p.pid), used=used))
        return tuple(seen.values())

    def _mig_mode(self, handle: Any) -> str:
        nvml = self._nvml
        try:
            current, pending = nvml.nvmlDeviceGetMigMode(handle)
        except nvml.NVMLError as e:
            # GPUs without MIG (everything before the A100, and the A10 or L4) say so this way.
            if e.value == nvml.NVML_ERROR_NOT_SUPPORTED:
                return "not supported"
            raise
        mode = _mig_word(current)
        if pending != current:
            mode += f", {_mig_word(pending)} after the next GPU reset"
        return mode

    def close(self) -> None:
        """Release NVML (nvmlShutdown), ignoring a library that is already gone."""
        if self._initialized:
            self._initialized = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as e:
                log.debug("NVML shutdown failed (%s): nothing more to release.", e)
