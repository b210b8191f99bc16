"""HTTP/2 flow control as two small types, used by both sides of the relay (RFC 9113 5.2, 6.9).

`Window` is what a peer lets us send: it shrinks as we send DATA, grows with the peer's
WINDOW_UPDATE and moves with its SETTINGS_INITIAL_WINDOW_SIZE, and refuses to pass 2^31-1
(`FlowControlError`, which the caller turns into GOAWAY or RST_STREAM FLOW_CONTROL_ERROR, as the
window is the connection's or a stream's). `ReceiveWindow` is what we let a peer send: DATA that
arrives must fit in it (else the same error), and bytes we are done with are credited back in
steps, so one WINDOW_UPDATE covers many frames.

What it must not do: write frames or know streams; the caller sends the WINDOW_UPDATEs these
types ask for.
"""

from __future__ import annotations

from proxy.http2 import frames


class FlowControlError(Exception):
    """A window went past what RFC 9113 allows (over 2^31-1, or DATA beyond it)."""


class Window:
    """What the peer lets us send on a connection or a stream."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size
        """Bytes we may send now; negative after the peer shrank its initial window."""

    def __repr__(self) -> str:
        return f"Window({self.size})"

    def grow(self, increment: int) -> None:
        """The peer's WINDOW_UPDATE (`increment` > 0: the frame layer refused 0)."""
        size = self.size + increment
        if size > frames.MAX_WINDOW:
            raise FlowControlError(f"a WINDOW_UPDATE of {increment} takes the window over 2^31-1")
        self.size = size

    def shift(self, delta: int) -> None:
        """The peer changed SETTINGS_INITIAL_WINDOW_SIZE by `delta` (streams only)."""
        size = self.size + delta
        if size > frames.MAX_WINDOW:
            raise FlowControlError("a new SETTINGS_INITIAL_WINDOW_SIZE takes a window over 2^31-1")
        self.size = size


class ReceiveWindow:
    """What we let the peer send on a connection or a stream, and the credit we owe it."""

    __slots__ = ("owed", "size", "step")

    def __init__(self, size: int, step: int) -> None:
        self.size = size
        """Bytes the peer may still send."""
        self.owed = 0
        """Bytes we are done with and have not credited back yet."""
        self.step = step
        """Credit goes back once this much is owed."""

    def __repr__(self) -> str:
        return f"ReceiveWindow({self.size}, owed={self.owed})"

    def arrived(self, size: int) -> None:
        """`size` flow-controlled bytes arrived; raises FlowControlError past the window."""
        self.size -= size
        if self.size < 0:
            raise FlowControlError(f"{-self.size} bytes of DATA beyond the window")

    def take(self, size: int) -> int:
        """`arrived` and `release` at once, for a window credited as bytes arrive (a
        connection's, whose streams bound what is held): the increment to send now, or 0."""
        self.size -= size
        if self.size < 0:
            raise FlowControlError(f"{-self.size} bytes of DATA beyond the window")
        owed = self.owed + size
        if owed < self.step:
            self.owed = owed
            return 0
        self.owed = 0
        self.size += owed
        return owed

    def release(self, size: int) -> int:
        """We are done with `size` bytes: the increment to send now (0 while under a step)."""
        owed = self.owed + size
        if owed < self.step:
            self.owed = owed
            return 0
        self.owed = 0
        self.size += owed
        return owed
