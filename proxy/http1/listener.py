"""The tenant-facing KServe v2 REST endpoint: an HTTP/1.1 relay on asyncio protocols.

`RestRelay` listens, owns the pool of keep-alive connections to Triton and the tenant connections
(`relay.ClientConnection`, one per tenant connection), and prepares request heads: parsed
strictly (`framing`), decided (`policy.routing`) and re-serialized for Triton once per distinct
head, then kept, because clients send the same head again and again on the hot path (the same
route, headers and body length), and parsing and deciding are pure functions of the head's bytes.

Why not aiohttp's server and client: on these machines their per-request cost made the proxy add
about 0.5 ms and lose half of Triton's throughput; a relay of callbacks, with no task, no body
parsing and no header objects per request on the common path, stays close to a bare TCP relay.
What it must not do: decide isolation itself, or buffer whole bodies.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Final

from proxy.http1.connection import Connection, Prepared
from proxy.http1.framing import parse_request_head
from proxy.http1.relay import ClientConnection
from proxy.http1.renaming import RenamingConnection
from proxy.http1.upstream import UpstreamPool
from proxy.idle import IdleSweeper
from proxy.metrics import ProxyMetrics
from proxy.policy.limiter import Limiter
from proxy.policy.routing import Forward, HttpRouter
from proxy.processflags import ProxyState
from proxy.settings import Settings
from proxy.sockets import bind
from proxy.table import MeshViews, ModelTable, Served

log = logging.getLogger(__name__)

CLOSING_GRACE: Final = 1.0
"""Seconds a stopping relay leaves idle keep-alive connections open, so that a client's next
request is answered (with `Connection: close`) rather than sent on a connection closing under
it; those still idle after it are closed."""
_PREPARED_HEADS: Final = 256
"""Distinct request heads kept; past that the cache starts again (a client varying its heads)."""
_PREPARED_HEAD_BYTES: Final = 4096
"""Larger heads are prepared every time, so the cache holds at most about 1 MiB."""
_ACCEPT_ENCODING: Final = b"accept-encoding"


class RestRelay:
    """Listens on the REST port and owns the upstream pool and the tenant connections."""

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
        self.router = HttpRouter(
            settings.model_id,
            settings.triton_name,
            table.names if mesh is None else mesh.names,
            table.private if table.renames else None,
            table.left if mesh is None else None,
        )
        self.listen = settings.listen_http
        """Where it listens: the REST port, or (`mesh`) the namespace router's."""
        self.route_pools: dict[tuple[str, int], UpstreamPool] = {}
        """The router's connections to other models' Services, by address and port."""
        self.limiter = limiter
        """The pod's own limiter (quarantine, the gateway's share); a model pod's model's."""
        self.metrics = metrics
        """Where requests naming no model of the table count; a model pod's model's."""
        self.models: dict[str, Served] = table.models if mesh is None else mesh.models
        """Each model's limiter and metrics by model id (the table's, followed as it changes;
        the router's: the table's and the relayed ones, `proxy.mesh`)."""
        self.state = state
        self.max_body = settings.max_body_bytes
        self.max_inflated = settings.max_inflated_bytes
        self.upstream_address = settings.triton_http_url
        host, _, port = settings.triton_http_url.rpartition(":")
        self.pool = UpstreamPool(host, int(port), settings.source_address, state)
        self.connections: set[Connection] = set()
        self.idle = IdleSweeper(settings.idle_timeout_seconds, self.connections)
        metrics.listener("http" if mesh is None else "mesh-http", self.idle)
        if mesh is not None and settings.listen_mesh_http is not None:
            self.listen = settings.listen_mesh_http
        self._prepared: dict[bytes, Prepared] = {}
        self.closing = False
        self._server: asyncio.Server | None = None
        self.port = 0

    def prepare(self, block: bytes) -> Prepared:
        """The prepared request head for `block` (the head's bytes before the blank line);
        raises a `policy.refusals.ProxyError` for a head the relay will not forward."""
        prepared = self._prepared.get(block)
        if prepared is None:
            head = parse_request_head(block)
            decision = self.router.decide(head.method, head.target)
            upstream_head = b""
            if isinstance(decision, Forward):
                # Renamed answers must be readable: Triton may compress only for a client that
                # accepts it, and this one does not.
                renames = self.router.renames or self.router.per_model
                drop = _ACCEPT_ENCODING if renames else b""
                upstream_head = head.serialize(decision.path, drop)
            prepared = (head, decision, upstream_head)
            if len(block) <= _PREPARED_HEAD_BYTES:
                if len(self._prepared) >= _PREPARED_HEADS:
                    self._prepared.clear()
                self._prepared[block] = prepared
        return prepared

    def pool_for(self, route: tuple[str, int, int]) -> UpstreamPool:
        """The connections to a relayed model's Service (`Served.route`): no caller key, which
        only the node gateway reads."""
        key = (route[0], route[1])
        pool = self.route_pools.get(key)
        if pool is None:
            pool = self.route_pools[key] = UpstreamPool(key[0], key[1])
        return pool

    def forget_heads(self) -> None:
        """Prepare every head again (the table changed: a model a kept head names may be gone)."""
        self._prepared.clear()

    async def start(self) -> None:
        """Start listening."""
        host, port = self.listen
        sock = bind(host, port)
        self.port = sock.getsockname()[1]
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self.connection, sock=sock, backlog=1024)
        log.info(
            "Serving KServe v2 REST for model %s on port %d.",
            self.settings.model_id or ", ".join(sorted(self.router.names)) or "(none yet)",
            self.port,
        )
        self.idle.start()

    async def adopt(self, sock: socket.socket) -> None:
        """Serve a tenant connection another listener accepted (the node gateway's, which
        accepts for many pods and hands each connection to the relay of the pod it came from)."""
        self.idle.start()
        loop = asyncio.get_running_loop()
        await loop.connect_accepted_socket(self.connection, sock)

    def connection(self) -> ClientConnection:
        """A new tenant connection's protocol; one that renames Triton's answers when Triton
        knows the model by a private name."""
        router = self.router
        if router.renames:
            return RenamingConnection(self, router.triton_name.encode(), router.model_id.encode())
        if router.per_model:
            return RenamingConnection(self, b"", b"", per_model=True)
        return ClientConnection(self)

    def held_bytes(self) -> int:
        """What this relay holds for its tenant (the gateway's byte budget reads it on a timer,
        never per request)."""
        return sum(connection.held_bytes() for connection in self.connections)

    def leave(self, leaving: bool) -> None:
        """While the node pod stops and its gateway takes this pod out of its Service
        (`leaving`): each answer says `Connection: close`, so that clients open their next
        connection through their Service to another replica (an idle connection stays open: a
        close could cross a request already on its way); after: connections kept alive again
        (unless the relay stops)."""
        if leaving:
            self.closing = True
        elif self._server is not None and self._server.is_serving():
            self.closing = False

    def abort_all(self) -> None:
        """Drop every tenant connection now, mid-request or not (the caller lost its right)."""
        self.closing = True
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.abort()

    async def stop(self) -> None:
        """Stop listening; let in-flight exchanges finish (up to the finish timeout), each next
        request answered with `Connection: close` (idle connections closed after
        CLOSING_GRACE); close."""
        self.closing = True
        self.idle.stop()
        if self._server is not None:
            self._server.close()
        started = time.monotonic()
        deadline = started + self.settings.finish_timeout_seconds
        graceful = started + min(CLOSING_GRACE, self.settings.finish_timeout_seconds)
        while True:
            if time.monotonic() >= graceful:
                for connection in list(self.connections):
                    connection.close_if_idle()
            if not self.connections or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        if self.connections:
            log.warning(
                "Closing %d REST connections that were still busy after %.1f s.",
                len(self.connections),
                self.settings.finish_timeout_seconds,
            )
            for connection in list(self.connections):
                if connection.transport is not None:
                    connection.transport.abort()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        self.pool.close()
        for pool in self.route_pools.values():
            pool.close()
