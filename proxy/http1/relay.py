"""One tenant's HTTP/1.1 exchanges with the REST relay: requests in order, one at a time.

Built on the tenant's socket (`connection.Connection`: reading, refusals, what the gateway asks).

Reads each request head (parsed strictly by `framing`, decided by `policy.routing`, both through the
listener's cache of prepared heads; a connection also remembers its last head as prepared, since
keep-alive clients repeat theirs; admitted by `gate`), then either answers locally or relays the
request to Triton over a pooled keep-alive connection (`upstream`): the head as re-serialized from
what was checked (the received bytes themselves when they are the same), the body and the whole
response passed through verbatim, chunk by chunk as they arrive, so server-sent events stream and a
1 GiB body is never held in memory; back-pressure pauses the sending side. A compressed body
(Content-Encoding gzip or deflate, which Triton inflates whole and unbounded) is counted as it
passes (`policy.inflation`: in slices, at most BUDGET inflated bytes per event-loop turn, reading
paused meanwhile), and each piece goes on only once counted: one that inflates past --max-inflated
is refused (413) and its upstream connection aborted before Triton has it whole. A body's JSON
nesting and inputs' shapes are checked by `gate` (whole, or as it passes), its last piece going on
only once they passed. Triton's answer to a health or readiness call, which has no body, is held
and given the Open Inference Protocol's JSON body (`HealthBody`); those the proxy answers itself
(draining, asleep, parked) have a JSON body too.

A client that disconnects mid-request aborts its upstream connection, so Triton sees the
cancellation. What it must not do: decide isolation itself, or buffer whole bodies.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Final

from common.lifecycle import spawn
from proxy.http1.answers import with_health_body
from proxy.http1.connection import (
    AWAIT,
    BODY,
    CLOSED,
    IDLE,
    PENDING,
    Connection,
    Listener,
    Prepared,
)
from proxy.http1.framing import MAX_HEAD_BYTES, ChunkedFraming, RequestHead
from proxy.http1.gate import ADMITTED, check_whole, head_refusal, too_large
from proxy.http1.upstream import Upstream
from proxy.policy import refusals
from proxy.policy.inflation import BUDGET, Inflation
from proxy.policy.routing import (
    JSON,
    NOT_FOUND,
    Answer,
    Forward,
    error_body,
    health_body,
    parked_message,
)
from proxy.reconnect import connect_retrying
from proxy.table import Served

log = logging.getLogger(__name__)

LOCAL_ANSWERS_PER_TURN: Final = 16
"""Pipelined requests a connection answers itself (refusals, errors) in one event-loop turn; the
rest wait for the next turn, so a buffer of them (at most PIPELINE_LIMIT and one read) never holds
the loop for long, and each turn is charged to the pod's share of the gateway's loop."""
_clock: Final = time.perf_counter
"""The latency clock (`metrics.observe`), bound once: compiled (mypyc), a C static, where an
imported name is a look-up in the module's dict at each of a request's two calls."""
_MODELS_PATH: Final = b" /v2/models/"
"""What precedes the model's name in the request line of a per-model route (`_renamed_head`)."""
_KNOWN_HEAD_BYTES: Final = 4096
"""The largest request head a connection remembers as its last one (as the listener's cache)."""
_NOTHING_KNOWN: Final[Prepared] = (RequestHead("", "", b"", (), None, False, False), NOT_FOUND, b"")
"""Stands for the last head until there is one (never read: `_known` is empty until then)."""


class ClientConnection(Connection):
    """One tenant connection: requests in order, one exchange at a time."""

    def __init__(self, relay: Listener) -> None:
        super().__init__(relay)
        self._pool = relay.pool
        self._head: RequestHead | None = None
        self._upstream_head = b""
        self._sink: Upstream | None = None
        self._remaining = 0
        self._chunked: ChunkedFraming | None = None
        self._inflation: Inflation | None = None  # counting a compressed body
        self._request_done = False
        self._response_done = False
        # The last request head read on this connection, with its blank line, as prepared:
        # keep-alive clients send the same head again and again.
        self._known = b""
        self._known_prepared = _NOTHING_KNOWN
        self._known_verbatim = False
        self._served: Served | None = None
        """The table's entry of the model the exchange names; None: a server-wide route."""

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
        answered = 0
        while self._state == IDLE and self._buffer:
            if self._write_blocked or answered == LOCAL_ANSWERS_PER_TURN:
                # The tenant reads no answers, or this turn answered enough: the rest waits
                # (`resume_writing`, `_continue`), reading paused past PIPELINE_LIMIT of it.
                if not self._write_blocked:
                    self._later()
                return
            buffer = self._buffer
            known = self._known
            if known and buffer.startswith(known):
                # The same head as this connection's last request (the same bytes up to and
                # including the blank line, so its end is found at the same place): as prepared.
                head_end = len(known) - 4
                prepared = self._known_prepared
                verbatim = self._known_verbatim
                if self._head_timer is not None:  # only for a head that came in pieces
                    self._stop_head_timer()
                self._started = _clock()
            else:
                head_end = buffer.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES + 4)
                if head_end < 0:
                    if len(buffer) > MAX_HEAD_BYTES:
                        self._refuse(
                            refusals.HeadTooLargeError(
                                "the request head is over 64 KiB; send smaller headers"
                            )
                        )
                    elif self._head_timer is None:
                        self._head_timer = asyncio.get_running_loop().call_later(
                            relay.settings.head_timeout_seconds, self._head_timed_out
                        )
                    return
                if self._head_timer is not None:
                    self._stop_head_timer()
                self._started = _clock()
                self._route = "unreadable"
                try:
                    prepared = relay.prepare(buffer[:head_end])
                except refusals.ProxyError as e:
                    self._refuse(e)
                    return
                verbatim = False
                # Only a forward: an answer (a model not in the table) may change as the host's
                # table does, and a forward whose model leaves it is decided again below.
                if head_end <= _KNOWN_HEAD_BYTES and isinstance(prepared[1], Forward):
                    self._known = buffer[: head_end + 4]
                    self._known_prepared = prepared
                    # Re-serializing gave the same bytes (as with clients that send the framing
                    # header last): the head can go to Triton as received, without a copy.
                    self._known_verbatim = prepared[2] == self._known
            head, decision, self._upstream_head = prepared
            body = head_end + 4
            self._head = head
            self._keep_alive = head.keep_alive and not relay.closing
            self._request_done = self._response_done = False
            self._remaining = length = head.content_length or 0
            self._chunked = ChunkedFraming() if head.chunked else None
            self._route = decision.route
            # Below, `self._buffer` keeps what follows the head whenever the request does not go
            # to Triton at once: `_send` takes the buffer as it is.
            if isinstance(decision, Answer):
                self._metrics = relay.metrics
                self._buffer = buffer[body:]
                if decision.close:
                    self._keep_alive = False
                self._answer_locally(decision.status, decision.content_type, decision.body)
                answered += 1
                continue
            # The model's own limiter and metrics: one look-up, whatever the table's size.
            served = relay.models.get(decision.model) if decision.model else None
            if served is not None and served.replicas is not None and served.draining_since is None:
                # One of several replicas (the node gateway's host), named once picked.
                served = served.replicas.pick()
                self._upstream_head = _renamed_head(self._upstream_head, served)
                verbatim = False
            self._served = served
            if served is not None and served.draining_since is None:
                self._limiter = served.limiter
                self._metrics = served.metrics
            elif decision.model:
                # Its model left the table since this head was prepared: as for any other name.
                gone = relay.router.decide(head.method, head.target)
                if isinstance(gone, Answer):
                    self._metrics = relay.metrics
                    self._buffer = buffer[body:]
                    if gone.close:
                        self._keep_alive = False
                    self._answer_locally(gone.status, gone.content_type, gone.body)
                    answered += 1
                    continue
            else:
                self._limiter = relay.limiter
                self._metrics = relay.metrics
            if length > ADMITTED or length > relay.max_body or head.chunked:
                refused = head_refusal(head, decision, relay.max_body)
            else:
                refused = None  # most requests: nothing `head_refusal` could refuse
            if refused is not None:
                error, close = refused
                if close:
                    self._refuse(error)
                    return
                # Answered before the body is read (then read and dropped).
                self._buffer = buffer[body:]
                self._answer_refusal(error)
                answered += 1
                continue
            if self._limiter.refusal is not None:
                # A pod the node quarantined: every request, its readiness too, so that its
                # pod is not ready and its Service sends elsewhere.
                self._buffer = buffer[body:]
                self._answer_refusal(self._limiter.refusal)
                answered += 1
                continue
            parked = served is not None and served.entry.parked
            if decision.health:
                if self._health(decision, served, parked, buffer, body, verbatim):
                    answered += 1
                    continue
                return  # the request is on its way: the state is no longer IDLE
            if decision.limited or parked:  # a parked model's calls wait for its wake
                if not self._limiter.try_acquire():
                    self._buffer = buffer[body:]
                    self._wait(self._acquire_then_send())
                    return
                self._holding = True
            upstream = self._pool.take()
            if upstream is None:
                self._buffer = buffer[body:]
                self._wait(self._connect_then_send())
                return
            self._send(upstream, buffer, body, verbatim)
            return  # the request is on its way: the state is no longer IDLE
        if self._reading_paused and self._state == IDLE and not self._write_blocked:
            self.resume_reading()  # what was pipelined past PIPELINE_LIMIT has been answered

    def _health(
        self,
        decision: Forward,
        served: Served | None,
        parked: bool,
        buffer: bytes,
        body: int,
        verbatim: bool,
    ) -> bool:
        """A health or readiness call: answered here when the proxy knows the answer (True),
        else sent to Triton, whose answer gets the protocol's JSON body (`HealthBody`)."""
        state = self._relay.state
        if decision.readiness and state.draining:
            self._buffer = buffer[body:]
            self._answer_locally(
                503, JSON, error_body("the model proxy is shutting down: use another replica")
            )
            return True
        if decision.readiness and state.model_asleep:
            # Triton no longer has the on-demand model loaded; its next request wakes it,
            # so the pod stays ready for its Service.
            self._buffer = buffer[body:]
            self._answer_locally(200, JSON, health_body(decision.route, decision.model, True))
            return True
        if parked and decision.route == "ready":
            assert served is not None
            self._buffer = buffer[body:]
            self._answer_locally(400, JSON, error_body(parked_message(served.model_id)))
            return True
        upstream = self._pool.take()
        if upstream is None:
            self._buffer = buffer[body:]
            self._wait(self._connect_then_send(decision))
            return False
        self._send(upstream, buffer, body, verbatim)
        self._give_health_body(upstream, decision)
        return False

    def keep_alive_ends(self) -> None:
        """The connection closes after this exchange (its answer says so)."""
        self._keep_alive = False

    def _give_health_body(self, upstream: Upstream, decision: Forward) -> None:
        """Have Triton's answer to the health call just sent on `upstream` reach the tenant
        through a `HealthBody`."""
        head = self._head
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
        upstream = self._relay.pool.take()
        if upstream is None:
            await self._connect_then_send()
        else:
            self._send(upstream, self._buffer, 0)

    async def _connect_then_send(self, health: Forward | None = None) -> None:
        try:
            # Refused: the gateway (or Triton) restarts; the request has not left, so it waits.
            upstream = await connect_retrying(
                self._relay.pool.connect,
                self._relay.settings.connect_retry_seconds,
                restoring=self._restoring,
            )
        except OSError as e:
            self._release_slot()
            address = self._relay.upstream_address
            self._answer_refusal(
                refusals.UpstreamError(
                    f"Triton at {address} is unreachable ({e.strerror}); retry soon"
                )
            )
            self._resume()
            return
        if self._state == CLOSED:
            self._relay.pool.put(upstream)
            return
        self._send(upstream, self._buffer, 0)
        if health is not None:
            self._give_health_body(upstream, health)

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

    def _send(self, upstream: Upstream, buffer: bytes, start: int, verbatim: bool = False) -> None:
        """Send the request on `upstream`: the prepared head, then the body, which begins at
        `buffer[start]`; `verbatim` when `buffer[:start]` is the head as received and the same
        bytes as the prepared one."""
        head = self._head
        assert head is not None
        self._task = None
        self._upstream = upstream
        self._buffer = b""
        end = start + self._remaining
        if head.encoding:
            self._inflation = Inflation(
                head.encoding, self._relay.max_inflated, "the request body", "--max-inflated"
            )
        if self._chunked is None and len(buffer) >= end and not head.encoding:
            try:
                check_whole(buffer, start, end, head, self._route)
            except refusals.ProxyError as e:
                upstream.abort()
                self._upstream = None
                self._release_slot()
                self._refuse(e)
                return
            # The whole request is here: one write, one segment to Triton (`_body_done`, inline:
            # no response can have come yet).
            if verbatim:
                request = buffer if end == len(buffer) else buffer[:end]
            elif end > start:
                request = self._upstream_head + buffer[start:end]
            else:
                request = self._upstream_head
            upstream.begin(self, head.method == "HEAD", request)
            self._remaining = 0
            self._request_done = True
            if end < len(buffer):
                self._buffer = buffer[end:]
            self._state = AWAIT
        else:
            upstream.begin(self, head.method == "HEAD", self._upstream_head)
            self._state = BODY
            self._sink = upstream
            self._checks.begin(head, self._route, self._remaining)
            self._relay_body(buffer, start)
        if head.keep_alive and (self._relay.closing or _leaving(self._served)):
            # The tenant's client is told to reconnect (through its Service, which no longer
            # routes here) before its next request, rather than finding the connection closed.
            upstream.client = ClosingAnswer(self)
        if self._reading_paused:  # paused while it waited for a slot or a connection
            self.resume_reading()

    def _relay_body(self, data: bytes, start: int) -> None:
        if self._inflation is not None:
            self._relay_compressed(data, start)
            return
        try:
            if self._chunked is None:
                step = min(self._remaining, len(data) - start)
                self._remaining -= step
                end = start + step if self._remaining == 0 else -1
                if self._sink is not None:
                    self._checks.plain(data, start, step, end >= 0)
            else:
                checks = self._checks
                shapes = checks.shapes if self._sink is not None else None
                end = self._chunked.feed(data, start, None if shapes is None else shapes.feed)
                if self._chunked.payload > self._relay.max_body:
                    raise refusals.BodyTooLargeError(too_large(self._relay.max_body))
                if checks.nesting is not None and self._sink is not None:
                    # The chunks' framing (extensions may hold quotes) is not JSON: only their
                    # openings are counted, which bounds the depth however they are framed.
                    checks.nesting.count(data, start, len(data) if end < 0 else end)
                if shapes is not None and end >= 0:
                    checks.shapes = None
                    shapes.check(self._chunked.payload)
        except refusals.ProxyError as e:
            self._checks.shapes = None
            if self._upstream is not None:
                self._upstream.abort()
                self._upstream = None
            self._release_slot()
            self._refuse(e)
            return
        stop = len(data) if end == -1 else end
        if self._sink is not None and stop > start:
            self._sink.write(data if start == 0 and stop == len(data) else data[start:stop])
        if end >= 0:
            self._body_done(data, end)

    def _relay_compressed(self, data: bytes, start: int) -> None:
        """`_relay_body` for a compressed body (Content-Length framed): each piece goes to Triton
        only once its inflated size is counted; past the budget, the rest waits for the next
        event-loop turn with reading paused."""
        counting = self._inflation
        assert counting is not None
        step = min(self._remaining, len(data) - start)
        piece = data if start == 0 and step == len(data) else data[start : start + step]
        try:
            taken = counting.feed(piece, BUDGET, self._checks.inflated)
            if taken == self._remaining:
                counting.finish()
                shapes = self._checks.shapes
                if shapes is not None:  # checked before the last piece goes
                    self._checks.shapes = None
                    shapes.check(counting.size)
        except refusals.ProxyError as e:
            self._inflation = None
            self._checks.shapes = None
            if self._upstream is not None:
                self._upstream.abort()  # Triton never gets the rest: it inflates nothing
                self._upstream = None
            self._release_slot()
            # Answered now, the rest of the body read and dropped, then the connection closed:
            # closing on unread bytes would reset it, and the client might never read why.
            status = refusals.http_status(e)
            self._metrics.observe("http", self._route, str(status), 0.0)
            self._keep_alive = False
            self._response_done = True
            self._sink = None
            self._write_answer(status, "application/json", error_body(str(e)))
            self._relay_body(data, start)
            return
        self._remaining -= taken
        if self._sink is not None and taken:
            self._sink.write(piece if taken == len(piece) else piece[:taken])
        if not self._remaining:
            self._inflation = None
            self._body_done(data, start + taken)
        elif taken < step:
            self._stash = data[start + taken :]
            self.pause_reading()
            asyncio.get_running_loop().call_soon(self._count_stash)

    def _count_stash(self) -> None:
        """The next event-loop turn: go on counting what was left."""
        data = self._stash
        self._stash = None
        if data is None or self._state != BODY or self._inflation is None:
            return
        self._relay_body(data, 0)
        if self._stash is None:
            self.resume_reading()

    def _body_done(self, data: bytes, end: int) -> None:
        self._request_done = True
        self._sink = None
        self._checks.end()
        rest = data[end:] if end < len(data) else b""
        if rest:
            self._buffer = rest + self._buffer if self._buffer else rest
        if self._response_done:
            self._state = IDLE
            self._after_exchange()
        else:
            self._state = AWAIT

    def relay_response(self, data: bytes) -> None:
        """Bytes of Triton's response, passed through as they come."""
        if self.transport is not None and self._state != CLOSED:
            self.transport.write(data)

    def response_complete(self, upstream: Upstream, data: bytes, reusable: bool) -> None:
        """Triton finished its response with `data`, passed through as it is."""
        if self._state == CLOSED:
            upstream_transport = upstream.transport
            if upstream_transport is not None:
                upstream_transport.close()
            self._response_done = True
            self._upstream = None
            self._finish(upstream.code)
            return
        if data and self.transport is not None:
            self.transport.write(data)
        self._response_done = True
        self._upstream = None
        if not upstream.keep_alive:
            self._keep_alive = False
        # `_finish`, inline: this runs once per request.
        if self._holding:
            self._holding = False
            self._limiter.release()
        self._metrics.observe("http", self._route, upstream.code, _clock() - self._started)
        if not self._request_done:
            if upstream.transport is not None:
                upstream.transport.close()
            self._sink = None  # Triton answered early: read and drop the rest of the body
            return
        if reusable:
            self._pool.put(upstream)
        elif upstream.transport is not None:
            upstream.transport.close()
        self._state = IDLE
        # `_after_exchange`, inline.
        if not self._keep_alive:
            self._close()
        else:
            if self._reading_paused:
                self.resume_reading()
            if self._buffer:
                self._next_request()

    def upstream_failed(self, upstream: Upstream, reason: str) -> None:
        """The upstream connection broke before the response was complete."""
        self._upstream = None
        self._sink = None
        if self._state == CLOSED:
            return
        self._response_done = True
        if upstream.code:  # the response had begun
            self._finish("502")
            if self.transport is not None:
                self.transport.abort()  # the tenant must not mistake a cut answer for a whole one
            return
        error = refusals.UpstreamError(
            f"Triton at {self._relay.upstream_address} failed: {reason}; retry shortly"
        )
        status = refusals.http_status(error)
        self._finish(str(status))
        self._keep_alive = False
        self._write_answer(status, "application/json", error_body(str(error)))

    def _finish(self, code: str) -> None:
        if self._holding:  # `_release_slot`, inline: this runs once per request
            self._holding = False
            self._limiter.release()
        self._metrics.observe("http", self._route, code, _clock() - self._started)

    def _after_exchange(self) -> None:
        if not self._keep_alive:
            self._close()
            return
        # Checked here rather than in the calls: after most exchanges reading was never paused
        # and nothing of the next request has arrived yet.
        if self._reading_paused:
            self.resume_reading()
        if self._buffer:
            self._next_request()

    def _answer_locally(
        self, status: int, content_type: str, body: bytes, retry_after: int = 0
    ) -> None:
        """Answer without Triton, then skip the request's body (if any)."""
        self._metrics.observe("http", self._route, str(status), _clock() - self._started)
        self._response_done = True
        self._sink = None
        self._write_answer(status, content_type, body, retry_after)
        if self._state == CLOSED:
            return
        head = self._head
        if head is not None and (head.content_length or head.chunked):
            self._state = BODY
            buffer = self._buffer
            self._buffer = b""
            self._relay_body(buffer, 0)
            if self._state == BODY:
                self.resume_reading()
        else:
            self._state = IDLE
            if not self._keep_alive:
                self._close()

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


class HealthBody:
    """Between an upstream connection and the tenant connection for one health or readiness
    call: holds Triton's answer (a few bytes) and passes it on whole with the protocol's JSON
    body (`answers.with_health_body`). An answer past MAX_HEAD_BYTES passes as it comes."""

    __slots__ = ("_client", "_held", "_not_ready", "_ready")

    def __init__(self, client: ClientConnection, ready: bytes, not_ready: bytes) -> None:
        self._client = client
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

    def upstream_failed(self, upstream: Upstream, reason: str) -> None:
        self._client.upstream_failed(upstream, reason)

    def pause_reading(self) -> None:
        self._client.pause_reading()

    def resume_reading(self) -> None:
        self._client.resume_reading()


class ClosingAnswer:
    """Between an upstream connection and the tenant connection for one exchange whose
    connection ends after it (the model leaves the host, or the proxy stops): Triton's answer
    passes as it comes, with `Connection: close` added to its final head, so that the tenant's
    client opens a new connection for its next request instead of sending it on one about to
    close."""

    __slots__ = ("_client", "_said")

    def __init__(self, client: ClientConnection) -> None:
        self._client = client
        self._said = False

    def _told(self, data: bytes) -> bytes:
        if self._said or data.startswith(b"HTTP/1.1 1"):  # an interim 1xx head passes as it is
            return data
        self._said = True
        self._client.keep_alive_ends()
        line_end = data.find(b"\r\n")
        if line_end < 0:  # never: the upstream passes the response's head whole
            return data
        return data[: line_end + 2] + b"Connection: close\r\n" + data[line_end + 2 :]

    def relay_response(self, data: bytes) -> None:
        self._client.relay_response(self._told(data))

    def response_complete(self, upstream: Upstream, data: bytes, reusable: bool) -> None:
        self._client.response_complete(upstream, self._told(data) if data else data, reusable)

    def upstream_failed(self, upstream: Upstream, reason: str) -> None:
        self._client.upstream_failed(upstream, reason)

    def pause_reading(self) -> None:
        self._client.pause_reading()

    def resume_reading(self) -> None:
        self._client.resume_reading()


def _leaving(served: Served | None) -> bool:
    """Whether `served` is a model that leaves the host (`leaving` in its models file line)."""
    return served is not None and served.entry.leaving


def _renamed_head(head: bytes, served: Served) -> bytes:
    """`head`, whose request line names `served`'s public model id after /v2/models/ (as the
    router forwards a path of a replica mapped once picked), naming its private name instead."""
    if not served.private:
        return head
    start = head.index(_MODELS_PATH) + len(_MODELS_PATH)
    return head[:start] + served.private + head[start + len(served.public) :]
