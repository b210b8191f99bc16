"""A stand-in model process for `agent.gpucheck`: torch allocating a known amount on one GPU.

It plays a model's load and unload for the agent's measurement code: a child Python process
creates its CUDA context (as Triton has one before it loads a model), then, on command, allocates
exactly the amount asked for and frees it. The child sees only the chosen GPU
(`CUDA_VISIBLE_DEVICES=<its UUID>`, as a model pinned by the placement's instance group does),
and says which GPU torch uses, so a mismatch with NVML's UUID is caught instead of measured.

It needs torch with CUDA in the Python that runs it; without them it fails with what is missing.
It must not read NVML: the check measures it from outside, as the agent measures Triton.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import tempfile
import time
from typing import IO, Protocol

from agent.gpus.inventory import GpuInfo

# The child's side. It speaks one line per step: `ready <uuid> <torch version> <device name>`,
# then `allocated <bytes reserved by torch>` and `freed <bytes reserved>` on command, or
# `error <what is wrong>` and exit code 3.
_CHILD = r"""
import sys

def say(*words):
    print(*words, flush=True)

try:
    import torch
except ImportError as e:
    say("error", f"torch cannot be imported by {sys.executable} ({e}): install torch with CUDA")
    sys.exit(3)
if not torch.cuda.is_available():
    say("error", f"torch {torch.__version__} sees no CUDA device (built for CUDA "
        f"{torch.version.cuda}); the NVIDIA driver must be visible to this process")
    sys.exit(3)
amount = int(sys.argv[1])
# The context, and the fill kernel loaded (CUDA loads kernels lazily, into GPU memory): neither
# may land in the measured load.
warm = torch.empty(1, dtype=torch.uint8, device="cuda")
warm.fill_(1)
torch.cuda.synchronize()
props = torch.cuda.get_device_properties(0)
say("ready", str(getattr(props, "uuid", "") or "-"), torch.__version__, props.name)
block = None
while True:
    word = sys.stdin.readline().strip()
    if word == "allocate":
        block = torch.empty(amount, dtype=torch.uint8, device="cuda")
        block.fill_(1)
        torch.cuda.synchronize()
        say("allocated", torch.cuda.memory_reserved())
    elif word == "free":
        block = None
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        say("freed", torch.cuda.memory_reserved())
    else:
        break
"""


class StandInError(Exception):
    """The stand-in could not start or do a step; the message says what is missing or wrong."""


class StandIn(Protocol):
    """A model process the check can load and unload."""

    @property
    def pid(self) -> int | None:
        """Its process id, to find it in NVML's process list (None: not a process)."""
        ...

    def start(self) -> str:
        """Start it with its CUDA context and nothing else; returns what it runs on."""
        ...

    def allocate(self) -> None: ...

    def free(self) -> None: ...

    def stop(self) -> None: ...


class TorchStandIn:
    """The stand-in as a child `python -c` process with torch; one step at a time, each within
    `timeout` seconds."""

    def __init__(
        self, gpu: GpuInfo, amount: int, timeout: float, *, python: str = sys.executable
    ) -> None:
        self.gpu = gpu
        self.amount = amount
        self.timeout = timeout
        self.python = python
        self.pid: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None

    def start(self) -> str:
        env = dict(os.environ)
        env["CUDA_VISIBLE_DEVICES"] = self.gpu.uuid
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        # Closed in stop(): it outlives this call, as the process does.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self._process = subprocess.Popen(
            [self.python, "-c", _CHILD, str(self.amount)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            bufsize=0,
        )
        self.pid = self._process.pid
        words = self._answer("ready", "start")
        uuid, version, name = words[0], words[1], " ".join(words[2:])
        if uuid != "-" and f"GPU-{uuid}" != self.gpu.uuid:
            raise StandInError(
                f"torch allocates on GPU-{uuid}, not on GPU {self.gpu.index} ({self.gpu.uuid}) "
                f"that it was pinned to with CUDA_VISIBLE_DEVICES; the measurement would be of "
                f"the wrong GPU"
            )
        return f"torch {version} on {name}"

    def allocate(self) -> None:
        self._send("allocate")
        self._answer("allocated", f"allocate {self.amount} bytes")

    def free(self) -> None:
        self._send("free")
        self._answer("freed", "free its memory")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            try:
                if process.stdin is not None:
                    process.stdin.close()
                process.wait(timeout=self.timeout)
            except (OSError, subprocess.TimeoutExpired):
                process.kill()
                process.wait()
            finally:
                if process.stdout is not None:
                    process.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def _send(self, word: str) -> None:
        assert self._process is not None and self._process.stdin is not None
        try:
            self._process.stdin.write(f"{word}\n".encode())
        except OSError as e:
            raise self._failed(f"could not be told to {word} ({e})") from e

    def _answer(self, expected: str, step: str) -> list[str]:
        """The child's next line, which must start with `expected`, within the timeout."""
        process = self._process
        assert process is not None and process.stdout is not None
        deadline = time.monotonic() + self.timeout
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            while not selector.select(max(deadline - time.monotonic(), 0)):
                if time.monotonic() >= deadline:
                    raise self._failed(f"did not {step} within {self.timeout:g} s")
        words = process.stdout.readline().decode(errors="replace").split()
        if not words:
            process.wait(timeout=self.timeout)
            raise self._failed(f"exited with code {process.returncode} before it could {step}")
        if words[0] == "error":
            raise StandInError(f"the stand-in model process cannot run: {' '.join(words[1:])}")
        if words[0] != expected or (expected == "ready" and len(words) < 4):
            raise self._failed(f"answered {' '.join(words)!r} when asked to {step}")
        return words[1:]

    def _failed(self, what: str) -> StandInError:
        tail = ""
        if self._stderr is not None:
            self._stderr.seek(0)
            lines = self._stderr.read().decode(errors="replace").strip().splitlines()
            tail = f"; its last error output: {' | '.join(lines[-3:])}" if lines else ""
        return StandInError(f"the stand-in model process {what}{tail}")
