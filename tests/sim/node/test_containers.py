"""The simulated kubelet probes a container as the real one does (pkg/kubelet/prober): nothing
but the startup probe until it passes, then the readiness probe at once (the real kubelet
triggers a readiness run when the container is started but not yet ready), then each probe at
its own period, never faster."""

from __future__ import annotations

import signal
import socket
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from sim.node.containers import ContainerRun, Probe, http_get
from sim.node.podspec import Launch


class Site:
    """A real HTTP server whose paths answer 200 once listed in `up`, else 503; it counts
    the requests per path."""

    def __init__(self) -> None:
        self.up: set[str] = set()
        self.hits: Counter[str] = Counter()
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                site.hits[self.path] += 1
                self.send_response(200 if self.path in site.up else 503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]


@pytest.fixture
def site() -> Iterator[Site]:
    served = Site()
    thread = threading.Thread(target=served.server.serve_forever, name="probe-site")
    thread.start()
    try:
        yield served
    finally:
        served.server.shutdown()
        served.server.server_close()
        thread.join(10)


def container(port: int) -> ContainerRun:
    """A started container with the proxy's probes: startup every second, readiness every 5 s
    (its schedule begins at the container's start, as `ContainerRun.start` sets it)."""
    spec: dict[str, Any] = {
        "name": "proxy",
        "startupProbe": {
            "httpGet": {"path": "/healthz", "port": port},
            "periodSeconds": 1,
            "failureThreshold": 30,
        },
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": port},
            "periodSeconds": 5,
        },
    }
    run = ContainerRun(spec)
    run.startup = Probe.of(spec["startupProbe"])
    run.readiness = Probe.of(spec["readinessProbe"])
    return run


def state(run: ContainerRun) -> tuple[bool, bool]:
    """(started, ready) as the kubelet reports them."""
    return run.started_ok, run.ready


def test_readiness_waits_for_the_start_then_runs_at_once(site: Site) -> None:
    run = container(site.port)
    site.up = {"/ready"}
    assert run.probe("127.0.0.1") == ""
    assert site.hits == Counter({"/healthz": 1}), "readiness ran before the container started"
    assert state(run) == (False, False)

    # The startup probe's next turn is a period away: probing again sooner asks nothing.
    assert run.probe("127.0.0.1") == ""
    assert site.hits == Counter({"/healthz": 1})

    site.up = {"/healthz", "/ready"}
    assert run.startup is not None
    run.startup.due = 0.0  # its period has passed
    assert run.probe("127.0.0.1") == ""
    # Started, and readiness probed in the same pass: Ready now, not 5 s later.
    assert state(run) == (True, True)
    assert site.hits == Counter({"/healthz": 2, "/ready": 1})

    # Started: the startup probe is done, and readiness keeps its own 5 s period.
    assert run.probe("127.0.0.1") == ""
    assert site.hits == Counter({"/healthz": 2, "/ready": 1})


def test_a_failed_first_readiness_waits_its_period(site: Site) -> None:
    """No faster than the real kubelet: a readiness probe that fails right after the start is
    tried again after its period, not at the next pass."""
    run = container(site.port)
    site.up = {"/healthz"}
    run.probe("127.0.0.1")
    assert state(run) == (True, False)
    assert site.hits["/ready"] == 1
    site.up = {"/healthz", "/ready"}
    run.probe("127.0.0.1")
    assert state(run) == (True, False) and site.hits["/ready"] == 1
    assert run.readiness is not None
    run.readiness.due = 0.0
    run.probe("127.0.0.1")
    assert state(run) == (True, True) and site.hits["/ready"] == 2


def test_a_probe_of_a_port_not_listening_yet_or_not_http_fails() -> None:
    """A failure the kubelet counts, not an error: a named port the container does not list (the
    simulated cluster's agent before it has written its ports file), or an answer that is not
    HTTP."""
    probe = {"path": "/healthz", "port": "agent-http"}
    assert not http_get(probe, {}, "127.0.0.1", 1)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        answer = threading.Thread(target=_answer_garbage, args=(server,), name="not-http")
        answer.start()
        try:
            assert not http_get(probe, {"agent-http": server.getsockname()[1]}, "127.0.0.1", 5)
        finally:
            answer.join(10)


def _answer_garbage(server: socket.socket) -> None:
    connection, _ = server.accept()
    with connection:
        connection.recv(4096)
        connection.sendall(b"SSH-2.0-OpenSSH\r\n\r\n")


def _sleeper(tmp_path: Path) -> ContainerRun:
    """A started container whose process sleeps."""
    run = ContainerRun({"name": "proxy"})
    launch = Launch(
        "proxy", (sys.executable, "-c", "import time; time.sleep(60)"), {}, tmp_path / "term"
    )
    run.start(launch, tmp_path / "proxy.log", tmp_path)
    return run


def _ended(run: ContainerRun) -> int:
    assert run.process is not None
    return run.process.wait(30)


def test_an_oom_kill_is_reported_oomkilled_once(tmp_path: Path) -> None:
    run = _sleeper(tmp_path)
    assert run.oom_kill()
    code = _ended(run)
    run.exited(code)
    assert code == -signal.SIGKILL
    assert run.state["terminated"]["reason"] == "OOMKilled"
    assert not run.oom_kill()  # no process left to kill
    # The next run's exit is its own: a plain kill reads Error.
    run.start(run.launch or pytest.fail("no launch"), tmp_path / "proxy.log", tmp_path)
    run.signal(signal.SIGKILL)
    run.exited(_ended(run))
    assert run.state["terminated"]["reason"] == "Error"
