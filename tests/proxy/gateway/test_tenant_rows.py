"""How a calling pod's tenant follows its rows (`Tenants`): a model host that stays the same pod
keeps its tenant and its open connections whatever its rows do, whether the caller book told the
gateway first or a new connection brought rows the tenant has not heard of yet; a new connection
finds the rows it was admitted with served. Another pod at the address, or a model pod whose row
changed, is dropped with its connections."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from common.callers import Caller
from proxy.gateway.settings import GatewaySettings
from proxy.gateway.tenants import RelaySettings, Tenant, Tenants
from proxy.policy.inflight import InFlightShares
from proxy.policy.probation import ProbationLane
from proxy.policy.share import LoopShares
from proxy.processflags import ProxyState

HOST = "127.1.9.2"
HOST_POD = "team-h/tritonshare-host-0123456789abcdef"
A = Caller(HOST, "a", HOST_POD, "uid-a/0", 0, "team-h.a.0a0a")
B0 = Caller(HOST, "b", HOST_POD, "uid-b/0", 0, "team-h.b.0b00")
B1 = Caller(HOST, "b", HOST_POD, "uid-b/1", 0, "team-h.b.0b01")
POD = Caller("127.1.9.3", "c", "team-c/c-pod", "uid-c", 0, "team-c.c.0c0c")


def rows(*callers: Caller) -> dict[str, Caller]:
    return {caller.model_id: caller for caller in callers}


@pytest.fixture
def settings_for(tmp_path: Path) -> RelaySettings:
    settings = GatewaySettings(
        caller_table=tmp_path / "callers.json",
        triton_http_url="127.0.0.1:9",  # nothing here reaches Triton
        triton_grpc_url="127.0.0.1:9",
    )
    return settings.relay_settings


@pytest.fixture
def tenants() -> Iterator[Tenants]:
    yield Tenants(ProxyState(), LoopShares(0.5, lambda delay, callback: None))


class Connected:
    """One connection of a pod, adopted by its tenant as the gateway adopts it."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.client = socket.create_connection(self.listener.getsockname())
        self.accepted, _ = self.listener.accept()
        self.accepted.setblocking(False)
        self.client.setblocking(False)

    async def adopt(self, tenant: Tenant) -> None:
        await tenant.adopt("http", self.accepted)

    async def is_open(self) -> bool:
        for _ in range(3):  # what the tenant scheduled has run
            await asyncio.sleep(0)
        try:
            return self.client.recv(1) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False

    def close(self) -> None:
        self.client.close()
        self.listener.close()


@pytest.mark.parametrize(
    "changed",
    [(A, B0), (A, B1), (A,), (replace(A, quarantined="why"), B1), (B1,)],
    ids=["joined", "moved", "left", "all-changed", "only-the-neighbour"],
)
async def test_a_new_connection_with_a_hosts_changed_rows_keeps_its_tenant_and_connections(
    tenants: Tenants, settings_for: RelaySettings, changed: tuple[Caller, ...]
) -> None:
    # The rows a new connection is admitted with may reach the tenants before the book's
    # change does: the host's tenant follows them, as it follows the book.
    tenant = tenants.get(rows(A, B0) if B0 not in changed else rows(A), settings_for)
    connection = Connected()
    try:
        await connection.adopt(tenant)
        assert tenants.get(rows(*changed), settings_for) is tenant
        assert tenant.rows == rows(*changed)
        assert sorted(tenant.table.names) == sorted(rows(*changed))
        assert await connection.is_open(), "the host's connection was closed"
        tenants.rows_changed(HOST, rows(A, B1))  # the book's own word, after
        assert tenants.get(rows(A, B1), settings_for) is tenant
        assert await connection.is_open()
    finally:
        tenant.abort()
        connection.close()
        await tenants.stop()


async def test_another_pod_at_the_address_or_a_model_pods_changed_row_is_dropped(
    tenants: Tenants, settings_for: RelaySettings
) -> None:
    host = tenants.get(rows(A, B0), settings_for)
    pod = tenants.get(rows(POD), settings_for)
    connections = Connected(), Connected()
    try:
        await connections[0].adopt(host)
        await connections[1].adopt(pod)
        other_host = replace(A, pod="team-h/tritonshare-host-fedcba9876543210")
        assert tenants.get(rows(other_host), settings_for) is not host
        assert not await connections[0].is_open(), "another pod kept the host's connection"
        assert tenants.get(rows(replace(POD, triton_name="team-c.c.ffff")), settings_for) is not pod
        assert not await connections[1].is_open(), "the model pod's connection stayed"
    finally:
        for tenant in tenants:
            tenant.abort()
        for connection in connections:
            connection.close()
        await tenants.stop()


async def test_a_host_on_probation_takes_its_turns_as_one_pod(settings_for: RelaySettings) -> None:
    """The probation lane keeps pods apart (the crash witness names pods), not a host's models:
    in the host's turn each of its models' requests goes to Triton at once, with no turn nor
    quiet gap between them; another probationer's turn begins once none of the host's is at
    Triton, after the gap. Before, each model of a host on probation took turns of its own, a
    gap apart: a host of four models on probation after a neighbour's crash had requests wait
    more than 10 s."""
    lane = ProbationLane(gap_seconds=0.2)
    tenants = Tenants(ProxyState(), LoopShares(0.5, lambda delay, callback: None), probation=lane)
    on = [replace(caller, probation=True) for caller in (A, B0, POD)]
    host = tenants.get(rows(on[0], on[1]), settings_for)
    pod = tenants.get(rows(on[2]), settings_for)
    a, b = host.members["a"].limiter, host.members["b"].limiter
    c = pod.members["c"].limiter
    try:
        assert a.try_acquire()
        assert b.try_acquire(), "the host's other model waited for a turn of its own"
        assert not c.try_acquire(), "another probationer's request went beside the host's"
        a.release()
        b.release()
        ended = time.monotonic()
        await asyncio.wait_for(c.acquire(), 5)
        assert time.monotonic() - ended >= 0.19, "no quiet gap between two pods' turns"
        assert not a.try_acquire() and not b.try_acquire(), "the host went beside the pod"
        c.release()
        host.on_probation(replace(A, probation=False))
        host.on_probation(replace(B0, probation=False))
        assert lane.waiting == 0 and a.try_acquire(), "off probation: it takes no turns"
    finally:
        await tenants.stop()


async def test_a_request_queued_at_a_replica_leaving_the_spread_goes_on(
    settings_for: RelaySettings,
) -> None:
    """Under the node's in-flight budget a host's request may wait for its namespace's slot in
    the queue of the replica it was given. When that replica leaves the model's spread (the
    model scaled down: it drains), the request goes on through it at its namespace's next free
    slot, as its requests in flight do; before, the replica left the budget with its queue and
    nothing granted it a slot, so the request waited out the queue's timeout (30 s) past its
    client's deadline. It does not go past its namespace's part either: the replica stays in
    the budget until what it held is answered."""
    loop = asyncio.get_running_loop()
    shares = InFlightShares(2, loop.call_later)
    tenants = Tenants(ProxyState(), LoopShares(0.5, lambda delay, callback: None), shares)
    spread = replace(B0, spread=((B1.triton_name, B1.uid),))
    host = tenants.get(rows(A, spread), settings_for)
    pod = tenants.get(rows(POD), settings_for)
    a, c = host.members["a"].limiter, pod.members["c"].limiter
    leaving = host.members[f"b/{B1.triton_name}"].limiter
    try:
        assert c.try_acquire() and a.try_acquire(), "each namespace's one slot"
        waiting = loop.create_task(leaving.acquire())
        await asyncio.sleep(0)
        assert not waiting.done(), "no slot of its namespace is free: it waits"
        tenants.rows_changed(HOST, rows(A, B0))  # the replica leaves the spread
        await asyncio.sleep(0)
        assert not waiting.done(), "its namespace's slot is still taken: it still waits"
        a.release()
        await asyncio.wait_for(waiting, 2)
        assert leaving.in_flight == 1 and leaving.node is shares
        leaving.release()
        assert leaving.node is None, "answered: the replica left the node's budget"
    finally:
        await tenants.stop()
