"""agent.models.probationhold with agent.pods.callertable: while a watched load is under way, and
for a while after it ends, the caller table marks probationers held (and, through a suspected
file's trial in flight, every pod, bounded); a load that begins the hold waits until the gateway's
activity table shows them held with nothing at Triton (bounded); with no probationer, nothing
waits."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from agent.models import probationhold
from agent.models.probationhold import (
    NONE_HELD,
    TRIAL_MARGIN_SECONDS,
    ProbationHold,
    drained,
    latest_use,
)
from agent.pods.callertable import CallerPublisher, nobody_quarantined
from common.activity import Activity, ActivityTable
from common.callers import read_table
from tests.agent.pods.test_gateway_table import pod


def test_drained_needs_a_table_written_since_the_hold_that_shows_each_held_model_empty() -> None:
    empty, busy = Activity(1, 5.0, 0, True), Activity(1, 5.0, 1, True)
    assert drained([], None, 10.0), "nobody held: nothing to wait for"
    assert not drained(["a"], None, 10.0), "no table: not known"
    assert not drained(["a"], ActivityTable(9.0, {"a": empty}), 10.0), "written before the hold"
    assert not drained(["a"], ActivityTable(11.0, {"a": busy}), 10.0), "a request at Triton"
    unheld = Activity(0, 5.0, 0, False)
    assert not drained(["a"], ActivityTable(11.0, {"a": unheld}), 10.0), "not held yet"
    assert not drained(["a", "b"], ActivityTable(11.0, {"a": empty}), 10.0), "b not shown"
    assert drained(["a"], ActivityTable(11.0, {"a": empty, "c": busy}), 10.0)
    restoring = Activity(1, 5.0, 0, True, True)
    assert not drained(["a"], ActivityTable(11.0, {"a": restoring}), 10.0), "what it lets go"


async def test_probationers_are_held_through_a_watched_load_and_a_while_after(
    tmp_path: Path,
) -> None:
    owners = {"a-private": pod("a", "10.1.0.5"), "b-private": pod("b", "10.1.0.6")}
    probation = {"team/a"}
    table = tmp_path / "callers.json"
    hold = ProbationHold(0.3, drain_seconds=5.0, quiet_seconds=0.0)
    publisher = CallerPublisher(
        table,
        "node-1",
        lambda: owners,
        quarantine=nobody_quarantined,
        probation=probation.__contains__,
        held=hold.holds,
        trial=lambda: False,  # no hold is a trial
        key_of=lambda uid: "",  # no caller keys: pods known by address
    )
    hold.on_change = publisher.publish
    asked: list[list[str]] = []
    gateway_done = asyncio.Event()

    def gateway_drained(since: float) -> float | None:
        asked.append(publisher.held_names())
        return 0.0 if gateway_done.is_set() else None

    hold.drained = gateway_drained
    publisher.publish()

    def held() -> dict[str, bool]:
        return {c.pod: c.held for c in read_table(table).callers}

    assert held() == {"team/a": False, "team/b": False}
    beginning = asyncio.get_running_loop().create_task(hold.begin("team/b"))
    await asyncio.sleep(0.3)
    assert not beginning.done(), "the load waits for the gateway to drain the probationer"
    assert held() == {"team/a": True, "team/b": False}, "probationers only"
    assert asked and asked[-1] == ["a-private"]
    gateway_done.set()
    await asyncio.wait_for(beginning, 5)
    await asyncio.wait_for(hold.begin("team/b"), 1)  # a second one while held: drained already
    hold.end("team/b")
    hold.end("team/b")
    assert hold.holding() and held()["team/a"]
    deadline = time.monotonic() + 10
    while held()["team/a"]:
        assert time.monotonic() < deadline, "the hold never ended"
        await asyncio.sleep(0.05)
    assert not hold.holding()
    # A gateway that never answers bounds the wait.
    gateway_done.clear()
    hold.drain_seconds = 0.2
    await asyncio.wait_for(hold.begin("team/b"), 5)
    hold.end("team/b")


async def test_a_probationers_own_settling_load_does_not_hold_it() -> None:
    """In flight, a probationer's own load holds it (its requests would explain the exit);
    ended, only another pod's load does (an exit beside its own counts against its requests)."""
    hold = ProbationHold(5.0)
    await hold.begin("team/a")
    assert hold.holds("team/a") and hold.holds("team/b")
    hold.end("team/a")
    assert not hold.holds("team/a") and hold.holds("team/b")
    await hold.begin("team/b")
    hold.end("team/b")
    assert hold.holds("team/a") and hold.holds("team/b"), "each held for the other's load"


async def test_a_load_that_ended_with_triton_gone_holds_until_triton_is_back() -> None:
    """The agent sees its load fail the moment Triton dies, a moment before the gateway sees
    Triton go: the probationers stay held until Triton accepts connections again (then the
    gateway's restore holds what it lets go), at most `hold_seconds`; a load that ended
    otherwise keeps its whole window."""
    now = [100.0]
    changes: list[bool] = []
    hold = ProbationHold(10.0, clock=lambda: now[0])
    hold.on_change = lambda: changes.append(hold.holds("team/b"))
    await hold.begin("team/a")
    hold.end("team/a", exited=True)
    assert hold.holds("team/b"), "not let go to a Triton the gateway has not seen die"
    now[0] += 1.0
    hold.triton_back()
    assert not hold.holds("team/b") and not hold.holding()
    assert changes[-1] is False, "the caller table is rewritten to let them go"
    # Without Triton seen back, the window's bound ends it.
    await hold.begin("team/a")
    hold.end("team/a", exited=True)
    now[0] += 9.9
    assert hold.holds("team/b")
    now[0] += 0.2
    assert not hold.holds("team/b")
    # Triton back cuts only the windows of loads that ended with it gone.
    await hold.begin("team/a")
    hold.end("team/a", exited=True)
    await hold.begin("team/c")
    hold.end("team/c")
    hold.triton_back()
    assert hold.holds("team/b") and hold.holds("team/a"), "team/c's load still holds the others"
    now[0] += 10.1
    assert not hold.holding()
    # A suspected file's trial that ended with Triton gone holds every other pod the same way.
    hold.node_holds_per_file = 1
    await hold.begin("team/a", trial=True, suspect="digest")
    assert hold.holds("team/b", probation=False)
    hold.end("team/a", trial=True, exited=True)
    assert hold.holds("team/b", probation=False) and not hold.holds("team/a", probation=False)
    hold.triton_back()
    assert not hold.holds("team/b", probation=False)


async def test_no_hold_when_it_is_off() -> None:
    hold = ProbationHold(0.0)
    hold.drained = lambda since: None
    await asyncio.wait_for(hold.begin("team/b"), 1.0)
    assert not hold.holding()
    hold.end("team/b")
    assert not hold.holding()


async def test_a_suspects_trial_holds_until_its_settling_window_is_over_and_says_so() -> None:
    """A suspect's load (a trial) holds the other probationers, marked `trial`, while in flight
    and through its settling window and the margin after, not just `hold_seconds`; a plain
    load's hold is no trial. Its own pod is not held after it, as for any load."""
    now = [0.0]
    hold = ProbationHold(1.0, clock=lambda: now[0])
    await hold.begin("team/a")
    assert hold.holding() and not hold.trial()
    hold.end("team/a")
    await hold.begin("team/s", trial=True)
    assert hold.trial() and hold.holds("team/b")
    hold.end("team/s", trial=True, settle_seconds=8.0)
    now[0] = 5.0
    assert hold.trial() and hold.holds("team/b") and not hold.holds("team/s")
    now[0] = 8.0 + TRIAL_MARGIN_SECONDS - 0.1
    assert hold.trial() and hold.holds("team/b")
    now[0] = 8.0 + TRIAL_MARGIN_SECONDS + 0.1
    assert not hold.trial() and not hold.holds("team/b")
    # A trial whose load was refused (no READY) holds as a plain load does, after it.
    await hold.begin("team/s", trial=True)
    hold.end("team/s", trial=True)
    assert hold.holds("team/b") and not hold.trial()


async def test_a_namespaces_next_trial_waits_as_long_as_its_last_one_refused() -> None:
    """A namespace's trials refuse probationers at most half the time: its next begins only as
    long after the last one's refusal ended as that refusal lasted; another namespace's goes at
    once, and trials go one at a time."""
    now = [100.0]
    hold = ProbationHold(1.0, clock=lambda: now[0])
    await hold.trial_turn("team-a")
    await hold.begin("team-a/s-1", trial=True)
    now[0] = 101.0  # READY after 1 s
    hold.end("team-a/s-1", trial=True, settle_seconds=5.0)
    refused = 1.0 + 5.0 + TRIAL_MARGIN_SECONDS
    assert hold.trial_wait("team-a") == 100.0 + 2 * refused - now[0]
    assert hold.trial_wait("team-b") == 0.0
    await hold.trial_turn("team-b")
    other = asyncio.get_running_loop().create_task(hold.trial_turn("team-c"))
    await asyncio.sleep(0)
    assert not other.done(), "one trial at a time"
    hold.trial_over()  # team-b's never began
    await asyncio.wait_for(other, 5)


async def test_the_caller_table_marks_held_rows_of_a_trial(tmp_path: Path) -> None:
    owners = {"a-private": pod("a", "10.1.0.5"), "b-private": pod("b", "10.1.0.6")}
    table = tmp_path / "callers.json"
    hold = ProbationHold(5.0)
    publisher = CallerPublisher(
        table,
        "node-1",
        lambda: owners,
        quarantine=nobody_quarantined,
        probation={"team/a"}.__contains__,
        held=hold.holds,
        trial=hold.trial,
        key_of=lambda uid: "",  # no caller keys: pods known by address
    )
    hold.on_change = publisher.publish
    await hold.begin("team/b", trial=True)
    rows = {c.pod: (c.held, c.trial) for c in read_table(table).callers}
    assert rows == {"team/a": (True, True), "team/b": (False, False)}
    hold.end("team/b", trial=True)
    rows = {c.pod: (c.held, c.trial) for c in read_table(table).callers}
    assert rows == {"team/a": (True, False), "team/b": (False, False)}, "held, no trial"


async def test_a_suspected_files_trial_holds_every_pod_while_in_flight_within_its_bounds() -> None:
    """A trial of files counted for an exit alone holds pods not on probation too, while it is
    in flight and at most `hold_seconds` from its begin, and each file's trials only
    `node_holds_per_file` times; a trial without such files, or any other load, holds only
    probationers."""
    now = [0.0]
    hold = ProbationHold(1.0, node_holds_per_file=2, clock=lambda: now[0])
    await hold.begin("team/a")
    assert hold.holds("team/b") and not hold.holds("team/b", False), "a plain load"
    hold.end("team/a")
    await hold.begin("team/s", trial=True)
    assert not hold.holds("team/b", False), "a held namespace's new files: probationers only"
    hold.end("team/s", trial=True)
    await hold.begin("team/s", trial=True, suspect="d1")
    assert hold.holds_node() and hold.holds("team/b", False) and hold.holds("other/c", False)
    assert not hold.holds("team/s", False), "its own pod: its model is the one loading"
    now[0] = 0.9
    assert hold.holds("team/b", False)
    now[0] = 1.1
    assert not hold.holds("team/b", False), "in flight still, past its bound"
    assert hold.holds("team/b"), "probationers are held as before"
    hold.end("team/s", trial=True)
    await hold.begin("team/s", trial=True, suspect="d1")
    assert hold.holds("team/b", False), "the file's second trial"
    hold.end("team/s", trial=True)
    assert not hold.holds("team/b", False), "not once it ended"
    await hold.begin("team/s", trial=True, suspect="d1")
    assert not hold.holds_node(), "the file's allowance is spent"
    hold.end("team/s", trial=True)
    await hold.begin("team/s", trial=True, suspect="d2")
    assert hold.holds_node(), "another file's first"
    hold.end("team/s", trial=True)


async def test_the_caller_table_holds_every_row_through_a_suspected_files_trial_refusing_none(
    tmp_path: Path,
) -> None:
    """Through a suspected file's trial every row is held; only probationers' are refused."""
    owners = {"a-private": pod("a", "10.1.0.5"), "b-private": pod("b", "10.1.0.6")}
    table = tmp_path / "callers.json"
    hold = ProbationHold(5.0, node_holds_per_file=1)
    publisher = CallerPublisher(
        table,
        "node-1",
        lambda: owners,
        quarantine=nobody_quarantined,
        probation={"team/a"}.__contains__,
        held=hold.holds,
        trial=hold.trial,
        key_of=lambda uid: "",  # no caller keys: pods known by address
    )
    hold.on_change = publisher.publish
    await hold.begin("team/s", trial=True, suspect="d1")
    rows = {c.pod: (c.held, c.trial) for c in read_table(table).callers}
    assert rows == {"team/a": (True, True), "team/b": (True, False)}
    hold.end("team/s", trial=True)
    rows = {c.pod: (c.held, c.trial) for c in read_table(table).callers}
    assert rows == {"team/a": (True, False), "team/b": (False, False)}, "only probationers after"


def test_latest_use_is_the_held_models_last_request_once_drained() -> None:
    quiet, recent = Activity(1, 5.0, 0, True), Activity(1, 9.0, 0, True)
    assert latest_use([], None, 10.0) == NONE_HELD, "nobody held"
    assert latest_use(["a"], ActivityTable(11.0, {"a": Activity(1, 5.0, 1, True)}), 10.0) is None
    table = ActivityTable(11.0, {"a": quiet, "b": recent, "c": Activity(0, 10.5, 2, False)})
    assert latest_use(["a", "b"], table, 10.0) == 9.0, "the latest of the held, not of c"


async def test_a_watched_load_waits_until_the_held_pods_have_sent_nothing_for_the_quiet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gateway's witness names every pod that sent a request within `BESIDE_SECONDS` of an
    exit: a load begins only once the held pods have been quiet that long, and, once the table
    showed one of them moving (a restore letting its requests go), only after it has stayed
    drained that long, as the table may lag what the restore let go."""
    monkeypatch.setattr(probationhold, "POLL_SECONDS", 0.0)
    wall = [100.0]
    now = [0.0]
    hold = ProbationHold(10.0, drain_seconds=60.0, quiet_seconds=2.0, clock=lambda: now[0])
    hold._wall = lambda: wall[0]
    answers: list[float | None] = []
    hold.drained = lambda since: answers.pop(0) if len(answers) > 1 else answers[0]

    async def begins_after(script: list[float | None]) -> float:
        """Seconds of the fake clocks the begin takes, polled each 0.1 s."""
        answers[:] = script
        began = now[0]
        task = asyncio.get_running_loop().create_task(hold.begin("team/s"))
        await asyncio.sleep(0)
        while not task.done():
            now[0] += 0.1
            wall[0] += 0.1
            await asyncio.sleep(0)
        hold.end("team/s")
        return now[0] - began

    assert await begins_after([wall[0] - 10.0]) == 0, "quiet for long: at once"
    assert 1.4 <= await begins_after([wall[0] - 0.5]) <= 1.7, "1.5 s more of quiet"
    # Moving (a restore), then drained with an old last request: it stays drained 2 s first.
    assert 2.1 <= await begins_after([None, None, None, wall[0] - 30.0]) <= 2.5
