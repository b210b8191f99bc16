"""One relay per calling pod: the proxy's own REST and gRPC relays, bound to that pod's model.

A `Tenant` is what the gateway serves a caller with: the proxy's `RestRelay` and `GrpcRelay`
(routing, the raw-path grammar, server-wide APIs refused, other models answered like unknown
ones, every gRPC message checked), made for the caller's model and fed the connections the
gateway accepted from the caller's address. Where Triton knows the caller's model by a private
name (`Caller.name_in_triton`), the relays map the public model id in each request to
it and back in each answer. Each tenant has its own connections to Triton, so one pod's stalled
stream or slow reader never holds another's; and each has its share of the one event loop
(`policy.share`): while it is over it and other pods are active, its connections stop reading
until the round ends, so its flood waits in its own socket buffers. `Tenants` makes them on a
pod's first connection and drops them, with every open connection, the moment the pod loses its
place in the caller table. What it must not do: decide who a caller is (`gateway.callers`) or
accept sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Iterator
from dataclasses import replace

from common.callers import Caller
from proxy.grpc.relay import H2Connection
from proxy.grpc.server import GrpcRelay
from proxy.http1.connection import Connection as RestConnection
from proxy.http1.listener import RestRelay
from proxy.metrics import ProxyMetrics
from proxy.policy.holdings import GRACE, ByteBudget
from proxy.policy.inflight import InFlightShares
from proxy.policy.limiter import Limiter
from proxy.policy.probation import ProbationLane
from proxy.policy.refusals import OverBudgetError, ProxyError, QuarantinedError
from proxy.policy.share import LoopShares
from proxy.settings import Settings
from proxy.state import ProxyState

log = logging.getLogger(__name__)

FAILED = frozenset({"502", "UNAVAILABLE"})
"""How the relays answer a request Triton's connection failed under (REST, gRPC)."""

_PAUSE_LOG_SECONDS = 60.0
"""A pod held to its share of the loop is logged once per this period."""


class Tenant:
    """The relays serving one calling pod."""

    def __init__(
        self,
        caller: Caller,
        settings: Settings,
        state: ProxyState,
        shares: LoopShares,
        in_flight: InFlightShares | None = None,
    ) -> None:
        self.caller = caller
        # The pod's proxy names the public model id; the gateway alone knows the private name.
        settings = replace(settings, triton_name=caller.triton_name)
        self.limiter = Limiter(
            settings.container_concurrency, settings.queue_limit, settings.queue_timeout_seconds
        )
        self.share = self.limiter.share = shares.share(
            self._throttle, self._unthrottle, caller.namespace
        )
        if caller.quarantined:
            self.limiter.refusal = QuarantinedError(caller.quarantined)
        if in_flight is not None:
            in_flight.add(self.limiter, caller.namespace)
        self._logged_pause = -_PAUSE_LOG_SECONDS
        self.logged_budget = self.logged_shed = -_PAUSE_LOG_SECONDS
        self._answers_paused = False  # its channels to Triton stopped for the byte budget
        self._cleared = False
        """On probation, it left the lane after its clean turns."""
        self._may_clear = True
        """It may leave the lane early (not once named at an exit after it did)."""
        self.metrics = ProxyMetrics(self.limiter, caller.model_id)
        self.rest = RestRelay(settings, self.limiter, self.metrics, state)
        self.grpc = GrpcRelay(settings, self.limiter, self.metrics, state)

    def on_probation(self, caller: Caller, lane: ProbationLane) -> None:
        """Follow `caller`'s probation (it is this tenant's caller in all else): its requests
        take turns in `lane` with other probationers' while it is on probation, unless it left
        the lane after its clean turns."""
        self.caller = caller
        if not caller.probation:
            self._cleared = False
            self._may_clear = True
        if caller.probation and self.limiter.probation is None and not self._cleared:
            self._join(lane)
        elif not caller.probation and self.limiter.probation is not None:
            self._leave(lane)

    def present_at_exit(self, lane: ProbationLane) -> None:
        """The gateway's witness named this pod at Triton's death: its clean turns start
        over; if it had left the lane after them, it takes turns again, and leaves no more
        before its probation ends."""
        if self.limiter.probation is not None:
            lane.present(self.limiter)
        elif self.caller.probation and self._cleared:
            self._cleared = self._may_clear = False
            self._join(lane)

    def _join(self, lane: ProbationLane) -> None:
        self.limiter.probation = lane
        lane.join(
            self.limiter,
            lambda: self.metrics.answered_with(FAILED),
            namespace=self.caller.namespace,
            on_clear=(lambda: self._clear(lane)) if self._may_clear and lane.clean_turns else None,
        )

    def _clear(self, lane: ProbationLane) -> None:
        log.info(
            "Pod %s (%s) had %d clean turns alone at Triton on probation: its requests no "
            "longer take turns with other probationers' unless it is at another exit.",
            self.caller.pod,
            self.caller.address,
            lane.clean_turns,
        )
        self._cleared = True
        self._leave(lane)

    def _leave(self, lane: ProbationLane) -> None:
        self.limiter.probation = None
        lane.leave(self.limiter)
        self.limiter.lane_opened()  # what waited for the lane goes now

    @property
    def connections(self) -> int:
        return len(self.rest.connections) + len(self.grpc.connections)

    def _throttle(self) -> None:
        now = time.monotonic()
        # A pause for the node's byte budget is logged by `Tenants.account`.
        if not self.share.held and now - self._logged_pause >= _PAUSE_LOG_SECONDS:
            self._logged_pause = now
            log.info(
                "Pod %s (%s) took more than its share of the gateway's event loop while other "
                "pods were active: its connections stop reading until each round ends "
                "(logged once a minute; tritonshare_gateway_loop_pauses_total counts them all).",
                self.caller.pod,
                self.caller.address,
            )
        for connection in self.rest.connections:
            connection.throttle()
        for h2 in self.grpc.connections:
            h2.throttle()
        if self.share.held and not self._answers_paused:
            # Stopping the pod's reading does not stop Triton answering what it sent already:
            # its answers wait in Triton and the kernel, not here, until the budget lets it go.
            self._answers_paused = True
            for channel in self.grpc.channels:
                if channel.transport is not None:
                    channel.transport.pause_reading()

    def _unthrottle(self) -> None:
        for connection in self.rest.connections:
            connection.unthrottle()
        for h2 in self.grpc.connections:
            h2.unthrottle()
        if self._answers_paused:
            self._answers_paused = False
            for channel in self.grpc.channels:
                if channel.transport is not None:
                    channel.transport.resume_reading()

    def held_bytes(self) -> int:
        """Bytes the gateway holds for this pod now (its connections', both relays)."""
        return self.rest.held_bytes() + self.grpc.held_bytes()

    def shed(self, excess: int, error: ProxyError) -> tuple[int, int]:
        """Answer `error` on and close this pod's largest connections until they held `excess`
        bytes or more; how many connections, and the bytes they held."""
        connections: list[tuple[int, RestConnection | H2Connection]] = [
            (c.held_bytes(), c) for c in self.rest.connections
        ]
        connections += [(c.held_bytes(), c) for c in self.grpc.connections]
        connections.sort(key=lambda pair: pair[0], reverse=True)
        closed = freed = 0
        for held, connection in connections:
            if freed >= excess or not held:
                break
            connection.shed(error)
            closed += 1
            freed += held
        return closed, freed

    async def adopt(self, protocol: str, sock: socket.socket) -> None:
        """Serve an accepted connection of this pod on the `http` or `grpc` relay."""
        await (self.rest if protocol == "http" else self.grpc).adopt(sock)

    def abort(self) -> None:
        """Drop every connection of this pod now."""
        self.rest.abort_all()
        self.grpc.abort_all()

    async def stop(self) -> None:
        """Let in-flight requests finish (up to the finish timeout), then close everything."""
        await asyncio.gather(self.rest.stop(), self.grpc.stop())


class Tenants:
    """The tenants of the pods that have connected, by address."""

    def __init__(
        self,
        state: ProxyState,
        shares: LoopShares,
        in_flight: InFlightShares | None = None,
        probation: ProbationLane | None = None,
    ) -> None:
        self.state = state
        self.shares = shares
        self.in_flight = in_flight
        """The node's in-flight budget split among the namespaces sending, then their pods;
        None: none."""
        self.probation = probation or ProbationLane()
        self._by_address: dict[str, Tenant] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    def __iter__(self) -> Iterator[Tenant]:
        return iter(list(self._by_address.values()))

    def account(self, budget: ByteBudget) -> None:
        """Measure what the gateway holds for each pod and apply the node's byte budget: pods
        past their share stop reading, and those past it for longer than the grace have their
        largest connections answered and closed."""
        tenants = {tenant.share: tenant for tenant in self._by_address.values()}
        shed = budget.measured({share: t.held_bytes() for share, t in tenants.items()})
        now = time.monotonic()
        for tenant in tenants.values():
            if tenant.share.held and now - tenant.logged_budget >= _PAUSE_LOG_SECONDS:
                tenant.logged_budget = now
                log.warning(
                    "Pod %s (%s) holds %d bytes in the gateway, more than its share (%d) of the "
                    "node's byte budget (--max-buffered-bytes=%d), which the gateway has passed: "
                    "its connections stop reading, and past %g s their largest are closed "
                    "(logged once a minute; tritonshare_gateway_budget_* count them).",
                    tenant.caller.pod,
                    tenant.caller.address,
                    budget.held_of(tenant.share),
                    budget.fair_of(tenant.share),
                    budget.limit,
                    GRACE,
                )
        for share, excess in shed:
            tenant = tenants[share]
            error = OverBudgetError(
                f"the node's gateway holds more than its byte budget "
                f"(--max-buffered-bytes={budget.limit}) and this pod more than its share of it "
                f"({budget.fair_of(tenant.share)} bytes, its namespace's part split among its "
                "pods holding bytes): its largest connections are closed. Send each message "
                "whole and promptly, read answers as they come, and hold fewer calls open at "
                "once; the node's operator may raise --max-buffered-bytes"
            )
            closed, freed = tenant.shed(excess, error)
            log.warning(
                "Pod %s (%s) stayed over its share of the node's byte budget for %g s: closed %d "
                "of its connections, which held %d bytes (logged once a minute).",
                tenant.caller.pod,
                tenant.caller.address,
                GRACE,
                closed,
                freed,
            )

    def get(self, caller: Caller, settings: Settings) -> Tenant:
        """The tenant for `caller`, made on its first connection."""
        tenant = self._by_address.get(caller.address)
        if tenant is None or tenant.caller != caller:
            if tenant is not None:
                self._drop(tenant)
            tenant = Tenant(caller, settings, self.state, self.shares, self.in_flight)
            tenant.on_probation(caller, self.probation)
            self._by_address[caller.address] = tenant
        return tenant

    def probation_changed(self, caller: Caller) -> None:
        """`caller` went on probation or off it: its turns at Triton change, its connections
        stay open."""
        tenant = self._by_address.get(caller.address)
        if tenant is not None:
            tenant.on_probation(caller, self.probation)

    def revoke(self, addresses: set[str]) -> None:
        """These addresses lost their place: drop their tenants and every connection at once."""
        for address in addresses:
            tenant = self._by_address.pop(address, None)
            if tenant is not None:
                self._drop(tenant)

    def _drop(self, tenant: Tenant) -> None:
        caller = tenant.caller
        if tenant.connections:
            log.info(
                "Pod %s (%s) may no longer reach model %s: closing its %d connections.",
                caller.pod,
                caller.address,
                caller.model_id,
                tenant.connections,
            )
        self._by_address.pop(caller.address, None)
        self.shares.remove(tenant.share)
        if self.in_flight is not None:
            self.in_flight.remove(tenant.limiter)
        tenant.limiter.probation = None
        self.probation.leave(tenant.limiter)
        tenant.abort()
        task = asyncio.get_running_loop().create_task(
            tenant.stop(), name=f"gateway: closing the relays of {caller.pod}"
        )
        self._stopping.add(task)
        task.add_done_callback(self._stopped)

    def _stopped(self, task: asyncio.Task[None]) -> None:
        self._stopping.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("Closing a revoked pod's relays failed: %s", task.exception())

    async def stop(self) -> None:
        """Stop every tenant (in-flight requests finish up to the finish timeout)."""
        tenants = list(self._by_address.values())
        self._by_address.clear()
        await asyncio.gather(*(t.stop() for t in tenants))
        for task in list(self._stopping):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
