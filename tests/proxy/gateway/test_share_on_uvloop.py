"""A connection a pod opens while it is held to its share of the gateway's loop starts paused, on
the event loop the gateway runs on (uvloop), for both relays (an independent attack
suite's case, run here first).

The attack: a pod floods the gateway's loop while a neighbour is served, so it is held to its
share round after round, and opens new connections meanwhile on which it writes without reading
(PINGs, pipelined requests: each answered). The relays paused such a connection in
`connection_made`, but uvloop starts reading only after `connection_made` returns, undoing the
pause while the relay believed the connection paused (asyncio's own loop keeps it). The
connection then read whatever the tenant sent: its pause when its answers backed up was skipped
as "already paused", and the end of the round found it "paused for its answers" and left it
alone. Seen through a real gateway process: 256 MiB of PINGs, answers unread, grew the gateway by
250 MiB (`tests/proxy/gateway/test_h2_attacks.py` runs such floods). This test pins the mechanism
without timing: the pod's share is paused by the policy's own call, a connection is adopted as
the gateway adopts it, and the transport must not be reading; the round's end must resume it.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import uvloop

from proxy.gateway.settings import GatewaySettings
from proxy.gateway.tenants import Tenants
from proxy.policy.share import ROUND, LoopShares
from proxy.processflags import ProxyState
from tests.proxy.gateway.conftest import caller


class Timer:
    """The share's round timer, run by the test: the round ends when the test says."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], object]] = []

    def __call__(self, delay: float, callback: Callable[[], object]) -> None:
        self.callbacks.append(callback)

    def fire(self) -> None:
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            callback()


async def held_connection_reads(protocol: str, tmp_path: Path) -> tuple[bool, bool]:
    """Adopt a connection of a pod whose share is paused; whether its transport reads then, and
    after the round ends."""
    now = [0.0]
    timer = Timer()
    shares = LoopShares(0.5, timer, clock=lambda: now[0])
    settings = GatewaySettings(
        caller_table=tmp_path / "callers.json",
        triton_http_url="127.0.0.1:9",  # nothing here reaches Triton
        triton_grpc_url="127.0.0.1:9",
    )
    tenants = Tenants(ProxyState(), shares)
    tenant = tenants.get({"identity": caller("127.0.0.1", "identity")}, settings.relay_settings)
    shares.pause(tenant.share)  # the pod took more than its share: held until the round ends
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    accepted.setblocking(False)
    client.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" if protocol == "grpc" else b"GET / HTTP/1.1")
    try:
        await tenant.adopt(protocol, accepted)
        for _ in range(3):  # a few turns: what the relay scheduled has run
            await asyncio.sleep(0)
        relay: Any = tenant.grpc if protocol == "grpc" else tenant.rest
        (connection,) = relay.connections
        while_held = connection.transport.is_reading()
        now[0] += 2 * ROUND
        timer.fire()  # the round ends: a pod alone owes nothing and is resumed
        after = connection.transport.is_reading()
        tenant.abort()
        return while_held, after
    finally:
        client.close()
        listener.close()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_connection_opened_while_its_pod_is_held_to_its_share_starts_paused_on_uvloop(
    protocol: str, tmp_path: Path
) -> None:
    while_held, after = uvloop.run(held_connection_reads(protocol, tmp_path))
    assert not while_held, "the connection reads while its pod is held to its share"
    assert after, "the connection stayed paused after its pod's round ended"
