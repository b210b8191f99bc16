"""One REST request's trip to Triton and back, on a tenant connection: the exchange.

`Exchange` builds on the tenant's socket (`connection.Connection`) what an exchange needs once the
request is admitted: the request head as prepared (`_send`: the received bytes themselves when they
are the same), then the body passed through verbatim, chunk by chunk as it arrives (`_relay_body`),
so a 1 GiB body is never held in memory; back-pressure pauses the sending side. A compressed body
(Content-Encoding gzip or deflate, which Triton inflates whole and unbounded) is counted as it
passes (`policy.inflation`: in slices, at most BUDGET inflated bytes per event-loop turn, reading
paused meanwhile), and each piece goes on only once counted: one that inflates past --max-inflated
is refused (413) and its upstream connection aborted before Triton has it whole. A body's JSON
nesting and inputs' shapes are checked by `gate` (whole, or as it passes), its last piece going
on only once they passed. Triton's response comes back through the `upstream.ResponseSink` calls,
passed through as it arrives (server-sent events stream), and ends the exchange: the connection's
slot is released, the request counted, the upstream connection pooled again. An exchange whose
connection ends after it passes Triton's answer through a `ClosingAnswer`; one answered here
(`_answer_locally`) never reaches Triton, its body read and dropped. `relay.ClientConnection`
reads and decides the requests that become exchanges.

What it must not do: decide whether a request goes to Triton, or buffer whole bodies.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

from proxy.http1.connection import AWAIT, BODY, CLOSED, IDLE, Connection, Listener
from proxy.http1.framing import ChunkedFraming, RequestHead
from proxy.http1.gate import check_whole, too_large
from proxy.http1.upstream import Upstream
from proxy.policy import refusals
from proxy.policy.inflation import BUDGET, Inflation
from proxy.policy.refusals import lacks_model
from proxy.policy.routing import error_body
from proxy.table import RESEND_BYTES, RESENDS, Served

_clock: Final = time.perf_counter
"""The latency clock (`metrics.observe`), bound once: compiled (mypyc), a C static, where an
imported name is a look-up in the module's dict at each of a request's two calls."""
_NOT_FOUND_HEAD: Final = b"HTTP/1.1 404 "
"""How Triton's answer that it has no such model begins (`Exchange._model_missing`)."""


class Exchange(Connection):
    """A tenant connection's exchanges with Triton, one at a time (see the module docstring)."""

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
        self._served: Served | None = None
        """The table's entry of the model the exchange names; None: a server-wide route."""
        self._kept: bytes | None = None
        """The request as sent whole, kept to send again (`upstream_failed`) until Triton's
        answer begins: a model's whose calls may run twice (`Served.resend`)."""
        self._resends = 0
        """Times the request was sent again (at most `RESENDS`)."""
        self._keeping: bytearray | None = None
        """The request so far, as its body passes (`_relay_body`), to be `_kept` once whole."""

    def _next_request(self) -> None:
        """Take the next request buffered, if any (`relay.ClientConnection`)."""
        raise NotImplementedError

    def keep_alive_ends(self) -> None:
        """The connection closes after this exchange (its answer says so)."""
        self._keep_alive = False

    def _send(self, upstream: Upstream, buffer: bytes, start: int, verbatim: bool = False) -> None:
        """Send the request on `upstream`: the prepared head, then the body, which begins at
        `buffer[start]`; `verbatim` when `buffer[:start]` is the head as received and the same
        bytes as the prepared one."""
        self._kept = self._keeping = None  # nothing of an earlier exchange is sent again
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
            served = self._served
            if served is not None and served.resend and len(request) <= RESEND_BYTES:
                self._kept = request
                self._resends = 0
            upstream.begin(self, head.method == "HEAD", request)
            self._remaining = 0
            self._request_done = True
            if end < len(buffer):
                self._buffer = buffer[end:]
            self._state = AWAIT
        else:
            served = self._served
            if (
                served is not None
                and served.resend
                and self._chunked is None
                and not head.encoding
                and len(self._upstream_head) + self._remaining <= RESEND_BYTES
            ):
                self._keeping = bytearray(self._upstream_head)  # its body arrives in pieces
            upstream.begin(self, head.method == "HEAD", self._upstream_head)
            self._state = BODY
            self._sink = upstream
            self._checks.begin(head, self._route, self._remaining)
            self._relay_body(buffer, start)
        self._closing_answer(upstream)
        if self._reading_paused:  # paused while it waited for a slot or a connection
            self.resume_reading()

    def _closing_answer(self, upstream: Upstream) -> None:
        """Have Triton's answer on `upstream` close the tenant's connection after it if the
        proxy stops or the model leaves the host: the tenant's client is told to reconnect
        (through its Service, which no longer routes here) before its next request, rather than
        finding the connection closed."""
        head = self._head
        if head is not None and head.keep_alive and (self._relay.closing or _leaving(self._served)):
            upstream.client = ClosingAnswer(self)

    def _send_again(self, request: bytes) -> None:
        """Send `request` (`_kept`) on a new connection: the last one was lost under it."""
        raise NotImplementedError

    def _resent(self, upstream: Upstream, request: bytes) -> None:
        """`request` goes again, on `upstream`; what the exchange waits for is unchanged."""
        head = self._head
        assert head is not None
        self._task = None
        self._upstream = upstream
        self._state = AWAIT
        self._resends += 1
        if self._resends < RESENDS:
            self._kept = request  # lost again (Triton exits in a row): sent again
        upstream.begin(self, head.method == "HEAD", request)
        self._closing_answer(upstream)

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
            if self._response_done:  # answered before this part came: one answer a request
                self._close()
                return
            self._refuse(e)
            return
        stop = len(data) if end == -1 else end
        if self._sink is not None and stop > start:
            piece = data if start == 0 and stop == len(data) else data[start:stop]
            self._sink.write(piece)
            if self._keeping is not None:
                self._keeping += piece
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
            if self._response_done:  # answered before this part came: one answer a request
                self._keep_alive = False
                self._relay_body(data, start)
                return
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
        data = self._take_stash()
        if data is None or self._state != BODY:
            return
        self._relay_body(data, 0)
        if self._stash is None:  # not left over again: the counting is caught up
            self.resume_reading()

    def _take_stash(self) -> bytes | None:
        # Apart from `_count_stash`, which must not see `_stash` narrowed to None by its own
        # assignment: `_relay_body` may stash again, and a compiled build checks the narrowed type.
        data, self._stash = self._stash, None
        return data

    def _body_done(self, data: bytes, end: int) -> None:
        keeping = self._keeping
        if keeping is not None:
            self._keeping = None
            if self._sink is not None and not self._response_done:
                # The request went whole and is not answered yet: kept to send again.
                self._kept = bytes(keeping)
                self._resends = 0
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
        if upstream.code == "404" and self._model_missing(upstream, data, reusable):
            return
        if data and self.transport is not None:
            self.transport.write(data)
        self._response_done = True
        self._upstream = None
        self._kept = None
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
            # Triton (or the gateway) answered early: the rest of the body is read and dropped,
            # uncounted: nothing of it goes on, and the answer is given.
            self._sink = None
            self._inflation = None
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

    def _model_missing(self, upstream: Upstream, data: bytes, reusable: bool) -> bool:
        """Whether Triton's 404, ending with `data`, says it has no such model while the node
        gateway's table serves it and Triton had just started again (`Limiter.on_unknown`, the
        gateway's only). The model is then held until it is READY, and the request answered 502,
        unanswered (`framing.UNANSWERED`: it did not run, so a pod's proxy sends it again).
        Only an answer whose head is in `data` (nothing of it passed on yet, `relay_response`):
        Triton writes such a small one at once."""
        served = self._served
        if (
            served is None
            or served.limiter.on_unknown is None
            or not data.startswith(_NOT_FOUND_HEAD)
            or not lacks_model(data)
            or not served.limiter.on_unknown()
        ):
            return False
        self._upstream = None
        self._sink = None
        self._kept = None
        if reusable and self._request_done:
            self._pool.put(upstream)
        elif upstream.transport is not None:
            upstream.transport.close()
        self._answer_failure(str(refusals.missing_model(served.model_id)))
        return True

    def upstream_failed(self, upstream: Upstream, reason: str) -> None:
        """The upstream connection broke before the response was complete (or the gateway said
        Triton did, `Upstream`): a request kept (`_kept`) whose answer had not begun is sent
        again (up to RESENDS times, `_resent`); any other fails."""
        self._upstream = None
        self._sink = None
        kept, self._kept = self._kept, None
        if self._state == CLOSED:
            return
        if kept is not None and not upstream.code:
            self._metrics.resent("http")
            self._send_again(kept)
            return
        self._response_done = True
        if upstream.code:  # the response had begun
            self._finish("502")
            if self.transport is not None:
                self.transport.abort()  # the tenant must not mistake a cut answer for a whole one
            return
        self._answer_failure(
            upstream.said
            or f"Triton at {self._relay.upstream_address} failed: {reason}; retry shortly"
        )

    def _answer_failure(self, text: str) -> None:
        """Answer the exchange's request 502 saying `text`, marked unanswered
        (`framing.UNANSWERED`: Triton may have had it, and gave no answer), and close after
        it."""
        self._response_done = True
        error = refusals.UpstreamError(text)
        status = refusals.http_status(error)
        self._finish(str(status))
        self._keep_alive = False
        self._write_answer(status, "application/json", error_body(str(error)), 0, True)

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


class AnswerFilter:
    """Between an upstream connection and the tenant connection for one exchange whose answer the
    proxy changes on its way (each subclass's `relay_response` and `response_complete`); a
    failure and back-pressure pass to the tenant connection as they are."""

    __slots__ = ("_client",)

    def __init__(self, client: Exchange) -> None:
        self._client = client

    def upstream_failed(self, upstream: Upstream, reason: str) -> None:
        self._client.upstream_failed(upstream, reason)

    def pause_reading(self) -> None:
        self._client.pause_reading()

    def resume_reading(self) -> None:
        self._client.resume_reading()


class ClosingAnswer(AnswerFilter):
    """Between an upstream connection and the tenant connection for one exchange whose
    connection ends after it (the model leaves the host, or the proxy stops): Triton's answer
    passes as it comes, with `Connection: close` added to its final head, so that the tenant's
    client opens a new connection for its next request instead of sending it on one about to
    close."""

    __slots__ = ("_said",)

    def __init__(self, client: Exchange) -> None:
        super().__init__(client)
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


def _leaving(served: Served | None) -> bool:
    """Whether `served` is a model that leaves the host (`leaving` in its models file line)."""
    return served is not None and served.entry.leaving
