"""The kubelet's restarts and liveness probes for the node pods that `sim.cluster` runs itself.

The simulated cluster runs each real node's node pod (Triton under its keeper, the agent, the
gateway) as processes of its own, not through `sim.node.kubelet`. `NodePodKubelet` does for them
what the kubelet does for the containers of a `restartPolicy: Always` pod: it starts a container
that exited again, at once the first time, then after 10 s doubling to 5 minutes
(CrashLoopBackOff; a container that ran 10 minutes before it exited starts the count afresh), and
kills one whose httpGet liveness probe fails (the path, port, period, timeout and failure
threshold of the pod template; SIGTERM, then SIGKILL after the pod's grace, at most 10 s), which
it then starts again the same way. Exec probes are not run: Triton's is one, and its keeper
restarts the server inside its container. Every exit is logged at WARNING with the end of the
container's log, and kept (`exits`, `restarts`).

One thread looks at every container every `TICK` seconds. It starts no process itself: the
cluster does, through `NodePods`. What the cluster does to a node pod on purpose (replace it,
restart a container, kill an agent for good) it does under `paused`, so that it is no crash.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sim.node.containers import Probe
from sim.processes import ClusterError

log = logging.getLogger(__name__)

TICK = 0.5
"""Seconds between two looks at every node pod container."""
BACK_OFF_FIRST = 10.0
BACK_OFF_MAX = 300.0
BACK_OFF_RESET = 600.0
"""The kubelet's container restart back-off: none for a first exit, then `BACK_OFF_FIRST` seconds
doubling to `BACK_OFF_MAX`, forgotten once a container has run `BACK_OFF_RESET` seconds."""
KILL_GRACE_MAX = 10.0
"""At most this many seconds between the SIGTERM and the SIGKILL of a container whose liveness
probe failed (the pod's terminationGracePeriodSeconds when shorter), as `sim.node.podworker`."""
EXIT_LINES = 40
"""Lines of a container's log kept with its exit (`ContainerExit.last_lines`)."""
LOGGED_LINES = 10
"""Lines of them the exit's WARNING shows."""


def restart_delay(restarts: int) -> float:
    """Seconds the kubelet waits before it starts a container again that it has already started
    `restarts` times since the container last ran `BACK_OFF_RESET` seconds."""
    if restarts <= 0:
        return 0.0
    return float(min(BACK_OFF_MAX, BACK_OFF_FIRST * 2 ** (restarts - 1)))


def exit_words(returncode: int | None) -> str:
    """A `Popen.returncode` as the kubelet's log would say it."""
    if returncode is not None and returncode < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"


@dataclass(frozen=True)
class Running:
    """One run of a node pod's container, as the cluster started it."""

    process: subprocess.Popen[bytes]
    log_path: Path | None
    ports: Mapping[str, int]
    """Its ports by the pod template's names, where it listens now (one not known yet: left out,
    and a probe of it fails)."""
    host: str
    """The address its httpGet probes ask: its node's."""


class NodePods(Protocol):
    """The node pods' containers as the cluster runs them (`sim.cluster.SimCluster`)."""

    def container_run(self, node: str, container: str) -> Running | None:
        """The container's current run; None when the node runs none."""

    def start_container_again(self, node: str, container: str) -> None:
        """Start the container again in place of its run that ended; ClusterError on failure."""


@dataclass(frozen=True)
class ContainerExit:
    """A node pod container's run that ended other than by the cluster's will."""

    at: float
    """Monotonic seconds when the kubelet saw it."""
    node: str
    container: str
    returncode: int | None
    """Negative: ended by that signal."""
    reason: str
    """Why the kubelet killed it (its failed liveness probe); empty when it exited by itself."""
    last_lines: str
    """The last `EXIT_LINES` lines of its log."""


@dataclass
class _Watched:
    """What the kubelet keeps of one container between its looks."""

    process: subprocess.Popen[bytes] | None
    log_path: Path | None
    started: float
    """When the kubelet first saw it: its start, give or take a `TICK`."""
    liveness: Probe | None
    back_off: int = 0
    """Restarts since it last ran `BACK_OFF_RESET` seconds."""
    killing: str = ""
    """Why the kubelet is killing it (SIGTERM sent); empty when it is not."""
    kill_at: float = 0.0
    """When SIGKILL follows the SIGTERM."""
    next_start: float | None = None
    """When its run has ended: when it may start again."""
    seen_running: bool = False
    """The kubelet saw it running (not when it first looked after its end)."""


@dataclass
class _Node:
    """The kubelet's state of one node, touched only under its lock."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    """Held while the kubelet looks at the node, and while the cluster changes its node pod."""
    watched: dict[str, _Watched] = field(default_factory=dict)
    left_down: set[str] = field(default_factory=set)
    """The containers never to start again (`leave_down`)."""


class NodePodKubelet:
    """Restart the node pods' containers of `nodes` when they exit or fail their liveness probe,
    as `template` (the node pod's template) says."""

    def __init__(self, pods: NodePods, nodes: Sequence[str], template: Mapping[str, Any]) -> None:
        self._pods = pods
        spec = template["spec"]
        self._specs: dict[str, Mapping[str, Any]] = {c["name"]: c for c in spec["containers"]}
        self._grace = min(float(spec.get("terminationGracePeriodSeconds", 30)), KILL_GRACE_MAX)
        self._nodes = {node: _Node() for node in nodes}
        self._kept = threading.Lock()
        """Guards what other threads read: the restarts and the exits."""
        self._restarts: Counter[tuple[str, str]] = Counter()
        self._exits: list[ContainerExit] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-pod-kubelet", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop looking (after a restart in progress, such as Triton's, has ended)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(120)

    @contextlib.contextmanager
    def paused(self, node: str) -> Iterator[None]:
        """The cluster changes `node`'s node pod on purpose: no look meanwhile, and the containers
        it runs after are new ones (their back-off and probes start afresh)."""
        state = self._nodes[node]
        with state.lock:
            state.watched.clear()
            state.left_down.clear()
            try:
                yield
            finally:
                state.watched.clear()

    def leave_down(self, node: str, container: str) -> None:
        """Never start `node`'s `container` again once it ends (until the node pod is changed on
        purpose: `paused`)."""
        state = self._nodes[node]
        with state.lock:
            state.left_down.add(container)

    def restarts(self, node: str) -> dict[str, int]:
        """How many times the kubelet has started each container of `node`'s node pod again."""
        with self._kept:
            return {name: self._restarts[node, name] for name in self._specs}

    def exits(self) -> list[ContainerExit]:
        """Every run that ended other than by the cluster's will, oldest first."""
        with self._kept:
            return list(self._exits)

    def _run(self) -> None:
        while not self._stop.wait(TICK):
            for node, state in self._nodes.items():
                if self._stop.is_set() or not state.lock.acquire(blocking=False):
                    continue
                try:
                    for container in self._specs:
                        if container not in state.left_down:
                            self._look(node, container, state.watched)
                except Exception:
                    log.exception("The simulated kubelet failed to look at node %s's pod.", node)
                finally:
                    state.lock.release()

    def _look(self, node: str, container: str, node_watched: dict[str, _Watched]) -> None:
        run = self._pods.container_run(node, container)
        watched = node_watched.get(container)
        if run is not None and (watched is None or watched.process is not run.process):
            # A run it has not seen yet (the cluster's first, or what its own start left): the
            # back-off carries over.
            back_off = watched.back_off if watched is not None else 0
            watched = self._watch(container, run, back_off)
            node_watched[container] = watched
        if watched is None:
            return
        if watched.next_start is None:
            assert watched.process is not None
            code = watched.process.poll()
            if code is None:
                watched.seen_running = True
                if run is not None:
                    self._probe(node, container, watched, run)
                return
            self._ended(node, container, watched, code)
        assert watched.next_start is not None
        if time.monotonic() >= watched.next_start and not self._stop.is_set():
            self._start_again(node, container, watched, node_watched)

    def _watch(self, container: str, run: Running, back_off: int) -> _Watched:
        probe = self._specs[container].get("livenessProbe") or {}
        liveness = Probe.of(probe) if "httpGet" in probe else None
        return _Watched(run.process, run.log_path, time.monotonic(), liveness, back_off)

    def _probe(self, node: str, container: str, watched: _Watched, run: Running) -> None:
        assert watched.process is not None
        if watched.killing:
            if time.monotonic() >= watched.kill_at:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(watched.process.pid, signal.SIGKILL)
                watched.kill_at = float("inf")
            return
        if watched.liveness is None or watched.liveness.check(run.ports, run.host) != "fail":
            return
        spec = watched.liveness.spec
        get = spec["httpGet"]
        port = run.ports.get(get["port"], get["port"])
        watched.killing = (
            f"liveness probe failed {watched.liveness.failures} times in a row (GET "
            f"http://{run.host}:{port}{get.get('path', '/')} every "
            f"{float(spec.get('periodSeconds', 10)):.0f} s, timeout "
            f"{float(spec.get('timeoutSeconds', 1)):.0f} s)"
        )
        log.warning(
            "Node %s's %s: its %s; the simulated kubelet kills it (SIGTERM, SIGKILL after %.0f s) "
            "to start it again.",
            node,
            container,
            watched.killing,
            self._grace,
        )
        watched.kill_at = time.monotonic() + self._grace
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(watched.process.pid, signal.SIGTERM)

    def _ended(self, node: str, container: str, watched: _Watched, code: int | None) -> None:
        now = time.monotonic()
        ran = now - watched.started if watched.seen_running else 0.0
        if ran >= BACK_OFF_RESET:
            watched.back_off = 0
        delay = restart_delay(watched.back_off)
        watched.next_start = now + delay
        lines = _tail(watched.log_path, EXIT_LINES)
        with self._kept:
            self._exits.append(ContainerExit(now, node, container, code, watched.killing, lines))
        after = f" after {ran:.1f} s of running" if watched.seen_running else ""
        killed = f", killed because its {watched.killing}" if watched.killing else ""
        when = "at once" if delay == 0 else f"in {delay:.0f} s (CrashLoopBackOff)"
        shown = "\n".join(f"    {line}" for line in lines.splitlines()[-LOGGED_LINES:])
        log.warning(
            "Node %s's %s exited (%s)%s%s: the simulated kubelet starts it again %s. Its log (%s) "
            "ends:\n%s",
            node,
            container,
            exit_words(code),
            after,
            killed,
            when,
            watched.log_path,
            shown or "    (nothing)",
        )

    def _start_again(
        self, node: str, container: str, watched: _Watched, node_watched: dict[str, _Watched]
    ) -> None:
        watched.back_off += 1
        with self._kept:
            self._restarts[node, container] += 1
        try:
            self._pods.start_container_again(node, container)
        except ClusterError as e:
            delay = restart_delay(watched.back_off)
            watched.next_start = time.monotonic() + delay
            log.warning(
                "Node %s's %s did not start again (%s): the simulated kubelet tries again in "
                "%.0f s.",
                node,
                container,
                e,
                delay,
            )
            return
        run = self._pods.container_run(node, container)
        if run is None:
            watched.process = None
            watched.next_start = time.monotonic() + restart_delay(watched.back_off)
            return
        node_watched[container] = self._watch(container, run, watched.back_off)


def _tail(path: Path | None, lines: int) -> str:
    if path is None:
        return ""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
