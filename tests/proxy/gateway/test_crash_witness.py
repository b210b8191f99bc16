"""What the gateway witnesses when Triton goes away (`gateway.witness`, `common.sentinel`), and
how it refuses a quarantined pod (`policy.limiter`'s refusal): on their own, with a real
listening socket standing in for Triton's port. The whole path, with a real Triton, is
tests/agent/quarantine/test_request_quarantine.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest

from common.callers import Caller
from common.crashwitness import Suspect, Witness, read_witnesses
from common.sentinel import Sentinel, host_and_port
from proxy.gateway.restore import Restore
from proxy.gateway.tenants import Tenant
from proxy.gateway.witness import CrashWitness, suspects_of
from proxy.policy.limiter import Limiter
from proxy.policy.probation import ProbationLane
from proxy.policy.refusals import QuarantinedError, grpc_code, http_status
from tests.agent.conftest import eventually


class Answered:
    """The pod's metrics as the witness reads them: answers by code, of inferences unless a
    code is written `route__code` (`ready__502`)."""

    def __init__(self, **codes: int) -> None:
        self.codes: dict[tuple[str, str], int] = {}
        for key, n in codes.items():
            route, _, code = key.rpartition("__") if "__" in key else ("infer", "", key)
            self.codes[(route, code.removeprefix("_"))] = n

    def answered_with(self, codes: frozenset[str], routes: frozenset[str] | None = None) -> int:
        return sum(
            n
            for (route, code), n in self.codes.items()
            if code in codes and (routes is None or route in routes)
        )


class Pod:
    """What the witness reads of a tenant (hashed by identity, as a `Tenant` is)."""

    host = False  # a model pod: its one model's limiter and metrics are the tenant's

    def __init__(self, limiter: Limiter, caller: Caller, metrics: Answered) -> None:
        self.limiter, self.caller, self.metrics = limiter, caller, metrics
        self.at_exits = 0

    def present_at_exit(self) -> None:
        self.at_exits += 1


def tenant(pod: str, *, in_flight: int = 0, last: float = 0.0, **codes: int) -> Tenant:
    limiter = Limiter(0, 0, 1.0)
    limiter.in_flight, limiter.last = in_flight, last
    caller = Caller(f"10.0.0.{len(pod)}", pod.partition("/")[2], pod, f"uid-{pod}")
    return cast(Tenant, Pod(limiter, caller, Answered(**codes)))


def pods(tenants: list[Tenant], before: dict[Tenant, int] | None = None) -> list[tuple[str, int]]:
    return [(s.pod, s.in_flight) for s in suspects_of(tenants, before or {}, 100.0, last=5.0)]


def test_the_suspects_are_the_pods_with_requests_at_triton() -> None:
    """In flight, or failed by the death (the relays may answer theirs before the sentinel's
    turn); a neighbour answered normally a moment before is named with none at Triton."""
    failed_rest = tenant("b/rest-failed", last=99.0, _502=3, _200=40)
    failed_grpc = tenant("c/grpc-failed", last=99.0, UNAVAILABLE=1)
    earlier = tenant("d/failed-before", last=99.0, _502=2)
    tenants = [
        tenant("a/flight", in_flight=2, last=90.0),
        failed_rest,
        failed_grpc,
        earlier,
        tenant("e/answered", last=99.99, _200=500),
        tenant("f/idle"),
    ]
    before = {failed_rest: 2, earlier: 2}
    assert pods(tenants, before) == [
        ("a/flight", 2),
        ("b/rest-failed", 1),
        ("c/grpc-failed", 1),
        ("d/failed-before", 0),
        ("e/answered", 0),
    ]


def test_a_readiness_check_failed_on_a_stale_connection_is_no_presence() -> None:
    """After a restart, a stock proxy's readiness check on a connection the old Triton left
    fails (502): no inference of the pod was at Triton, so it is no suspect at the next exit."""
    probed = tenant("a/probed", last=10.0, ready__502=1, ModelReady__UNAVAILABLE=1)
    sent = tenant("b/sent", last=10.0, _502=1)
    assert pods([probed, sent]) == [("b/sent", 1)]


def test_every_pod_that_sent_just_before_is_named_too() -> None:
    """A request whose harm comes a moment after its answer: its sender is named beside a busy
    neighbour at Triton, so the agent counts neither alone. Before, only the last sender was
    named, and only when no request was at Triton: the neighbour was counted alone."""
    busy = tenant("d/busy", in_flight=1, last=99.9)
    assert pods([busy, tenant("e/attacker", last=99.0, _200=1)]) == [
        ("d/busy", 1),
        ("e/attacker", 0),
    ]
    assert pods([busy, tenant("e/attacker", last=97.0)]) == [("d/busy", 1)], "past 2 s"
    both = [tenant("a/first", last=98.5, _200=1), tenant("b/last", last=99.0, _200=1)]
    assert pods([*both, tenant("c/long-ago", last=9.0, _200=1)]) == [("a/first", 0), ("b/last", 0)]
    earlier = [tenant("a/earlier", last=96.0, _200=1), tenant("b/last", last=99.0, _200=1)]
    assert pods(earlier) == [("b/last", 0)]
    assert pods(earlier[:1]) == [("a/earlier", 0)], "with none at Triton, the last within 5 s"
    assert pods([tenant("c/long-ago", last=9.0)]) == [], "none within 5 s"


async def test_a_record_adds_the_pods_whose_requests_failed_after_the_snapshot(
    tmp_path: Path,
) -> None:
    """The sentinel's connection closed a moment before the death: the pod whose request Triton
    died under failed after the snapshot, and is named too; a pod answered normally is not, the
    probation lane closed by the failed turn reopens, and the pods named start their clean turns
    over."""
    attacker = tenant("a/attacker", last=99.0)
    tenants = [tenant("b/busy", in_flight=1, last=99.0), attacker, tenant("c/ok", last=99.9)]
    lane = ProbationLane()
    lane.closed = True
    holds_nothing = Restore("127.0.0.1:1", lambda: tenants, hold_seconds=0.0)
    witness = CrashWitness(
        tmp_path / "w.json", "127.0.0.1:1", lambda: tenants, holds_nothing, lane=lane
    )
    snapshot = Witness(50.0, (Suspect("b/busy", "uid-b/busy", "10.0.0.6", "busy", 1),))
    cast(Pod, attacker).metrics.codes[("infer", "502")] = 1
    witness._record(snapshot)
    (recorded,) = read_witnesses(tmp_path / "w.json")
    assert [(s.pod, s.in_flight) for s in recorded.suspects] == [("a/attacker", 1), ("b/busy", 1)]
    assert recorded.at == 50.0 and not lane.closed
    assert [cast(Pod, t).at_exits for t in tenants] == [1, 1, 0], "the lane hears who was there"


async def test_a_quarantined_pods_requests_are_refused_before_they_take_a_slot() -> None:
    limiter = Limiter(4, 4, 1.0)
    limiter.refusal = QuarantinedError("quarantined: ask the operator")
    assert not limiter.try_acquire()
    with pytest.raises(QuarantinedError, match="quarantined"):
        await limiter.acquire()
    assert (limiter.in_flight, limiter.held, limiter.queued) == (0, 0, 0)
    assert http_status(QuarantinedError("x")) == 503
    assert grpc_code(QuarantinedError("x")).name == "FAILED_PRECONDITION"


def test_the_sentinel_reads_hosts_and_ports_as_the_flags_give_them() -> None:
    assert host_and_port("127.0.0.1:8000") == ("127.0.0.1", 8000)
    assert host_and_port("http://triton:8000") == ("triton", 8000)
    assert host_and_port("[::1]:8000") == ("::1", 8000)


async def test_the_sentinel_tells_a_death_from_a_dropped_connection() -> None:
    """An idle close with the port still listening is no death; a close with the port refused
    is one, and the port listening again is Triton back."""
    accepted: asyncio.Queue[asyncio.StreamWriter] = asyncio.Queue()
    writers: list[asyncio.StreamWriter] = []

    async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        accepted.put_nowait(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    seen: list[Any] = []
    back = asyncio.Event()
    gone = asyncio.Event()

    def on_gone(lost: int) -> None:
        seen.append(("gone", lost))
        gone.set()

    def on_back() -> None:
        seen.append("back")
        back.set()

    sentinel = Sentinel(
        f"127.0.0.1:{port}", lambda: len(seen), on_gone, on_back, retry_seconds=0.02
    )
    stop = asyncio.Event()
    task = asyncio.create_task(sentinel.run(stop))
    try:
        async with asyncio.timeout(10):
            (await accepted.get()).close()  # an idle close: the port still listens
            second = await accepted.get()
        assert seen == [] and sentinel.deaths == 0
        server.close()  # the process dies: its port and connections go at once
        second.transport.abort()
        await server.wait_closed()
        async with asyncio.timeout(10):
            await gone.wait()
        assert seen == [("gone", 0)] and sentinel.deaths == 1
        server = await asyncio.start_server(accept, "127.0.0.1", port)
        async with asyncio.timeout(10):
            await back.wait()
        assert seen == [("gone", 0), "back"]
    finally:
        stop.set()
        await task
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()


def held_now(sentinel: Sentinel[int]) -> asyncio.StreamWriter | None:
    """The sentinel's held connection, read afresh (mypy narrows an attribute)."""
    return sentinel.held


async def test_a_closed_sentinel_is_known_before_the_sentinels_turn() -> None:
    """`closed_now` peeks at the held connection's socket: true once Triton's side closed it,
    though the event loop has not read it for the sentinel yet (its reading is paused here),
    and false while it is open."""
    accepted: asyncio.Queue[asyncio.StreamWriter] = asyncio.Queue()

    async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.put_nowait(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    gone, up = asyncio.Event(), asyncio.Event()
    sentinel = Sentinel(
        f"127.0.0.1:{port}", lambda: 0, lambda _: gone.set(), on_up=up.set, retry_seconds=0.02
    )
    stop = asyncio.Event()
    task = asyncio.create_task(sentinel.run(stop))
    try:
        async with asyncio.timeout(10):
            triton_side = await accepted.get()
            await up.wait()
        held = sentinel.held
        assert held is not None and not sentinel.closed_now()
        transport = cast(asyncio.Transport, held.transport)
        transport.pause_reading()
        server.close()  # the process dies
        triton_side.close()
        await server.wait_closed()
        await eventually(sentinel.closed_now, what="the peek seeing the close")
        assert sentinel.held is held and not gone.is_set(), "the sentinel's turn not come"
        transport.resume_reading()
        async with asyncio.timeout(10):
            await gone.wait()
        assert held_now(sentinel) is None and not sentinel.closed_now()
    finally:
        stop.set()
        await task


async def test_a_connection_a_dying_triton_still_accepts_is_the_same_death() -> None:
    """A killed process's port may accept one more connection while its sockets are torn
    down, and then close it: that is no Triton there. Before, the sentinel took it for Triton
    alive (the witness then forgot the requests that had failed by the death) and saw the
    death a second time."""
    writers: list[asyncio.StreamWriter] = []
    first: asyncio.Future[asyncio.StreamWriter] = asyncio.get_running_loop().create_future()
    server: asyncio.Server | None = None

    async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        if not first.done():
            first.set_result(writer)
            return
        assert server is not None
        server.close()  # the port goes as the accepted connection does
        writer.transport.abort()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    seen: list[Any] = []
    gone = asyncio.Event()

    def on_gone(lost: int) -> None:
        seen.append(("gone", lost))
        gone.set()

    sentinel = Sentinel(
        f"127.0.0.1:{port}",
        lambda: len(seen),
        on_gone,
        on_up=lambda: seen.append("up"),
        retry_seconds=0.02,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(sentinel.run(stop))
    try:
        async with asyncio.timeout(10):
            (await first).transport.abort()  # the death closes the sentinel's connection
            await gone.wait()
        assert seen == ["up", ("gone", 1)] and sentinel.deaths == 1
    finally:
        stop.set()
        await task
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()
