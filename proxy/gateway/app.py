"""The node gateway: the one way from model pods to the node's Triton, which listens on loopback.

Triton binds the node pod's loopback, so nothing outside the node pod reaches it; the gateway, in
the node pod too, listens for the model pods' proxies. The agent's caller table
(`gateway.callerbook`) maps each proven model pod of this node that owns its model to that model,
and each model host to its replicas' models. A connection names its pod by the caller key it sends
first, or by its source address where it sends none (`gateway.identity`); its first bytes are read
once, apart from the accept loop when they are not there yet, bounded in time
(`--caller-key-timeout`), per source address (`--max-silent-connections-per-address`) and in all. A
connection that names no caller is closed before a byte of its protocol is read; one from a caller
is handed to that pod's relays (`gateway.tenants`), which are the proxy's own, bound to the pod's
model. When a pod leaves the table its connections are dropped at once.

Start: read the caller table, listen on the metrics, REST and gRPC ports, follow the table, and
write the activity table (`gateway.activity`) the agent's evictions read. Stop (SIGTERM): stop
accepting, let in-flight requests finish up to the finish timeout, close. A listener that stops
accepting otherwise (its socket no longer listens, its accept loop ended) fails /healthz for good,
so the kubelet restarts a gateway whose model port refuses every pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import struct
import time
from collections.abc import Callable, Mapping

from common.callers import Caller
from common.crashwitness import BESIDE_SECONDS, path_beside
from common.health import HttpServer, build_health_app
from common.lifecycle import Lifecycle, serve
from proxy.gateway.activity import ActivityWriter
from proxy.gateway.callerbook import CallerBook
from proxy.gateway.identity import MAX_WAITING, ClosedError, KeyReader, identify
from proxy.gateway.keep import BACKLOG, Kept
from proxy.gateway.metrics import GatewayMetrics
from proxy.gateway.restore import Restore
from proxy.gateway.settings import GatewaySettings
from proxy.gateway.tenants import Tenants, members
from proxy.gateway.witness import CrashWitness
from proxy.policy.holdings import PERIOD, QUIET_PERIOD, ByteBudget
from proxy.policy.inflight import InFlightShares
from proxy.policy.probation import ProbationLane
from proxy.policy.share import LoopShares
from proxy.processflags import ProxyState
from proxy.sockets import bind, listens

log = logging.getLogger(__name__)

_REFUSAL_LOG_SECONDS = 60.0
"""A refused address is logged once per this period, so a scan cannot flood the log."""
_REMEMBERED_REFUSALS = 4096
_LISTENERS = {"http": "REST", "grpc": "gRPC"}
_KEY_REFUSALS = {
    "address_mismatch": "it presented the caller key of another pod than the one at its address",
    "bad_key": "its first bytes are no caller key of this version",
    "no_key": "it presented no caller key (--caller-identity key)",
    "no_key_in_time": "it sent nothing within --caller-key-timeout",
}


def _call_later(delay: float, callback: Callable[[], None]) -> object:
    return asyncio.get_running_loop().call_later(delay, callback)


def caller_address(peer: object) -> str:
    """The source address of an accepted connection, IPv4-mapped IPv6 written as IPv4."""
    host = str(peer[0]) if isinstance(peer, tuple) and peer else ""
    with contextlib.suppress(ValueError):
        address = ipaddress.ip_address(host.split("%", 1)[0])
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(address)
    return host


class Gateway:
    """Every part of one gateway process."""

    def __init__(self, settings: GatewaySettings, kept: Kept | None = None) -> None:
        self.settings = settings
        self.kept = Kept() if kept is None else kept
        """The listeners and start count a keeper passed (`proxy.gateway.keep`)."""
        self.state = ProxyState()
        shares = LoopShares(settings.loop_busy_percent / 100.0, _call_later)
        in_flight = (
            InFlightShares(settings.max_in_flight_node, _call_later)
            if settings.max_in_flight_node
            else None
        )
        self.tenants = Tenants(
            self.state,
            shares,
            in_flight,
            # A harm left by one probationer's request lands before the next one's turn.
            ProbationLane(clean_turns=settings.probation_clean_turns, gap_seconds=BESIDE_SECONDS),
        )
        self._walk_now = asyncio.Event()
        self.budget = (
            ByteBudget(settings.max_buffered_bytes, shares, on_hold=self._walk_now.set)
            if settings.max_buffered_bytes
            else None
        )
        self.book = CallerBook(
            settings.caller_table,
            max_age=settings.table_max_age_seconds,
            stale_grace=settings.table_stale_grace_seconds,
            on_revoke=self.tenants.revoke,
            on_probation=self._probation_changed,
            on_rows=self._rows_changed,
        )
        self.activity = ActivityWriter(settings.activity_path, self.tenants)
        self.restore = Restore(
            settings.triton_http_url,
            lambda: members(self.tenants),
            settings.restore_hold_seconds,
        )
        self.tenants.on_unknown = self.restore.missing
        self.witness = CrashWitness(
            settings.crash_witness_file or path_beside(settings.caller_table),
            settings.triton_http_url,
            lambda: self.tenants,
            self.restore,
            lane=self.tenants.probation,
        )
        self.metrics = GatewayMetrics(
            self.book,
            lambda: self.tenants,
            self.budget,
            in_flight,
            self.tenants.probation.held,
            starts=self.kept.starts,
        )
        self.ports: dict[str, int] = {}
        self._sockets: dict[str, socket.socket] = {}
        self._health: HttpServer | None = None
        self._refusals: dict[str, float] = {}
        self._accepting: dict[str, asyncio.Task[None]] = {}
        self._listeners: dict[str, str] = {}
        """Each protocol's listener as a log line names it: "REST listener on host:port"."""
        self._down: dict[str, str] = {}
        """Why each listener that stopped accepting did; a listener never comes back."""
        self._stopping: asyncio.Event | None = None
        self._waiting: dict[asyncio.Task[None], str] = {}
        """Connections waiting for their first bytes, oldest first, with their source address."""
        self._silent: dict[str, int] = {}
        """How many of them each source address holds (`--max-silent-connections-per-address`)."""

    def _probation_changed(self, caller: Caller) -> None:
        """A pod's probation or hold changed: follow it, and say so in the activity table at
        once (a watched load waits for it)."""
        self.tenants.probation_changed(caller)
        self.activity.nudge()

    def _rows_changed(self, address: str, rows: Mapping[str, Caller]) -> None:
        self.tenants.rows_changed(address, rows)
        self.activity.nudge()

    def not_ready(self) -> list[str]:
        # Serving a stale table is not ready either, so `kubectl get pods` shows the node pod's
        # trouble; readiness gates no traffic here (proxies reach the gateway by hostPort, not
        # through a Service) and the kubelet restarts only on /healthz (`not_alive`).
        problem = self.book.problem or self.book.stale
        return [problem] if problem else []

    def not_alive(self) -> list[str]:
        """Why the gateway is not alive: each listener that stopped accepting (its accept loop
        ended, its socket no longer listens) while the gateway is not stopping. Asked by /healthz
        only, so no request pays for it."""
        if self._stopping is None or self._stopping.is_set():
            return []
        for protocol, task in self._accepting.items():
            if protocol in self._down:
                continue
            listening = self._sockets[protocol]
            if task.cancelled():
                self._stopped_accepting(protocol, "its accept loop was cancelled")
            elif task.done():
                error = task.exception()
                self._stopped_accepting(protocol, repr(error), error)
            elif listening.fileno() == -1:
                self._stopped_accepting(protocol, "its listening socket is closed")
            elif not listens(listening):
                self._stopped_accepting(protocol, "its socket no longer listens")
        return [
            f"the {self._listeners[p]} stopped accepting: {why}" for p, why in self._down.items()
        ]

    def _stopped_accepting(
        self, protocol: str, why: str, error: BaseException | None = None
    ) -> None:
        if protocol in self._down:
            return
        self._down[protocol] = why
        log.error(
            "The %s stopped accepting (%s): every connection to its port fails, and /healthz "
            "answers 503 so that the kubelet restarts the gateway.",
            self._listeners[protocol],
            why,
            exc_info=error,
        )

    async def start(self, lifecycle: Lifecycle) -> None:
        """Read the table, listen, and spawn the accept loops and the table watch."""
        settings = self.settings
        self.book.check()
        self._stopping = lifecycle.stop_event
        host, port = settings.listen_metrics
        self._health = HttpServer(
            build_health_app(self.metrics.registry, self.not_ready, not_alive=self.not_alive),
            host,
            port,
        )
        await self._health.start()
        self.ports["metrics"] = self._health.port
        lifecycle.on_shutdown("the health server", self._health.stop)
        lifecycle.on_shutdown("the relays", self._stop_relays)
        for protocol, (host, port) in (
            ("http", settings.listen_http),
            ("grpc", settings.listen_grpc),
        ):
            # A keeper's listener, bound on the same address, queued what came while no gateway ran.
            sock = self.kept.listening.pop(protocol, None) or bind(host, port)
            sock.listen(BACKLOG)
            self._sockets[protocol] = sock
            self.ports[protocol] = sock.getsockname()[1]
            where = f"[{host}]" if ":" in host else host
            self._listeners[protocol] = (
                f"{_LISTENERS[protocol]} listener on {where}:{self.ports[protocol]}"
            )
            self._accepting[protocol] = lifecycle.spawn(
                f"gateway {protocol} accept", self._accept(protocol, sock)
            )
        lifecycle.on_shutdown("the listening sockets", self._close_sockets)
        lifecycle.spawn(
            "the caller table watch",
            self.book.run(lifecycle.stop_event, settings.table_poll_seconds),
        )
        lifecycle.spawn("the crash witness", self.witness.run(lifecycle.stop_event))
        lifecycle.on_shutdown("the held requests of a restore", self.restore.stop)
        if self.budget is not None:
            lifecycle.spawn("the byte budget's walk", self._account(self.budget))
        lifecycle.spawn("the activity table", self.activity.run(lifecycle.stop_event))
        log.info(
            "Node gateway: REST on port %d, gRPC on port %d, metrics on port %d, to Triton at %s "
            "and %s; callers from %s (%s).",
            self.ports["http"],
            self.ports["grpc"],
            self.ports["metrics"],
            settings.triton_http_url,
            settings.triton_grpc_url,
            settings.caller_table,
            self.book.problem or f"{len(self.book.callers)} callers",
        )

    async def _accept(self, protocol: str, listening: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, peer = await loop.sock_accept(listening)
            except OSError as e:
                if not listens(listening):
                    if self._stopping is None or not self._stopping.is_set():
                        self._stopped_accepting(protocol, str(e), e)
                    return
                log.warning("Accepting a %s connection failed (%s): retrying.", protocol, e)
                await asyncio.sleep(0.1)
                continue
            address = caller_address(peer)
            if self.state.draining:
                self._refuse(protocol, address, sock)
                continue
            sock.setblocking(False)
            reader = KeyReader(sock)
            try:
                first = reader.step()
            except ClosedError:
                sock.close()
                continue
            if first is None:
                if self._silent.get(address, 0) >= self.settings.max_silent_per_address:
                    # Its address holds its bound of silent connections already: no waiting room
                    # for another, so one address's flood takes none of another's.
                    self._refuse(protocol, address, sock, why="too_many_silent")
                    continue
                # Its first bytes are not here yet: wait for them apart, accepting meanwhile.
                self._wait_for_key(protocol, address, sock, reader)
                continue
            await self._admit(protocol, address, sock, first)

    def _wait_for_key(
        self, protocol: str, address: str, sock: socket.socket, reader: KeyReader
    ) -> None:
        if len(self._waiting) >= MAX_WAITING:
            # The longest-waiting of the address that holds the most: many addresses' floods
            # close their own connections, not a lone caller's.
            most = max(self._silent, key=self._silent.__getitem__)
            oldest = next(t for t, a in self._waiting.items() if a == most)
            self._unwait(oldest)
            oldest.cancel()
        task = asyncio.get_running_loop().create_task(
            self._read_key(protocol, address, sock, reader)
        )
        self._waiting[task] = address
        self._silent[address] = self._silent.get(address, 0) + 1
        task.add_done_callback(self._waiting_done)

    def _unwait(self, task: asyncio.Task[None]) -> None:
        """The connection no longer waits for its first bytes: its address's count drops."""
        address = self._waiting.pop(task, None)
        if address is None:
            return
        left = self._silent[address] - 1
        if left:
            self._silent[address] = left
        else:
            del self._silent[address]

    def _waiting_done(self, task: asyncio.Task[None]) -> None:
        self._unwait(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("Admitting a connection has failed: %s", task.exception())

    async def _read_key(
        self, protocol: str, address: str, sock: socket.socket, reader: KeyReader
    ) -> None:
        loop = asyncio.get_running_loop()
        fd = sock.fileno()
        readable = asyncio.Event()
        loop.add_reader(fd, readable.set)
        try:
            async with asyncio.timeout(self.settings.caller_key_timeout_seconds):
                while (first := reader.step()) is None:
                    readable.clear()
                    await readable.wait()
        except (TimeoutError, ClosedError, asyncio.CancelledError) as e:
            loop.remove_reader(fd)
            if isinstance(e, TimeoutError):
                self._refuse(protocol, address, sock, why="no_key_in_time")
            else:
                sock.close()
            if isinstance(e, asyncio.CancelledError):
                raise
            return
        loop.remove_reader(fd)
        # No longer waiting: neither the bound nor shutdown may cancel it halfway into a relay.
        task = asyncio.current_task()
        if task is not None:
            self._unwait(task)
        await self._admit(protocol, address, sock, first)

    async def _admit(self, protocol: str, address: str, sock: socket.socket, first: bytes) -> None:
        """Serve the connection as its pod's, or refuse it."""
        rows = identify(self.book, self.settings.caller_identity == "key", address, first)
        if isinstance(rows, str):
            self._refuse(protocol, address, sock, why=rows)
            return
        if self.state.draining:
            self._refuse(protocol, address, sock)
            return
        tenant = self.tenants.get(rows, self.settings.relay_settings)
        caller = tenant.caller
        if tenant.connections >= self.settings.max_connections_per_pod:
            self._refuse(protocol, address, sock, why="too_many_connections")
            return
        if tenant.share.held:
            # A new connection reads once before it can be paused (uvloop starts reading
            # after connection_made), so a pod the byte budget stopped opens none: each
            # would bring another read past its share.
            self._refuse(protocol, address, sock, why="over_budget")
            return
        try:
            await tenant.adopt(protocol, sock)
        except OSError as e:
            log.warning("Serving a connection of pod %s failed at once: %s", caller.pod, e)
            sock.close()

    def _refuse(self, protocol: str, address: str, sock: socket.socket, *, why: str = "") -> None:
        # SO_LINGER 0: the peer sees a reset at once rather than an orderly close it might
        # mistake for an answer.
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        reason = why or "not_a_caller"
        if reason == "not_a_caller" and self.book.problem:
            reason = "no_table"
        self.metrics.refused(protocol, reason)
        now = time.monotonic()
        last = self._refusals.get(address)
        if last is not None and now - last < _REFUSAL_LOG_SECONDS:
            return
        if len(self._refusals) >= _REMEMBERED_REFUSALS:
            self._refusals.clear()
        self._refusals[address] = now
        if reason == "too_many_silent":
            said = (
                f"the address already holds {self.settings.max_silent_per_address} connections "
                "that have sent nothing yet (--max-silent-connections-per-address)"
            )
        elif reason == "too_many_connections":
            said = (
                f"the pod already holds {self.settings.max_connections_per_pod} connections "
                "(--max-connections-per-pod)"
            )
        elif reason in _KEY_REFUSALS:
            said = _KEY_REFUSALS[reason]
        elif reason == "over_budget":
            said = (
                "the pod holds more than its share of the node's byte budget "
                "(--max-buffered-bytes) and may open no connection until it holds less"
            )
        else:
            said = self.book.problem or (
                "it is not a model pod that this node's agent placed and that owns its model here"
                + (
                    " (the caller table is stale: no pod is admitted until the agent writes again)"
                    if self.book.stale
                    else ""
                )
            )
        log.warning("Refused a %s connection from %s: %s.", protocol, address, said)

    async def _account(self, budget: ByteBudget) -> None:
        """Measure every pod's holdings each PERIOD while the budget is busy, else each
        QUIET_PERIOD, or at once when a pod is stopped between walks; never sooner than 20 walks'
        time (a walk is linear in connections and streams: walking takes at most 5 % of the
        loop)."""
        while True:
            started = time.perf_counter()
            self.tenants.account(budget)
            spent = time.perf_counter() - started
            self._walk_now.clear()
            if spent > 0.0005:
                await asyncio.sleep(20 * spent)
            if self._walk_now.is_set():
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PERIOD if budget.busy else QUIET_PERIOD):
                    await self._walk_now.wait()

    async def _close_sockets(self) -> None:
        waiting = list(self._waiting)
        for task in (*self._accepting.values(), *waiting):
            task.cancel()
        for task in (*self._accepting.values(), *waiting):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for sock in self._sockets.values():
            sock.close()

    async def _stop_relays(self) -> None:
        self.state.draining = True
        await self.tenants.stop()


def shutdown_seconds(settings: GatewaySettings) -> float:
    """How long stopping may take: the in-flight requests' finish timeout, with 10 s to spare."""
    return settings.finish_timeout_seconds + 10.0


async def run(settings: GatewaySettings, kept: Kept | None = None) -> int:
    """Run until SIGTERM/SIGINT, then stop; the process exit code."""
    return await serve(Gateway(settings, kept), cleanup_timeout=shutdown_seconds(settings))
