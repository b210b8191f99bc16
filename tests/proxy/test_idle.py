"""`--idle-timeout`: tenant connections with nothing in progress are closed, busy ones never.

The sweep's rule is checked sweep by sweep on stand-in connections; the rest runs against the
real Triton: a REST connection that never sends, or sends nothing after its last answer, is
closed; a gRPC one gets GOAWAY (NO_ERROR from the relay) and is closed, in both gRPC modes; a
request or call that lasts longer than the timeout is not cut; tritonclient (HTTP and gRPC)
carries on after its idle connection was closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from proxy.http2 import frames as f
from proxy.idle import SWEEPS, IdleSweeper
from sim.triton import TritonServer
from tests.proxy.conftest import RunningProxy, proxy_settings, running_proxy
from tests.proxy.grpc.test_relay_channel import (
    RawTenant,
    add_one_inputs,
    established_to,
    poll,
    port_of,
    sleepy_inputs,
)

TIMEOUT = 0.4


class Stand:
    """A stand-in connection: `mark` is what `activity` says (None while busy)."""

    def __init__(self) -> None:
        self.mark: object | None = 0.0
        self.closed = 0

    def activity(self) -> object | None:
        return self.mark

    def close_idle(self) -> None:
        self.closed += 1


# -- the sweep's rule ------------------------------------------------------------------------------


def _sweeps_to_close(sweeper: IdleSweeper, connection: Stand, limit: int = 50) -> int:
    """How many more sweeps it takes `sweeper` to close `connection`."""
    for sweeps in range(1, limit + 1):
        sweeper.sweep()
        if connection.closed:
            return sweeps
    raise AssertionError(f"not closed after {limit} sweeps")


def test_a_connection_idle_on_every_sweep_of_a_timeout_is_closed_on_the_last() -> None:
    connection = Stand()
    sweeper = IdleSweeper(1.0, [connection])
    # seen idle on the first sweep, then for a whole timeout: SWEEPS more
    assert _sweeps_to_close(sweeper, connection) == SWEEPS + 1
    assert sweeper.closed == 1


def test_a_request_begun_between_sweeps_restarts_the_count() -> None:
    connection = Stand()
    sweeper = IdleSweeper(1.0, [connection])
    for _ in range(SWEEPS):
        sweeper.sweep()
    connection.mark = 1.5  # a request began and ended since the last sweep
    assert _sweeps_to_close(sweeper, connection) == SWEEPS + 1


def test_a_busy_connection_is_never_closed_and_counts_from_when_it_is_idle_again() -> None:
    connection = Stand()
    connection.mark = None
    sweeper = IdleSweeper(1.0, [connection])
    for _ in range(3 * SWEEPS):
        sweeper.sweep()
    assert connection.closed == 0
    connection.mark = 7
    assert _sweeps_to_close(sweeper, connection) == SWEEPS + 1


async def test_the_sweep_runs_on_its_own_and_stops() -> None:
    connection = Stand()
    sweeper = IdleSweeper(0.05, {connection})
    sweeper.start()
    started = time.monotonic()
    deadline = started + 5
    while not connection.closed:
        assert time.monotonic() < deadline, "the sweep did not close an idle connection"
        await asyncio.sleep(0.005)
    assert time.monotonic() - started >= 0.05
    sweeper.stop()
    closed = connection.closed
    await asyncio.sleep(0.2)  # four sweeps' worth: none may run after stop
    assert connection.closed == closed


async def test_a_zero_timeout_keeps_idle_connections() -> None:
    connection = Stand()
    sweeper = IdleSweeper(0.0, [connection])
    sweeper.start()
    await asyncio.sleep(0.2)
    sweeper.stop()
    assert connection.closed == 0


# -- REST against the real Triton ------------------------------------------------------------------


def _connect(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _closed_after(sock: socket.socket, within: float = 10) -> float:
    """Seconds until the peer closes `sock` (anything it sends before is read and dropped)."""
    started = time.monotonic()
    sock.settimeout(within)
    while sock.recv(65536):
        pass
    return time.monotonic() - started


def _exchange(sock: socket.socket, path: str, body: bytes = b"") -> bytes:
    """One keep-alive request and its whole answer (Content-Length framed)."""
    method = "POST" if body else "GET"
    head = f"{method} {path} HTTP/1.1\r\nHost: proxy\r\nContent-Length: {len(body)}\r\n\r\n"
    sock.sendall(head.encode() + body)
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"the proxy closed the connection instead of answering {path}")
        answer += chunk
    head_bytes, _, rest = answer.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head_bytes.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"the proxy closed the connection inside the answer to {path}")
        rest += chunk
    return head_bytes


@pytest.fixture
def rest_only(served_triton: TritonServer) -> Iterator[str]:
    with running_proxy(proxy_settings(served_triton, idle_timeout_seconds=TIMEOUT)) as running:
        yield running.http_url


@pytest.mark.triton
def test_rest_connection_that_sends_nothing_is_closed(rest_only: str) -> None:
    with _connect(rest_only) as sock:
        waited = _closed_after(sock)
    assert TIMEOUT <= waited < TIMEOUT * 1.25 + 2


@pytest.mark.triton
def test_rest_keep_alive_connection_is_closed_after_its_last_answer(rest_only: str) -> None:
    with _connect(rest_only) as sock:
        head = _exchange(sock, "/v2/health/live")
        assert head.startswith(b"HTTP/1.1 200")
        waited = _closed_after(sock)
    assert TIMEOUT <= waited < TIMEOUT * 1.25 + 2


@pytest.mark.triton
def test_rest_request_longer_than_the_timeout_is_not_cut(served_triton: TritonServer) -> None:
    settings = proxy_settings(served_triton, model_id="sleepy", idle_timeout_seconds=TIMEOUT)
    body = b'{"inputs":[{"name":"DELAY_MS","shape":[1],"datatype":"INT32","data":[%d]}]}' % int(
        TIMEOUT * 3000
    )
    with running_proxy(settings) as running, _connect(running.http_url) as sock:
        started = time.monotonic()
        head = _exchange(sock, "/v2/models/sleepy/infer", body)
        assert head.startswith(b"HTTP/1.1 200"), head
        assert time.monotonic() - started >= TIMEOUT * 3
        # the same connection still serves: it was busy, never idle
        assert _exchange(sock, "/v2/health/live").startswith(b"HTTP/1.1 200")


@pytest.mark.triton
def test_tritonclient_http_carries_on_after_its_connection_was_closed(
    served_triton: TritonServer,
) -> None:
    settings = proxy_settings(served_triton, idle_timeout_seconds=TIMEOUT)
    with running_proxy(settings) as running:
        client = httpclient.InferenceServerClient(running.http_url)
        try:
            values = np.array([[1, 2, 3, 4]], np.float32)
            infer_input = httpclient.InferInput("INPUT0", [1, 4], "FP32")
            infer_input.set_data_from_numpy(values)
            first = client.infer("add_one", [infer_input]).as_numpy("OUTPUT0")
            poll(lambda: not running.proxy.rest.connections, "the idle connection closing")
            second = client.infer("add_one", [infer_input]).as_numpy("OUTPUT0")
        finally:
            client.close()
    np.testing.assert_array_equal(first, values + 1)
    np.testing.assert_array_equal(second, values + 1)


# -- gRPC against the real Triton, both modes ------------------------------------------------------


@pytest.mark.triton
def test_grpc_idle_connection_gets_goaway_and_is_closed(
    served_triton: TritonServer, grpc_mode: str
) -> None:
    settings = proxy_settings(served_triton, grpc_mode=grpc_mode, idle_timeout_seconds=TIMEOUT)
    with (
        running_proxy(settings) as running,
        contextlib.closing(RawTenant(running.grpc_url)) as tenant,
    ):
        started = time.monotonic()
        tenant.start()
        tenant.pump(lambda: tenant.goaway is not None, "GOAWAY to an idle connection")
        waited = time.monotonic() - started
        tenant.wait_closed()
    assert tenant.goaway is not None
    last_stream, code = struct.unpack(">II", tenant.goaway[:8])
    assert last_stream == 0
    if grpc_mode == "relay":
        assert code == f.NO_ERROR
        assert waited >= TIMEOUT
    else:  # grpc core says INTERNAL_ERROR "connection idle" (and jitters the time); its clients
        # reconnect all the same
        assert tenant.goaway[8:] == b"connection idle"


@pytest.mark.triton
def test_grpc_call_longer_than_the_timeout_is_not_cut(
    served_triton: TritonServer, grpc_mode: str
) -> None:
    settings = proxy_settings(
        served_triton, model_id="sleepy", grpc_mode=grpc_mode, idle_timeout_seconds=TIMEOUT
    )
    with running_proxy(settings) as running:
        client = grpcclient.InferenceServerClient(running.grpc_url)
        try:
            started = time.monotonic()
            client.infer("sleepy", sleepy_inputs(int(TIMEOUT * 3000)))
            assert time.monotonic() - started >= TIMEOUT * 3
        finally:
            client.close()


@pytest.mark.triton
def test_tritonclient_grpc_carries_on_after_its_connection_was_closed(
    served_triton: TritonServer, grpc_mode: str
) -> None:
    settings = proxy_settings(served_triton, grpc_mode=grpc_mode, idle_timeout_seconds=TIMEOUT)
    with running_proxy(settings) as running:
        client = grpcclient.InferenceServerClient(running.grpc_url)
        try:
            first = client.infer("add_one", add_one_inputs([1, 2, 3, 4])).as_numpy("OUTPUT0")
            port = port_of(running.grpc_url)  # the client's end, in this process
            poll(lambda: not established_to(port), "the idle connection closing")
            second = client.infer("add_one", add_one_inputs([1, 2, 3, 4])).as_numpy("OUTPUT0")
        finally:
            client.close()
    np.testing.assert_array_equal(first, [[2, 3, 4, 5]])
    np.testing.assert_array_equal(second, [[2, 3, 4, 5]])


# -- metrics ---------------------------------------------------------------------------------------


def _connection_samples(running: RunningProxy) -> dict[tuple[str, str], float]:
    """(sample name, protocol) -> value of the connection metrics, as a Prometheus scrape reads
    them."""
    with urllib.request.urlopen(running.metrics_url, timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, sample.labels["protocol"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("tritonshare_proxy_") and "connections" in family.name
        for sample in family.samples
    }


@pytest.mark.triton
def test_open_and_idle_closed_connections_are_reported(served_triton: TritonServer) -> None:
    settings = proxy_settings(served_triton, grpc_mode="relay", idle_timeout_seconds=TIMEOUT)
    opened = ("tritonshare_proxy_connections", "http"), ("tritonshare_proxy_connections", "grpc")
    closed = (
        ("tritonshare_proxy_idle_closed_connections_total", "http"),
        ("tritonshare_proxy_idle_closed_connections_total", "grpc"),
    )
    with running_proxy(settings) as running:
        assert [_connection_samples(running)[key] for key in (*opened, *closed)] == [0, 0, 0, 0]
        with (
            _connect(running.http_url) as sock,
            contextlib.closing(RawTenant(running.grpc_url)) as tenant,
        ):
            poll(
                lambda: [_connection_samples(running)[key] for key in opened] == [1, 1],
                "both connections counted as open",
            )
            tenant.start()
            _closed_after(sock)
            tenant.wait_closed()
        poll(
            lambda: (
                [_connection_samples(running)[key] for key in (*opened, *closed)] == [0, 0, 1, 1]
            ),
            "both counted as closed for idling",
        )
