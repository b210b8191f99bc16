"""The stream states of RFC 9113 5.1 (`proxy.http2.streamstates`): the steps the table holds, and
that any other step is an error, never a silent overwrite."""

from __future__ import annotations

import re

import pytest

from proxy.http2.streamstates import (
    ACTIVE,
    CLOSED,
    EVENTS,
    HALF_CLOSED_LOCAL,
    HALF_CLOSED_REMOTE,
    IDLE,
    NAMES,
    NEXT,
    OPEN,
    OPENED,
    PEER_ENDED,
    RECEIVED_END,
    RESET,
    SENT_END,
    WE_ENDED,
    StreamStateError,
    active,
    peer_ended,
    we_ended,
)


def walk(*events: int) -> int:
    state = IDLE
    for event in events:
        state = NEXT[state, event]
    return state


def test_a_call_closes_whichever_side_ends_first() -> None:
    assert walk(OPENED, RECEIVED_END) == HALF_CLOSED_REMOTE
    assert walk(OPENED, RECEIVED_END, SENT_END) == CLOSED
    assert walk(OPENED, SENT_END) == HALF_CLOSED_LOCAL
    assert walk(OPENED, SENT_END, RECEIVED_END) == CLOSED
    assert walk(OPENED, RESET) == CLOSED
    assert walk(OPENED, SENT_END, RESET, RESET) == CLOSED  # a reset after the end is harmless


@pytest.mark.parametrize(
    "events",
    [
        (SENT_END,),  # END_STREAM on a stream never opened
        (OPENED, OPENED),
        (OPENED, SENT_END, SENT_END),  # END_STREAM sent twice
        (OPENED, RECEIVED_END, RECEIVED_END),
        (OPENED, RESET, SENT_END),  # anything after a reset
        (OPENED, RESET, RECEIVED_END),
    ],
)
def test_a_step_the_rfc_has_not_is_an_error(events: tuple[int, ...]) -> None:
    with pytest.raises(StreamStateError, match="cannot be"):
        walk(*events)


def test_every_step_outside_the_table_is_refused_by_name() -> None:
    held = {(state, event) for state in range(len(NAMES)) for event in range(len(EVENTS))}
    allowed = {step for step in held if _takes(step)}
    assert allowed == {
        (IDLE, OPENED),
        (OPEN, SENT_END),
        (OPEN, RECEIVED_END),
        (HALF_CLOSED_LOCAL, RECEIVED_END),
        (HALF_CLOSED_REMOTE, SENT_END),
        (IDLE, RESET),
        (OPEN, RESET),
        (HALF_CLOSED_LOCAL, RESET),
        (HALF_CLOSED_REMOTE, RESET),
        (CLOSED, RESET),
    }
    with pytest.raises(StreamStateError, match=re.escape("half-closed (local) cannot be sent END")):
        NEXT[HALF_CLOSED_LOCAL, SENT_END]


def _takes(step: tuple[int, int]) -> bool:
    try:
        NEXT[step]
    except StreamStateError:
        return False
    return True


def test_the_state_sets_say_who_may_still_send() -> None:
    assert {OPEN, HALF_CLOSED_LOCAL, HALF_CLOSED_REMOTE} == ACTIVE
    assert {HALF_CLOSED_REMOTE, CLOSED} == PEER_ENDED
    assert {HALF_CLOSED_LOCAL, CLOSED} == WE_ENDED


@pytest.mark.parametrize("state", range(-1, len(NAMES) + 1))  # and one past each end
def test_the_state_tests_agree_with_the_sets(state: int) -> None:
    assert active(state) == (state in ACTIVE)
    assert peer_ended(state) == (state in PEER_ENDED)
    assert we_ended(state) == (state in WE_ENDED)
