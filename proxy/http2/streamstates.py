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

# Events: indices into `EVENTS`, their names.
OPENED: Final = 0
"""HEADERS opened the stream (sent or received)."""
SENT_END: Final = 1
RECEIVED_END: Final = 2
RESET: Final = 3
"""RST_STREAM, sent or received, or the connection ended."""

EVENTS: Final = ("opened", "sent END_STREAM", "received END_STREAM", "reset")


class StreamStateError(Exception):
    """An event that cannot happen in a stream's state: a bug in the relay, never the peer's
    doing (the peer's frames are checked against the state before they change it)."""


class Transitions:
    """The table, indexed as `NEXT[state, event]`; a step it does not hold raises
    StreamStateError.

    A flat list of next states rather than a dict keyed by (state, event): the relay takes a step
    on each side of every call, and compiled (mypyc), this lookup passes the pair without building
    a tuple and finds the answer with one multiplication, where a dict hashes and compares a new
    tuple each time.
    """

    __slots__ = ("_after",)

    def __init__(self, steps: dict[tuple[int, int], int]) -> None:
        self._after = [-1] * (len(NAMES) * len(EVENTS))
        for (state, event), after in steps.items():
            self._after[state * len(EVENTS) + event] = after

    def __getitem__(self, step: tuple[int, int]) -> int:
        state, event = step
        after = self._after[state * len(EVENTS) + event]
        if after < 0:
            raise StreamStateError(f"a stream in state {NAMES[state]} cannot be {EVENTS[event]}")
        return after


NEXT: Final = Transitions(
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


# The three sets above as tests of a state: the relay asks them several times per call, and
# compiled (mypyc), `state in ACTIVE` boxes the state and looks it up in a set (about 100
# instructions), where these compare native ints. tests/proxy/http2/test_state.py holds them to
# the sets.


def active(state: int) -> bool:
    """`state in ACTIVE`: open or half-closed."""
    return OPEN <= state <= HALF_CLOSED_REMOTE


def peer_ended(state: int) -> bool:
    """`state in PEER_ENDED`: the peer may send nothing more."""
    return state in (HALF_CLOSED_REMOTE, CLOSED)


def we_ended(state: int) -> bool:
    """`state in WE_ENDED`: we may send nothing more."""
    return state in (HALF_CLOSED_LOCAL, CLOSED)
