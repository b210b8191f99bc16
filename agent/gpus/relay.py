"""The NVML relay: NVML read in Triton's container, answered to the agent over a Unix socket.

With NVIDIA's device plugin only the container that requests `nvidia.com/gpu` (Triton's) gets
the GPUs' device files and driver library; the agent's container gets none, and NVML there would
need the runtime's `accept-nvidia-visible-devices-envvar-when-unprivileged`, which also hands the
GPUs to any image whose `ENV` sets `NVIDIA_VISIBLE_DEVICES`. So Triton's container runs this file
with its own `python3` (started beside `tritonserver`, the server's child once the shell `exec`s
it) and the agent (`--gpu-source=triton`, `agent.gpus.relayclient`) asks it what it would ask NVML.

It runs outside the tritonshare image, so it uses only the standard library and `pynvml` (one pure
Python file, nvidia-ml-py), both copied beside it by `--install DIR`, the node pod's init
container. The protocol: one JSON object per line each way; a request `{"call": NAME, "args":
[int, ...]}` names one of `CALLS` (read-only NVML queries, plus nvmlInit and nvmlShutdown) and
passes GPU handles as their index; the answer is `{"ok": VALUE}` or `{"error": CODE, "message":
TEXT}` with NVML's error code. It must not import the agent (it is not there), write anything but
its socket, or hold GPU memory (no CUDA): it answers queries, nothing else.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import socket
import socketserver
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

MAX_REQUEST_BYTES = 4096
"""A request is a call name and at most one index; anything longer is not one."""
SOCKET_MODE = 0o660
"""The agent connects as a member of the pod's fsGroup, which owns the socket's directory."""
ERROR_UNKNOWN = 999
"""NVML_ERROR_UNKNOWN: an answer NVML did not give (a bad request, an unexpected failure)."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _processes(listed: Any) -> list[dict[str, int | None]]:
    return [
        {
            "pid": int(p.pid),
            "usedGpuMemory": None if p.usedGpuMemory is None else int(p.usedGpuMemory),
        }
        for p in listed
    ]


def _memory(info: Any) -> dict[str, int]:
    return {"total": int(info.total), "free": int(info.free), "used": int(info.used)}


# Each call: (takes a GPU index, what makes its answer JSON).
CALLS: dict[str, tuple[bool, Callable[[Any], Any]]] = {
    "nvmlInit": (False, lambda _: None),
    "nvmlShutdown": (False, lambda _: None),
    "nvmlDeviceGetCount": (False, int),
    "nvmlSystemGetDriverVersion": (False, _text),
    "nvmlDeviceGetHandleByIndex": (True, lambda _: None),
    "nvmlDeviceGetUUID": (True, _text),
    "nvmlDeviceGetName": (True, _text),
    "nvmlDeviceGetMemoryInfo": (True, _memory),
    "nvmlDeviceGetComputeRunningProcesses": (True, _processes),
    "nvmlDeviceGetGraphicsRunningProcesses": (True, _processes),
    "nvmlDeviceGetMigMode": (True, lambda modes: [int(m) for m in modes]),
}


def answer(nvml: Any, line: bytes) -> dict[str, Any]:
    """The answer to one request line, from `nvml` (the `pynvml` module or a stand-in)."""
    try:
        request = json.loads(line)
        name = request["call"]
        args = request.get("args", [])
        takes_gpu, convert = CALLS[name]
        if not isinstance(args, list) or len(args) != int(takes_gpu):
            raise ValueError(f"{name} takes {int(takes_gpu)} argument(s)")
        if takes_gpu and (type(args[0]) is not int or args[0] < 0):
            raise ValueError("a GPU is named by its index, a non-negative integer")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return {"error": ERROR_UNKNOWN, "message": f"not a request the NVML relay answers: {e}"}
    try:
        if takes_gpu:
            handle = nvml.nvmlDeviceGetHandleByIndex(args[0])
            value = None if name == "nvmlDeviceGetHandleByIndex" else getattr(nvml, name)(handle)
        else:
            value = getattr(nvml, name)()
        return {"ok": convert(value)}
    except nvml.NVMLError as e:
        return {"error": int(e.value), "message": _text(e)}
    except Exception as e:  # the agent gets every failure as an answer, never a closed socket
        return {"error": ERROR_UNKNOWN, "message": f"{type(e).__name__}: {e}"}


class _Handler(socketserver.StreamRequestHandler):
    server: Relay

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.lock:
            self.server.connections.discard(self.connection)
        super().finish()

    def handle(self) -> None:
        while True:
            line = self.rfile.readline(MAX_REQUEST_BYTES + 1)
            if not line:
                return
            if len(line) > MAX_REQUEST_BYTES:
                reply: dict[str, Any] = {"error": ERROR_UNKNOWN, "message": "request too long"}
                self.wfile.write(json.dumps(reply).encode() + b"\n")
                return
            reply = answer(self.server.nvml, line)
            self.wfile.write(json.dumps(reply, separators=(",", ":")).encode() + b"\n")


class Relay(socketserver.ThreadingUnixStreamServer):
    """Answers NVML queries on a Unix socket, one thread per connection."""

    daemon_threads = True

    def __init__(self, path: Path, nvml: Any) -> None:
        self.nvml = nvml
        self.lock = threading.Lock()
        self.connections: set[socket.socket] = set()
        # A socket left by an earlier Triton container (the emptyDir outlives it) is replaced.
        if path.is_socket():
            path.unlink()
        super().__init__(str(path), _Handler)
        path.chmod(SOCKET_MODE)

    def server_close(self) -> None:
        """Stop listening and end every open connection, as the relay's exit would."""
        super().server_close()
        with self.lock:
            for connection in self.connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)


INSTALLED_NAME = "nvmlrelay.py"
"""The relay's file name in the directory it is installed into: Triton's container runs
`python3 <dir>/nvmlrelay.py` (the chart's and the manifests' command)."""
KEEPER_INSTALLED_NAME = "tritonkeeper.py"
"""The keeper's (`common.keeper`) file name there: Triton's container runs
`python3 <dir>/tritonkeeper.py -- tritonserver ...`."""


def install(directory: Path) -> list[Path]:
    """Copy this file (as `INSTALLED_NAME`), `pynvml` and the keeper (`common.keeper`, Triton's
    its container's main process) into `directory` (the init container's job): Triton's image
    runs them with its own Python."""
    import pynvml  # the one file of nvidia-ml-py, copied as it is

    from common import keeper  # here: the relay runs in Triton's container without tritonshare

    directory.mkdir(parents=True, exist_ok=True)
    copied = []
    sources = (
        (Path(__file__), INSTALLED_NAME),
        (Path(pynvml.__file__ or ""), "pynvml.py"),
        (Path(keeper.__file__), KEEPER_INSTALLED_NAME),
    )
    for source, name in sources:
        target = directory / name
        shutil.copyfile(source, target)
        copied.append(target)
    return copied


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="nvmlrelay.py",
        description="Answer NVML queries from the tritonshare agent on a Unix socket (run in "
        "Triton's container), or install this relay and pynvml into a directory.",
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--socket", type=Path, help="the Unix socket to serve on")
    which.add_argument(
        "--install", type=Path, help="copy the relay, pynvml and Triton's keeper here, then exit"
    )
    args = parser.parse_args(argv)
    if args.install is not None:
        for path in install(args.install):
            print(f"installed {path}")
        return 0
    import pynvml  # beside this file in Triton's container (the script's directory)

    try:
        relay = Relay(args.socket, pynvml)
    except OSError as e:
        print(f"nvmlrelay: cannot serve on {args.socket} ({e})", file=sys.stderr)
        return 1
    print(f"nvmlrelay: answering NVML queries on {args.socket}", file=sys.stderr, flush=True)
    with relay:
        relay.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
