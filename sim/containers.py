"""One container of a simulated pod: its process, readiness probe, and the state reported for it.

Owns starting a container's process from a `sim.podspec.Launch` (in its own session, logs to a
file), the httpGet action used by readiness probes and preStop hooks, the termination message
(the termination-log file, or the log tail under FallbackToLogsOnError), signals to the whole
process group, and the container's entry in the pod status. It must not call the API; the pod
worker (`sim.podworker`) decides when to start, probe, restart and stop.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sim.podspec import Launch, Obj

MAX_MESSAGE_BYTES = 4096
_LOG_TAIL_LINES = 80


def now_rfc3339() -> str:
    """The current time as Kubernetes writes timestamps."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def http_get(action: Obj | None, ports: Obj, host: str, timeout: float) -> bool:
    """Run an httpGet action (probe or hook); True for a 2xx/3xx answer, as the kubelet counts."""
    if not action:
        return True
    port = action["port"]
    if isinstance(port, str):
        port = ports.get(port, port)
    target = action.get("host") or host
    url = f"{action.get('scheme', 'HTTP').lower()}://{target}:{port}{action.get('path', '/')}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310
            return 200 <= int(response.status) < 400
    except (OSError, urllib.error.URLError, ValueError):
        return False


@dataclass
class ContainerRun:
    """One container's process and the state reported for it."""

    spec: Obj
    launch: Launch | None = None
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    restarts: int = 0
    ready: bool = False
    state: dict[str, Any] = field(
        default_factory=lambda: {"waiting": {"reason": "PodInitializing"}}
    )
    last_state: dict[str, Any] = field(default_factory=dict)
    started_at: str = ""
    next_start: float = 0.0
    probe_due: float = 0.0
    probe_failures: int = 0
    probe_successes: int = 0

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def ports(self) -> dict[str, Any]:
        """Named container ports, for probes and hooks that name a port."""
        return {p["name"]: p["containerPort"] for p in self.spec.get("ports", []) if "name" in p}

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, launch: Launch, log_path: Path, cwd: Path) -> None:
        """Start the process (a fresh session, so signals reach all it spawns)."""
        launch.termination_log.parent.mkdir(parents=True, exist_ok=True)
        launch.termination_log.write_text("")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as out:
            self.process = subprocess.Popen(
                launch.argv,
                env=dict(launch.env),
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                start_new_session=True,
            )
        self.launch, self.log_path = launch, log_path
        self.started_at = now_rfc3339()
        self.state = {"running": {"startedAt": self.started_at}}
        probe = self.spec.get("readinessProbe")
        self.ready = probe is None
        self.probe_failures = self.probe_successes = 0
        self.probe_due = time.monotonic() + float((probe or {}).get("initialDelaySeconds", 0))

    def exited(self, code: int) -> None:
        """Record the exit: terminated state with the termination message."""
        message = ""
        if self.launch is not None and self.launch.termination_log.exists():
            message = self.launch.termination_log.read_text(errors="replace")
        policy = self.spec.get("terminationMessagePolicy", "File")
        if not message.strip() and code != 0 and policy == "FallbackToLogsOnError":
            message = self.log_tail()
        self.state = {
            "terminated": {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "message": message.strip()[-MAX_MESSAGE_BYTES:],
                "startedAt": self.started_at,
                "finishedAt": now_rfc3339(),
            }
        }
        self.ready = False
        self.process = None

    def back_off(self, delay: float) -> None:
        """Report CrashLoopBackOff until the restart `delay` seconds from now."""
        self.last_state = {"terminated": self.state["terminated"]}
        self.state = {
            "waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {delay:.1f}s restarting failed container {self.name}",
            }
        }
        self.next_start = time.monotonic() + delay

    def log_tail(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:])

    def probe(self, host: str) -> None:
        """Run the readiness probe if it is due, and update `ready` by its thresholds."""
        probe = self.spec.get("readinessProbe")
        if not probe or time.monotonic() < self.probe_due:
            return
        self.probe_due = time.monotonic() + float(probe.get("periodSeconds", 10))
        timeout = float(probe.get("timeoutSeconds", 1))
        if http_get(probe.get("httpGet"), self.ports, host, timeout):
            self.probe_failures = 0
            self.probe_successes += 1
            if self.probe_successes >= int(probe.get("successThreshold", 1)):
                self.ready = True
        else:
            self.probe_successes = 0
            self.probe_failures += 1
            if self.probe_failures >= int(probe.get("failureThreshold", 3)):
                self.ready = False

    def signal(self, sig: signal.Signals) -> None:
        """Signal the container's whole process group."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, sig)

    def status(self) -> dict[str, Any]:
        """The container's entry in containerStatuses / initContainerStatuses."""
        status: dict[str, Any] = {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "ready": self.ready,
            "restartCount": self.restarts,
            "started": self.running(),
            "state": self.state,
        }
        if self.last_state:
            status["lastState"] = self.last_state
        return status
