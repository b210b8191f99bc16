"""One container of a simulated pod: its process, probes, and the state reported for it.

Owns starting a container's process from a `sim.node.podspec.Launch` (in its own session, logs to a
file), the httpGet probes (startup, liveness, readiness) and preStop action, the termination
message (the termination-log file, or the log tail under FallbackToLogsOnError), signals to the
whole process group, and the container's entry in the pod status. It must not call the API; the pod
worker (`sim.node.podworker`) decides when to start, probe, restart and stop.
"""

from __future__ import annotations

import contextlib
import http.client
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

from sim.node.podspec import Launch, Obj

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
    except (OSError, urllib.error.URLError, ValueError, http.client.HTTPException):
        return False


@dataclass
class Probe:
    """One httpGet probe's schedule and counters, as the kubelet keeps them."""

    spec: Obj
    due: float = 0.0
    failures: int = 0
    successes: int = 0

    @classmethod
    def of(cls, spec: Obj | None) -> Probe | None:
        """A fresh probe for a (re)started container, or None when the spec has none."""
        if not spec:
            return None
        return cls(spec, due=time.monotonic() + float(spec.get("initialDelaySeconds", 0)))

    def check(self, ports: Obj, host: str) -> str:
        """Probe if due; "pass" or "fail" when a threshold is reached, else ""."""
        now = time.monotonic()
        if now < self.due:
            return ""
        self.due = now + float(self.spec.get("periodSeconds", 10))
        timeout = float(self.spec.get("timeoutSeconds", 1))
        if http_get(self.spec.get("httpGet"), ports, host, timeout):
            self.failures = 0
            self.successes += 1
            return "pass" if self.successes >= int(self.spec.get("successThreshold", 1)) else ""
        self.successes = 0
        self.failures += 1
        return "fail" if self.failures >= int(self.spec.get("failureThreshold", 3)) else ""


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
    readiness: Probe | None = None
    liveness: Probe | None = None
    startup: Probe | None = None
    started_ok: bool = False
    """The startup probe has passed (or there is none)."""
    run_offsets: list[int] = field(default_factory=list)
    """Where each run's output starts in the log file (every run appends to it): the last is
    the current run's, the one before the previous run's (`kubectl logs --previous`)."""
    oom_killed: bool = False
    """The current run was killed as the kernel's OOM killer kills (`oom_kill`): its exit is
    reported `OOMKilled`, as the kubelet reads it from the container runtime."""

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
        if launch.scratch is not None:
            (launch.scratch / "tmp").mkdir(parents=True, exist_ok=True)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as out:
            self.run_offsets.append(out.tell())
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
        self.readiness = Probe.of(self.spec.get("readinessProbe"))
        self.liveness = Probe.of(self.spec.get("livenessProbe"))
        self.startup = Probe.of(self.spec.get("startupProbe"))
        self.started_ok = self.startup is None
        self.ready = self.readiness is None and self.startup is None

    def exited(self, code: int) -> None:
        """Record the exit: terminated state with the termination message."""
        message = ""
        if self.launch is not None and self.launch.termination_log.exists():
            message = self.launch.termination_log.read_text(errors="replace")
        policy = self.spec.get("terminationMessagePolicy", "File")
        if not message.strip() and code != 0 and policy == "FallbackToLogsOnError":
            message = self.log_tail()
        reason = "Completed" if code == 0 else "Error"
        if self.oom_killed and code != 0:
            reason = "OOMKilled"
        self.oom_killed = False
        self.state = {
            "terminated": {
                "exitCode": code,
                "reason": reason,
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

    def run_log(self, previous: bool = False) -> bytes | None:
        """The output of the current run, or of the one before it; None when there is none."""
        runs = len(self.run_offsets) - (2 if previous else 1)
        if self.log_path is None or runs < 0 or not self.log_path.exists():
            return None
        with self.log_path.open("rb") as log:
            log.seek(self.run_offsets[runs])
            if previous:
                return log.read(self.run_offsets[runs + 1] - self.run_offsets[runs])
            return log.read()

    def log_tail(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:])

    def probe(self, host: str) -> str:
        """Run the probes that are due: the startup probe until it passes, then liveness and
        readiness. Returns the probe that failed past its threshold ("startup" or "liveness"):
        the kubelet must restart the container; else ""."""
        if self.startup is not None and not self.started_ok:
            outcome = self.startup.check(self.ports, host)
            if outcome == "fail":
                return "startup"
            if outcome != "pass":
                return ""
            self.started_ok = True
            self.ready = self.readiness is None
        if self.liveness is not None and self.liveness.check(self.ports, host) == "fail":
            return "liveness"
        if self.readiness is not None:
            outcome = self.readiness.check(self.ports, host)
            if outcome:
                self.ready = outcome == "pass"
        return ""

    def oom_kill(self) -> bool:
        """Kill the container as the OOM killer does when it passes its memory limit: SIGKILL to
        its processes, its exit reported `OOMKilled`. False when it runs no process."""
        if not self.running():
            return False
        self.oom_killed = True
        self.signal(signal.SIGKILL)
        return True

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
            "started": self.running() and self.started_ok,
            "state": self.state,
        }
        if self.last_state:
            status["lastState"] = self.last_state
        return status
