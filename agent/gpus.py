"""Reading the node's GPUs through NVML: the only module that imports `pynvml`.

It turns NVML answers into `GpuSnapshot`s. A GPU whose calls fail with an NVML error (such as
NVML_ERROR_GPU_IS_LOST) is reported unhealthy with the error as its reason, keeping its last known
UUID, product and memory so the Node still lists it. NVML that cannot be loaded or initialised
raises `NvmlUnavailableError` with what to do. It must not write anywhere: `agent.node` publishes.
"""

from __future__ import annotations

import logging
import types
from typing import Any

import pynvml

from agent.errors import NvmlUnavailableError
from agent.inventory import GpuInfo, GpuSnapshot

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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GpuReader:
    """Reads snapshots; `nvml` is the `pynvml` module (or a stand-in with the same API)."""

    def __init__(self, nvml: types.ModuleType | None = None) -> None:
        self._nvml: Any = nvml if nvml is not None else pynvml
        self._initialized = False
        self._last: dict[int, GpuInfo] = {}

    def _unavailable(self, error: Exception) -> NvmlUnavailableError:
        self._initialized = False
        return NvmlUnavailableError(
            f"NVML is not usable ({error}): the NVIDIA driver and libnvidia-ml.so.1 must be "
            f"visible to the agent (the NVIDIA container runtime provides them); on a machine "
            f"without GPUs run the agent with --cpu-only"
        )

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

    def close(self) -> None:
        """Release NVML (nvmlShutdown), ignoring a library that is already gone."""
        if self._initialized:
            self._initialized = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as e:
                log.debug("NVML shutdown failed (%s): nothing more to release.", e)
