"""A flood of silent connections from one source address: connections that send nothing (no
caller key, no protocol byte) wait for their first bytes in a room bounded per address
(`--max-silent-connections-per-address`) and in time (`--caller-key-timeout`), so one address's
flood neither takes another caller's waiting connection nor slows its connects much.

Pods are played by their source addresses (127.1.0.x), as in `test_caller_keys`.
"""

from __future__ import annotations

import socket
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.callerkeys import preamble
from sim.triton import TritonServer
from tests.proxy.gateway.conftest import RunningGateway, gateway_settings, publish, running_gateway
from tests.proxy.gateway.test_caller_keys import KEY_A, POD_A, ROWS, fetch, poll, scrape

pytestmark = pytest.mark.triton

FLOODER = "127.1.0.99"
"""The attacker's pod: any address of the node's pod network, caller or not."""
BOUND = 64
"""`--max-silent-connections-per-address`'s default."""


def silent_from(gateway: RunningGateway, source: str) -> socket.socket:
    host, port = gateway.http_url.split(":")
    return socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))


def flood_from(gateway: RunningGateway, source: str, count: int, into: list[socket.socket]) -> int:
    """Open `count` silent connections from `source` into `into`; how many were reset before
    their connect returned (refused at once)."""
    reset = 0
    for _ in range(count):
        try:
            into.append(silent_from(gateway, source))
        except ConnectionResetError:
            reset += 1
    return reset


def reset_or_closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True


def waiting_from(gateway: RunningGateway, address: str) -> int:
    return sum(1 for a in gateway.gateway._waiting.values() if a == address)


@pytest.fixture
def gateway(served_triton: TritonServer, table: Path) -> Iterator[RunningGateway]:
    publish(table, *ROWS)
    settings = gateway_settings(served_triton, table, caller_key_timeout_seconds=60)
    assert settings.max_silent_per_address == BOUND
    with running_gateway(settings) as running:
        yield running


def test_an_address_holds_its_bound_of_silent_connections_and_no_more(
    gateway: RunningGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flood is larger than the whole waiting room: it once closed the longest-waiting
    connection, the neighbour's. Past its address's bound each silent connection is reset at
    once, and the neighbour's waits on and is served."""
    monkeypatch.setattr("proxy.gateway.app.MAX_WAITING", 4 * BOUND)
    neighbour = silent_from(gateway, POD_A)
    flood: list[socket.socket] = []
    try:
        poll(lambda: len(gateway.gateway._waiting) == 1, "the neighbour's connection waiting")
        flood_from(gateway, FLOODER, 5 * BOUND, flood)
        poll(lambda: reset_or_closed(flood[-1]), "the flood's last connection to be reset")
        # Past the bound each silent connection of the address was reset at once; those within
        # it still wait, and so does the neighbour's.
        assert all(reset_or_closed(sock) for sock in flood[BOUND:])
        assert waiting_from(gateway, FLOODER) == BOUND
        assert waiting_from(gateway, POD_A) == 1
        assert 'reason="too_many_silent"' in scrape(gateway)
        # The neighbour presents its key and is served.
        neighbour.sendall(
            preamble(KEY_A) + b"GET /v2/models/add_one/ready HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        assert neighbour.recv(1024).startswith(b"HTTP/1.1 200")
        # And its other connections are served as before.
        assert fetch(gateway, POD_A, KEY_A, "GET", "/v2/models/add_one/ready")[0] == 200
    finally:
        neighbour.close()
        for sock in flood:
            sock.close()


def test_another_caller_connects_as_fast_while_an_address_holds_many_silent_connections(
    gateway: RunningGateway,
) -> None:
    """1,500 silent connections held from one address: the gateway keeps its bound of them
    waiting and resets the rest, and a neighbour's new connections are served as fast."""

    def timed() -> float:
        started = time.perf_counter()
        assert fetch(gateway, POD_A, KEY_A, "GET", "/v2/models/add_one/ready")[0] == 200
        return time.perf_counter() - started

    quiet = [timed() for _ in range(20)]
    flood: list[socket.socket] = []
    try:
        flood_from(gateway, FLOODER, 1500, flood)
        during = []
        for _ in range(40):
            during.append(timed())
            time.sleep(0.02)
        assert waiting_from(gateway, FLOODER) == BOUND
    finally:
        for sock in flood:
            sock.close()
    # Generous for a shared machine: what a flood once cost a neighbour was a median of 190 ms.
    assert statistics.median(during) < max(10 * statistics.median(quiet), 0.05), (quiet, during)
