"""The stream states of RFC 9113 section 5.1, as one transition table for both sides of the relay.

A relayed call is two HTTP/2 streams: the tenant's (the relay is its server) and Triton's (the
relay is its client). Each `Stream` holds one state per side (`Stream.tenant`, `Stream.triton`),
and every change goes through `advance` with the event that causes it, so an impossible order
(END_STREAM sent twice, data after a reset) is an error here rather than a flag quietly
overwritten. The frame layer (`h2reader`) checks frames; this module checks their order on one
stream; what the relay does in each state is `h2relay`'s, `h2streams`'s and `h2channel`'s.

What it must not do: write frames, or know anything but states and events.
"""

from __future__ import annotations

IDLE = 0
OPEN = 1
HALF_CLOSED_LOCAL = 2
"""We sent END_STREAM; the peer may still send."""
HALF_CLOSED_REMOTE = 3
"""The peer sent END_STREAM; we may still send."""
CLOSED = 4

NAMES = ("idle", "open", "half-closed (local)", "half-closed (remote)", "closed")

# Events.
OPENED = "opened"
"""HEADERS opened the stream (sent or received)."""
SENT_END = "sent END_STREAM"
RECEIVED_END = "received END_STREAM"
RESET = "reset"
"""RST_STREAM, sent or received, or the connection ended."""

_NEXT: dict[tuple[int, str], int] = {
    (IDLE, OPENED): OPEN,
    (OPEN, SENT_END): HALF_CLOSED_LOCAL,
    (OPEN, RECEIVED_END): HALF_CLOSED_REMOTE,
    (HALF_CLOSED_LOCAL, RECEIVED_END): CLOSED,
    (HALF_CLOSED_REMOTE, SENT_END): CLOSED,
    (IDLE, RESET): CLOSED,
    (OPEN, RESET): CLOSED,
    (HALF_CLOSED_LOCAL, RESET): CLOSED,
    (HALF_CLOSED_REMOTE, RESET): CLOSED,
    (CLOSED, RESET): CLOSED,
}


class StreamStateError(Exception):
    """An event that cannot happen in a stream's state: a bug in the relay, never the peer's
    doing (the peer's frames are checked against the state before they change it)."""


def advance(state: int, event: str) -> int:
    """The state after `event`; raises StreamStateError when RFC 9113 5.1 has no such step."""
    try:
        return _NEXT[state, event]
    except KeyError:
        raise StreamStateError(f"a stream in state {NAMES[state]} cannot be {event}") from None


def is_active(state: int) -> bool:
    """Open or half-closed: the stream exists at the peer."""
    return OPEN <= state <= HALF_CLOSED_REMOTE


def peer_ended(state: int) -> bool:
    """The peer may send nothing more on the stream."""
    return state in (HALF_CLOSED_REMOTE, CLOSED)


def we_ended(state: int) -> bool:
    """We may send nothing more on the stream."""
    return state in (HALF_CLOSED_LOCAL, CLOSED)
