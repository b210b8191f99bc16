"""What a tenant connection of the gRPC relay sends back: Triton's answers, within the tenant's
windows, under its stream ids, with header blocks encoded for it.

Response DATA goes out at once when the tenant's stream and connection windows allow it and its
socket takes writes; otherwise it waits on the stream (with the trailers behind it) until a
WINDOW_UPDATE or the socket drains. Triton's stream is credited only as the tenant takes the bytes,
in steps, so a tenant that stops reading holds back Triton's sending on its own streams, not the
relay's memory. Header blocks are encoded by the tenant connection's own HPACK encoder at the
moment they are written, so the tenant's decoder follows them in order.

A mixin of `relay.H2Connection`, kept apart so each file stays readable; `channel` calls the
`triton_*` methods. What it must not do: send a tenant more than its windows allow, or encode a
header block that is not then written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.grpc.gate import CREDIT_STEP, UNAVAILABLE, Stream
from proxy.http2 import frames as f
from proxy.http2.state import CLOSED, RESET, SENT_END, advance, is_active

if TYPE_CHECKING:
    from proxy.http2.flow import Window
    from proxy.http2.headers import BlockEncoder, Fields
_STATUS = {str(number).encode(): name for number, name in f.CODE_NAMES.items()}


class TenantSide:
    """The tenant-bound half of a relay connection (see the module docstring)."""

    streams: dict[int, Stream]
    _wbuf: list[bytes]
    _blocked: dict[Stream, None]
    _paused: bool
    _window: Window
    _max_frame: int
    _encoder: BlockEncoder

    if TYPE_CHECKING:  # provided by H2Connection, Gathered and StreamGate

        def write(self, frames: bytes) -> None: ...

        def completed(self) -> None: ...

        def closed(self, sid: int, strict: bool) -> None: ...

        def _finish(self, stream: Stream, code: str) -> None: ...

        def _refuse(
            self, stream: Stream, code: str, details: str, response: bytes | None = None
        ) -> None: ...

    def to_tenant(self, stream: Stream, payload: bytes, end_stream: bool, triton: int = 0) -> None:
        """DATA for the tenant on `stream`, now or once its windows allow; `triton` of its bytes
        came from Triton (credited back to Triton as they leave)."""
        size = len(payload)
        if (
            not stream.held
            and not self._paused
            and size <= stream.window.size
            and size <= self._window.size
            and size <= self._max_frame
        ):
            stream.window.size -= size
            self._window.size -= size
            self._wbuf.append(f.data_header(size, end_stream, stream.sid))
            self.write(payload)
            if triton:
                self._give(stream, triton)
            return
        stream.held += payload
        stream.held_end = stream.held_end or end_stream
        stream.held_up += triton
        self._blocked[stream] = None
        self._drain(stream)

    def end_to_tenant(self, stream: Stream, trailers: bytes | Fields) -> None:
        """End `stream` towards the tenant with `trailers` (frames, or Triton's fields to encode),
        after any DATA still waiting for its window."""
        if stream.held or stream.held_end:
            stream.trailers = trailers
            self.streams[stream.sid] = stream  # kept for the tenant's WINDOW_UPDATEs
            return
        if isinstance(trailers, bytes):
            if trailers:
                self.write(trailers)
        else:
            block = self._encoder.encode(trailers)
            self.write(f.headers_frames(stream.sid, block, True, self._max_frame))
        stream.tenant = advance(stream.tenant, SENT_END)
        if not is_active(stream.triton):
            self.streams.pop(stream.sid, None)
            self.closed(stream.sid, strict=stream.tenant == CLOSED)

    def _drain(self, stream: Stream) -> None:
        """Send what waits on `stream` as far as the tenant's windows allow."""
        held = stream.held
        while held and not self._paused:
            size = min(len(held), stream.window.size, self._window.size, self._max_frame)
            if size <= 0:
                return
            chunk = bytes(held[:size])
            del held[:size]
            stream.window.size -= size
            self._window.size -= size
            end = stream.held_end and not held
            self.write(f.data_header(size, end, stream.sid) + chunk)
            if end:
                stream.held_end = False
            triton = min(size, stream.held_up)
            if triton:
                stream.held_up -= triton
                self._give(stream, triton)
        if held or (stream.held_end and self._paused):
            return
        if stream.held_end:  # an empty last DATA frame
            self.write(f.data_header(0, True, stream.sid))
            stream.held_end = False
        self._blocked.pop(stream, None)
        trailers, stream.trailers = stream.trailers, None
        if trailers is not None:
            self.end_to_tenant(stream, trailers)

    def _give(self, stream: Stream, size: int) -> None:
        """The tenant took `size` of Triton's bytes on `stream`: credit Triton in steps."""
        stream.given += size
        if stream.given >= CREDIT_STEP and is_active(stream.triton) and stream.channel:
            stream.channel.credit(stream, stream.given)
            stream.given = 0

    # -- Triton's side of a stream (called by grpc.channel) -------------------------------------

    def triton_headers(self, stream: Stream, fields: Fields, end_stream: bool) -> None:
        if stream.sid not in self.streams:
            return  # answered by the relay already
        if not end_stream:
            stream.responded = True
            block = self._encoder.encode(fields)
            self.write(f.headers_frames(stream.sid, block, False, self._max_frame))
            return
        self.completed()
        code = "UNKNOWN"
        for name, value in fields:
            if name == b"grpc-status":
                code = _STATUS.get(value, "UNKNOWN")
        self._finish(stream, code)
        self.end_to_tenant(stream, fields)

    def triton_data(self, stream: Stream, body: bytes, end_stream: bool) -> None:
        if stream.sid not in self.streams:
            return
        self.to_tenant(stream, body, end_stream, len(body))
        if end_stream:  # a response without trailers: not gRPC, but passed on as it came
            self._finish(stream, "UNKNOWN")
            self.end_to_tenant(stream, b"")  # nothing more to send; forgotten once all is out

    def triton_reset(self, stream: Stream, code: int) -> None:
        if self.streams.pop(stream.sid, None) is not None:
            stream.tenant = advance(stream.tenant, RESET)
            self.closed(stream.sid, strict=False)
            self._blocked.pop(stream, None)
            self.write(f.rst_stream(stream.sid, code))
            self._finish(stream, "CANCELLED")

    def triton_refused(self, stream: Stream) -> None:
        """Triton's GOAWAY left `stream` unprocessed: the tenant may retry it."""
        if self.streams.pop(stream.sid, None) is not None:
            stream.tenant = advance(stream.tenant, RESET)
            self.closed(stream.sid, strict=False)
            self._blocked.pop(stream, None)
            self.write(f.rst_stream(stream.sid, f.REFUSED_STREAM))
            self._finish(stream, "UNAVAILABLE")

    def triton_unavailable(self, stream: Stream) -> None:
        """The connection to Triton failed under `stream`."""
        if stream.sid in self.streams:
            self._refuse(stream, "UNAVAILABLE", UNAVAILABLE)
