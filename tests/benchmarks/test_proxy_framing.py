"""benchmarks/proxy_framing.py reads what strace wrote: the HTTP/2 frames in each read and write,
END_STREAM and ACK marked, counted per call and per connection, and every system call counted."""

from __future__ import annotations

from pathlib import Path

from benchmarks.proxy_framing import frame_kinds, per_call
from proxy.http2 import frames


def _hex(data: bytes) -> str:
    return "".join(f"\\x{byte:02x}" for byte in data)


def test_frames_are_read_by_their_headers_with_end_stream_and_ack_marked() -> None:
    data = (
        frames.PREFACE
        + frames.frame(frames.HEADERS, frames.END_HEADERS, 1, b"\x82")
        + frames.data_header(3, True, 1)
        + b"abc"
        + frames.window_update(0, 3)
        + frames.frame(frames.PING, frames.ACK, 0, bytes(8))
    )
    assert frame_kinds(data) == ["HEADERS", "DATA*", "WINDOW_UPDATE", "PING*"]


def test_a_trace_is_counted_per_call_and_per_connection(tmp_path: Path) -> None:
    request = frames.frame(frames.HEADERS, frames.END_HEADERS, 1, b"\x82")
    request += frames.data_header(2, True, 1) + b"hi"
    trace = tmp_path / "strace"
    lines = []
    for _ in range(2):  # two calls: each one read from the proxy, one write to Triton
        lines.append(f'7 read(12, "{_hex(request)}", 65536) = {len(request)}')
        lines.append(f'7 write(13, "{_hex(request)}", {len(request)}) = {len(request)}')
        lines.append("7 read(12, 0x7f00, 65536) = -1 EAGAIN (Resource temporarily unavailable)")
        lines.append("7 epoll_pwait(3, [], 1024, 0, NULL, 8) = 0")
    trace.write_text("\n".join(lines) + "\n")
    out = per_call(trace, {"fd 12": "the proxy", "fd 13": "Triton"}, calls=2)
    assert out[0] == "  system calls: read 2.00, write 1.00, epoll_pwait 1.00"
    assert "  reads from the proxy: DATA* 1.00, HEADERS 1.00, reads 1.00" in out
    assert "  writes to Triton: DATA* 1.00, HEADERS 1.00, writes 1.00" in out
