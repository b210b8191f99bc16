"""One relay per calling pod: the proxy's own REST and gRPC relays, bound to that pod's models.

A `Tenant` is what the gateway serves a caller with: the proxy's `RestRelay` and `GrpcRelay`
(routing, the raw-path grammar, server-wide APIs refused, other models answered like unknown ones,
every gRPC message checked), made for the caller's model and fed the connections the gateway
accepted from the caller's address. Where Triton knows the caller's model by a private name
(`Caller.name_in_triton`), the relays map the public model id in each request to it and back in each
answer. A model host's tenant serves its rows as the proxy serves a table (`proxy.table`): each row
a `Member` with its own limiter (limit, quarantine, probation) and metrics, each mapped to its own
private name, per request; a row that spreads over several replicas of its model (`Caller.spread`)
is an entry of several `Served`, a `Member` each, and each request goes to the one with the fewest
held (`table.Replicas`). Each tenant has its own connections to Triton, so one pod's stalled stream
or slow reader never holds another's; and each has its share of the one event loop (`policy.share`):
while it is over it and other pods are active, its connections stop reading until the round ends, so
its flood waits in its own socket buffers. `Tenants` makes them on a pod's first connection and
drops them, with every open connection, the moment the pod loses its place in the caller table (a
host, its last row). What it must not do: decide who a caller is (`gateway.callerbook`) or accept
sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from functools import partial

from common.callers import Caller
from proxy.grpc.connection import Connection as GrpcConnection
from proxy.grpc.server import GrpcRelay
from proxy.http1.connection import Connection as RestConnection
from proxy.http1.listener import RestRelay
from proxy.metrics import ProxyMetrics
from proxy.policy.holdings import GRACE, ByteBudget
from proxy.policy.inflight import InFlightShares
from proxy.policy.limiter import Limiter
from proxy.policy.probation import PodTurns, ProbationLane
from proxy.policy.refusals import OverBudgetError, ProxyError, QuarantinedError
from proxy.policy.share import LoopShares
from proxy.processflags import ProxyState
from proxy.settings import Settings
from proxy.table import Entry, ModelTable, Replicas, Served

log = logging.getLogger(__name__)

FAILED = frozenset({"502", "UNAVAILABLE"})
"""How the relays answer a request Triton's connection failed under (REST, gRPC)."""

_PAUSE_LOG_SECONDS = 60.0
"""A pod held to its share of the loop is logged once per this period."""


class Member:
    """One replica a calling pod may reach (a row of the caller table, or one of its spread):
    its own limiter (limit, queue, quarantine, turns on probation); its model's metrics. A model
    pod has one; a model host one per replica."""

    def __init__(
        self, caller: Caller, limiter: Limiter, metrics: ProxyMetrics, turns: PodTurns
    ) -> None:
        self.caller = caller
        self.limiter = limiter
        self.metrics = metrics
        self.turns = turns
        """Its pod's turns in the probation lane, which its limiter takes while on probation."""
        self._cleared = False
        """On probation, it left the lane after its clean turns."""
        self._may_clear = True
        """It may leave the lane early (not once named at an exit after it did)."""

    def on_probation(self, caller: Caller) -> None:
        """Follow `caller`'s probation (it is this member's row in all else): its requests take
        its pod's turns in the lane with other probationers' while it is on probation, unless
        it left the lane after its clean turns, and wait while it is held; and its stop (its
        readiness calls answered not ready while it is `stopping`)."""
        self.caller = caller
        if not caller.probation:
            self._cleared = False
            self._may_clear = True
        if caller.probation and self.limiter.probation is None and not self._cleared:
            self._join()
        elif not caller.probation and self.limiter.probation is not None:
            self._leave()
        self.limiter.hold(caller.held, trial=caller.trial, after_restore=caller.probation)
        self.limiter.unready = caller.stopping

    def present_at_exit(self) -> None:
        """The gateway's witness named this pod at Triton's death: its clean turns start
        over; if it had left the lane after them, it takes turns again, and leaves no more
        before its probation ends."""
        if self.limiter.probation is not None:
            self.turns.present(self.limiter)
        elif self.caller.probation and self._cleared:
            self._cleared = self._may_clear = False
            self._join()

    def _join(self) -> None:
        self.limiter.probation = self.turns
        self.turns.join(
            self.limiter,
            lambda: self.metrics.answered_with(FAILED),
            on_clear=self._clear if self._may_clear else None,
        )

    def _clear(self) -> None:
        log.info(
            "Pod %s (%s) had %d clean turns alone at Triton on probation for model %s: its "
            "requests no longer take turns with other probationers' unless it is at another "
            "exit.",
            self.caller.pod,
            self.caller.address,
            self.turns.lane.clean_turns,
            self.caller.model_id,
        )
        self._cleared = True
        self._leave()

    def _leave(self) -> None:
        self.limiter.probation = None
        self.turns.leave(self.limiter)
        self.limiter.lane_opened()  # what waited for the lane goes now

    def leave(self, in_flight: InFlightShares | None) -> None:
        """This model may no longer be reached: out of the node's budgets and the lane."""
        if in_flight is not None:
            in_flight.remove(self.limiter)
        self.limiter.probation = None
        self.turns.leave(self.limiter)

    def retire(self, in_flight: InFlightShares | None) -> None:
        """This replica is picked no more (it drains; its pod stays): out of the lane, and the
        requests waiting in its queue go on through it, as its requests in flight do, within
        its namespace's part of the node's budget (`InFlightShares.retire`), which it leaves
        once they are answered."""
        if in_flight is not None:
            in_flight.retire(self.limiter)
        self._leave()


RelaySettings = Callable[[str, int], Settings]
"""The relay settings for a model id and the concurrency its row declares
(`GatewaySettings.relay_settings`)."""


class Tenant:
    """The relays serving one calling pod: a model pod's, bound to its model as its own proxy
    is, or a model host's, serving the table of its rows (`table.ModelTable`, each entry mapped
    to its row's private name)."""

    def __init__(
        self,
        rows: Mapping[str, Caller],
        settings_for: RelaySettings,
        state: ProxyState,
        shares: LoopShares,
        in_flight: InFlightShares | None = None,
        lane: ProbationLane | None = None,
        on_unknown: Callable[[Member | Tenant], bool] | None = None,
    ) -> None:
        first = next(iter(rows.values()))
        self.rows = dict(rows)
        self.host = len(rows) > 1 or first.replica
        """A model host: its rows are served as a table, even while it has one."""
        self._settings_for = settings_for
        self._in_flight = in_flight
        self._on_unknown = on_unknown
        """Told of a model of the pod that Triton answered it does not have
        (`Limiter.on_unknown`)."""
        self._lane = lane or ProbationLane()
        self.turns = PodTurns(self._lane, first.namespace)
        """The pod's turns in the probation lane: its models' limiters take them as one."""
        self.members: dict[str, Member] = {}
        """Each replica the pod may reach: a row's own by its model id, the others of its
        spread by `<model id>/<name in Triton>` (`_keyed`)."""
        if self.host:
            # The host's own requests naming no model (Triton's health, its metadata).
            settings = settings_for("", 0)
        else:
            # The pod's proxy names the public model id; the gateway alone knows the private
            # name.
            settings = replace(
                settings_for(first.model_id, first.concurrency), triton_name=first.triton_name
            )
        self.limiter = Limiter(
            settings.container_concurrency, settings.queue_limit, settings.queue_timeout_seconds
        )
        """A model pod's model's limiter; a host's for requests naming no model."""
        self.share = self.limiter.share = shares.share(
            self._throttle, self._unthrottle, first.namespace
        )
        self._logged_pause = -_PAUSE_LOG_SECONDS
        self.logged_budget = self.logged_shed = -_PAUSE_LOG_SECONDS
        self._answers_paused = False  # its channels to Triton stopped for the byte budget
        self.metrics = ProxyMetrics(self.limiter, first.model_id if not self.host else "")
        self.table: ModelTable
        """The models the pod may reach: a model pod's one (renamed by its own settings), or a
        host's rows, each with its own limiter and metrics and its private name."""
        if self.host:
            self.table = ModelTable(
                self._served, drain_seconds=0.0, on_remove=self._removed, renames=True
            )
        else:
            self._admit(first, self.limiter, self.metrics)
            self.table = ModelTable.of_one(Served(first.model_id, self.limiter, self.metrics))
        self.rest = RestRelay(settings, self.limiter, self.metrics, state, self.table)
        self.grpc = GrpcRelay(settings, self.limiter, self.metrics, state, self.table)
        self.table.on_change = self.rest.forget_heads
        self.table.set_models([Entry(model) for model in sorted(rows)])

    @property
    def caller(self) -> Caller:
        """The calling pod (a row of it: every row names the same pod and address)."""
        for member in self.members.values():
            return member.caller
        return next(iter(self.rows.values()))

    def _admit(
        self, caller: Caller, limiter: Limiter, metrics: ProxyMetrics, key: str = ""
    ) -> Member:
        if caller.quarantined:
            limiter.refusal = QuarantinedError(caller.quarantined)
        if self._in_flight is not None:
            self._in_flight.add(limiter, caller.namespace)
        member = self.members[key or caller.model_id] = Member(caller, limiter, metrics, self.turns)
        limiter.on_held = partial(self._lane.held.record, caller.namespace)
        if self._on_unknown is not None:
            # The restore holds what `members` lists: a host's member, a model pod's tenant.
            limiter.on_unknown = partial(self._on_unknown, member if self.host else self)
        member.on_probation(caller)
        return member

    def _served(self, entry: Entry) -> Served:
        """A new entry of a host's table: its row's replicas, each with a limiter of its own
        (the row's limit each), and the model's metrics."""
        replicas: list[Served] = []
        for key, replica in _keyed(self.rows[entry.model]):
            metrics = replicas[0].metrics if replicas else None
            replicas.append(self._replica(entry, replica, key, metrics))
        # Even of one: an entry is mapped to its private name once picked, so a prepared
        # request names its public id whichever replicas the row spreads over now or later.
        Replicas(replicas)
        return replicas[0]

    def _replica(
        self, entry: Entry, replica: Caller, key: str, metrics: ProxyMetrics | None
    ) -> Served:
        """One replica of `entry`: its own limiter, admitted as a member; counted in the
        model's `metrics` (made with its first replica)."""
        settings = self._settings_for(entry.model, replica.concurrency)
        limiter = Limiter(
            settings.container_concurrency, settings.queue_limit, settings.queue_timeout_seconds
        )
        if metrics is None:
            metrics = ProxyMetrics(limiter, entry.model, shared=self.metrics)
        else:
            metrics.also(limiter)
        self._admit(replica, limiter, metrics, key)
        return Served(entry.model, limiter, metrics, entry, replica.triton_name)

    def _respread(self, row: Caller) -> None:
        """Follow a row whose spread alone changed: the replicas that stay keep their limiters
        (and what they hold), those that join get theirs, those that leave are picked no more
        (their requests in flight finish); the model's entry and metrics go on."""
        first = self.table.models[row.model_id]
        group = first.replicas
        assert group is not None  # every entry of a host's table
        by_limiter = {served.limiter: served for served in group.members}
        wanted = _keyed(row)
        replicas = []
        for key, replica in wanted:
            member = self.members.get(key)
            served = None if member is None else by_limiter.get(member.limiter)
            replicas.append(served or self._replica(first.entry, replica, key, first.metrics))
        keys = {key for key, _ in wanted}
        for key in [k for k in self.members if k.startswith(f"{row.model_id}/")]:
            if key not in keys:
                member = self.members.pop(key)
                member.retire(self._in_flight)
                first.metrics.drop(member.limiter)
        Replicas(replicas)

    def _removed(self, served: Served) -> None:
        group = [served] if served.replicas is None else served.replicas.members
        limiters = {each.limiter for each in group}
        for name, member in list(self.members.items()):
            if member.limiter in limiters:
                del self.members[name]
                member.retire(self._in_flight)

    def update(self, rows: Mapping[str, Caller]) -> None:
        """Serve `rows` now (a host's replicas came, went, moved or changed; the caller book
        revokes the pod instead when it is another pod or has no row left): a row gone or
        changed is no longer served (its requests in flight finish), a new or changed one is
        served from now on; a row whose spread alone changed goes on (`_respread`). The other
        rows, and the host's connections, are untouched."""
        table = self.table
        if not self.host:
            return
        served = {member.caller.model_id for member in self.members.values()}
        kept = {
            model for model, row in rows.items() if model in served and self.rows[model].alike(row)
        }
        respread = {
            model
            for model, row in rows.items()
            if model in served
            and model not in kept
            and self.rows[model].alike(replace(row, spread=self.rows[model].spread))
        }
        kept |= respread
        for model in sorted(served - set(rows)):
            log.info(
                "Pod %s (%s) may no longer reach model %s: refusing its new requests.",
                self.caller.pod,
                self.caller.address,
                model,
            )
        table.set_models([Entry(model) for model in sorted(kept)])
        # A changed row (another replica of the model, say) is served by a new entry, even
        # while the old one has requests in flight.
        table.retire({model for model in rows if model in served and model not in kept})
        self.rows = dict(rows)
        for model in sorted(respread):
            self._respread(rows[model])
        table.set_models([Entry(model) for model in sorted(rows)])
        for row in rows.values():
            for key, replica in _keyed(row):
                member = self.members.get(key)
                if member is not None and member.caller != replica:
                    member.on_probation(replica)

    def on_probation(self, caller: Caller) -> None:
        """Follow `caller`'s probation (it is the row of one of this pod's models in all
        else), on each of its replicas."""
        for key, replica in _keyed(caller):
            member = self.members.get(key)
            if member is not None:
                member.on_probation(replica)
                if member.limiter.probation is not None:
                    for h2 in self.grpc.connections:  # an idle open stream would hold the lane
                        h2.gate.idle_back()
        self.rows[caller.model_id] = caller

    def present_at_exit(self) -> None:
        """The gateway's witness named this pod at Triton's death (`Member.present_at_exit`)."""
        for member in list(self.members.values()):
            member.present_at_exit()

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
        connections: list[tuple[int, RestConnection | GrpcConnection]] = [
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


def _keyed(row: Caller) -> list[tuple[str, Caller]]:
    """Each replica of `row` with its key among a tenant's members: the row's own by its model
    id (as a row of one replica was before spreads), the others by `<model id>/<name in
    Triton>`, which no model id is (it has a slash)."""
    own, *others = row.replicas()
    return [(row.model_id, own)] + [(f"{row.model_id}/{o.name_in_triton}", o) for o in others]


def members(tenants: Iterable[Tenant]) -> list[Member | Tenant]:
    """Every model of every calling pod: a host's `Member`s; a model pod's tenant, whose
    limiter, metrics and caller are its one model's."""
    return [m for t in tenants for m in (t.members.values() if t.host else (t,))]


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
        self.on_unknown: Callable[[Member | Tenant], bool] | None = None
        """Told of a pod's model that Triton answered it does not have, though the table
        serves it (`gateway.restore.Restore.missing`)."""
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

    def get(self, rows: Mapping[str, Caller], settings_for: RelaySettings) -> Tenant:
        """The tenant for the pod of `rows` (its rows by model id), made on its first
        connection; one whose rows differ follows them first (`rows_changed`)."""
        address = next(iter(rows.values())).address
        tenant = self._by_address.get(address)
        if tenant is not None and tenant.rows != rows:
            self.rows_changed(address, rows)
            tenant = self._by_address.get(address)
        if tenant is None:
            tenant = Tenant(
                rows,
                settings_for,
                self.state,
                self.shares,
                self.in_flight,
                self.probation,
                self.on_unknown,
            )
            self._by_address[address] = tenant
        return tenant

    def probation_changed(self, caller: Caller) -> None:
        """`caller` went on probation or off it: its turns at Triton change, its connections
        stay open."""
        tenant = self._by_address.get(caller.address)
        if tenant is not None:
            tenant.on_probation(caller)

    def rows_changed(self, address: str, rows: Mapping[str, Caller]) -> None:
        """The pod at `address` serves `rows` now. A model host that is still the same pod
        keeps its connections, and each of its models' requests go on as its row says
        (`Tenant.update`); any other pod is dropped, its connections closed."""
        tenant = self._by_address.get(address)
        if tenant is None:
            return
        pod = tenant.caller.pod
        if tenant.host and all(row.replica and row.pod == pod for row in rows.values()):
            tenant.update(rows)
        else:
            self._drop(tenant)

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
                ", ".join(sorted(tenant.rows)),
                tenant.connections,
            )
        if self._by_address.get(caller.address) is tenant:
            del self._by_address[caller.address]
        self.shares.remove(tenant.share)
        for member in list(tenant.members.values()):
            member.leave(self.in_flight)
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
