"""The relay mode's gRPC listener: accepts tenant connections, and drains them on shutdown.

Each accepted connection is an `h2relay.H2Connection` with its own connection to Triton. On stop
every tenant gets GOAWAY (no new streams), open streams finish up to the grace period, then the
connections close. It owns the tasks the connections start, so none outlives the proxy.
What it must not do: look at frames (that is `h2relay`) or decide isolation (`routing`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any

from proxy.h2relay import H2Connection
from proxy.limiter import Limiter
from proxy.metrics import ProxyMetrics
from proxy.routing import GrpcRouter
from proxy.settings import Settings
from proxy.sockets import bind
from proxy.state import ProxyState

log = logging.getLogger(__name__)


class GrpcRelay:
    """Listens on the gRPC port; owns the tenant connections (each with its Triton connection)."""

    def __init__(
        self, settings: Settings, limiter: Limiter, metrics: ProxyMetrics, state: ProxyState
    ) -> None:
        self.settings = settings
        self.router = GrpcRouter(settings.model_id)
        self.limiter = limiter
        self.metrics = metrics
        self.state = state
        self.max_message = settings.max_body_bytes
        self.connections: set[H2Connection] = set()
        self.tasks: set[asyncio.Future[None]] = set()
        self.started: dict[int, float] = {}
        self._server: asyncio.Server | None = None
        self.port = 0

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
        """Run `coro` as a task that stop() cancels."""
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def start(self) -> None:
        """Start listening."""
        host, port = self.settings.listen_grpc
        sock = bind(host, port)
        self.port = sock.getsockname()[1]
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: H2Connection(self), sock=sock, backlog=1024)
        log.info("Relaying Triton gRPC for model %s on port %d.", self.settings.model_id, self.port)

    async def stop(self, grace: float | None = None) -> None:
        """GOAWAY to every tenant, let open streams finish (up to `grace` s), close."""
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
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()
        for task in list(self.tasks):
            task.cancel()
        for task in list(self.tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
