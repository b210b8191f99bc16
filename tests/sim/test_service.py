"""The Service-style path (`sim.service.Endpoints`): a pod is an endpoint while it is Ready and
not being deleted, as a Service's ready endpoints are."""

from __future__ import annotations

import contextlib
import socket
import statistics
import threading
import time
from typing import Any

import kubernetes.client
import pytest

from sim.apiserver import RunningApiServer
from sim.processes import wait_until
from sim.service import (
    KUBE_PROXY_BURST_SYNCS,
    KUBE_PROXY_MIN_SYNC_SECONDS,
    Endpoints,
    RuleSyncs,
    ServiceProxy,
)
from tests.fixtures_sim import core_v1


def _pod(core: Any, name: str, app: str = "web") -> None:
    core.create_namespaced_pod(
        "default",
        {
            "metadata": {"name": name, "labels": {"app": app}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]},
        },
    )


def _ready(core: Any, name: str, address: str, ready: bool = True) -> None:
    status = {
        "status": {
            "phase": "Running",
            "podIP": address,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        }
    }
    core.patch_namespaced_pod_status(name, "default", status)


def test_endpoints_are_the_ready_pods_not_being_deleted(
    kube_api: kubernetes.client.ApiClient,
) -> None:
    core = core_v1(kube_api)
    core.create_node({"metadata": {"name": "n1"}})
    for name in ("a", "b", "c"):
        _pod(core, name)
    _pod(core, "other", app="db")
    with Endpoints(kube_api, "default", "app=web") as endpoints:
        assert endpoints.pick() is None
        _ready(core, "a", "127.1.0.1")
        _ready(core, "b", "127.1.0.2")
        _ready(core, "c", "127.1.0.3", ready=False)
        _ready(core, "other", "127.1.0.9")
        wanted = ["127.1.0.1", "127.1.0.2"]
        wait_until("a and b ready", lambda: endpoints.addresses() == wanted, 10)
        assert {endpoints.pick() for _ in range(4)} == set(wanted)
        # Marked for deletion (graceful: the pod still runs and drains): no longer an endpoint.
        core.delete_namespaced_pod("a", "default")
        assert core.read_namespaced_pod("a", "default").metadata.deletion_timestamp
        wait_until("a gone from the endpoints", lambda: endpoints.addresses() == wanted[1:], 10)
        _ready(core, "b", "127.1.0.2", ready=False)
        wait_until("none ready", lambda: endpoints.addresses() == [], 10)


def test_kube_proxy_applies_changes_at_most_as_often_as_its_minimum_sync_period() -> None:
    """Two changes back to back are applied at once (kube-proxy's burst), a third waits for
    the next sync to accrue (1 s), and after a quiet period a change is applied at once."""
    syncs = RuleSyncs(KUBE_PROXY_MIN_SYNC_SECONDS, KUBE_PROXY_BURST_SYNCS, now=100.0)
    assert syncs.take(100.0) and syncs.take(100.1)
    assert not syncs.take(100.2)
    assert not syncs.take(100.9), "the third sync of a burst waits for its period"
    assert syncs.take(101.1)
    assert not syncs.take(101.2)
    assert syncs.take(110.0) and syncs.take(110.0), "a quiet period saves a full burst"
    assert not syncs.take(110.0)
    assert RuleSyncs(0.0, 1, now=0.0).take(0.0)


def test_a_minimum_sync_period_that_cannot_be_is_refused() -> None:
    with pytest.raises(ValueError, match="burst at least 1"):
        RuleSyncs(1.0, 0, now=0.0)


class _Answering:
    """An HTTP/1.1 server on port 0 that answers each request once its body is in, in one
    write, as the model proxy does: it sends nothing while the body is on its way."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name="answering", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._exchanges, args=(conn,), daemon=True).start()

    def _exchanges(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn, contextlib.suppress(OSError):
            while (head := _read_until(conn, b"\r\n\r\n")) is not None:
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                while len(head) - head.index(b"\r\n\r\n") - 4 < length:
                    head += conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self.sock.close()
        self._thread.join(5)


def _read_until(conn: socket.socket, end: bytes) -> bytes | None:
    data = b""
    while end not in data:
        piece = conn.recv(65536)
        if not piece:
            return None
        data += piece
    return data


def _exchange_times(address: tuple[str, int], count: int) -> list[float]:
    """Seconds per request of a client that writes each request's head and body apart (as
    httpx, under KServe's SDK, does), on one keep-alive connection."""
    body = b'{"inputs": []}'
    head = (
        f"POST /v2/models/m/infer HTTP/1.1\r\nHost: m\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    times = []
    with socket.create_connection(address, timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(count):
            started = time.perf_counter()
            sock.sendall(head)
            sock.sendall(body)
            answer = b""
            while not answer.endswith(b"{}"):
                piece = sock.recv(65536)
                assert piece, "the connection closed before the answer"
                answer += piece
            times.append(time.perf_counter() - started)
    return times


def test_a_services_path_adds_no_stall_to_a_request_written_in_two_pieces(
    kube_api: kubernetes.client.ApiClient,
) -> None:
    """kube-proxy rewrites addresses in the kernel and adds nothing to a request's time: a
    request whose head and body are written apart takes about as long through the Service as
    to the pod, not a delayed acknowledgement (40 ms) more."""
    core = core_v1(kube_api)
    core.create_node({"metadata": {"name": "n1"}})
    _pod(core, "a")
    _ready(core, "a", "127.0.0.1")
    server = _Answering()
    address = _web_service(core, server.port)
    services = ServiceProxy(kube_api, period=0.1)
    services.start()
    try:
        wait_until("the Service answers", lambda: _answers(address), 10)
        direct = statistics.median(_exchange_times(("127.0.0.1", server.port), 30))
        through = statistics.median(_exchange_times(address, 30))
    finally:
        services.stop()
        server.close()
    assert through < 0.01, f"{through * 1000:.1f} ms a request through the Service"
    assert through < direct + 0.005, f"{through * 1000:.2f} ms against {direct * 1000:.2f} ms"


def _web_service(core: Any, target: int | str) -> tuple[str, int]:
    """A Service `web` of the pods `app=web`, on a port free on its cluster IP, to `target`;
    its address."""
    with socket.create_server(("127.2.0.1", 0)) as probe:  # a port free on the cluster IP
        port = probe.getsockname()[1]
    service = {
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": port, "targetPort": target}]},
    }
    created = core.create_namespaced_service("default", service)
    return created.spec.cluster_ip, port


def _answers(address: tuple[str, int]) -> bool:
    try:
        _exchange_times(address, 1)
    except OSError:
        return False
    return True


def test_a_named_target_port_is_routed_through_an_api_server_outage(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient
) -> None:
    """kube-proxy routes a named target port from the EndpointSlice it already has: a
    connection made while the API server is down still reaches the pod (once, each one asked
    the API server for the pod's ports, and was reset)."""
    core = core_v1(kube_api)
    core.create_node({"metadata": {"name": "n1"}})
    server = _Answering()
    http = {"name": "http", "containerPort": server.port}
    core.create_namespaced_pod(
        "default",
        {
            "metadata": {"name": "a", "labels": {"app": "web"}},
            "spec": {
                "nodeName": "n1",
                "containers": [{"name": "c", "image": "x", "ports": [http]}],
            },
        },
    )
    _ready(core, "a", "127.0.0.1")
    address = _web_service(core, "http")
    services = ServiceProxy(kube_api, period=0.1)
    services.start()
    try:
        wait_until("the Service answers", lambda: _answers(address), 10)
        apiserver.pause()
        try:
            assert len(_exchange_times(address, 5)) == 5
            for _ in range(5):  # a new connection each
                assert _answers(address)
        finally:
            apiserver.resume()
    finally:
        services.stop()
        server.close()
