"""The relay's one HTTP/2 connection to Triton, shared by every tenant connection of the proxy.

Tenant streams are multiplexed onto it under stream ids of its own (`Stream.up`). Everything
Triton receives is written here: request header blocks from the channel's own HPACK encoder,
DATA within the windows Triton grants, RST_STREAM, WINDOW_UPDATE, and the answers to Triton's
SETTINGS and PING. No tenant frame reaches Triton as sent, so a tenant that breaks the protocol
only ever breaks its own connection. Triton's frames are read here (through the same checked
frame layer as the tenants', `proxy.http2.reader`) and handed to the stream's `stream.TenantSide`
(the `replies.Replies` of the tenant connection that owns it), which writes them under its own
ids, windows and header compression. The channel reaches the listener only through
`ChannelOwner`.

Flow control, request direction: DATA waits here while Triton's stream or connection window is
short, and the tenant's stream gets its credit back only once its bytes went to Triton.
Response direction: the channel grants Triton a large connection window, credited as bytes
arrive; each stream's window (`RESPONSE_WINDOW`) is credited only as the tenant takes the bytes,
so a tenant that stops reading holds at most that much per stream here.

Writes from every tenant made in one event-loop turn leave in one write (`GrpcRelay.flush`): under
load Triton reads many streams' frames per read, as from one client with many calls in flight.
When Triton sends GOAWAY the channel takes no new streams (a new channel is opened) and streams
Triton will not process are refused to their tenants with REFUSED_STREAM, which clients retry.

What it must not do: forward a tenant's bytes unchecked, or exceed a window Triton granted.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final, Protocol

from hpack import HPACKError

from proxy.grpc.framing import UNANSWERED
from proxy.grpc.outbox import Outbox, Scheduler
from proxy.grpc.stream import Channel, Stream
from proxy.http2 import frames
from proxy.http2.flow import FlowControlError, ReceiveWindow, Window
from proxy.http2.headers import BlockDecoder, BlockEncoder, Fields
from proxy.http2.reader import ConnectionBrokenError, FrameReader
from proxy.http2.streamstates import (
    CLOSED,
    NEXT,
    OPENED,
    RECEIVED_END,
    RESET,
    SENT_END,
    StreamStateError,
    peer_ended,
    we_ended,
)
from proxy.policy.limiter import Limiter
from proxy.policy.naming import ANSWERS, AnswerNames, NamingError, name_fields, spliced
from proxy.processflags import ProxyState
from proxy.reconnect import connect_retrying
from proxy.settings import Settings
from proxy.sockets import local_address, nodelay
from proxy.table import RESEND_BYTES, RESENDS

log = logging.getLogger(__name__)

CONNECT_TIMEOUT: Final = 10.0
"""Seconds to wait for Triton to accept the connection (it runs on the same node)."""
RESPONSE_WINDOW: Final = 1024 * 1024
"""The per-stream window the channel grants Triton: what it may hold of one stream's response."""
_CONNECTION_WINDOW: Final = 1 << 30
"""The channel's connection window for Triton, credited back as bytes arrive (streams bound it)."""
_LAST_ID: Final = 2**31 - 1


class ChannelOwner(Scheduler, Protocol):
    """What a channel needs from the listener that opened it (`server.GrpcRelay`)."""

    settings: Settings
    limiter: Limiter
    state: ProxyState

    def forget(self, channel: TritonChannel) -> None:
        """`channel` takes no new streams."""

    def channel(self) -> TritonChannel:
        """The channel a new stream goes on."""

    def triton_unreachable(self, address: str, error: object) -> None:
        """Connecting to Triton failed."""

    def triton_reachable(self) -> None:
        """Triton accepted a connection."""


def _hello() -> list[bytes]:
    """What the proxy sends Triton first on a connection: the preface, its settings (no push;
    each stream's window), and the larger connection window it grants."""
    settings = {
        frames.SETTINGS_ENABLE_PUSH: 0,
        frames.SETTINGS_INITIAL_WINDOW_SIZE: RESPONSE_WINDOW,
    }
    return [
        frames.PREFACE,
        frames.settings(settings),
        frames.window_update(0, _CONNECTION_WINDOW - frames.DEFAULT_WINDOW),
    ]


class TritonChannel(Channel, asyncio.Protocol):
    """One HTTP/2 client connection to Triton carrying streams of many tenant connections."""

    def __init__(self, relay: ChannelOwner, address: str = "", keyed: bool = True) -> None:
        self.relay = relay
        self.address = address or relay.settings.triton_grpc_url
        """host:port: the node gateway's gRPC side, or a relayed model's Service (`proxy.mesh`)."""
        self.keyed = keyed
        """Sends the pod's caller key first (the node gateway reads it; a Service does not)."""
        self.streams: dict[int, Stream] = {}  # by Triton-side stream id
        self.closing = False  # GOAWAY from Triton, ids used up, or the proxy stops
        self.max_streams = _LAST_ID  # Triton's SETTINGS_MAX_CONCURRENT_STREAMS
        self.max_frame = frames.DEFAULT_MAX_FRAME  # Triton's SETTINGS_MAX_FRAME_SIZE
        self.initial_window = frames.DEFAULT_WINDOW  # Triton's SETTINGS_INITIAL_WINDOW_SIZE
        self.window = Window(frames.DEFAULT_WINDOW)  # what Triton's connection window lets us send
        self.waiting: dict[Stream, None] = {}  # streams with DATA held for Triton's windows
        self._next_id = 1
        self._encoder = BlockEncoder()
        self._decoder = BlockDecoder()
        self._reader = FrameReader(self, from_server=True, max_block=1 << 20)
        self._got = 0  # flow-controlled bytes of the read in progress
        # What Triton may still send on the connection, credited as bytes arrive (streams bound it).
        self._received = ReceiveWindow(_CONNECTION_WINDOW, _CONNECTION_WINDOW // 2)
        self.out = Outbox(relay, _hello())  # leaves once connected; the listener marks it
        # The listener's hold and flush around each read, bound once (see connection.Connection).
        self._hold = relay.hold
        self._flush = relay.flush
        # In the gateway, the pod's share: what Triton sends for it counts against the node's
        # byte budget (`policy.holdings`) as it arrives, not only at the next walk.
        self._share = relay.limiter.share

    @property
    def transport(self) -> asyncio.Transport | None:
        """The socket to Triton (None until connected and once lost)."""
        return self.out.transport

    @transport.setter
    def transport(self, transport: asyncio.Transport | None) -> None:
        self.out.transport = transport

    # -- connection ------------------------------------------------------------------------------

    async def connect(self) -> None:
        """Open the connection; until then frames wait in the write buffer."""
        host, _, port = self.address.rpartition(":")
        loop = asyncio.get_running_loop()
        source = local_address(self.relay.settings.source_address)

        async def connection() -> object:
            if self.transport is not None or self.closing:
                return None  # connected meanwhile (a test's transport), or given up
            opening = loop.create_connection(lambda: self, host, int(port), local_addr=source)
            return await asyncio.wait_for(opening, CONNECT_TIMEOUT)

        try:
            # Refused: the gateway (or Triton) restarts; the streams on this channel have not
            # left (their frames wait in its outbox), so they wait too.
            await connect_retrying(
                connection, self.relay.settings.connect_retry_seconds, restoring=self._restoring
            )
        except (OSError, TimeoutError) as e:
            reason = e if isinstance(e, OSError) else f"no answer within {CONNECT_TIMEOUT:g} s"
            self.relay.triton_unreachable(f"{host}:{port}", reason)
            self._fail()

    def _restoring(self) -> tuple[asyncio.Event, float] | None:
        """The restore a refused connection waits for (the node gateway's, `gateway.restore`):
        that of the first model among the channel's streams whose model is restoring."""
        for stream in self.streams.values():
            served = stream.served
            limiter = self.relay.limiter if served is None else served.limiter
            if limiter.restoring is not None:
                return limiter.restoring, limiter.restore_seconds
        return None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = nodelay(transport)
        if self.keyed and self.relay.state.caller_key:
            # The node gateway reads the pod's caller key before the HTTP/2 preface.
            self.transport.write(self.relay.state.caller_key)
        self.relay.triton_reachable()
        self.out.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.streams:
            log.warning(
                "The connection to Triton's gRPC endpoint closed (%s) with %d calls in flight: "
                "those of idempotent models not answered yet are sent again on a new "
                "connection, the others fail UNAVAILABLE.",
                exc or "closed by Triton",
                len(self.streams),
            )
        self.transport = None
        self._fail(lost=True)

    def _fail(self, lost: bool = False) -> None:
        """The connection is gone (`lost`) or never came: every stream on it fails UNAVAILABLE,
        but one still to send goes on a new connection once its message may go
        (`Replies.triton_unavailable`), and one `_resendable` is sent again on one now."""
        self.closing = True
        self.relay.forget(self)
        streams, self.streams = list(self.streams.values()), {}
        self.waiting.clear()
        again: TritonChannel | None = None
        for stream in streams:
            if lost and _resendable(stream):
                if again is None:
                    again = self.relay.channel()  # a new one: this one is forgotten
                _send_again(stream, again)
                continue
            stream.triton = NEXT[stream.triton, RESET]
            stream.replies.triton_unavailable(stream)

    def accepts(self) -> bool:
        """Whether a new stream may go on this channel."""
        return not self.closing and len(self.streams) < self.max_streams

    # -- writing ---------------------------------------------------------------------------------

    def open(self, stream: Stream, fields: Fields, end_stream: bool) -> None:
        """Open `stream` at Triton with request header `fields`."""
        up = self._next_id
        self._next_id += 2
        if self._next_id > _LAST_ID:
            self.closing = True  # ids used up: new streams go to a new channel
        stream.up = up
        stream.channel = self
        stream.fields = fields
        stream.up_window.size = self.initial_window
        stream.triton = NEXT[stream.triton, OPENED]
        if end_stream:
            stream.triton = NEXT[stream.triton, SENT_END]
        self.streams[up] = stream
        block = self._encoder.encode(fields)  # every block encoded is written, in order
        self.out.write(frames.headers_frames(up, block, end_stream, self.max_frame))

    def send(self, stream: Stream, payload: bytes, end_stream: bool) -> None:
        """Send request bytes of `stream` as DATA, now or as soon as Triton's windows allow."""
        stream.up_sent = True
        size = len(payload)
        kept = stream.kept
        if kept is not None:
            if len(kept) + size <= RESEND_BYTES:
                kept += payload
            else:
                stream.kept = None
        if (
            not stream.up_held
            and size <= stream.up_window.size
            and size <= self.window.size
            and size <= self.max_frame
        ):
            stream.up_window.size -= size
            self.window.size -= size
            self.out.write_data(frames.data_header(size, end_stream, stream.up), payload)
            if end_stream:
                stream.triton = NEXT[stream.triton, SENT_END]
            if size:
                stream.replies.forwarded(stream, size)
            return
        stream.up_held += payload
        stream.up_end = stream.up_end or end_stream
        self.waiting[stream] = None
        self._release(stream)

    def _release(self, stream: Stream) -> None:
        """Send what `stream` holds as far as the windows allow."""
        held = stream.up_held
        while held:
            size = min(len(held), stream.up_window.size, self.window.size, self.max_frame)
            if size <= 0:
                return
            chunk = bytes(held[:size])
            del held[:size]
            stream.up_window.size -= size
            self.window.size -= size
            end = stream.up_end and not held
            self.out.write(frames.data_header(size, end, stream.up) + chunk)
            if end:
                stream.triton = NEXT[stream.triton, SENT_END]
                stream.up_end = False
            stream.replies.forwarded(stream, size)
        if stream.up_end:
            self.out.write(frames.data_header(0, True, stream.up))  # ends an empty remainder
            stream.triton = NEXT[stream.triton, SENT_END]
        stream.up_end = False
        self.waiting.pop(stream, None)

    def reset(self, stream: Stream) -> None:
        """Cancel `stream` at Triton (the tenant left it, or the relay answered it)."""
        if self.streams.pop(stream.up, None) is not None:
            self.out.write(frames.rst_stream(stream.up, frames.CANCEL))
        stream.triton = NEXT[stream.triton, RESET]
        stream.up_held.clear()
        self.waiting.pop(stream, None)
        self._ended()

    def credit(self, stream: Stream, size: int) -> None:
        """The tenant took `size` response bytes of `stream`: Triton may send that much more."""
        if stream.up in self.streams:
            self.out.write(frames.window_update(stream.up, size))

    def _ended(self) -> None:
        if self.closing and not self.streams and self.transport is not None:
            self.transport.close()

    # -- reading ---------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        share = self._share
        if share is not None:
            share.took(len(data))
        self._hold()  # what this read makes for tenants leaves at its end, in one write each
        try:
            self._read(data)
        except (ConnectionBrokenError, FlowControlError, HPACKError) as e:
            code = e.code if isinstance(e, ConnectionBrokenError) else frames.PROTOCOL_ERROR
            if isinstance(e, FlowControlError):
                code = frames.FLOW_CONTROL_ERROR
            elif isinstance(e, HPACKError):
                code = frames.COMPRESSION_ERROR
            log.warning("Triton broke HTTP/2 (%s): closing the connection to it.", e)
            self.out.write(frames.goaway(0, code))
            self.out.flush()
            if self.transport is not None:
                self.transport.abort()
        except StreamStateError:
            # A bug of the relay's: this connection's calls fail UNAVAILABLE, the proxy goes on.
            log.exception("The gRPC relay lost track of a stream: reconnecting to Triton.")
            if self.transport is not None:
                self.transport.abort()
        finally:
            self._flush()

    def _read(self, data: bytes) -> None:
        self._got = 0
        self._reader.feed(data)  # frames come back to on_* below
        got = self._got
        if got:
            increment = self._received.take(got)  # more than the window: FlowControlError
            if increment:
                self.out.write(frames.window_update(0, increment))

    # -- checked frames from the reader (`proxy.http2.reader.FrameSink`) ---------------------------

    def on_data(self, body: bytes, flags: int, sid: int, length: int) -> None:
        self._got += length
        stream = self.streams.get(sid)
        if stream is None:
            return  # reset by the relay: its bytes still count on the connection
        if stream.finals is not None:  # a stream's answers end its requests (`policy.finals`)
            body = self._counted(stream, body, length)
            length = len(body)
            if not body and not flags:
                stream.replies.settle(stream)  # an answer dropped may leave it idle
                return
        if not flags:  # the common shape first, without detours
            stream.replies.to_tenant(stream, body, False, length)
            return
        if len(body) < length:
            self.credit(stream, length - len(body))
        if flags & frames.END_STREAM:
            self._ended_by_triton(stream)
        stream.replies.triton_data(stream, body, bool(flags & frames.END_STREAM))

    def _counted(self, stream: Stream, body: bytes, length: int) -> bytes:
        """What to pass on of `body` (`length` bytes of Triton's with padding), Triton's DATA
        on a ModelStreamInfer stream, read for the requests its answers end (their slots go
        back). Every byte passed on is one of Triton's, credited as it leaves; padding and the
        answers dropped are credited now; an answer's start held is passed on later."""
        finals = stream.finals
        assert finals is not None
        out, ended, dropped = finals.feed(body)
        if ended:
            stream.replies.answered(stream, ended)
        if length - len(body) + dropped:
            self.credit(stream, length - len(body) + dropped)
        return out

    def on_frame(self, payload: bytes, kind: int, flags: int, sid: int) -> None:
        if kind == frames.WINDOW_UPDATE:
            self._window_update(sid, frames.u31(payload))
        elif kind == frames.RST_STREAM:
            stream = self.streams.get(sid)
            if stream is not None:
                self._close_stream(stream)
                stream.replies.triton_reset(stream, int.from_bytes(payload, "big"))
        elif kind == frames.SETTINGS:
            if not flags & frames.ACK:
                self._settings(frames.settings_values(payload))
                self.out.write(frames.frame(frames.SETTINGS, frames.ACK, 0))
        elif kind == frames.PING:
            if not flags & frames.ACK:
                self.out.write(frames.frame(frames.PING, frames.ACK, 0, payload))
        elif kind == frames.GOAWAY:
            self._goaway(int.from_bytes(payload[:4], "big") & 0x7FFFFFFF, payload[4:8])

    def on_stream_error(self, sid: int, code: int, reason: str) -> None:
        """Triton broke a rule of stream `sid`: reset it there; the tenant's call fails."""
        log.warning("Triton broke HTTP/2 on stream %d (%s): resetting the call.", sid, reason)
        self.out.write(frames.rst_stream(sid, code))
        stream = self.streams.get(sid)
        if stream is not None:
            self._close_stream(stream)
            stream.replies.triton_reset(stream, frames.INTERNAL_ERROR)

    def on_headers(self, sid: int, flags: int, block: bytes) -> None:
        fields = self._decoder.decode(block)  # every block: the decoder follows Triton's table
        stream = self.streams.get(sid)
        if stream is None:
            return
        end_stream = bool(flags & frames.END_STREAM)
        if end_stream:
            self._ended_by_triton(stream)
            if self._sent_again(stream, fields):
                return
        stream.kept = None  # its answer began: never sent again
        stream.replies.triton_headers(stream, fields, end_stream)

    def _sent_again(self, stream: Stream, fields: Fields) -> bool:
        """Whether `stream`, ended by the node gateway with `fields`, went again: the gateway
        lost Triton's connection under a call kept to send again (Triton exited:
        `framing.UNANSWERED`); it goes here or on a new channel, and the gateway holds it until
        its model is back in Triton."""
        if not (_resendable(stream) and UNANSWERED in fields):
            return False
        _send_again(stream, self if self.accepts() else self.relay.channel())
        return True

    def _ended_by_triton(self, stream: Stream) -> None:
        """Triton sent END_STREAM: if the tenant's side is still open, close it at Triton too
        (RST_STREAM NO_ERROR), or the stream would count against Triton's stream limit forever."""
        if we_ended(stream.triton):
            stream.triton = NEXT[stream.triton, RECEIVED_END]
        else:
            self.out.write(frames.rst_stream(stream.up, frames.NO_ERROR))
        self._close_stream(stream)

    def _close_stream(self, stream: Stream) -> None:
        """Triton ended `stream` (END_STREAM, or a reset either way): nothing more goes to
        Triton on it."""
        del self.streams[stream.up]
        if stream.triton != CLOSED:
            stream.triton = NEXT[stream.triton, RESET]
        # Tested before acted on: compiled (mypyc), `clear` and `dict.pop` are calls by name, and
        # on every call there is nothing to clear.
        if stream.up_held:
            stream.up_held.clear()
        if stream in self.waiting:
            del self.waiting[stream]
        self._ended()

    def _window_update(self, sid: int, increment: int) -> None:
        if sid == 0:
            self.window.grow(increment)  # past 2^31-1: FlowControlError, the connection ends
            for waiting in list(self.waiting):
                self._release(waiting)
                if self.window.size <= 0:
                    break
            return
        stream = self.streams.get(sid)
        if stream is not None:
            try:
                stream.up_window.grow(increment)
            except FlowControlError as e:
                self.on_stream_error(sid, frames.FLOW_CONTROL_ERROR, str(e))
                return
            if stream in self.waiting:
                self._release(stream)

    def _settings(self, values: dict[int, int]) -> None:
        self.max_streams = values.get(frames.SETTINGS_MAX_CONCURRENT_STREAMS, self.max_streams)
        self.max_frame = values.get(frames.SETTINGS_MAX_FRAME_SIZE, self.max_frame)
        table = values.get(frames.SETTINGS_HEADER_TABLE_SIZE)
        if table is not None:
            self._encoder.limit_table(table)
        window = values.get(frames.SETTINGS_INITIAL_WINDOW_SIZE)
        if window is not None:
            delta = window - self.initial_window
            self.initial_window = window
            for stream in self.streams.values():
                stream.up_window.shift(delta)
            for stream in list(self.waiting):
                self._release(stream)

    def _goaway(self, last: int, code: bytes) -> None:
        """Triton takes no new streams; those above `last` it never processed."""
        if code != b"\x00\x00\x00\x00":
            log.warning(
                "Triton's gRPC endpoint sent GOAWAY with error %d: new calls open a new "
                "connection.",
                int.from_bytes(code, "big"),
            )
        self.closing = True
        self.relay.forget(self)
        for sid, stream in list(self.streams.items()):
            if sid > last:
                del self.streams[sid]
                stream.triton = NEXT[stream.triton, RESET]
                self.waiting.pop(stream, None)
                stream.replies.triton_refused(stream)
        self._ended()


def _resendable(stream: Stream) -> bool:
    """Whether a call lost with the gateway's or Triton's exit is sent again: a unary call of a
    model that runs its calls twice safely (`Served.resend`: a pod's proxy, its upstream the
    node gateway), kept whole (`Stream.kept`: its tenant ended it, so no credit the tenant is
    given again lets it send more), whose bytes went (`Stream.up_sent`) and whose answer had
    not begun. Triton may have run it, which such a model allows. A call still to send (held
    for its model's wake or a slot) goes the way of every other call still to send
    (`Replies.triton_unavailable`: on a new connection once its message may go), its copy still
    empty; a stream's messages, or a begun answer, are never sent twice."""
    return (
        stream.kept is not None
        and stream.up_sent
        and not stream.responded
        and peer_ended(stream.tenant)
    )


def _send_again(stream: Stream, channel: TritonChannel) -> None:
    """Open `stream` on `channel` and send what it kept; kept again for another time until it
    went `RESENDS` times."""
    kept, stream.kept = stream.kept, None  # not kept twice by `send` below
    assert kept is not None and stream.served is not None
    stream.served.metrics.resent("grpc")
    stream.resends += 1
    ended = stream.up_end or we_ended(stream.triton)
    stream.detach()
    stream.up_held.clear()
    stream.up_end = False
    channel.open(stream, stream.fields, False)
    channel.send(stream, bytes(kept), ended)
    if stream.resends < RESENDS:
        stream.kept = kept


class RenamingChannel(TritonChannel):
    """A channel for a model Triton knows by a private name: Triton's answers name it,
    and the tenant gets them naming the public model id (`policy.naming`), byte for byte as if
    Triton served the model under that id. A message's start is held until its name can be
    read (at most `naming.HOLD` per stream, within the stream's window); the tenant is then
    sent the renamed bytes, and Triton credited for the bytes it sent (`AnswerNames.owed`).
    An answer that cannot be renamed (compressed, or malformed) fails the call: never the
    private name passed on. A separate class so a channel that renames nothing costs nothing."""

    def __init__(self, relay: ChannelOwner, private: bytes, public: bytes) -> None:
        super().__init__(relay)
        self._names: tuple[bytes, bytes, bytes, bytes] | None = (
            private,
            public,
            *name_fields(private, public),
        )

    def names(self, stream: Stream) -> tuple[bytes, bytes, bytes, bytes] | None:
        """The stream's private name, public id and their name fields; None: nothing to map."""
        return self._names

    def on_data(self, body: bytes, flags: int, sid: int, length: int) -> None:
        stream = self.streams.get(sid)
        if stream is None:
            super().on_data(body, flags, sid, length)
            return
        answers = stream.answers
        if answers is None:
            spec = ANSWERS.get(stream.kind)
            names = self.names(stream)
            if spec is None or names is None:  # an answer that names no model
                super().on_data(body, flags, sid, length)
                return
            private, public, first, renamed_first = names
            # The common answer, one whole message in one frame, spliced without an
            # `AnswerNames` (what it would answer; the next frame, if any, starts a message).
            out = None if flags else spliced(spec, body, first, renamed_first)
            if out is not None:
                self._got += length
                stream.replies.to_tenant(stream, out, False, length)
                return
            answers = stream.answers = AnswerNames(spec, private, public, first, renamed_first)
        self._got += length
        if stream.finals is not None:  # a stream's answers end its requests (`policy.finals`)
            body = self._counted(stream, body, length)
        elif len(body) < length:
            self.credit(stream, length - len(body))  # padding: never the tenant's
        try:
            out = answers.feed(body)
        except NamingError as e:
            self._unrenamable(stream, e)
            return
        answers.owed += len(body)
        if flags & frames.END_STREAM:
            self._ended_by_triton(stream)
            stream.replies.triton_data(stream, out, True)
        elif out:
            stream.replies.to_tenant(stream, out, False, answers.owed)
            answers.owed = 0
        elif stream.slots:
            stream.replies.settle(stream)  # an answer dropped may leave it idle

    def on_headers(self, sid: int, flags: int, block: bytes) -> None:
        if not flags & frames.END_STREAM:
            super().on_headers(sid, flags, block)
            return
        fields = self._decoder.decode(block)  # every block: the decoder follows Triton's table
        stream = self.streams.get(sid)
        if stream is None:
            return
        self._ended_by_triton(stream)
        if self._sent_again(stream, fields):
            return
        names = self.names(stream)
        if names is not None:
            private, public = names[0], names[1]
            for name, value in fields:
                if name == b"grpc-message" and private in value:
                    fields = tuple(
                        (n, v.replace(private, public) if n == b"grpc-message" else v)
                        for n, v in fields
                    )
                    break
        stream.replies.triton_headers(stream, fields, True)

    def _unrenamable(self, stream: Stream, error: NamingError) -> None:
        names = self.names(stream)
        log.warning(
            "An answer of Triton's for model %s cannot be renamed to its public id (%s): "
            "failing the call.",
            "?" if names is None else names[1].decode(),
            error,
        )
        self.out.write(frames.rst_stream(stream.up, frames.CANCEL))
        self._close_stream(stream)
        stream.replies.triton_reset(stream, frames.INTERNAL_ERROR)


class PerModelRenamingChannel(RenamingChannel):
    """A `RenamingChannel` of the node gateway's relays for a model host, whose models each
    have their own private name: each stream's answers are renamed from the private name of
    the model the stream serves (`Stream.served`, the one model it names), and a stream of no
    model, or of one Triton knows by its id, passes as it is."""

    def __init__(self, relay: ChannelOwner) -> None:
        TritonChannel.__init__(self, relay)
        self._names = None

    def names(self, stream: Stream) -> tuple[bytes, bytes, bytes, bytes] | None:
        served = stream.served
        return None if served is None else served.names
