"""A model's life on the node as one state machine: every (phase, event) pair is a transition of
the table or a refusal; every phase is reachable and can end; what a phase reports and tells the
pod; when a refused load is tried again."""

from __future__ import annotations

import itertools

import pytest

from agent.phases import (
    CONDITIONS,
    HELD_LOADED,
    PASSING,
    TRANSITIONS,
    Event,
    Life,
    ModelState,
    Phase,
    RefusedTransitionError,
    RetryPolicy,
    Rules,
    given_up,
    reported,
    step,
)


@pytest.mark.parametrize(
    ("phase", "event"), list(itertools.product(Phase, Event)), ids=lambda v: v.name
)
def test_every_pair_is_a_transition_of_the_table_or_a_refusal(phase: Phase, event: Event) -> None:
    life = Life(phase)
    to = TRANSITIONS.get((phase, event))
    if to is None:
        with pytest.raises(RefusedTransitionError) as refused:
            step(life, event, 5.0)
        assert (refused.value.phase, refused.value.event) == (phase, event)
        assert phase.value in str(refused.value) and event.value in str(refused.value)
        return
    after = step(life, event, 5.0, reason="why")
    assert after.phase is to
    # Pure: the same step again gives the same life, and the input is untouched.
    assert step(life, event, 5.0, reason="why") == after
    assert life == Life(phase)


def walk(start: Phase) -> set[Phase]:
    """Every phase reachable from `start` through the table (a crash may also quarantine)."""
    seen, todo = {start}, [start]
    while todo:
        phase = todo.pop()
        nexts = [to for (at, event), to in TRANSITIONS.items() if at is phase]
        if (phase, Event.CRASH_SUSPECTED) in TRANSITIONS:
            nexts.append(Phase.QUARANTINED)
        for to in nexts:
            if to not in seen:
                seen.add(to)
                todo.append(to)
    return seen


def test_every_phase_is_reached_from_absent_and_can_end_absent() -> None:
    assert walk(Phase.ABSENT) == set(Phase)
    for phase in Phase:
        assert Phase.ABSENT in walk(phase), f"{phase} is a dead end"


def test_triton_restarting_changes_only_what_the_agent_held_ready() -> None:
    for phase in Phase:
        expected = Phase.LOST if phase is Phase.READY else phase
        assert step(Life(phase), Event.TRITON_RESTARTED, 0.0).phase is expected


def test_one_operation_at_a_time_and_a_quarantined_model_never_loads() -> None:
    busy = (Phase.INSTALLING, Phase.LOADING, Phase.UNLOADING, Phase.WAKING)
    for phase in (*busy, Phase.QUARANTINED, Phase.ABSENT):
        for event in (Event.LOAD_STARTED, Event.INSTALL_STARTED):
            if phase is Phase.ABSENT and event is Event.INSTALL_STARTED:
                continue
            assert (phase, event) not in TRANSITIONS, (phase, event)
    for phase in busy:
        for event in (Event.UNLOAD_STARTED, Event.POD_GONE, Event.OVER_REQUEST):
            assert (phase, event) not in TRANSITIONS, (phase, event)


def test_a_refused_load_is_remembered_until_a_load_or_an_install_succeeds() -> None:
    life = step(Life(Phase.INSTALLED), Event.LOAD_STARTED, 1.0)
    life = step(life, Event.LOAD_FAILED, 2.0, reason="bad config")
    assert (life.phase, life.failure, life.failed_at, life.failures) == (
        Phase.FAILED,
        "bad config",
        2.0,
        1,
    )
    assert life.held_loaded and not life.counts_loaded
    again = step(step(life, Event.LOAD_STARTED, 3.0), Event.LOAD_FAILED, 4.0, reason="still")
    assert (again.failures, again.failed_at) == (2, 4.0)
    # Still refused while loading again: not counted until Triton answers READY.
    loading = step(again, Event.LOAD_STARTED, 5.0)
    assert loading.failure == "still" and not loading.counts_loaded
    ready = step(loading, Event.LOAD_OK, 6.0)
    assert (ready.phase, ready.failure, ready.failures) == (Phase.READY, "", 0)
    assert ready.counts_loaded
    installed = step(step(again, Event.INSTALL_STARTED, 7.0), Event.INSTALL_DONE, 8.0)
    assert (installed.phase, installed.failure) == (Phase.INSTALLED, "")


def test_a_load_without_room_rests_and_an_unanswered_one_is_loaded_again() -> None:
    loading = step(Life(Phase.INSTALLED), Event.LOAD_STARTED, 0.0)
    assert step(loading, Event.LOAD_REFUSED, 1.0).phase is Phase.INSTALLED
    lost = step(loading, Event.LOAD_UNANSWERED, 1.0)
    assert lost.phase is Phase.LOST and lost.held_loaded and lost.counts_loaded
    assert Phase.INSTALLED not in HELD_LOADED


def test_a_sleep_keeps_the_files_and_a_wake_loads_again_or_sleeps_on() -> None:
    unloading = step(Life(Phase.READY), Event.UNLOAD_STARTED, 0.0)
    asleep = step(step(unloading, Event.UNLOADED, 1.0), Event.IDLE, 1.0)
    assert asleep.phase is Phase.IDLE_UNLOADED and not asleep.held_loaded
    # Asleep is wanted but not held loaded: a restart of Triton or a pass does not load it.
    assert step(asleep, Event.TRITON_RESTARTED, 2.0).phase is Phase.IDLE_UNLOADED
    with pytest.raises(RefusedTransitionError):
        step(asleep, Event.LOAD_STARTED, 2.0)
    waking = step(asleep, Event.REQUEST_ARRIVED, 3.0)
    assert waking.phase is Phase.WAKING and reported(waking, "", True) is ModelState.LOADING
    assert step(waking, Event.LOAD_OK, 4.0).phase is Phase.READY
    # No room (nothing could be evicted) or no answer: asleep again, the next request retries.
    assert step(waking, Event.LOAD_REFUSED, 4.0).phase is Phase.IDLE_UNLOADED
    assert step(waking, Event.LOAD_UNANSWERED, 4.0).phase is Phase.IDLE_UNLOADED
    assert step(waking, Event.LOAD_FAILED, 4.0, reason="bad").failure == "bad"
    assert reported(asleep, "", installed=True) is ModelState.INSTALLED
    assert step(asleep, Event.POD_GONE, 5.0).phase is Phase.UNLOADING


def test_crashes_quarantine_after_the_rule_s_count() -> None:
    rules = Rules(quarantine_after=2)
    life = step(Life(Phase.READY), Event.CRASH_SUSPECTED, 0.0, rules=rules)
    assert (life.phase, life.crashes) == (Phase.LOST, 1)
    life = step(step(life, Event.LOAD_STARTED, 1.0), Event.CRASH_SUSPECTED, 2.0, rules=rules)
    assert (life.phase, life.crashes) == (Phase.QUARANTINED, 2)
    with pytest.raises(RefusedTransitionError):
        step(life, Event.LOAD_STARTED, 3.0)
    assert reported(life, "", installed=True) is ModelState.FAILED


@pytest.mark.parametrize(
    ("phase", "triton", "installed", "failure", "expected"),
    [
        (Phase.LOADING, "READY", True, "", ModelState.LOADING),
        (Phase.WAKING, "", True, "", ModelState.LOADING),
        (Phase.UNLOADING, "READY", True, "", ModelState.UNLOADING),
        (Phase.READY, "READY", True, "", ModelState.READY),
        (Phase.INSTALLED, "READY", True, "", ModelState.READY),
        (Phase.LOST, "LOADING", True, "", ModelState.LOADING),
        (Phase.LOST, "UNLOADING", True, "", ModelState.UNLOADING),
        (Phase.FAILED, "UNAVAILABLE", True, "bad", ModelState.FAILED),
        (Phase.LOST, "", True, "bad", ModelState.FAILED),
        (Phase.READY, "", True, "", ModelState.INSTALLED),
        (Phase.READY, "UNAVAILABLE", False, "", ModelState.ABSENT),
        (Phase.ABSENT, "", False, "", ModelState.ABSENT),
        (Phase.INSTALLING, "", True, "", ModelState.INSTALLED),
    ],
)
def test_what_the_agent_reports(
    phase: Phase, triton: str, installed: bool, failure: str, expected: ModelState
) -> None:
    assert reported(Life(phase, failure=failure), triton, installed) is expected


def test_the_pod_condition_is_told_for_every_reported_state() -> None:
    assert set(CONDITIONS) | PASSING == set(ModelState)
    assert not set(CONDITIONS) & PASSING
    assert CONDITIONS[ModelState.READY] == ("True", "ModelReady")
    not_ready = [said for state, said in CONDITIONS.items() if state is not ModelState.READY]
    assert all(status == "False" for status, _ in not_ready)


def test_a_refused_load_waits_for_its_retry_time() -> None:
    failed = Life(Phase.FAILED, failure="bad", failed_at=100.0, failures=1)
    constant = RetryPolicy(first=60.0)
    assert constant.retry_at(Life(Phase.INSTALLED)) == 0.0
    assert constant.retry_at(failed) == 160.0
    assert constant.retry_at(Life(Phase.FAILED, failure="bad", failed_at=100.0, failures=5)) == 160
    doubling = RetryPolicy(first=10.0, factor=2.0, cap=50.0)
    delays = [
        doubling.retry_at(Life(Phase.FAILED, failure="x", failed_at=0.0, failures=n))
        for n in range(1, 6)
    ]
    assert delays == [10.0, 20.0, 40.0, 50.0, 50.0]


def test_loads_refused_attempts_times_in_a_row_are_given_up_until_an_install() -> None:
    policy = RetryPolicy(first=60.0, factor=2.0, cap=300.0, attempts=3)
    life = Life(Phase.INSTALLED)
    tries = []
    now = 0.0
    while policy.retry_at(life) != float("inf"):
        now = max(now, policy.retry_at(life))
        tries.append(now)
        life = step(step(life, Event.LOAD_STARTED, now), Event.LOAD_FAILED, now + 1, "refused")
        now += 1
    # Three tries, each gap (from the refusal) twice the one before.
    assert tries == [0.0, 61.0, 182.0]
    assert given_up(life, 3) and not given_up(life, 4) and not given_up(life, 0)
    assert RetryPolicy(first=60.0, attempts=0).retry_at(life) == 183.0 + 60.0
    # A new install resets the count: the files changed.
    life = step(step(life, Event.INSTALL_STARTED, now), Event.INSTALL_DONE, now)
    assert not given_up(life, 3) and policy.retry_at(life) == 0.0
