"""What a tenant connection of the gRPC relay sends back: Triton's answers, within the tenant's
windows, under its stream ids, with header blocks encoded for it.

Response DATA goes out at once when the tenant's stream and connection windows allow it and its
socket takes writes; otherwise it waits on the stream (with the trailers behind it) until a
WINDOW_UPDATE or the socket drains. Triton's stream is credited only as the tenant takes the bytes,
in steps, so a tenant that stops reading holds back Triton's sending on its own streams, not the
relay's memory. Header blocks are encoded by the tenant connection's own HPACK encoder at the
moment they are written, so the tenant's decoder follows them in order.

It also gives the tenant its credit back as its request bytes leave for Triton (`forwarded`).
One `Replies` per tenant connection, composed by `connection.Connection`; it is the `TenantSide` the
channel delivers Triton's frames to (`stream.Stream.replies`), and reaches the connection's stream
bookkeeping and the gate only through `ReplyHooks`. What it must not do: send a tenant more than
its windows allow, or encode a header block that is not then written.
"""

from __future__ import annotations

from typing import Final

from proxy.grpc import framing
from proxy.grpc.outbox import Outbox
from proxy.grpc.stream import CREDIT_STEP, Stream, TenantSide
from proxy.http2 import frames
from proxy.http2.flow import Window
from proxy.http2.headers import BlockEncoder, Fields
from proxy.http2.reader import FrameSink
from proxy.http2.streamstates import CLOSED, NEXT, RESET, SENT_END, active, peer_ended
from proxy.policy.refusals import UpstreamError, grpc_code, lacks_model, missing_model

UNAVAILABLE: Final = "Triton's gRPC endpoint is unreachable from the model proxy; retry later"
_STATUS: Final = {str(number).encode(): name for number, name in framing.CODE_NAMES.items()}


class ReplyHooks(FrameSink):
    """What the replies need from the tenant connection (`relay.H2Connection`, the one
    implementation) and its gate. A base class rather than a Protocol: compiled (mypyc), a call
    through a Protocol looks the method up by name, through a compiled base class it is a C call
    (as `stream.Channel` and `stream.TenantSide`). The tenant connection reads the tenant's
    frames, so this is its frame reader's sink too (mypyc has one base class per class)."""

    def completed(self) -> None:
        """Triton completed one of the tenant's calls."""
        raise NotImplementedError

    def closed(self, sid: int, strict: bool) -> None:
        """Stream `sid` closed (see `connection.Connection.closed`)."""
        raise NotImplementedError

    def finish(self, stream: Stream, code: str) -> None:
        """The call ended with `code`: free its slot, count it."""
        raise NotImplementedError

    def refuse(
        self,
        stream: Stream,
        code: str,
        details: str,
        response: bytes | None,
        unanswered: bool = False,
    ) -> None:
        """Answer `stream` with the relay's own error (and `response`), reset it at Triton
        (`unanswered`: lost with the connection to Triton, `framing.UNANSWERED`)."""
        raise NotImplementedError

    def answered(self, stream: Stream, requests: int) -> None:
        """Triton's answers ended `requests` of a stream's request messages: free their slots."""
        raise NotImplementedError

    def settled(self, stream: Stream) -> None:
        """A stream's answers all reached its tenant and none of its requests is at Triton:
        free the slot it kept for them."""
        raise NotImplementedError

    def go_away(self) -> None:
        """Take no new streams on the connection; those already open finish."""
        raise NotImplementedError


class Replies(TenantSide):
    """The tenant-bound half of one tenant connection (see the module docstring)."""

    __slots__ = (
        "blocked",
        "encoder",
        "hooks",
        "max_frame",
        "out",
        "paused",
        "streams",
        "window",
    )

    def __init__(self, out: Outbox, streams: dict[int, Stream], hooks: ReplyHooks) -> None:
        self.out = out
        self.streams = streams  # the connection's open streams, shared with it and the gate
        self.hooks = hooks
        self.blocked: dict[Stream, None] = {}  # streams with DATA waiting for the tenant
        self.paused = False  # the tenant's socket is full: response DATA waits
        self.window = Window(frames.DEFAULT_WINDOW)  # the tenant's connection window for our DATA
        self.max_frame = frames.DEFAULT_MAX_FRAME  # the tenant's SETTINGS_MAX_FRAME_SIZE
        self.encoder = BlockEncoder()  # bounded by the tenant's SETTINGS_HEADER_TABLE_SIZE

    def forwarded(self, stream: Stream, size: int) -> None:
        """`size` bytes of `stream` left the relay (to Triton, or dropped): the tenant may send
        that much more on it."""
        increment = stream.received.release(size)
        if increment and not peer_ended(stream.tenant):
            self.out.write(frames.window_update(stream.sid, increment))

    def drain_all(self) -> None:
        """Send what waits on every stream, as far as the windows allow (they grew)."""
        for stream in list(self.blocked):
            self.drain(stream)

    def to_tenant(self, stream: Stream, payload: bytes, end_stream: bool, triton: int = 0) -> None:
        """DATA for the tenant on `stream`, now or once its windows allow; `triton` of its bytes
        came from Triton (credited back to Triton as they leave)."""
        size = len(payload)
        if (
            not stream.held
            and not self.paused
            and size <= stream.window.size
            and size <= self.window.size
            and size <= self.max_frame
        ):
            stream.window.size -= size
            self.window.size -= size
            self.out.write_data(frames.data_header(size, end_stream, stream.sid), payload)
            if triton:
                self._give(stream, triton)
            if stream.slots:  # a stream's answer went out: idle now, it keeps no slot
                self.settle(stream)
            return
        stream.held += payload
        stream.held_end = stream.held_end or end_stream
        stream.held_up += triton
        self.blocked[stream] = None
        self.drain(stream)

    def end_to_tenant(self, stream: Stream, trailers: bytes | Fields) -> None:
        """End `stream` towards the tenant with `trailers` (frames, or Triton's fields to encode),
        after any DATA still waiting for its window."""
        if stream.held or stream.held_end:
            stream.trailers = trailers
            self.streams[stream.sid] = stream  # kept for the tenant's WINDOW_UPDATEs
            return
        if isinstance(trailers, bytes):
            if trailers:
                self.out.write(trailers)
        else:
            block = self.encoder.encode(trailers)
            self.out.write(frames.headers_frames(stream.sid, block, True, self.max_frame))
        stream.tenant = NEXT[stream.tenant, SENT_END]
        if not active(stream.triton):
            if stream.sid in self.streams:  # compiled (mypyc), `dict.pop` is a call by name
                del self.streams[stream.sid]
            self.hooks.closed(stream.sid, stream.tenant == CLOSED)

    def drain(self, stream: Stream) -> None:
        """Send what waits on `stream` as far as the tenant's windows allow."""
        held = stream.held
        while held and not self.paused:
            size = min(len(held), stream.window.size, self.window.size, self.max_frame)
            if size <= 0:
                return
            chunk = bytes(held[:size])
            del held[:size]
            stream.window.size -= size
            self.window.size -= size
            end = stream.held_end and not held
            self.out.write(frames.data_header(size, end, stream.sid) + chunk)
            if end:
                stream.held_end = False
            triton = min(size, stream.held_up)
            if triton:
                stream.held_up -= triton
                self._give(stream, triton)
        if held or (stream.held_end and self.paused):
            return
        if stream.held_up:  # Triton's bytes became fewer on the way (renamed answers)
            stream.held_up, triton = 0, stream.held_up
            self._give(stream, triton)
        if stream.held_end:  # an empty last DATA frame
            self.out.write(frames.data_header(0, True, stream.sid))
            stream.held_end = False
        self.blocked.pop(stream, None)
        if stream.slots:
            self.settle(stream)
        trailers, stream.trailers = stream.trailers, None
        if trailers is not None:
            self.end_to_tenant(stream, trailers)

    def _give(self, stream: Stream, size: int) -> None:
        """The tenant took `size` of Triton's bytes on `stream`: credit Triton in steps."""
        stream.given += size
        if stream.given >= CREDIT_STEP and active(stream.triton) and stream.channel:
            stream.channel.credit(stream, stream.given)
            stream.given = 0

    # -- Triton's side of a stream (`stream.TenantSide`, called by `channel`) ----------------

    def answered(self, stream: Stream, requests: int) -> None:
        self.hooks.answered(stream, requests)

    def settle(self, stream: Stream) -> None:
        """`stream` keeps its last slot from its last request's end until its answers have all
        left for the tenant (so a stream whose answers wait for a tenant that does not read
        counts against the limit, as one at Triton does); then, idle, it keeps none."""
        finals = stream.finals
        if finals is not None and not finals.pending and finals.quiet and not stream.held:
            self.hooks.settled(stream)

    def triton_headers(self, stream: Stream, fields: Fields, end_stream: bool) -> None:
        if stream.sid not in self.streams:
            return  # answered by the relay already
        if not end_stream:
            if stream.responded:  # the relay answered in the stream first, with its own head
                return
            stream.responded = True
            block = self.encoder.encode(fields)
            self.out.write(frames.headers_frames(stream.sid, block, False, self.max_frame))
            return
        code = "UNKNOWN"
        for name, value in fields:
            if name == b"grpc-status":
                code = _STATUS.get(value, "UNKNOWN")
        if code == "NOT_FOUND" and self._model_missing(stream, fields):
            return
        self.hooks.completed()
        self.hooks.finish(stream, code)
        self.end_to_tenant(stream, fields)

    def _model_missing(self, stream: Stream, fields: Fields) -> bool:
        """Whether Triton's NOT_FOUND ending `stream` says it has no such model while the node
        gateway's table serves it and Triton had just started again (`Limiter.on_unknown`, the
        gateway's only). The model is then held until it is READY, and the call answered
        UNAVAILABLE, unanswered (`framing.UNANSWERED`: it did not run, so a pod's proxy sends
        it again)."""
        served = stream.served
        if served is None:
            return False
        on_unknown = served.limiter.on_unknown
        if on_unknown is None:
            return False
        for name, value in fields:
            if name == b"grpc-message":
                if not lacks_model(value) or not on_unknown():
                    return False
                error = missing_model(served.model_id)
                self.hooks.refuse(stream, grpc_code(error).name, str(error), None, True)
                return True
        return False

    def triton_data(self, stream: Stream, body: bytes, end_stream: bool) -> None:
        if stream.sid not in self.streams:
            return
        self.to_tenant(stream, body, end_stream, len(body))
        if end_stream:  # a response without trailers: not gRPC, but passed on as it came
            self.hooks.finish(stream, "UNKNOWN")
            self.end_to_tenant(stream, b"")  # nothing more to send; forgotten once all is out

    def triton_reset(self, stream: Stream, code: int) -> None:
        if self.streams.pop(stream.sid, None) is not None:
            stream.tenant = NEXT[stream.tenant, RESET]
            self.hooks.closed(stream.sid, strict=False)
            self.blocked.pop(stream, None)
            self.out.write(frames.rst_stream(stream.sid, code))
            self.hooks.finish(stream, "CANCELLED")

    def triton_refused(self, stream: Stream) -> None:
        """Triton's GOAWAY left `stream` unprocessed: the tenant may retry it."""
        if self.streams.pop(stream.sid, None) is not None:
            stream.tenant = NEXT[stream.tenant, RESET]
            self.hooks.closed(stream.sid, strict=False)
            self.blocked.pop(stream, None)
            self.out.write(frames.rst_stream(stream.sid, frames.REFUSED_STREAM))
            self.hooks.finish(stream, "UNAVAILABLE")

    def triton_unavailable(self, stream: Stream) -> None:
        """The connection to Triton failed under `stream`: answered UNAVAILABLE, unless its
        message has not gone yet (`Stream.detach`)."""
        if stream.sid in self.streams:
            if stream.unsent:
                stream.detach()
                return
            error = UpstreamError(UNAVAILABLE)
            self.hooks.refuse(stream, grpc_code(error).name, str(error), None, True)
