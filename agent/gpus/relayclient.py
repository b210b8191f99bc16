"""NVML in Triton's container, asked through the NVML relay's socket (`--gpu-source=triton`).

`RelayedNvml` has the part of `pynvml`'s API that `agent.gpus.nvml` uses (the same function names,
`NVMLError` with its code in `value`, GPU handles), so the one reading code runs whichever
container NVML is in. Each call is one request line and one answer line on a connection kept
open (`agent.gpus.relay` describes the protocol). The relay runs in Triton's container, which
serves tenants' models, so every answer is checked for its shape and size before use. A relay
that does not answer is NVML that cannot be used (NVML_ERROR_UNINITIALIZED): the node stays not
ready and says why. It must not read NVML itself (`agent.gpus.nvml`) or anything but its socket.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
MAX_ANSWER_BYTES = 1 << 20
"""The longest answer taken: a GPU's process list is the longest, a few KiB."""


class RelayedNvmlError(Exception):
    """An NVML error as the relay reports it, or the relay's absence; `value` is NVML's code."""

    def __init__(self, value: int, message: str) -> None:
        super().__init__(message)
        self.value = value


@dataclass(frozen=True)
class Handle:
    """A GPU as the relay names it: by its index in Triton's container."""

    index: int


def _int(value: Any) -> int:
    if type(value) is not int:
        raise ValueError(f"{value!r} is not an integer")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str) or len(value) > 256:
        raise ValueError(f"{value!r:.80} is not a short string")
    return value


def _memory(value: Any) -> SimpleNamespace:
    if not isinstance(value, dict):
        raise ValueError("memory info is not an object")
    return SimpleNamespace(**{k: _int(value.get(k)) for k in ("total", "free", "used")})


def _processes(value: Any) -> list[SimpleNamespace]:
    if not isinstance(value, list):
        raise ValueError("a process list is not a list")
    listed = []
    for p in value:
        if not isinstance(p, dict):
            raise ValueError("a process is not an object")
        used = p.get("usedGpuMemory")
        used = None if used is None else _int(used)
        listed.append(SimpleNamespace(pid=_int(p.get("pid")), usedGpuMemory=used))
    return listed


def _modes(value: Any) -> tuple[int, int]:
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError("MIG modes are not a pair")
    return _int(value[0]), _int(value[1])


class RelayedNvml:
    """The `pynvml` calls `agent.gpus.nvml` makes, answered by the relay at `path`."""

    NVMLError = RelayedNvmlError
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED

    def __init__(self, path: Path, *, timeout: float = 10.0) -> None:
        self.path = path
        self._timeout = timeout
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._file: Any = None
        self._reused = False

    def _absent(self, why: str) -> RelayedNvmlError:
        return RelayedNvmlError(
            NVML_ERROR_UNINITIALIZED,
            f"the NVML relay in Triton's container does not answer on {self.path} ({why}); "
            f"Triton's container starts it (its command runs nvmlrelay.py) and the agent mounts "
            f"its directory",
        )

    def _call(self, name: str, *args: int) -> Any:
        request = json.dumps({"call": name, "args": list(args)}).encode() + b"\n"
        with self._lock:
            try:
                line = self._exchange(request)
            except OSError as e:
                if not self._reused or isinstance(e, TimeoutError):
                    raise self._absent(str(e) or type(e).__name__) from e
                # The relay was restarted (with Triton's container) since the last call.
                try:
                    line = self._exchange(request)
                except OSError as again:
                    raise self._absent(str(again) or type(again).__name__) from again
            try:
                if not line.endswith(b"\n"):
                    raise ValueError("it ended early or was too long")
                answer = json.loads(line)
                if not isinstance(answer, dict):
                    raise ValueError("not an object")
                if "error" in answer:
                    raise RelayedNvmlError(_int(answer["error"]), _str(answer.get("message", "")))
                return answer["ok"]
            except (ValueError, KeyError) as e:
                self._disconnect()
                raise self._absent(f"an answer that is not the relay's: {e}") from e

    def _exchange(self, request: bytes) -> bytes:
        """One request and its answer line, on the open connection or a new one."""
        self._reused = self._file is not None
        try:
            if self._file is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(self._timeout)
                try:
                    sock.connect(str(self.path))
                except OSError:
                    sock.close()
                    raise
                self._socket, self._file = sock, sock.makefile("rwb")
            self._file.write(request)
            self._file.flush()
            line: bytes = self._file.readline(MAX_ANSWER_BYTES + 1)
        except OSError:
            self._disconnect()
            raise
        if not line and self._reused:
            self._disconnect()
            raise ConnectionResetError("the relay closed the connection")
        return line

    def _disconnect(self) -> None:
        for closable in (self._file, self._socket):
            if closable is not None:
                with contextlib.suppress(OSError):
                    closable.close()
        self._socket = self._file = None

    def close(self) -> None:
        with self._lock:
            self._disconnect()

    def _checked(self, convert: Any, name: str, *args: int) -> Any:
        value = self._call(name, *args)
        try:
            return convert(value)
        except ValueError as e:
            self.close()
            raise self._absent(f"{name} answered something NVML does not: {e}") from e

    # pynvml's names.
    def nvmlInit(self) -> None:  # noqa: N802
        try:
            self._call("nvmlInit")
        except RelayedNvmlError:
            self.close()  # nothing to shut down: no connection is kept for it
            raise

    def nvmlShutdown(self) -> None:  # noqa: N802
        try:
            self._call("nvmlShutdown")
        finally:
            self.close()

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return int(self._checked(_int, "nvmlDeviceGetCount"))

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return str(self._checked(_str, "nvmlSystemGetDriverVersion"))

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:  # noqa: N802
        self._call("nvmlDeviceGetHandleByIndex", index)
        return Handle(index)

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:  # noqa: N802
        return str(self._checked(_str, "nvmlDeviceGetUUID", handle.index))

    def nvmlDeviceGetName(self, handle: Handle) -> str:  # noqa: N802
        return str(self._checked(_str, "nvmlDeviceGetName", handle.index))

    def nvmlDeviceGetMemoryInfo(self, handle: Handle) -> SimpleNamespace:  # noqa: N802
        info: SimpleNamespace = self._checked(_memory, "nvmlDeviceGetMemoryInfo", handle.index)
        return info

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[SimpleNamespace]:  # noqa: N802
        return list(self._checked(_processes, "nvmlDeviceGetComputeRunningProcesses", handle.index))

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Handle) -> list[SimpleNamespace]:  # noqa: N802
        return list(
            self._checked(_processes, "nvmlDeviceGetGraphicsRunningProcesses", handle.index)
        )

    def nvmlDeviceGetMigMode(self, handle: Handle) -> tuple[int, int]:  # noqa: N802
        modes: tuple[int, int] = self._checked(_modes, "nvmlDeviceGetMigMode", handle.index)
        return modes
