"""Child processes of the simulated cluster, and waiting for things to happen.

Owns starting a part as a process (its own session, output to a log file), stopping it (SIGTERM,
grace, SIGKILL), reading its log tail for error messages, and polling with a deadline. It knows
nothing of Kubernetes; `sim.cluster` decides what runs.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


class ClusterError(RuntimeError):
    """A part of the simulated cluster did not come up; the message says which and where its log
    is."""


@dataclass
class ManagedProcess:
    """A child process with its log file; stopped with SIGTERM, then SIGKILL."""

    name: str
    argv: Sequence[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self, env: Mapping[str, str]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                list(self.argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env),
                cwd=REPO,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, grace: float = 20.0, sig: signal.Signals = signal.SIGTERM) -> int | None:
        """`sig`, wait up to `grace` seconds, then SIGKILL; the exit code (None if never run)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        return self.process.returncode


def wait_until(
    what: str, check: Callable[[], Any], timeout: float, on_fail: str | Callable[[], str] = ""
) -> Any:
    """Poll `check` until it returns something truthy; ClusterError after `timeout` seconds,
    saying `on_fail` (or what it returns then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.1)
    said = on_fail if isinstance(on_fail, str) else on_fail()
    raise ClusterError(f"{what} did not happen within {timeout:.0f} s. {said}".strip())


def http_ok(url: str) -> bool:
    """Whether `url` answers 200 (not when it answers something that is not HTTP/1: another
    server took the port)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310
            return int(response.status) == 200
    except (OSError, http.client.HTTPException):
        return False


def started_or_dead(process: ManagedProcess, started: Callable[[], bool]) -> bool:
    return started() or not process.alive()


def wait_started(
    process: ManagedProcess, what: str, started: Callable[[], bool], timeout: float = 60
) -> None:
    """Wait until `started()` holds; ClusterError with the end of its log if `process` (called
    `what`) exits first, or if it does not start within `timeout` seconds."""
    wait_until(f"{what} serving", partial(started_or_dead, process, started), timeout)
    if not process.alive():
        raise ClusterError(
            f"{what} exited while starting; its log ({process.log_path}) ends:\n"
            f"{process.log_tail()}"
        )


def available(module: str) -> bool:
    """True when `python -m <module>` can run from this tree."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@dataclass(frozen=True)
class ProcessStat:
    """A process as /proc/<pid>/stat gives it: its state and its parent, group and session."""

    pid: int
    state: str
    parent: int
    group: int
    session: int


def process_stats() -> Iterator[ProcessStat]:
    """Every process of the machine now (one that ends while read is left out)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # After the name, which may hold spaces and parentheses: state, ppid, pgrp, session.
            fields = stat.read_text().rpartition(")")[2].split()
            yield ProcessStat(
                int(stat.parent.name), fields[0], int(fields[1]), int(fields[2]), int(fields[3])
            )
