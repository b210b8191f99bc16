"""The stream states of RFC 9113 section 5.1, as one transition table for both sides of the relay.

A relayed call is two HTTP/2 streams: the tenant's (the relay is its server) and Triton's (the
relay is its client). Each `Stream` holds one state per side (`Stream.tenant`, `Stream.triton`),
and every change goes through the table (`NEXT[state, event]`) with the event that causes it,
so an impossible order (END_STREAM sent twice, data after a reset) is an error here rather than a
flag quietly overwritten. The frame layer (`reader`) checks frames; this module checks their
order on one stream; what the relay does in each state is `proxy.grpc`'s.

What it must not do: write frames, or know anything but states and events.
"""

from __future__ import annotations

from typing import Final

IDLE: Final = 0
OPEN: Final = 1
HALF_CLOSED_LOCAL: Final = 2
"""We sent END_STREAM; the peer may still send."""
HALF_CLOSED_REMOTE: Final = 3
"""The peer sent END_STREAM; we may still send."""
CLOSED: Final = 4

NAMES: Final = ("idle", "open", "half-closed (local)", "half-closed (remote)", "closed")

# Events.
OPENED: Final = "opened"
"""HEADERS opened the stream (sent or received)."""
SENT_END: Final = "sent END_STREAM"
RECEIVED_END: Final = "received END_STREAM"
RESET: Final = "reset"
"""RST_STREAM, sent or received, or the connection ended."""


class StreamStateError(Exception):
    """An event that cannot happen in a stream's state: a bug in the relay, never the peer's
    doing (the peer's frames are checked against the state before they change it)."""


class _Transitions(dict[tuple[int, str], int]):
    """The table; a step it does not hold raises StreamStateError (a lookup that hits costs what
    a dict's does, which is why the relay indexes it rather than calling `advance`)."""

    def __missing__(self, key: tuple[int, str]) -> int:
        state, event = key
        raise StreamStateError(f"a stream in state {NAMES[state]} cannot be {event}")


NEXT: Final = _Transitions(
    {
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
)
"""`NEXT[state, event]`: the state after `event`; StreamStateError when RFC 9113 5.1 has no such
step."""


ACTIVE: Final = frozenset((OPEN, HALF_CLOSED_LOCAL, HALF_CLOSED_REMOTE))
"""Open or half-closed: the stream exists at the peer (`state in ACTIVE`)."""
PEER_ENDED: Final = frozenset((HALF_CLOSED_REMOTE, CLOSED))
"""The peer may send nothing more on the stream."""
WE_ENDED: Final = frozenset((HALF_CLOSED_LOCAL, CLOSED))
"""We may send nothing more on the stream."""
