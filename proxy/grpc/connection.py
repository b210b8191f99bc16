"""A tenant's connection to the gRPC relay, beneath its frames: the socket and its streams' ends.

`Connection` owns what a tenant's HTTP/2 connection has whatever its frames say: the transport and
the writes gathered for it (`outbox.Outbox`), the open streams with their intake, gate and replies
(composed here: `intake.StreamIntake`, `gate.StreamGate`, `replies.Replies`); the connection
preface (within --head-timeout) and reading, each read charged to the pod's share of the gateway's
loop and handed to the frame reader (`proxy.http2.reader`), whose errors end the connection with
GOAWAY; reading paused and resumed (a tenant that does not read its answers, the pod over its
share: `throttle`); streams reset by the tenant or for its errors, with the rapid-reset allowance,
and the closed streams remembered; and what the listener and the gateway ask of a connection
(`held_bytes` for the node's byte budget, `shed`, the idle sweep, GOAWAY when draining). Its
`Listener` Protocol is how it reaches the listener (`server.GrpcRelay`). `relay.H2Connection`
reads the tenant's frames on it. Per tenant connection it limits streams, header block size and
resets (see the constants below).

What it must not do: open a stream or read a message (`relay`, `intake`), or decide anything
about a call.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final, Protocol

from hpack import HPACKError

from proxy.grpc.gate import GateContext
from proxy.grpc.intake import StreamIntake
from proxy.grpc.outbox import Outbox, Scheduler
from proxy.grpc.replies import Replies, ReplyHooks
from proxy.grpc.stream import RECEIVE_WINDOW, Channel, Stream
from proxy.http2 import frames
from proxy.http2.flow import FlowControlError, ReceiveWindow
from proxy.http2.reader import ConnectionBrokenError, FrameReader
from proxy.http2.streamstates import NEXT, RESET, StreamStateError, active
from proxy.policy.holdings import SHED_DRAIN_SECONDS
from proxy.policy.refusals import ProxyError
from proxy.policy.throttle import Throttle
from proxy.settings import Settings
from proxy.sockets import nodelay

log = logging.getLogger("proxy.grpc.relay")
"""The gRPC relay's logger: what a tenant connection logs is under one name, `relay`'s, whichever
of its modules writes it."""

MAX_STREAMS: Final = 128
"""Concurrent streams a tenant connection may open (SETTINGS_MAX_CONCURRENT_STREAMS)."""
_CONNECTION_WINDOW: Final = 1 << 30
"""The tenant's connection window; credited as bytes arrive, since stream windows bound memory."""
MAX_HEADER_BLOCK: Final = 64 * 1024
"""The largest header block a tenant may send (HEADERS and its CONTINUATION frames)."""
_RESETS: Final = 2 * MAX_STREAMS
"""How many more streams than it completes a tenant may open at Triton and reset: past that its
connection ends (ENHANCE_YOUR_CALM), so a reset flood costs Triton and the shared connection
little ("rapid reset", CVE-2023-44487)."""
_CLOSED_KEPT: Final = 256
"""Closed streams remembered per connection (the last this many a client opening its odd ids in
turn closed; fewer where it skips ids), to tell a frame the tenant may still send on one
(ignored) from one it may not (STREAM_CLOSED); on older ones DATA is ignored and HEADERS are a
PROTOCOL_ERROR, as for a stream id never used."""


class Listener(GateContext, Scheduler, Protocol):
    """What a tenant connection needs from the listener (`server.GrpcRelay`)."""

    settings: Settings
    connections: set[Connection]
    closing: bool
    """Each call's end sends its connection GOAWAY (the relay stops, or the pod leaves its
    Service)."""
    mesh: bool
    """The namespace router's port: calls are opened upstream once their model is read."""

    def channel(self) -> Channel:
        """The connection to Triton a new stream goes on."""


class Connection(ReplyHooks, asyncio.Protocol):
    """One tenant connection's socket and streams (see the module docstring)."""

    def __init__(self, relay: Listener) -> None:
        self.relay = relay
        self.out = Outbox(relay)
        self.streams: dict[int, Stream] = {}  # open towards the tenant, by its stream id
        self.replies = Replies(self.out, self.streams, self)
        self.intake = StreamIntake(relay, self.streams, self.out, self.replies)
        self.gate = self.intake.gate
        # The listener's hold and flush around each read, bound once: compiled (mypyc), a call
        # through a Protocol is a lookup by name every time.
        self._hold = relay.hold
        self._flush = relay.flush
        self.last_sid = 0
        self._in = b""
        self._preface = False
        self._preface_timer: asyncio.TimerHandle | None = None
        self._goaway = False
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

    # -- reading ---------------------------------------------------------------------------------

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
            self._reader.feed(data[pos:] if pos else data)  # frames come back to the on_* methods
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

    # -- streams' ends ---------------------------------------------------------------------------

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

    # -- what the listener and the gateway ask ---------------------------------------------------

    def held_bytes(self) -> int:
        """What this connection holds for its pod now: a partial frame, each open stream's bytes
        both ways, and its unsent writes (the gateway's byte budget reads it on a timer), to
        which `relay.H2Connection` adds the header blocks and plans it keeps."""
        held = self._reader.buffered + len(self._in)
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
