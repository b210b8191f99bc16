"""The Triton-facing half of a relay connection: Triton's frames pass to the tenant verbatim.

Frames are passed on whole (a partial frame waits for its rest), so anything the relay writes to
the tenant itself lands between Triton's frames. Response header blocks are decoded with their own
persistent HPACK decoder, only to keep it in step and read `grpc-status` for the metrics; Triton's
SETTINGS give the frame size the relay may send it and bound the decoder of tenant blocks.

A mixin of `h2relay.H2Connection`. What it must not do: change or drop Triton's frames.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy import h2frames as f

if TYPE_CHECKING:
    import asyncio

    from proxy.h2headers import BlockDecoder, BlockEncoder
    from proxy.h2streams import Stream


class TritonSide:
    """Reads Triton's frames for one tenant connection (see the module docstring)."""

    transport: asyncio.Transport | None
    streams: dict[int, Stream]
    _out: bytes
    _up_block: tuple[int, bytearray] | None
    _up_end: int
    _up_max_frame: int
    _deferred: list[bytes]
    _decoder: BlockDecoder
    _up_decoder: BlockDecoder
    _up_encoder: BlockEncoder

    if TYPE_CHECKING:  # provided by H2Connection and StreamGate; no stub may shadow them

        def _to_client(self, frames: bytes) -> None: ...

        def _finish(self, stream: Stream, code: str) -> None: ...

    def from_triton(self, data: bytes) -> None:
        data = self._out + data if self._out else data
        pos = 0
        end = len(data)
        while end - pos >= 9:
            length = int.from_bytes(data[pos : pos + 3], "big")
            stop = pos + 9 + length
            if stop > end:
                break
            kind = data[pos + 3]
            if kind != f.DATA:
                self._triton_frame(data, pos, stop, kind, data[pos + 4])
            pos = stop
        self._out = data[pos:] if pos < end else b""
        if pos and self.transport is not None:
            self.transport.write(data[:pos] if pos < end else data)
        if self._deferred and self._up_block is None:
            deferred, self._deferred = self._deferred, []
            self._to_client(b"".join(deferred))

    def _triton_frame(self, data: bytes, pos: int, stop: int, kind: int, flags: int) -> None:
        sid = int.from_bytes(data[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
        payload = data[pos + 9 : stop]
        if kind == f.HEADERS:
            if flags & f.PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            if flags & f.PRIORITY_FLAG:
                payload = payload[5:]
            stream = self.streams.get(sid)
            if stream is not None:
                stream.responded = True
            if flags & f.END_STREAM:
                self._up_end = sid  # trailers: END_STREAM is on the HEADERS frame
            if flags & f.END_HEADERS:
                self._triton_headers(sid, payload)
            else:
                self._up_block = (sid, bytearray(payload))
        elif kind == f.CONTINUATION and self._up_block is not None:
            self._up_block[1].extend(payload)
            if flags & f.END_HEADERS:
                sid, block = self._up_block
                self._up_block = None
                self._triton_headers(sid, bytes(block))
        elif kind == f.RST_STREAM:
            stream = self.streams.pop(sid, None)
            if stream is not None:
                stream.open = False
                self._finish(stream, "CANCELLED")
        elif kind == f.SETTINGS and not flags & f.ACK:
            values = f.settings_values(payload)
            self._up_max_frame = values.get(f.SETTINGS_MAX_FRAME_SIZE, self._up_max_frame)
            table = values.get(f.SETTINGS_HEADER_TABLE_SIZE)
            if table is not None:  # bounds the tenant's encoder (so our decoder) and our own
                self._decoder.max_allowed_table_size = table
                self._up_encoder.limit_table(table)

    def _triton_headers(self, sid: int, block: bytes) -> None:
        """A whole header block from Triton: decoded to keep in step; trailers end the stream."""
        fields = self._up_decoder.decode(block)
        if self._up_end == sid:
            self._up_end = 0
            stream = self.streams.pop(sid, None)
            if stream is not None:
                stream.open = False
                code = "UNKNOWN"
                for name, value in fields:
                    if name == b"grpc-status":
                        code = f.CODE_NAMES.get(int(value), "UNKNOWN")
                self._finish(stream, code)
