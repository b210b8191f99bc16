"""The relay mode's gRPC listener: tenant connections, the shared connection to Triton, drain.

Each accepted connection is an `grpc.relay.H2Connection`; the streams of all of them go to Triton on
one `grpc.channel.TritonChannel` (another is opened only when Triton stops taking streams on it:
GOAWAY, its stream limit, or ids used up). Writes are gathered per connection and leave once per
event-loop turn (`mark`, `flush`). On stop every tenant gets GOAWAY (no new streams), open streams
finish up to the grace period, then the connections close. It owns the tasks the connections
start, so none outlives the proxy.
What it must not do: look at frames (that is `grpc.relay`, `grpc.channel`) or decide isolation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Coroutine
from typing import Any

from common.lifecycle import spawn
from proxy.grpc.channel import PerModelRenamingChannel, RenamingChannel, TritonChannel
from proxy.grpc.connection import Connection
from proxy.grpc.outbox import Outbox
from proxy.grpc.relay import H2Connection
from proxy.idle import IdleSweeper
from proxy.metrics import ProxyMetrics
from proxy.policy.limiter import Limiter
from proxy.policy.routing import GrpcRouter
from proxy.processflags import ProxyState
from proxy.settings import Settings
from proxy.sockets import bind
from proxy.table import MeshViews, ModelTable, Served

log = logging.getLogger(__name__)


class GrpcRelay:
    """Listens on the gRPC port; owns the tenant connections and the channels to Triton."""

    def __init__(
        self,
        settings: Settings,
        limiter: Limiter,
        metrics: ProxyMetrics,
        state: ProxyState,
        table: ModelTable,
        mesh: MeshViews | None = None,
    ) -> None:
        self.settings = settings
        self.router = GrpcRouter(
            settings.model_id,
            settings.triton_name,
            table.encoded if mesh is None else mesh.encoded,
            table.private_encoded if table.renames else None,
            table.left_encoded if mesh is None else None,
        )
        self.mesh = mesh is not None
        """The namespace router's port (`proxy.mesh`): a call is opened upstream once its
        message names its model, at the node gateway or at a relayed model's Service."""
        self.listen = settings.listen_grpc
        if mesh is not None and settings.listen_mesh_grpc is not None:
            self.listen = settings.listen_mesh_grpc
        self.route_channels: dict[str, list[TritonChannel]] = {}
        """The router's channels to other models' Services, by host:port."""
        self.limiter = limiter
        """The pod's own limiter (quarantine, the gateway's share); a model pod's model's."""
        self.metrics = metrics
        """Where calls naming no model of the table count; a model pod's model's."""
        self.served: dict[bytes, Served] = table.served if mesh is None else mesh.served
        """Each model's limiter and metrics by encoded model id (the table's, as it changes)."""
        self.state = state
        self.max_message = settings.max_body_bytes
        self.max_inflated = settings.max_inflated_bytes
        self.connections: set[Connection] = set()
        self.idle = IdleSweeper(settings.idle_timeout_seconds, self.connections)
        metrics.listener("grpc" if mesh is None else "mesh-grpc", self.idle)
        self.channels: list[TritonChannel] = []
        self.tasks: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None
        self.closing = False
        """Each call's end sends its connection GOAWAY (the relay stops, or `leave`)."""
        self._dirty: list[Outbox] = []
        self._flush_soon = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unreachable = False
        self.port = 0

    def spawn(
        self, coro: Coroutine[Any, Any, None], name: str = "A gRPC stream waiting for a slot"
    ) -> asyncio.Future[None]:
        """Run `coro` as a task that stop() cancels; a failure is logged (common/lifecycle.py)."""
        return spawn(name, coro, keep=self.tasks)

    # -- writes ----------------------------------------------------------------------------------

    def mark(self, writer: Outbox) -> None:
        """`writer` has bytes to send: they leave when the read being handled is done (`hold`,
        `flush`), or at the end of this event-loop turn."""
        self._dirty.append(writer)
        if not self._flush_soon:
            self._flush_soon = True
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._loop.call_soon(self.flush)

    def hold(self) -> None:
        """Writes from now on wait for the caller's `flush` (the end of its read) rather than the
        end of the turn."""
        self._flush_soon = True

    def flush(self) -> None:
        """Write what every connection gathered."""
        self._flush_soon = False
        while self._dirty:
            dirty, self._dirty = self._dirty, []
            for writer in dirty:
                if writer.dirty:
                    writer.flush()

    # -- channels to Triton ----------------------------------------------------------------------

    def channel(self) -> TritonChannel:
        """The channel a new stream goes on; opened when there is none that takes it."""
        for channel in self.channels:
            if channel.accepts():
                return channel
        router = self.router
        opened: TritonChannel
        if router.renames:
            opened = RenamingChannel(self, router.triton_name, router.model_id.encode())
        elif router.per_model:
            opened = PerModelRenamingChannel(self)
        else:
            opened = TritonChannel(self)
        self.channels.append(opened)
        self.mark(opened.out)
        self.spawn(opened.connect(), "A gRPC channel's connection to Triton")
        return opened

    def route_channel(self, route: tuple[str, int, int]) -> TritonChannel:
        """The channel a relayed model's call goes on, to its Service (`Served.route`)."""
        address = f"{route[0]}:{route[2]}"
        channels = self.route_channels.setdefault(address, [])
        for channel in channels:
            if channel.accepts():
                return channel
        opened = TritonChannel(self, address, keyed=False)
        channels.append(opened)
        self.mark(opened.out)
        self.spawn(opened.connect(), "A gRPC channel's connection to a model's Service")
        return opened

    def forget(self, channel: TritonChannel) -> None:
        """`channel` takes no new streams."""
        with contextlib.suppress(ValueError):
            self.channels.remove(channel)
        with contextlib.suppress(KeyError, ValueError):
            self.route_channels[channel.address].remove(channel)

    def triton_unreachable(self, address: str, error: object) -> None:
        if not self._unreachable:
            self._unreachable = True
            log.warning(
                "Triton's gRPC endpoint %s is unreachable (%s): calls are answered UNAVAILABLE "
                "until it answers again.",
                address,
                error,
            )

    def triton_reachable(self) -> None:
        if self._unreachable:
            self._unreachable = False
            log.info("Triton's gRPC endpoint answers again.")

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start listening."""
        host, port = self.listen
        sock = bind(host, port)
        self.port = sock.getsockname()[1]
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: H2Connection(self), sock=sock, backlog=1024)
        log.info(
            "Relaying Triton gRPC for model %s on port %d.",
            self.settings.model_id or ", ".join(sorted(self.router.model_names())) or "(none yet)",
            self.port,
        )
        self.idle.start()

    async def adopt(self, sock: socket.socket) -> None:
        """Serve a tenant connection another listener accepted (the node gateway's, which
        accepts for many pods and hands each connection to the relay of the pod it came from)."""
        self.idle.start()
        loop = asyncio.get_running_loop()
        await loop.connect_accepted_socket(lambda: H2Connection(self), sock)

    def held_bytes(self) -> int:
        """What this relay holds for its tenant: its connections', and what waits to be written
        to Triton (the gateway's byte budget reads it on a timer, never per call)."""
        held = sum(connection.held_bytes() for connection in self.connections)
        for channel in self._all_channels():
            transport = channel.transport
            if transport is not None:
                held += transport.get_write_buffer_size()
        return held

    def _all_channels(self) -> list[TritonChannel]:
        """The channels to the node gateway and to relayed models' Services."""
        return [*self.channels, *(c for cs in self.route_channels.values() for c in cs)]

    def leave(self, leaving: bool) -> None:
        """While the node pod stops and its gateway takes this pod out of its Service
        (`leaving`): GOAWAY to every tenant now, and to each later one after its call, so that
        clients open their next connection through their Service to another replica; after:
        connections kept again (unless the relay stops)."""
        if leaving:
            self.closing = True
            for connection in list(self.connections):
                connection.go_away()
        elif self._server is not None and self._server.is_serving():
            self.closing = False

    def end_unserved(self) -> None:
        """Models left the table or are listed leaving: the streams of theirs with nothing at
        Triton end now (`gate.StreamGate.end_idle_unserved`), the others after their answers."""
        for connection in list(self.connections):
            connection.gate.end_idle_unserved()

    def abort_all(self) -> None:
        """Drop every tenant connection now, open streams or not (the caller lost its right)."""
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.abort()

    async def stop(self, grace: float | None = None) -> None:
        """GOAWAY to every tenant, let open streams finish (up to `grace` s), close."""
        self.closing = True
        self.idle.stop()
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.go_away()
        grace = self.settings.finish_timeout_seconds if grace is None else grace
        deadline = time.monotonic() + grace
        while True:
            if not any(c.streams for c in self.connections) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        self.flush()
        # Past the grace, what a connection still holds to write (a tenant that stopped
        # reading, a stream's message half sent to Triton) is abandoned: dropped at once, as a
        # close would wait for it to drain.
        for connection in list(self.connections):
            if connection.transport is not None:
                _close_now(connection.transport)
        for channel in self._all_channels():
            self.forget(channel)
            if channel.transport is not None:
                _close_now(channel.transport)
        for task in list(self.tasks):
            task.cancel()
        for task in list(self.tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None


def _close_now(transport: asyncio.Transport) -> None:
    """Close `transport`, dropping what it still holds to write rather than waiting for it."""
    if transport.get_write_buffer_size():
        transport.abort()
    else:
        transport.close()
