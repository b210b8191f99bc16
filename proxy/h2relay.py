"""The tenant gRPC endpoint as an HTTP/2 frame relay on asyncio protocols (`--grpc-mode relay`).

Each tenant connection gets its own connection to Triton (1:1), so stream ids, SETTINGS, PING,
WINDOW_UPDATE and flow control stay end to end and most frames pass verbatim. Only request header
blocks are decoded (a persistent HPACK decoder, fed every block so it stays in sync) to route on
`:path`; those forwarded are encoded for Triton by the relay's own encoder (`h2headers`).
Response header blocks are decoded too, only to read grpc-status for the metrics. The messages of
each stream pass the gate in `h2streams`. Frames the relay writes to the tenant itself are placed
between Triton's frames, never inside one or inside a header block.

Why not grpc.aio: its per-call cost (about 0.5-0.9 ms and most of a core here) made the proxy keep
a third of Triton's gRPC throughput; this relay scans frame headers and, for a client repeating
its headers, finds its header blocks already decoded and encoded (`h2headers`).

What it must not do: decide isolation itself, or hand Triton a message it has not checked.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from hpack import HPACKError

from proxy import h2frames as f
from proxy.h2headers import BlockDecoder, BlockEncoder, Fields
from proxy.h2streams import FORWARDED, READY_PATH, UNAVAILABLE, UNIMPLEMENTED, Stream, StreamGate
from proxy.h2triton import TritonSide
from proxy.routing import GrpcAnswer, grpc_kind
from proxy.sockets import nodelay

if TYPE_CHECKING:
    from proxy.h2server import GrpcRelay

log = logging.getLogger(__name__)

_COLLECT = 256 * 1024


class _Upstream(asyncio.Protocol):
    def __init__(self, conn: H2Connection) -> None:
        self.conn = conn

    def data_received(self, data: bytes) -> None:
        self.conn.from_triton(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.triton_lost()

    def pause_writing(self) -> None:
        _pause(self.conn.transport, True)

    def resume_writing(self) -> None:
        _pause(self.conn.transport, False)


class H2Connection(TritonSide, StreamGate, asyncio.Protocol):
    """One tenant connection and its own connection to Triton."""

    def __init__(self, relay: GrpcRelay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self.up: asyncio.Transport | None = None
        self._dead = False  # Triton unreachable: answer every stream UNAVAILABLE ourselves
        self._pending: list[bytes] = []
        self._in = b""
        self._parts: list[bytes] = []  # reads of one large frame, joined when it is complete
        self._have = 0
        self._need = 0
        self._out = b""
        self._preface = False
        self._decoder = BlockDecoder()
        self._up_decoder = BlockDecoder()
        self._plans: dict[Fields, tuple[str, Fields, bytes | None]] = {}  # see _plan
        self._up_encoder = BlockEncoder()
        self._block: tuple[int, int, bytearray] | None = None  # sid, flags, fragments
        self._up_block: tuple[int, bytearray] | None = None
        self._deferred: list[bytes] = []
        self._batch: list[bytes] | None = None  # frames for the tenant while Triton is mid-block
        self.streams: dict[int, Stream] = {}
        self.last_sid = 0
        self._goaway = False
        self._owed = 0  # bytes we sent the tenant that Triton does not know about
        self._up_max_frame = f.DEFAULT_MAX_FRAME  # Triton's SETTINGS_MAX_FRAME_SIZE
        self._up_end = 0  # stream whose Triton header block ends it

    # -- tenant side ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = nodelay(transport)
        self.relay.connections.add(self)
        self.relay.spawn(self._connect())

    async def _connect(self) -> None:
        host, _, port = self.relay.settings.triton_grpc_url.rpartition(":")
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.create_connection(lambda: _Upstream(self), host, int(port))
        except OSError as e:
            log.warning(
                "Triton's gRPC endpoint %s:%s is unreachable (%s): every call on this tenant "
                "connection is answered UNAVAILABLE.",
                host,
                port,
                e,
            )
            self._dead = True
            self._to_client(f.frame(f.SETTINGS, 0, 0))
        else:
            self.up = nodelay(transport)
            if self.transport is None or self.transport.is_closing():
                self.up.close()
                return
        pending, self._pending = self._pending, []
        for data in pending:
            self.data_received(data)

    def data_received(self, data: bytes) -> None:
        if self.up is None and not self._dead:
            self._pending.append(data)
            return
        if self._parts:
            # A large frame arrives in many reads: collect them and join once, not per read.
            self._parts.append(data)
            self._have += len(data)
            if self._have < self._need:
                return
            data = b"".join(self._parts)
            self._parts = []
        elif self._in:
            data = self._in + data
        pos = 0
        if not self._preface:
            if len(data) < 24:
                self._in = data
                return
            if data[:24] != f.PREFACE:
                self._close()
                return
            self._preface = True
            self._send_up(data[:24])
            pos = 24
        end = len(data)
        out: list[bytes] = []
        self._batch = out  # frames for Triton from this read, kept in the order they are made
        try:
            while end - pos >= 9:
                length = int.from_bytes(data[pos : pos + 3], "big")
                stop = pos + 9 + length
                if stop > end:
                    break
                kind = data[pos + 3]
                flags = data[pos + 4]
                sid = int.from_bytes(data[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
                self._client_frame(out, data, pos, stop, kind, flags, sid)
                pos = stop
        except (HPACKError, ValueError) as e:
            log.warning("A tenant sent an unreadable HTTP/2 frame (%s): closing its connection.", e)
            self._close()
            return
        finally:
            self._batch = None
        self._in = data[pos:] if pos < end else b""
        if len(self._in) >= 9:
            self._need = int.from_bytes(self._in[:3], "big") + 9
            if self._need > _COLLECT:
                self._parts = [self._in]
                self._have = len(self._in)
                self._in = b""
        if out:
            self._send_up(b"".join(out))

    def _client_frame(
        self, out: list[bytes], data: bytes, pos: int, stop: int, kind: int, flags: int, sid: int
    ) -> None:
        payload = data[pos + 9 : stop]
        if kind == f.DATA:
            stream = self.streams.get(sid)
            body = payload
            if flags & f.PADDED:
                body = payload[1 : len(payload) - payload[0]]
            if stream is None or not stream.open:
                self._credit(0, len(payload))  # for a stream Triton never sees, or saw end
                return
            if len(body) < len(payload):
                self._credit(sid, len(payload) - len(body))
            stream.ended = bool(flags & f.END_STREAM)
            if body is payload and self._whole_message(payload, stream):
                # The common case, one whole message in one frame: checked and, if it passes
                # unchanged, sent on as the very frame the tenant sent.
                self._check(out, stream, payload[5:], len(payload), data[pos:stop])
                return
            stream.buf += body
            self._messages(out, stream)
        elif kind == f.HEADERS:
            block = payload
            if flags & f.PADDED:
                block = block[1 : len(block) - block[0]]
            if flags & f.PRIORITY_FLAG:
                block = block[5:]
            if flags & f.END_HEADERS:
                self._headers(out, sid, flags, bytes(block))
            else:
                self._block = (sid, flags, bytearray(block))
        elif kind == f.CONTINUATION:
            if self._block is None or self._block[0] != sid:
                raise ValueError("CONTINUATION without HEADERS")
            self._block[2].extend(payload)
            if flags & f.END_HEADERS:
                sid, first, block_bytes = self._block
                self._block = None
                self._headers(out, sid, first, bytes(block_bytes))
        elif kind == f.RST_STREAM:
            stream = self.streams.pop(sid, None)
            if stream is not None and stream.open:
                out.append(data[pos:stop])
                self._finish(stream, "CANCELLED")
        elif kind == f.WINDOW_UPDATE:
            increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
            if sid == 0 and self._owed:
                taken = min(self._owed, increment)
                self._owed -= taken
                if increment > taken:
                    out.append(f.window_update(0, increment - taken))
            elif sid == 0 or (sid in self.streams and self.streams[sid].open):
                out.append(data[pos:stop])
        elif self._dead:
            if kind == f.SETTINGS and not flags & f.ACK:
                self._to_client(f.frame(f.SETTINGS, f.ACK, 0))
            elif kind == f.PING and not flags & f.ACK:
                self._to_client(f.frame(f.PING, f.ACK, 0, payload))
        else:
            if kind == f.SETTINGS and not flags & f.ACK:
                size = f.settings_values(payload).get(f.SETTINGS_HEADER_TABLE_SIZE)
                if size is not None:
                    self._up_decoder.max_allowed_table_size = size
            out.append(data[pos:stop])

    def _headers(self, out: list[bytes], sid: int, flags: int, block: bytes) -> None:
        fields = self._decoder.decode(block)
        end_stream = bool(flags & f.END_STREAM)
        stream = self.streams.get(sid)
        if stream is not None:  # trailers from the tenant end its side
            if stream.open:
                stream.ended = True
                self._messages(out, stream)
            return
        if sid <= self.last_sid or sid % 2 == 0:
            raise ValueError(f"stream id {sid} is not a new client stream")
        self.last_sid = sid
        kind, sent, encoding = self._plan(fields)
        stream = Stream(sid, kind, encoding)
        started = time.perf_counter()
        if self._goaway:
            self._to_client(f.rst_stream(sid, f.REFUSED_STREAM))
            return
        router = self.relay.router
        answer: GrpcAnswer | None = None
        if self._dead:
            answer = GrpcAnswer(kind or "unknown", "UNAVAILABLE", UNAVAILABLE)
        elif not kind:
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
        self.streams[sid] = stream
        self.relay.started[id(stream)] = started
        block = self._up_encoder.encode(sent)  # only now: every block encoded must reach Triton
        out.append(f.headers_frames(sid, block, end_stream, self._up_max_frame))
        if router.is_stream(kind):
            self._admit(out, stream)

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

    def triton_lost(self) -> None:
        """Triton closed the connection: every stream still open fails UNAVAILABLE."""
        self.up = None
        for stream in list(self.streams.values()):
            stream.open = False
            self._refuse(stream, "UNAVAILABLE", UNAVAILABLE)
        self._close()

    # -- both ----------------------------------------------------------------------------------

    def _to_client(self, frames: bytes) -> None:
        if self._up_block is not None or self._out:
            self._deferred.append(frames)  # never inside one of Triton's frames or header blocks
        elif self.transport is not None and frames:
            self.transport.write(frames)

    def _send_up(self, frames: bytes) -> None:
        if self._batch is not None:
            self._batch.append(frames)  # after the frames of this read made before it
        elif self.up is not None:
            self.up.write(frames)

    def pause_writing(self) -> None:
        _pause(self.up, True)

    def resume_writing(self) -> None:
        _pause(self.up, False)

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.connections.discard(self)
        for stream in list(self.streams.values()):
            self._finish(stream, "CANCELLED")
        self.streams.clear()
        if self.up is not None:
            self.up.close()
            self.up = None

    def go_away(self) -> None:
        """Take no new streams; those already open finish."""
        if not self._goaway:
            self._goaway = True
            self._to_client(f.goaway(self.last_sid))

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def _pause(transport: asyncio.Transport | None, pause: bool) -> None:
    """Back-pressure: one side cannot take bytes as fast as the other sends them."""
    if transport is not None:
        if pause:
            transport.pause_reading()
        else:
            transport.resume_reading()
