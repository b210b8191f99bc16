"""One tenant's HTTP/1.1 exchanges with the REST relay: requests in order, one at a time.

Built on the exchange with Triton (`exchange.Exchange`: the request sent, its body and the
response passed through), itself on the tenant's socket (`connection.Connection`: reading,
refusals, what the gateway asks).

Feeds what the tenant sent to its request cycle (`cycle.RequestCycle`: pure, it parses each
request head, routes it and has `gate.admit` say what becomes of it) and does what the cycle
says, the I/O around it: the head's timer while a head comes in pieces, an answer here (its body,
if any, read and dropped), a refusal, or the exchange with Triton, once the model's limiter gives
a slot and the pool a connection (waiting for them with reading paused). Triton's answer to a
health or readiness call, which has no body, is held and given the Open Inference Protocol's JSON
body (`HealthBody`); those the proxy answers itself (draining, asleep, parked) have a JSON body
too.

A client that disconnects mid-request aborts its upstream connection, so Triton sees the
cancellation. What it must not do: decide isolation itself, or buffer whole bodies.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Final

from common.lifecycle import spawn
from proxy.http1.answers import with_health_body
from proxy.http1.connection import AWAIT, BODY, CLOSED, IDLE, PENDING, Listener
from proxy.http1.cycle import (
    ANSWER,
    NEED_DATA,
    REFUSE_CLOSE,
    RELAY,
    UNREADABLE,
    RequestCycle,
)
from proxy.http1.exchange import AnswerFilter, Exchange
from proxy.http1.framing import MAX_HEAD_BYTES, ChunkedFraming
from proxy.http1.gate import HEALTH, SLOT_FIRST
from proxy.http1.upstream import Upstream
from proxy.policy import refusals
from proxy.policy.routing import Answer, error_body, health_body
from proxy.reconnect import connect_retrying

LOCAL_ANSWERS_PER_TURN: Final = 16
"""Pipelined requests a connection answers itself (refusals, errors) in one event-loop turn; the
rest wait for the next turn, so a buffer of them (at most PIPELINE_LIMIT and one read) never holds
the loop for long, and each turn is charged to the pod's share of the gateway's loop."""
_clock: Final = time.perf_counter
"""The latency clock (`metrics.observe`), bound once: compiled (mypyc), a C static, where an
imported name is a look-up in the module's dict at each of a request's two calls."""


class ClientConnection(Exchange):
    """One tenant connection: requests in order, one exchange at a time."""

    def __init__(self, relay: Listener) -> None:
        super().__init__(relay)
        self._cycle = RequestCycle(relay)  # what becomes of each request: pure, no I/O

    def connection_lost(self, exc: Exception | None) -> None:
        self._relay.connections.discard(self)
        self._stop_head_timer()
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._state == PENDING:
            self._finish("cancelled")
        elif self._state in (BODY, AWAIT) and not self._response_done:
            # The tenant gave up: abort upstream so Triton stops working for nobody.
            if self._upstream is not None:
                self._upstream.abort()
                self._upstream = None
            self._finish("cancelled")
        self._state = CLOSED

    def data_received(self, data: bytes) -> None:
        share = self._share
        if share is not None and not self._charging:
            # In the gateway: this read, charged to the pod's share of the loop.
            self._charging = True
            cpu = share.cpu
            started = cpu()
            try:
                self.data_received(data)
            finally:
                self._charging = False
                share.charge(started, cpu(), len(data))
            return
        if self._state == BODY:
            if self._stash is not None:  # read before the pause took effect: counted in order
                self._stash += data
                return
            self._relay_body(data, 0)
            return
        self._buffer = self._buffer + data if self._buffer else data
        if self._state == IDLE and not self._write_blocked:
            self._next_request()
            if self._buffer and self._pipeline_full():
                self.pause_reading()
        elif self._pipeline_full():
            self.pause_reading()

    def _next_request(self) -> None:
        relay = self._relay
        cycle = self._cycle
        answered = 0
        while self._state == IDLE and self._buffer:
            if self._write_blocked or answered == LOCAL_ANSWERS_PER_TURN:
                # The tenant reads no answers, or this turn answered enough: the rest waits
                # (`resume_writing`, `_continue`), reading paused past PIPELINE_LIMIT of it.
                if not self._write_blocked:
                    self._later()
                return
            buffer = self._buffer
            started = _clock()
            event = cycle.next_request(buffer)
            if event == NEED_DATA:
                if self._head_timer is None:
                    self._head_timer = asyncio.get_running_loop().call_later(
                        relay.settings.head_timeout_seconds, self._head_timed_out
                    )
                return
            if self._head_timer is not None:  # only for a head that came in pieces
                self._stop_head_timer()
            if event <= UNREADABLE:
                if event == UNREADABLE:
                    self._started = started
                    self._route = cycle.route
                error = cycle.error
                assert error is not None
                self._refuse(error)
                return
            self._started = started
            head = cycle.head
            self._head = head
            self._keep_alive = head.keep_alive and not relay.closing
            self._request_done = self._response_done = False
            self._remaining = head.content_length or 0
            self._chunked = ChunkedFraming() if head.chunked else None
            self._route = cycle.route
            body = cycle.body
            if event == RELAY:
                served = cycle.served
                self._served = served
                self._upstream_head = cycle.upstream_head
                # A model of the namespace served elsewhere (the router's port): to its Service.
                route = served.route if served is not None else None
                self._pool = relay.pool if route is None else relay.pool_for(route)
                limiter = self._limiter = cycle.limiter
                self._metrics = cycle.metrics
                verdict = cycle.verdict
                if verdict == SLOT_FIRST:
                    if not limiter.try_acquire():
                        self._buffer = buffer[body:]
                        self._wait(self._acquire_then_send())
                        return
                    self._holding = True
                upstream = self._pool.take()
                if upstream is None:
                    self._buffer = buffer[body:]
                    self._wait(self._connect_then_send(verdict == HEALTH))
                    return
                self._send(upstream, buffer, body, cycle.verbatim)
                if verdict == HEALTH:
                    self._give_health_body(upstream)
                return  # the request is on its way: the state is no longer IDLE
            self._metrics = cycle.metrics
            if event == REFUSE_CLOSE:
                error = cycle.error
                assert error is not None
                self._refuse(error)
                return
            # Answered here: its body, if any, read and dropped.
            self._buffer = buffer[body:]
            if event == ANSWER:
                self._answer_here(cycle.answer)
            else:
                error = cycle.error
                assert error is not None
                self._answer_refusal(error)
            answered += 1
        if self._reading_paused and self._state == IDLE and not self._write_blocked:
            self.resume_reading()  # what was pipelined past PIPELINE_LIMIT has been answered

    def _answer_here(self, answer: Answer) -> None:
        """Give `answer` (the router's, or `gate.admit`'s), closing after it if it says so."""
        if answer.close:
            self._keep_alive = False
        self._answer_locally(answer.status, answer.content_type, answer.body, answer.retry_after)

    def _give_health_body(self, upstream: Upstream) -> None:
        """Have Triton's answer to the health call just sent on `upstream` reach the tenant
        through a `HealthBody`."""
        head = self._head
        decision = self._cycle.health
        if self._upstream is upstream and head is not None and head.method == "GET":
            upstream.client = HealthBody(
                self,
                health_body(decision.route, decision.model, True),
                health_body(decision.route, decision.model, False),
            )

    def _wait(self, coro: Any) -> None:
        self._state = PENDING
        self.pause_reading()
        self._task = spawn("A REST request waiting for a slot or a connection to Triton", coro)

    async def _acquire_then_send(self) -> None:
        try:
            await self._limiter.acquire()
        except refusals.ProxyError as e:
            self._metrics.rejected(type(e).__name__)
            self._answer_refusal(e)
            self._resume()
            return
        self._holding = True
        upstream = self._pool.take()
        if upstream is None:
            await self._connect_then_send()
        else:
            self._send(upstream, self._buffer, 0)

    async def _connected(self) -> Upstream | str | None:
        """A new connection to Triton (through the node gateway): refused, the gateway or
        Triton restarts (or the gateway's process ended under the request, its keeper still
        listening), and it waits. Else why not, to answer; None: the tenant left meanwhile."""
        try:
            upstream = await connect_retrying(
                self._pool.connect,
                self._relay.settings.connect_retry_seconds,
                restoring=self._restoring,
            )
        except OSError as e:
            address = self._relay.upstream_address
            return f"Triton at {address} is unreachable ({e.strerror}); retry soon"
        if self._state == CLOSED:
            self._pool.put(upstream)
            return None
        return upstream

    async def _connect_then_send(self, health: bool = False) -> None:
        upstream = await self._connected()
        if isinstance(upstream, str):
            self._release_slot()
            self._answer_refusal(refusals.UpstreamError(upstream))
            self._resume()
            return
        if upstream is None:
            return
        self._send(upstream, self._buffer, 0)
        if health:
            self._give_health_body(upstream)

    def _send_again(self, request: bytes) -> None:
        self._wait(self._connect_then_resend(request))

    async def _connect_then_resend(self, request: bytes) -> None:
        upstream = await self._connected()
        if isinstance(upstream, str):
            self._task = None
            self._answer_failure(upstream)
        elif upstream is not None:
            self._resent(upstream, request)

    def _restoring(self) -> tuple[asyncio.Event, float] | None:
        """The restore of the request's model a refused connection waits for (the node
        gateway's, `gateway.restore`), if one is under way."""
        restoring = self._limiter.restoring
        return None if restoring is None else (restoring, self._limiter.restore_seconds)

    def _resume(self) -> None:
        self._task = None
        if self._state == IDLE:
            self.resume_reading()
            self._next_request()

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._state == IDLE and self._buffer:
            timeout = self._relay.settings.head_timeout_seconds
            self._refuse(
                refusals.HeadTimeoutError(f"the request head did not arrive within {timeout:g} s")
            )

    def _answer_refusal(self, error: refusals.ProxyError) -> None:
        """Answer the request with `error` (its status from `policy.refusals`); the connection
        goes on."""
        self._answer_locally(
            refusals.http_status(error),
            "application/json",
            error_body(str(error)),
            refusals.retry_after(error),
        )


class HealthBody(AnswerFilter):
    """Between an upstream connection and the tenant connection for one health or readiness
    call: holds Triton's answer (a few bytes) and passes it on whole with the protocol's JSON
    body (`answers.with_health_body`). An answer past MAX_HEAD_BYTES passes as it comes."""

    __slots__ = ("_held", "_not_ready", "_ready")

    def __init__(self, client: ClientConnection, ready: bytes, not_ready: bytes) -> None:
        super().__init__(client)
        self._ready = ready
        self._not_ready = not_ready
        self._held: bytes | None = b""
        """Triton's answer so far; None once it passes as it comes."""

    def relay_response(self, data: bytes) -> None:
        held = self._held
        if held is None:
            self._client.relay_response(data)
        elif len(held) + len(data) > MAX_HEAD_BYTES:
            self._held = None
            self._client.relay_response(held + data)
        else:
            self._held = held + data

    def response_complete(self, upstream: Upstream, data: bytes, reusable: bool) -> None:
        held = self._held
        if held is not None:
            data = with_health_body(held + data, self._ready, self._not_ready)
        self._client.response_complete(upstream, data, reusable)
