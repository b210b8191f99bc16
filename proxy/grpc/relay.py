"""One tenant connection to the gRPC relay (`--grpc-mode relay`): its frames, both ways.

The relay is the tenant's HTTP/2 peer: it answers SETTINGS and PING itself, grants and enforces
its own flow-control windows, decodes the tenant's header blocks (to route on `:path`) and encodes
Triton's response headers with an HPACK encoder of its own for this tenant. Streams it forwards go
to Triton on the proxy's shared connection (`grpc.channel`), after the per-stream gate (`grpc.gate`)
checked each message. A frame the tenant gets wrong (unreadable, out of order, over a window)
closes this connection only; Triton never sees it.

The connection is composed, not inherited: an `outbox.Outbox` gathers its writes (what it writes
in one event-loop turn leaves in one write), an `intake.StreamIntake` reads each stream's
messages for its `gate.StreamGate` to check, and `replies.Replies` writes Triton's answers back
within the tenant's windows; the gate and the replies reach back only through
`replies.ReplyHooks`, which this class implements. Per tenant connection it limits streams,
header block size and resets (see the constants below).

Why not grpc.aio: its per-call cost (about 0.5-0.9 ms and most of a core here) made the proxy keep
a third of Triton's gRPC throughput; this relay scans frame headers and, for a client repeating
its headers, finds its header blocks already decoded and encoded (`http2.headers`).

What it must not do: decide isolation itself, hand Triton a message it has not checked, or let
one tenant's frames reach the connection Triton shares among all of them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final, Protocol

from hpack import HPACKError

from proxy.grpc.gate import FORWARDED, READY_PATH, UNIMPLEMENTED, GateContext
from proxy.grpc.intake import StreamIntake
from proxy.grpc.outbox import Outbox, Scheduler
from proxy.grpc.replies import Replies, ReplyHooks
from proxy.grpc.stream import RECEIVE_WINDOW, Channel, Stream
from proxy.http2 import frames
from proxy.http2.flow import FlowControlError, ReceiveWindow
from proxy.http2.headers import (
    ENTRY_BYTES,
    KEPT_ENTRY_BYTES,
    BlockDecoder,
    Fields,
    fields_size,
    keep,
    request_problem,
    trailers_problem,
)
from proxy.http2.reader import ConnectionBrokenError, FrameReader
from proxy.http2.streamstates import (
    NEXT,
    RECEIVED_END,
    RESET,
    StreamStateError,
    active,
    peer_ended,
)
from proxy.policy.finals import Finals
from proxy.policy.holdings import SHED_DRAIN_SECONDS
from proxy.policy.refusals import ProxyError
from proxy.policy.routing import GrpcAnswer, grpc_kind
from proxy.policy.throttle import Throttle
from proxy.processflags import ProxyState
from proxy.settings import Settings
from proxy.sockets import nodelay

SERVER_READY: Final = GrpcAnswer("ServerReady", "OK", response=b"\x08\x01")
"""ServerReadyResponse(ready=true), answered without Triton while the own model sleeps."""

log = logging.getLogger(__name__)

MAX_STREAMS: Final = 128
"""Concurrent streams a tenant connection may open (SETTINGS_MAX_CONCURRENT_STREAMS)."""
_clock: Final = time.perf_counter
"""When a call started, for its latency (as `gate._clock`); compiled (mypyc), a C static."""
_CONNECTION_WINDOW: Final = 1 << 30
"""The tenant's connection window; credited as bytes arrive, since stream windows bound memory."""
MAX_HEADER_BLOCK: Final = 64 * 1024
"""The largest header block a tenant may send (HEADERS and its CONTINUATION frames)."""
_RESETS: Final = 2 * MAX_STREAMS
"""How many more streams than it completes a tenant may open at Triton and reset: past that its
connection ends (ENHANCE_YOUR_CALM), so a reset flood costs Triton and the shared connection
little ("rapid reset", CVE-2023-44487)."""
_Plan = tuple[str, bool, Fields, bytes | None, str | None]
_CLOSED_KEPT: Final = 256
"""Closed streams remembered per connection (the last this many a client opening its odd ids in
turn closed; fewer where it skips ids), to tell a frame the tenant may still send on one
(ignored) from one it may not (STREAM_CLOSED); on older ones DATA is ignored and HEADERS are a
PROTOCOL_ERROR, as for a stream id never used."""


class Listener(GateContext, Scheduler, Protocol):
    """What a tenant connection needs from the listener (`server.GrpcRelay`)."""

    settings: Settings
    state: ProxyState
    connections: set[H2Connection]

    def channel(self) -> Channel:
        """The connection to Triton a new stream goes on."""


class H2Connection(ReplyHooks, asyncio.Protocol):
    """One tenant connection (see the module docstring)."""

    def __init__(self, relay: Listener) -> None:
        self.relay = relay
        self.out = Outbox(relay)
        self.streams: dict[int, Stream] = {}  # open towards the tenant, by its stream id
        self.replies = Replies(self.out, self.streams, self)
        self.intake = StreamIntake(relay, self.streams, self.out, self.replies)
        self.gate = self.intake.gate
        # The listener's hold and flush around each read, its router and its channel to Triton
        # for a new stream, bound once: compiled (mypyc), a call or an attribute read through a
        # Protocol is a lookup by name every time.
        self._hold = relay.hold
        self._flush = relay.flush
        self._router = relay.router
        self._channel = relay.channel
        self.last_sid = 0
        self._in = b""
        self._preface = False
        self._preface_timer: asyncio.TimerHandle | None = None
        self._goaway = False
        self._decoder = BlockDecoder()
        self._plans: dict[Fields, _Plan] = {}  # see _plan
        self._plans_bytes = 0  # what they hold, counted as `headers.fields_size` counts
        # The last plan and its fields: a client repeating its headers gets the very tuple the
        # decoder kept, recognised by identity without hashing it (CPython does not cache a
        # tuple's hash; this one is seven pairs).
        self._last_fields: Fields | None = None
        self._last_plan: _Plan = ("", False, (), None, None)
        self._reader = FrameReader(self, from_server=False, max_block=MAX_HEADER_BLOCK)
        self._refused_sid = 0  # a new stream whose HEADERS broke a stream rule: reset once decoded
        # Recently closed streams (see `closed`): a table indexed by the stream's number (a
        # client's ids are odd, so `sid >> 1` counts its streams), each slot holding the last
        # stream closed there as `sid << 1 | strict` (0: none). One list write per call where a
        # dict of ids and a ring of their order took four dictionary operations on boxed ids.
        self._closed = [0] * _CLOSED_KEPT
        self._resets = _RESETS  # streams the tenant may still reset beyond those it completes
        # What the tenant may still send on the connection; credited as bytes arrive.
        self._received = ReceiveWindow(_CONNECTION_WINDOW, _CONNECTION_WINDOW // 2)
        self._initial_window = frames.DEFAULT_WINDOW  # the tenant's SETTINGS_INITIAL_WINDOW_SIZE
        # The pod's share of the gateway's loop (None in the proxy); reading also stops while
        # the pod is over it (`throttle`), whatever the replies' back-pressure wants.
        self._share = relay.limiter.share
        self._throttle = Throttle()

    @property
    def transport(self) -> asyncio.Transport | None:
        """The tenant's socket (None before it connects and once it is gone)."""
        return self.out.transport

    @transport.setter
    def transport(self, transport: asyncio.Transport | None) -> None:
        self.out.transport = transport

    # -- the hooks of the gate and the replies (`replies.ReplyHooks`) -----------------------------

    def finish(self, stream: Stream, code: str) -> None:
        self.gate.finish(stream, code)
        served = stream.served
        if served is not None and served.entry.leaving:
            # Its model leaves the host: the client opens a new connection (through its
            # Service, which no longer routes here) for its next call.
            self.go_away()

    def refuse(self, stream: Stream, code: str, details: str, response: bytes | None) -> None:
        self.gate.refuse(stream, code, details, response)

    def answered(self, stream: Stream, requests: int) -> None:
        self.gate.answered(stream, requests)

    # -- connection ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = nodelay(transport)
        self.relay.connections.add(self)
        self.out.write(
            frames.settings(
                {
                    frames.SETTINGS_MAX_CONCURRENT_STREAMS: MAX_STREAMS,
                    frames.SETTINGS_INITIAL_WINDOW_SIZE: RECEIVE_WINDOW,
                }
            )
            + frames.window_update(0, _CONNECTION_WINDOW - frames.DEFAULT_WINDOW)
        )
        loop = asyncio.get_running_loop()
        if self._share is not None:
            # Not here: uvloop starts reading an adopted socket after `connection_made` returns,
            # undoing a `pause_reading()` made in it while `_throttle` says paused, and then
            # neither the share nor the tenant's unread answers would stop this connection again.
            loop.call_soon(self._throttle_if_paused)
        self._preface_timer = loop.call_later(
            self.relay.settings.head_timeout_seconds, self._no_preface
        )

    def _no_preface(self) -> None:
        """A connection that never says it speaks HTTP/2 only holds a socket: close it."""
        timeout = self.relay.settings.head_timeout_seconds
        self._error(frames.PROTOCOL_ERROR, f"no HTTP/2 connection preface within {timeout:g} s")

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.connections.discard(self)
        if self._preface_timer is not None:
            self._preface_timer.cancel()
        self.transport = None
        for stream in list(self.streams.values()):
            stream.tenant = NEXT[stream.tenant, RESET]
            if active(stream.triton) and stream.channel is not None:
                stream.channel.reset(stream)  # Triton stops working for nobody
            self.gate.finish(stream, "CANCELLED")
        self.streams.clear()
        self.replies.blocked.clear()

    def pause_writing(self) -> None:
        # The tenant does not read: response DATA waits (its windows hold Triton back), and the
        # tenant's own frames wait too, so nothing it asks for (PING, SETTINGS) piles up here.
        self.replies.paused = True
        if self.transport is not None and not self._throttle.on:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.replies.paused = False
        if self.transport is not None and not self._throttle.on:
            self.transport.resume_reading()
        self.replies.drain_all()

    def throttle(self) -> None:
        """The pod is over its share of the gateway's loop: read nothing until `unthrottle`."""
        self._throttle.engage(self.transport, self.replies.paused)

    def _throttle_if_paused(self) -> None:
        self._throttle.engage_if_stopped(self._share, self.transport, self.replies.paused)

    def unthrottle(self) -> None:
        self._throttle.release(self.transport, self.replies.paused)

    def go_away(self) -> None:
        """Take no new streams; those already open finish."""
        if not self._goaway:
            self._goaway = True
            self.out.write(frames.goaway(self.last_sid))

    def activity(self) -> object | None:
        """For the idle sweep: None while calls are open, else the last stream id."""
        return None if self.streams else self.last_sid

    def close_idle(self) -> None:
        """Idle for --idle-timeout: GOAWAY NO_ERROR and close; the tenant's client reconnects on
        its next call, as after a gRPC server's max_connection_idle."""
        self.go_away()
        self.out.flush()
        if self.transport is not None:
            self.transport.close()

    def _error(self, code: int, reason: str) -> None:
        log.warning("A tenant broke the HTTP/2 protocol (%s): closing its connection.", reason)
        self._close_with(code)

    def _close_with(self, code: int) -> None:
        """GOAWAY with `code`, then close: the connection ends."""
        self.out.write(frames.goaway(self.last_sid, code))
        self.out.flush()
        if self.transport is not None:
            self.transport.close()

    # -- the tenant's frames ---------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        share = self._share
        started = share.cpu() if share is not None else 0.0
        self._hold()  # what this read makes (for Triton, and for this tenant) leaves at its end
        try:
            self._read(data)
        finally:
            self._flush()
            if share is not None:
                share.charge(started, share.cpu(), len(data))

    def _read(self, data: bytes) -> None:
        pos = 0
        if not self._preface:
            if self._in:
                data = self._in + data
                self._in = b""
            if len(data) < 24 and frames.PREFACE.startswith(data):
                self._in = data
                return
            if data[:24] != frames.PREFACE:
                self._error(frames.PROTOCOL_ERROR, "no HTTP/2 connection preface")
                return
            self._preface = True
            if self._preface_timer is not None:
                self._preface_timer.cancel()
                self._preface_timer = None
            pos = 24
        try:
            self._reader.feed(data[pos:] if pos else data)  # frames come back to on_* below
        except ConnectionBrokenError as e:
            self._error(e.code, str(e))
        except FlowControlError as flow:  # a name per type: compiled (mypyc), `e` has one type
            self._error(frames.FLOW_CONTROL_ERROR, str(flow))
        except HPACKError as hpack:
            self._error(frames.COMPRESSION_ERROR, f"an unreadable header block: {hpack}")
        except StreamStateError:
            # A bug of the relay's, never the tenant's doing: this connection ends, not the proxy.
            log.exception("The gRPC relay lost track of a stream: closing the tenant's connection.")
            self._close_with(frames.INTERNAL_ERROR)

    # -- checked frames from the reader (`proxy.http2.reader.FrameSink`) ---------------------------

    def on_data(self, body: bytes, flags: int, sid: int, size: int) -> None:
        increment = self._received.take(size)  # the stream windows bound what the relay holds
        if increment:
            self.out.write(frames.window_update(0, increment))
        stream = self.streams.get(sid)
        if stream is None:
            if sid > self.last_sid:
                raise ConnectionBrokenError(
                    frames.PROTOCOL_ERROR, f"DATA on stream {sid}, never opened"
                )
            if self._closed_strictly(sid):
                self.on_stream_error(sid, frames.STREAM_CLOSED, f"DATA on closed stream {sid}")
            return  # answered or reset by the relay: dropped (its bytes counted above)
        if peer_ended(stream.tenant):
            self.on_stream_error(
                sid, frames.STREAM_CLOSED, f"DATA on stream {sid} after END_STREAM"
            )
            return
        if not active(stream.triton) and stream.channel is not None:
            return  # answered by the relay, kept only for its response: dropped
        try:
            stream.received.arrived(size)
        except FlowControlError:
            raise ConnectionBrokenError(
                frames.FLOW_CONTROL_ERROR, f"DATA over stream {sid}'s window"
            ) from None
        if len(body) < size:
            self.replies.forwarded(stream, size - len(body))  # padding: Triton never gets it
        if flags & frames.END_STREAM:
            stream.tenant = NEXT[stream.tenant, RECEIVED_END]
            stream.ended = True
        if len(body) == size and self.intake.whole_message(body, stream):
            # The common case, one whole message in one frame: checked and, if it passes
            # unchanged, sent on as the very bytes the tenant sent.
            self.gate.check(stream, body[5:], size, body)
            return
        stream.buf += body
        self.intake.relay_buffered(stream)

    def on_frame(self, payload: bytes, kind: int, flags: int, sid: int) -> None:
        if kind == frames.WINDOW_UPDATE:
            self._window_update(sid, frames.u31(payload))
        elif kind == frames.RST_STREAM:
            if sid > self.last_sid:
                raise ConnectionBrokenError(
                    frames.PROTOCOL_ERROR, f"RST_STREAM on idle stream {sid}"
                )
            self._reset_by_tenant(sid)
            self.closed(sid, strict=True)  # RFC 9113 5.1: frames after its RST_STREAM are errors
        elif kind == frames.SETTINGS:
            if not flags & frames.ACK:
                self._settings(frames.settings_values(payload))
                self.out.write(frames.frame(frames.SETTINGS, frames.ACK, 0))
        elif kind == frames.PING and not flags & frames.ACK:
            self.out.write(frames.frame(frames.PING, frames.ACK, 0, payload))
        # a PING ACK, GOAWAY (the tenant closes when it is done): nothing to do

    def _reset_by_tenant(self, sid: int) -> bool:
        """The tenant's RST_STREAM (or a stream error): cancel the stream at Triton and finish
        it; False when the stream was not open here."""
        stream = self.streams.pop(sid, None)
        if stream is None:
            return False
        stream.tenant = NEXT[stream.tenant, RESET]
        self.replies.blocked.pop(stream, None)
        if active(stream.triton) and stream.channel is not None:
            stream.channel.reset(stream)
            self._resets -= 1
        self.gate.finish(stream, "CANCELLED")
        if self._resets < 0:
            raise ConnectionBrokenError(
                frames.ENHANCE_YOUR_CALM, f"over {_RESETS} more streams reset than completed"
            )
        return True

    def on_stream_error(self, sid: int, code: int, reason: str) -> None:
        """The tenant broke a rule of stream `sid`: RST_STREAM with `code`; the connection goes
        on."""
        log.info("A tenant broke HTTP/2 on stream %d (%s): resetting the stream.", sid, reason)
        if sid > self.last_sid:
            self._refused_sid = sid  # its HEADERS follow: decoded, then refused
        self._reset_by_tenant(sid)
        self.closed(sid, strict=False)  # frames the tenant sent before it saw the reset: ignored
        self.out.write(frames.rst_stream(sid, code))

    def closed(self, sid: int, strict: bool) -> None:
        """Remember that stream `sid` closed: with `strict` (the tenant ended or reset it) a
        later frame on it is the tenant's error (STREAM_CLOSED), else it is ignored (the relay
        ended it, and the tenant may have sent before it knew)."""
        self._closed[(sid >> 1) % _CLOSED_KEPT] = sid << 1 | strict

    def _closed_strictly(self, sid: int) -> bool | None:
        """How stream `sid` closed (`closed`'s `strict`), or None when it is not remembered."""
        entry = self._closed[(sid >> 1) % _CLOSED_KEPT]
        return bool(entry & 1) if entry >> 1 == sid else None

    def _settings(self, values: dict[int, int]) -> None:
        window = values.get(frames.SETTINGS_INITIAL_WINDOW_SIZE)
        if window is not None:
            delta = window - self._initial_window
            self._initial_window = window
            for stream in self.streams.values():
                stream.window.shift(delta)
            self.replies.drain_all()
        size = values.get(frames.SETTINGS_MAX_FRAME_SIZE)
        if size is not None:
            self.replies.max_frame = size
        table = values.get(frames.SETTINGS_HEADER_TABLE_SIZE)
        if table is not None:
            self.replies.encoder.limit_table(table)

    def _window_update(self, sid: int, increment: int) -> None:
        if sid == 0:
            self.replies.window.grow(
                increment
            )  # past 2^31-1: FlowControlError, the connection ends
            self.replies.drain_all()
            return
        stream = self.streams.get(sid)
        if stream is None:
            if sid > self.last_sid:
                raise ConnectionBrokenError(
                    frames.PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {sid}"
                )
            return  # closed here already: a WINDOW_UPDATE may still be on its way
        try:
            stream.window.grow(increment)
        except FlowControlError as e:
            self.on_stream_error(sid, frames.FLOW_CONTROL_ERROR, str(e))
            return
        if stream in self.replies.blocked:
            self.replies.drain(stream)

    def on_headers(self, sid: int, flags: int, block: bytes) -> None:
        fields = self._decoder.decode(block)  # every block: the decoder follows the tenant's table
        end_stream = bool(flags & frames.END_STREAM)
        stream = self.streams.get(sid)
        if stream is not None:  # trailers from the tenant end its side
            if peer_ended(stream.tenant):
                self.on_stream_error(
                    sid, frames.STREAM_CLOSED, f"HEADERS on stream {sid} after its end"
                )
            elif not end_stream:
                self.on_stream_error(sid, frames.PROTOCOL_ERROR, "trailers without END_STREAM")
            elif (problem := trailers_problem(fields)) is not None:
                self.on_stream_error(sid, frames.PROTOCOL_ERROR, problem)
            else:
                stream.tenant = NEXT[stream.tenant, RECEIVED_END]
                if active(stream.triton) or stream.channel is None:  # open, or detached
                    stream.ended = True
                    self.intake.relay_buffered(stream)
            return
        if sid <= self.last_sid:
            strict = self._closed_strictly(sid)
            if strict is None:  # RFC 9113 5.1.1: stream ids only grow
                raise ConnectionBrokenError(
                    frames.PROTOCOL_ERROR,
                    f"HEADERS opening stream {sid} after stream {self.last_sid}",
                )
            if strict:
                raise ConnectionBrokenError(frames.STREAM_CLOSED, f"HEADERS on closed stream {sid}")
            return  # the relay ended the stream first: trailers it no longer needs
        if sid % 2 == 0:
            raise ConnectionBrokenError(
                frames.PROTOCOL_ERROR, f"stream {sid} is not a client stream"
            )
        self.last_sid = sid
        if sid == self._refused_sid:
            self._refused_sid = 0
            return  # reset already (a stream error in its HEADERS frame)
        if fields is self._last_fields:  # the client's previous call's headers, as decoded
            plan = self._last_plan
        else:
            found = self._plans.get(fields)
            if found is None:
                plan = self._plan(fields)  # the last plan from now on if it is kept
            else:
                plan = found
                self._last_fields, self._last_plan = fields, plan
        kind, streaming, sent, encoding, problem = plan
        if problem is not None:
            self.on_stream_error(sid, frames.PROTOCOL_ERROR, f"a malformed request: {problem}")
            return
        stream = Stream(self.replies, sid, kind, self._initial_window)
        stream.streaming = streaming
        if end_stream:
            stream.tenant = NEXT[stream.tenant, RECEIVED_END]
        stream.encoding = encoding
        started = _clock()
        if self._goaway or len(self.streams) >= MAX_STREAMS:
            self.out.write(frames.rst_stream(sid, frames.REFUSED_STREAM))
            return
        router = self._router
        answer: GrpcAnswer | None = None
        if not kind:
            answer = UNIMPLEMENTED
        elif kind == "ServerReady" and self.relay.state.draining:
            answer = GrpcAnswer(kind, "OK")  # ready: false while the pod drains
        elif kind == "ServerReady" and self.relay.state.model_asleep:
            answer = SERVER_READY  # the on-demand model is unloaded; its next call wakes it
        elif kind not in FORWARDED:
            decision = router.decide(kind, b"")
            answer = decision if isinstance(decision, GrpcAnswer) else UNIMPLEMENTED
        if answer is not None:
            self.gate.answer(stream, answer, started)
            return
        stream.route = kind  # END_STREAM, if there, goes to Triton on the HEADERS frame
        if streaming:
            stream.finals = Finals()  # each request message in flight holds a slot (`gate`)
        self.streams[sid] = stream
        stream.started = started
        self._channel().open(stream, sent, end_stream)
        if streaming and router.model_id:
            # An open stream holds a slot of its model's; a host's streams from their first
            # request, once it names the model.
            self.gate.opened(stream)

    def _plan(self, fields: Fields) -> _Plan:
        """The RPC a tenant's request fields call, whether it streams, the fields Triton gets for
        them, their grpc-encoding (for compressed messages) and what makes them malformed (or
        None); made once per distinct fields, since a client repeats its headers call after
        call (the caller looks in `_plans` first: a hit costs no call)."""
        plan = self._plans.get(fields)
        if plan is None:
            path = next((value for name, value in fields if name == b":path"), b"")
            encoding = next((value for name, value in fields if name == b"grpc-encoding"), None)
            kind = grpc_kind(path.decode("latin-1"))
            sent = fields
            if kind == "ServerReady" and self._router.model_id:
                # The pod's readiness is its model's: ask ModelReady (a host asks Triton's own).
                sent = tuple((n, READY_PATH if n == b":path" else v) for n, v in fields)
            router = self._router
            streaming = router.is_stream(kind)
            if router.renames or router.per_model or streaming:
                # Triton's answers name the model's private name and are renamed on their way
                # back, and a stream's answers are read for the end of each request
                # (`policy.finals`), which compressed answers would hide: Triton may compress
                # only for a client that accepts it, and this one does not.
                sent = tuple((n, v) for n, v in sent if n != b"grpc-accept-encoding")
            plan = (kind, streaming, sent, encoding, request_problem(fields))
            # Counted by the fields it holds (the key, and `sent` when it is a copy), as the
            # decoder counts its blocks: a block of a thousand one-byte fields is not kept.
            size = ENTRY_BYTES + fields_size(fields)
            if sent is not fields:
                size += fields_size(sent)
            self._plans_bytes = keep(self._plans, fields, plan, size, self._plans_bytes)
            if size <= KEPT_ENTRY_BYTES:
                # Only a plan kept is remembered as the last: a list of a thousand fields kept
                # here would hold what `keep` refused, uncounted.
                self._last_fields, self._last_plan = fields, plan
        return plan

    def held_bytes(self) -> int:
        """What this connection holds for its pod now: a partial frame, the header blocks and
        plans it keeps, each open stream's bytes both ways, and its unsent writes (the gateway's
        byte budget reads it on a timer)."""
        held = self._reader.buffered + len(self._in) + self._decoder.kept_bytes + self._plans_bytes
        transport = self.transport
        if transport is not None:
            held += transport.get_write_buffer_size()
        for stream in self.streams.values():
            held += len(stream.buf) + len(stream.held) + len(stream.up_held)
        return held

    def shed(self, error: ProxyError) -> None:
        """The pod holds more than its share of the node's byte budget: answer every open stream
        with `error` and close the connection, so that what it holds is freed."""
        for stream in list(self.streams.values()):
            self.gate.refuse_error(stream, error)
        self.go_away()
        self.out.flush()
        transport = self.transport
        if transport is not None:
            # The write side ends once the refusals are sent. Not close(): the pod's reading is
            # paused, and closing a socket with bytes unread sends a reset, which would take the
            # refusals from the tenant before it reads them. It is dropped a moment later, with
            # whatever it holds, whether the tenant read them or not.
            transport.write_eof()
            asyncio.get_running_loop().call_later(SHED_DRAIN_SECONDS, self._drop, transport)

    def _drop(self, transport: asyncio.Transport) -> None:
        if self.transport is transport:
            transport.abort()

    def completed(self) -> None:
        """Triton completed one of this tenant's calls: it earns back one reset."""
        if self._resets < _RESETS:
            self._resets += 1
