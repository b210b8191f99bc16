"""A tenant's connection to the REST relay, beneath its exchanges: the socket and its reading.

`Connection` owns what every tenant connection has, whatever it relays: the transport; reading
paused and resumed (a pipeline past its limit, the exchange's back-pressure, a tenant that does
not read its answers, the pod over its share of the gateway's loop: `throttle`); the relay's
own refusals written and the connection closed; and what the listener and the gateway ask of a
connection (`held_bytes` for the node's byte budget, `shed`, the idle sweep). Its states and the
`Listener` Protocol it reaches the listener through are the REST relay's. `exchange.Exchange`
builds one exchange with Triton on it, and `relay.ClientConnection` the HTTP/1.1 requests on that.

What it must not do: read a request, or decide anything about one.
"""

from __future__ import annotations

import asyncio
from typing import Final, Protocol

from proxy.http1.framing import MAX_HEAD_BYTES, RequestHead, answer_bytes
from proxy.http1.gate import BodyChecks
from proxy.http1.upstream import Upstream, UpstreamPool
from proxy.metrics import ProxyMetrics
from proxy.policy import refusals
from proxy.policy.holdings import SHED_DRAIN_SECONDS
from proxy.policy.limiter import Limiter
from proxy.policy.routing import Answer, Forward, HttpRouter, error_body
from proxy.policy.throttle import Throttle
from proxy.processflags import ProxyState
from proxy.settings import Settings
from proxy.sockets import nodelay
from proxy.table import Served

Prepared = tuple[RequestHead, Forward | Answer, bytes]
"""A parsed head, its routing decision, and the head to send Triton (b"" for a local answer)."""


class Listener(Protocol):
    """What a tenant connection needs from the REST listener (`listener.RestRelay`)."""

    settings: Settings
    limiter: Limiter
    metrics: ProxyMetrics
    state: ProxyState
    models: dict[str, Served]
    router: HttpRouter
    pool: UpstreamPool
    max_body: int
    max_inflated: int
    upstream_address: str
    closing: bool
    connections: set[Connection]

    def prepare(self, block: bytes) -> Prepared:
        """The prepared form of request head `block` (parsed, decided, re-serialized)."""

    def pool_for(self, route: tuple[str, int, int]) -> UpstreamPool:
        """The connections to a relayed model's Service (`table.Served.route`)."""


PIPELINE_LIMIT: Final = 1024 * 1024

# Client connection states.
IDLE: Final = 0  # waiting for a request head
PENDING: Final = 1  # head read, waiting for a concurrency slot or an upstream connection
BODY: Final = 2  # relaying the request body
AWAIT: Final = 3  # request sent, response still coming
CLOSED: Final = 4


class Connection(asyncio.Protocol):
    """One tenant connection's socket (see the module docstring)."""

    def __init__(self, relay: Listener) -> None:
        self._relay = relay
        # The listener's parts every request uses, read once: compiled (mypyc), reading an
        # attribute through the Protocol is a lookup by name every time.
        self._limiter = relay.limiter
        self._metrics = relay.metrics
        self.transport: asyncio.Transport | None = None
        self._buffer = b""
        self._state = IDLE
        self._route = ""
        self._holding = False
        self._started = 0.0
        self._upstream: Upstream | None = None
        self._checks = BodyChecks()  # of a body relayed in pieces (JSON nesting, shapes)
        self._stash: bytes | None = None  # received bytes left for the next turn's counting
        self._keep_alive = True
        self._task: asyncio.Task[None] | None = None
        self._reading_paused = False
        # The pod's share of the gateway's loop (None in the proxy); reading also stops while
        # the pod is over it (`throttle`), whatever the exchange's own back-pressure wants.
        self._share = relay.limiter.share
        self._throttle = Throttle()
        self._charging = False  # inside a read being charged to the share
        # The tenant does not read what is written to it: no request is taken until it does.
        self._write_blocked = False
        self._continuing = False  # a call to `_continue` is scheduled
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = nodelay(transport)
        self._relay.connections.add(self)
        if self._share is not None:
            # Not here: uvloop starts reading an adopted socket after `connection_made` returns,
            # undoing a `pause_reading()` made in it while `_throttle` says paused, and then
            # neither the share nor the tenant's unread answers would stop this connection again.
            asyncio.get_running_loop().call_soon(self._throttle_if_paused)

    def pause_writing(self) -> None:
        self._write_blocked = True
        upstream = self._upstream
        if upstream is not None and upstream.transport is not None:
            upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        self._write_blocked = False
        upstream = self._upstream
        if upstream is not None and upstream.transport is not None:
            upstream.transport.resume_reading()
        if self._state == IDLE and self._buffer:
            self._later()

    def pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            if not self._throttle.on:
                self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None and self._stash is None:
            self._reading_paused = False
            if not self._throttle.on:
                self.transport.resume_reading()

    def throttle(self) -> None:
        """The pod is over its share of the gateway's loop: read nothing until `unthrottle`."""
        self._throttle.engage(self.transport, self._reading_paused)

    def _throttle_if_paused(self) -> None:
        self._throttle.engage_if_stopped(self._share, self.transport, self._reading_paused)

    def unthrottle(self) -> None:
        throttled = self._throttle.release(self.transport, self._reading_paused)
        if throttled and self._state == IDLE and self._buffer:
            self._later()

    def _later(self) -> None:
        """Take the next buffered requests at the next event-loop turn."""
        if not self._continuing:
            self._continuing = True
            asyncio.get_running_loop().call_soon(self._continue)

    def _continue(self) -> None:
        self._continuing = False
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self._state == IDLE and self._buffer and not self._throttle.on:
            if self._reading_paused and not self._pipeline_full():
                self.resume_reading()
            self.data_received(b"")  # as a read: charged to the pod's share

    @property
    def idle(self) -> bool:
        """Between requests, with nothing buffered."""
        return self._state == IDLE and not self._buffer

    def _pipeline_full(self) -> bool:
        """Enough is buffered to stop reading: between requests, a whole head's worth (there is
        a request to take first; answering one copies what follows it, so less is kept); while
        one is waiting or relayed, PIPELINE_LIMIT."""
        return len(self._buffer) > (MAX_HEAD_BYTES if self._state == IDLE else PIPELINE_LIMIT)

    def _release_slot(self) -> None:
        if self._holding:
            self._holding = False
            self._limiter.release()

    def _write_answer(
        self,
        status: int,
        content_type: str,
        body: bytes,
        retry_after: int = 0,
        unanswered: bool = False,
    ) -> None:
        if self.transport is not None:
            self.transport.write(
                answer_bytes(
                    status, content_type, body, not self._keep_alive, retry_after, unanswered
                )
            )
        if not self._keep_alive and self._state != BODY:
            self._close()

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _refuse(self, error: refusals.ProxyError) -> None:
        """Answer a request that cannot be read safely with `error`, and close the connection."""
        status = refusals.http_status(error)
        self._relay.metrics.observe("http", self._route or "unreadable", str(status), 0.0)
        self._keep_alive = False
        if self.transport is not None and self._state != CLOSED:
            self.transport.write(
                answer_bytes(status, "application/json", error_body(str(error)), True)
            )
        self._close()

    def _close(self) -> None:
        self._state = CLOSED
        if self.transport is not None:
            self.transport.close()

    def held_bytes(self) -> int:
        """What this connection holds for its pod now: a request head or pipelined requests not
        yet taken, a body read before a pause, and unsent writes both ways (the gateway's byte
        budget reads it on a timer)."""
        held = len(self._buffer)
        if self._stash is not None:
            held += len(self._stash)
        shapes = self._checks.shapes
        if shapes is not None:
            held += shapes.held
        if self.transport is not None:
            held += self.transport.get_write_buffer_size()
        upstream = self._upstream
        if upstream is not None and upstream.transport is not None:
            held += upstream.transport.get_write_buffer_size()
        return held

    def shed(self, error: refusals.ProxyError) -> None:
        """The pod holds more than its share of the node's byte budget: answer with `error` and
        close, or, mid-exchange at Triton (the answer may have begun), drop the connection."""
        if self._state == IDLE or self._state == PENDING:
            if self._task is not None:
                self._task.cancel()
                self._task = None
            self._release_slot()  # one it got while its connection to Triton was being made
            self._refuse(error)
        transport = self.transport
        if transport is None:
            return
        if self._state != CLOSED:
            transport.abort()  # mid-exchange at Triton: the answer may have begun
        elif transport.get_write_buffer_size():
            # The refusal first; a tenant that does not read it is dropped a moment later.
            asyncio.get_running_loop().call_later(SHED_DRAIN_SECONDS, self._drop, transport)

    def _drop(self, transport: asyncio.Transport) -> None:
        if self in self._relay.connections:  # not yet lost: its refusal is still unread
            transport.abort()

    def close_if_idle(self) -> None:
        """Close between requests (used when the proxy stops)."""
        if self.idle:
            self._close()

    def activity(self) -> object | None:
        """For the idle sweep: None during a request, else when the last one began."""
        return self._started if self.idle else None

    def close_idle(self) -> None:
        """Idle for --idle-timeout: close, as an HTTP/1.1 server may between requests."""
        self._close()
