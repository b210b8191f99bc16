"""One tenant connection to the gRPC relay (`--grpc-mode relay`): its frames, both ways.

The relay is the tenant's HTTP/2 peer: it answers SETTINGS and PING itself, grants and enforces
its own flow-control windows, decodes the tenant's header blocks (to route on `:path`) and encodes
Triton's response headers with an HPACK encoder of its own for this tenant. Streams it forwards go
to Triton on the proxy's shared connection (`h2channel`), after the per-stream gate (`h2streams`)
checked each message. A frame the tenant gets wrong (unreadable, out of order, over a window)
closes this connection only; Triton never sees it.

Writes to the tenant made in one event-loop turn leave in one write. What goes back to the tenant
(Triton's answers within its windows, under its stream ids) is `h2replies`; per tenant connection
it limits streams, header block size and resets (see the constants below).

Why not grpc.aio: its per-call cost (about 0.5-0.9 ms and most of a core here) made the proxy keep
a third of Triton's gRPC throughput; this relay scans frame headers and, for a client repeating
its headers, finds its header blocks already decoded and encoded (`h2headers`).

What it must not do: decide isolation itself, hand Triton a message it has not checked, or let
one tenant's frames reach the connection Triton shares among all of them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from hpack import HPACKError

from proxy import h2frames as f
from proxy.h2channel import Gathered
from proxy.h2headers import BlockDecoder, BlockEncoder, Fields, HeaderBlocks
from proxy.h2replies import CREDIT_STEP, TenantSide
from proxy.h2streams import (
    FORWARDED,
    READY_PATH,
    RECEIVE_WINDOW,
    UNIMPLEMENTED,
    Stream,
    StreamGate,
)
from proxy.routing import GrpcAnswer, grpc_kind
from proxy.sockets import nodelay

if TYPE_CHECKING:
    from proxy.h2server import GrpcRelay

log = logging.getLogger(__name__)

MAX_STREAMS = 128
"""Concurrent streams a tenant connection may open (SETTINGS_MAX_CONCURRENT_STREAMS)."""
_CONNECTION_WINDOW = 1 << 30
"""The tenant's connection window; credited as bytes arrive, since stream windows bound memory."""
MAX_HEADER_BLOCK = 64 * 1024
"""The largest header block a tenant may send (HEADERS and its CONTINUATION frames)."""
_RESETS = 2 * MAX_STREAMS
"""How many more streams than it completes a tenant may open at Triton and reset: past that its
connection ends (ENHANCE_YOUR_CALM), so a reset flood costs Triton and the shared connection
little ("rapid reset", CVE-2023-44487)."""
"""Stream credit is given back in steps this large, not a WINDOW_UPDATE per message."""


class ProtocolBrokenError(Exception):
    """The tenant broke the protocol: the connection ends with GOAWAY and this error code."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class H2Connection(Gathered, TenantSide, StreamGate, asyncio.Protocol):
    """One tenant connection (see the module docstring)."""

    def __init__(self, relay: GrpcRelay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}  # open towards the tenant, by its stream id
        self.last_sid = 0
        self.dirty = False
        self._wbuf: list[bytes] = []
        self._in = b""
        self._preface = False
        self._preface_timer: asyncio.TimerHandle | None = None
        self._goaway = False
        self._paused = False  # the tenant's socket is full: response DATA waits
        self._decoder = BlockDecoder()
        self._encoder = BlockEncoder()
        self._plans: dict[Fields, tuple[str, Fields, bytes | None]] = {}  # see _plan
        self._blocks = HeaderBlocks(MAX_HEADER_BLOCK)
        self._resets = _RESETS  # streams the tenant may still reset beyond those it completes
        self._received = _CONNECTION_WINDOW  # what the tenant may still send on the connection
        self._taken = 0  # connection bytes received and not yet credited back
        self._window = f.DEFAULT_WINDOW  # the tenant's connection window for our DATA
        self._initial_window = f.DEFAULT_WINDOW  # the tenant's SETTINGS_INITIAL_WINDOW_SIZE
        self._max_frame = f.DEFAULT_MAX_FRAME  # the tenant's SETTINGS_MAX_FRAME_SIZE
        self._blocked: dict[Stream, None] = {}  # streams with DATA waiting for the tenant

    # -- connection ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = nodelay(transport)
        self.relay.connections.add(self)
        self.write(
            f.settings(
                {
                    f.SETTINGS_MAX_CONCURRENT_STREAMS: MAX_STREAMS,
                    f.SETTINGS_INITIAL_WINDOW_SIZE: RECEIVE_WINDOW,
                }
            )
            + f.window_update(0, _CONNECTION_WINDOW - f.DEFAULT_WINDOW)
        )
        self._preface_timer = asyncio.get_running_loop().call_later(
            self.relay.settings.head_timeout_seconds, self._no_preface
        )

    def _no_preface(self) -> None:
        """A connection that never says it speaks HTTP/2 only holds a socket: close it."""
        timeout = self.relay.settings.head_timeout_seconds
        self._error(f.PROTOCOL_ERROR, f"no HTTP/2 connection preface within {timeout:g} s")

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.connections.discard(self)
        if self._preface_timer is not None:
            self._preface_timer.cancel()
        self.transport = None
        for stream in list(self.streams.values()):
            if stream.open and stream.channel is not None:
                stream.open = False
                stream.channel.reset(stream)  # Triton stops working for nobody
            self._finish(stream, "CANCELLED")
        self.streams.clear()
        self._blocked.clear()

    def pause_writing(self) -> None:
        # The tenant does not read: response DATA waits (its windows hold Triton back), and the
        # tenant's own frames wait too, so nothing it asks for (PING, SETTINGS) piles up here.
        self._paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        if self.transport is not None:
            self.transport.resume_reading()
        for stream in list(self._blocked):
            self._drain(stream)

    def go_away(self) -> None:
        """Take no new streams; those already open finish."""
        if not self._goaway:
            self._goaway = True
            self.write(f.goaway(self.last_sid))

    def activity(self) -> object | None:
        """For the idle sweep: None while calls are open, else the last stream id."""
        return None if self.streams else self.last_sid

    def close_idle(self) -> None:
        """Idle for --idle-timeout: GOAWAY NO_ERROR and close; the tenant's client reconnects on
        its next call, as after a gRPC server's max_connection_idle."""
        self.go_away()
        self.flush()
        if self.transport is not None:
            self.transport.close()

    def _error(self, code: int, reason: str) -> None:
        log.warning("A tenant broke the HTTP/2 protocol (%s): closing its connection.", reason)
        self.write(f.goaway(self.last_sid, code))
        self.flush()
        if self.transport is not None:
            self.transport.close()

    # -- the tenant's frames ---------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._in:
            data = self._in + data
        pos = 0
        if not self._preface:
            if len(data) < 24 and f.PREFACE.startswith(data):
                self._in = data
                return
            if data[:24] != f.PREFACE:
                self._error(f.PROTOCOL_ERROR, "no HTTP/2 connection preface")
                return
            self._preface = True
            if self._preface_timer is not None:
                self._preface_timer.cancel()
                self._preface_timer = None
            pos = 24
        end = len(data)
        try:
            while end - pos >= 9:
                length = int.from_bytes(data[pos : pos + 3], "big")
                if length > f.DEFAULT_MAX_FRAME:
                    raise ProtocolBrokenError(f.FRAME_SIZE_ERROR, f"a {length}-byte frame")
                stop = pos + 9 + length
                if stop > end:
                    break
                kind = data[pos + 3]
                flags = data[pos + 4]
                sid = int.from_bytes(data[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
                if self._blocks.pending and kind != f.CONTINUATION:
                    raise ProtocolBrokenError(f.PROTOCOL_ERROR, "a header block left unfinished")
                if kind == f.DATA:
                    self._data(data[pos + 9 : stop], flags, sid)
                else:
                    self._frame(data[pos + 9 : stop], kind, flags, sid)
                pos = stop
        except ProtocolBrokenError as e:
            self._error(e.code, str(e))
            return
        except (HPACKError, ValueError) as e:
            self._error(f.PROTOCOL_ERROR, f"unreadable: {e}")
            return
        self._in = data[pos:] if pos < end else b""

    def _data(self, payload: bytes, flags: int, sid: int) -> None:
        size = len(payload)
        self._received -= size
        self._taken += size
        if self._received < 0:
            raise ProtocolBrokenError(f.FLOW_CONTROL_ERROR, "DATA over the connection window")
        if self._taken >= _CONNECTION_WINDOW // 2:
            self.write(f.window_update(0, self._taken))
            self._received += self._taken
            self._taken = 0
        if sid == 0 or sid > self.last_sid:
            raise ProtocolBrokenError(f.PROTOCOL_ERROR, f"DATA on stream {sid}, never opened")
        stream = self.streams.get(sid)
        if stream is None or not stream.open or stream.fin:
            return  # answered or reset already: dropped (its bytes counted above)
        stream.received -= size
        if stream.received < 0:
            raise ProtocolBrokenError(f.FLOW_CONTROL_ERROR, f"DATA over stream {sid}'s window")
        body = payload
        if flags & f.PADDED:
            body = payload[1 : size - payload[0]]
            self.forwarded(stream, size - len(body))
        if flags & f.END_STREAM:
            stream.ended = stream.fin = True
        if body is payload and self._whole_message(payload, stream):
            # The common case, one whole message in one frame: checked and, if it passes
            # unchanged, sent on as the very bytes the tenant sent.
            self._check(stream, payload[5:], size, payload)
            return
        stream.buf += body
        self._messages(stream)

    def _frame(self, payload: bytes, kind: int, flags: int, sid: int) -> None:
        if kind == f.HEADERS or kind == f.CONTINUATION:
            block = self._blocks.feed(kind, flags, sid, payload)
            if block is not None:
                self._headers(*block)
        elif kind == f.WINDOW_UPDATE:
            self._window_update(sid, int.from_bytes(payload, "big") & 0x7FFFFFFF)
        elif kind == f.RST_STREAM:
            stream = self.streams.pop(sid, None)
            if stream is not None:
                self._blocked.pop(stream, None)
                if stream.open and stream.channel is not None:
                    stream.open = False
                    stream.channel.reset(stream)
                    self._resets -= 1
                self._finish(stream, "CANCELLED")
                if self._resets < 0:
                    raise ProtocolBrokenError(
                        f.ENHANCE_YOUR_CALM, f"over {_RESETS} more streams reset than completed"
                    )
        elif kind == f.SETTINGS:
            if not flags & f.ACK:
                self._settings(f.settings_values(payload))
                self.write(f.frame(f.SETTINGS, f.ACK, 0))
        elif kind == f.PING:
            if not flags & f.ACK:
                self.write(f.frame(f.PING, f.ACK, 0, payload))
        elif kind == f.PUSH_PROMISE:
            raise ProtocolBrokenError(f.PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # PRIORITY, GOAWAY (the tenant closes when it is done) and unknown types: nothing to do

    def _settings(self, values: dict[int, int]) -> None:
        window = values.get(f.SETTINGS_INITIAL_WINDOW_SIZE)
        if window is not None:
            if window > f.MAX_WINDOW:
                raise ProtocolBrokenError(f.FLOW_CONTROL_ERROR, "an initial window over 2^31-1")
            delta = window - self._initial_window
            self._initial_window = window
            for stream in self.streams.values():
                stream.window += delta
            for stream in list(self._blocked):
                self._drain(stream)
        size = values.get(f.SETTINGS_MAX_FRAME_SIZE)
        if size is not None:
            if not f.DEFAULT_MAX_FRAME <= size < 1 << 24:
                raise ProtocolBrokenError(f.PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {size}")
            self._max_frame = size
        table = values.get(f.SETTINGS_HEADER_TABLE_SIZE)
        if table is not None:
            self._encoder.limit_table(table)

    def _window_update(self, sid: int, increment: int) -> None:
        if sid == 0:
            if increment == 0 or self._window + increment > f.MAX_WINDOW:
                raise ProtocolBrokenError(f.FLOW_CONTROL_ERROR, "a bad connection WINDOW_UPDATE")
            self._window += increment
            for blocked in list(self._blocked):
                self._drain(blocked)
            return
        stream = self.streams.get(sid)
        if stream is not None:
            stream.window += increment
            if stream in self._blocked:
                self._drain(stream)

    def _headers(self, sid: int, flags: int, block: bytes) -> None:
        fields = self._decoder.decode(block)  # every block: the decoder follows the tenant's table
        end_stream = bool(flags & f.END_STREAM)
        stream = self.streams.get(sid)
        if stream is not None:  # trailers from the tenant end its side
            if stream.open and not stream.fin:
                stream.ended = stream.fin = True
                self._messages(stream)
            return
        if sid <= self.last_sid or sid % 2 == 0:
            raise ProtocolBrokenError(f.PROTOCOL_ERROR, f"stream {sid} is not a new client stream")
        self.last_sid = sid
        kind, sent, encoding = self._plan(fields)
        stream = Stream(self, sid, kind, self._initial_window)
        stream.encoding = encoding
        started = time.perf_counter()
        if self._goaway or len(self.streams) >= MAX_STREAMS:
            self.write(f.rst_stream(sid, f.REFUSED_STREAM))
            return
        router = self.relay.router
        answer: GrpcAnswer | None = None
        if not kind:
            answer = UNIMPLEMENTED
        elif kind == "ServerReady" and self.relay.state.draining:
            answer = GrpcAnswer(kind, "OK")  # ready: false while the pod drains
        elif kind not in FORWARDED:
            decision = router.decide(kind, b"")
            answer = decision if isinstance(decision, GrpcAnswer) else UNIMPLEMENTED
        if answer is not None:
            self._answer(stream, answer, started)
            return
        stream.route = kind
        stream.fin = end_stream  # and END_STREAM goes to Triton on the HEADERS frame
        stream.open = True
        self.streams[sid] = stream
        stream.started = started
        self.relay.channel().open(stream, sent, end_stream)
        if router.is_stream(kind):
            self._admit(stream)

    def _plan(self, fields: Fields) -> tuple[str, Fields, bytes | None]:
        """The RPC a tenant's request fields call, the fields Triton gets for them, and their
        grpc-encoding (for compressed messages); made once per distinct fields, since a client
        repeats its headers call after call."""
        plan = self._plans.get(fields)
        if plan is None:
            path = next((value for name, value in fields if name == b":path"), b"")
            encoding = next((value for name, value in fields if name == b"grpc-encoding"), None)
            kind = grpc_kind(path.decode("latin-1"))
            sent = fields
            if kind == "ServerReady":  # the pod's readiness is its model's: ask ModelReady
                sent = tuple((n, READY_PATH if n == b":path" else v) for n, v in fields)
            plan = (kind, sent, encoding)
            if len(self._plans) >= 64:
                self._plans.clear()
            self._plans[fields] = plan
        return plan

    def completed(self) -> None:
        """Triton completed one of this tenant's calls: it earns back one reset."""
        if self._resets < _RESETS:
            self._resets += 1

    def forwarded(self, stream: Stream, size: int) -> None:
        """`size` bytes of `stream` left the relay (to Triton, or dropped): the tenant may send
        that much more on it."""
        stream.taken += size
        if stream.taken >= CREDIT_STEP and not stream.fin:
            self.write(f.window_update(stream.sid, stream.taken))
            stream.received += stream.taken
            stream.taken = 0
