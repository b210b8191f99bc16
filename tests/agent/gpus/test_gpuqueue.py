"""Turns at each GPU's load slot, in fake time: round the namespaces per GPU (FIFO within one), GPUs
independent, a waiter that gives up keeps the others' order, and each turn's budget."""

from __future__ import annotations

from agent.gpus.gpuqueue import GpuQueue, Turn, Work, load_budget


def test_turns_on_one_gpu_are_granted_first_come_first_served() -> None:
    queue = GpuQueue()
    first = queue.ask("GPU-a", Work.LOAD, "m1", "team-a", 0.0)
    second = queue.ask("GPU-a", Work.UNLOAD, "m2", "team-b", 1.0)
    third = queue.ask("GPU-a", Work.LOAD, "m3", "team-a", 2.0)
    assert queue.holder("GPU-a") == first
    assert queue.waiting("GPU-a") == [second, third]
    assert queue.done(first, 3.0) == second
    # The load after the unload goes beside it (see below), not behind it.
    assert queue.holder("GPU-a") == second and queue.beside("GPU-a") == third
    assert queue.waiting("GPU-a") == []
    assert queue.done(second, 4.0) is None and queue.holder("GPU-a") == third
    assert queue.done(third, 5.0) is None
    assert queue.holder("GPU-a") is None and queue.waiting("GPU-a") == []


def test_gpus_do_not_wait_for_each_other() -> None:
    queue = GpuQueue()
    a = queue.ask("GPU-a", Work.LOAD, "m1", "team-a", 0.0)
    b = queue.ask("GPU-b", Work.LOAD, "m2", "team-a", 0.0)
    assert (queue.holder("GPU-a"), queue.holder("GPU-b")) == (a, b)
    assert queue.done(b, 1.0) is None
    assert queue.holder("GPU-a") == a


def test_a_waiter_that_gives_up_leaves_the_order_of_the_others() -> None:
    queue = GpuQueue()
    first = queue.ask("GPU-a", Work.LOAD, "m1", "ns", 0.0)
    gone = queue.ask("GPU-a", Work.LOAD, "m2", "ns", 0.0)
    last = queue.ask("GPU-a", Work.EVICT, "m3", "ns", 0.0)
    assert queue.done(gone, 1.0) is None
    assert queue.holder("GPU-a") == first
    assert queue.done(first, 2.0) == last
    # Ending a turn twice, or on a GPU with no turns, changes nothing.
    assert queue.done(gone, 3.0) is None
    assert queue.done(Turn(99, "GPU-z", Work.LOAD, "x", "ns", 0.0), 3.0) is None
    assert queue.holder("GPU-a") == last


def test_a_turn_s_budget_runs_from_when_it_is_granted() -> None:
    def budget(turn: Turn) -> float | None:
        return 30.0 if turn.work is Work.LOAD else None

    queue = GpuQueue(budget)
    load = queue.ask("GPU-a", Work.LOAD, "m1", "ns", 10.0)
    unload = queue.ask("GPU-a", Work.UNLOAD, "m2", "ns", 11.0)
    later = queue.ask("GPU-a", Work.LOAD, "m3", "ns", 12.0)
    assert queue.deadline("GPU-a") == 40.0
    assert queue.overdue(39.9) == []
    assert queue.overdue(40.0) == [load]
    queue.done(load, 45.0)
    assert queue.deadline("GPU-a") is None and queue.beside("GPU-a") == later
    # Granted at 45 (beside the unload), not asked at 12: the wait does not use its budget.
    assert queue.deadline_of(later) == 75.0 and queue.overdue(74.9) == []
    queue.done(unload, 50.0)
    assert queue.holder("GPU-a") == later and queue.deadline("GPU-a") == 75.0


def test_without_a_budget_no_turn_is_ever_overdue() -> None:
    queue = GpuQueue()
    queue.ask("GPU-a", Work.LOAD, "m1", "ns", 0.0)
    assert queue.deadline("GPU-a") is None and queue.overdue(1e9) == []
    assert queue.deadline("GPU-b") is None


def test_the_slot_goes_round_the_namespaces_waiting_fifo_within_each() -> None:
    queue = GpuQueue()
    a = [queue.ask("GPU-a", Work.LOAD, f"a{i}", "team-a", float(i)) for i in range(5)]
    b = queue.ask("GPU-a", Work.LOAD, "b0", "team-b", 10.0)
    c = [queue.ask("GPU-a", Work.WAKE, f"c{i}", "team-c", 11.0 + i) for i in range(2)]
    granted = [queue.holder("GPU-a")]
    now = 20.0
    while (turn := granted[-1]) is not None:
        granted.append(queue.done(turn, now))
        now += 1
    # team-b's one load waits for one of team-a's (the one holding the slot when it asked);
    # team-c, not served yet, goes before team-a's second.
    assert granted[:-1] == [a[0], b, c[0], a[1], c[1], a[2], a[3], a[4]]
    assert queue.holder("GPU-a") is None and queue._slots == {}


def test_a_namespace_that_comes_back_is_not_held_behind_one_that_never_left() -> None:
    queue = GpuQueue()
    a0 = queue.ask("GPU-a", Work.LOAD, "a0", "team-a", 0.0)
    b0 = queue.ask("GPU-a", Work.LOAD, "b0", "team-b", 0.0)
    a1 = queue.ask("GPU-a", Work.LOAD, "a1", "team-a", 0.0)
    a2 = queue.ask("GPU-a", Work.LOAD, "a2", "team-a", 0.0)
    assert queue.done(a0, 1.0) == b0
    assert queue.done(b0, 2.0) == a1
    # team-b asks again while team-a's second holds: it goes before team-a's third.
    b1 = queue.ask("GPU-a", Work.LOAD, "b1", "team-b", 2.5)
    assert queue.done(a1, 3.0) == b1
    assert queue.done(b1, 4.0) == a2
    # A waiter that gives up is skipped; the rotation goes on with the others.
    c0 = queue.ask("GPU-a", Work.LOAD, "c0", "team-c", 4.5)
    a3 = queue.ask("GPU-a", Work.LOAD, "a3", "team-a", 4.6)
    assert queue.done(c0, 4.7) is None
    assert queue.done(a2, 5.0) == a3


def test_a_load_s_budget_grows_with_its_size_up_to_the_cap() -> None:
    budget = load_budget(30.0, 60.0, 600.0)
    gib = 1024**3
    load = Turn(1, "GPU-a", Work.LOAD, "m", "ns", 0.0, size=0)
    assert budget(load) == 30.0
    assert budget(Turn(2, "GPU-a", Work.WAKE, "m", "ns", 0.0, size=gib // 2)) == 60.0
    assert budget(Turn(3, "GPU-a", Work.LOAD, "m", "ns", 0.0, size=4 * gib)) == 270.0
    assert budget(Turn(4, "GPU-a", Work.LOAD, "m", "ns", 0.0, size=40 * gib)) == 600.0
    assert budget(Turn(5, "GPU-a", Work.UNLOAD, "m", "ns", 0.0, size=gib)) is None
    queue = GpuQueue(budget)
    queue.ask("GPU-a", Work.LOAD, "big", "ns", 100.0, size=2 * gib)
    assert queue.deadline("GPU-a") == 100.0 + 150.0


def test_a_wake_is_granted_beside_an_unload_not_behind_it() -> None:
    queue = GpuQueue(lambda turn: 30.0 if turn.work.adds else None)
    sleep = queue.ask("GPU-a", Work.UNLOAD, "a", "team-a", 0.0)
    wake = queue.ask("GPU-a", Work.WAKE, "b", "team-b", 1.0)
    assert queue.holder("GPU-a") == sleep and queue.beside("GPU-a") == wake
    assert queue.granted(wake) and queue.waiting("GPU-a") == []
    assert queue.deadline_of(wake) == 31.0 and queue.deadline("GPU-a") is None
    # One turn beside an unload's: the next load waits, and so does any unload.
    load = queue.ask("GPU-a", Work.LOAD, "c", "team-c", 2.0)
    evict = queue.ask("GPU-a", Work.EVICT, "d", "team-a", 2.5)
    assert queue.waiting("GPU-a") == [load, evict]
    # The unload ends first: the wake holds the slot, granted already; nothing else is.
    assert queue.done(sleep, 3.0) is None
    assert queue.holder("GPU-a") == wake and queue.beside("GPU-a") is None
    assert queue.deadline("GPU-a") == 31.0
    assert queue.done(wake, 4.0) == load
    assert queue.done(load, 5.0) == evict


def test_loads_never_overlap_nor_does_anything_beside_a_load() -> None:
    queue = GpuQueue()
    load = queue.ask("GPU-a", Work.LOAD, "a", "team-a", 0.0)
    wake = queue.ask("GPU-a", Work.WAKE, "b", "team-b", 1.0)
    unload = queue.ask("GPU-a", Work.UNLOAD, "c", "team-c", 2.0)
    assert queue.holder("GPU-a") == load and queue.beside("GPU-a") is None
    assert queue.waiting("GPU-a") == [wake, unload]
    unload2 = queue.ask("GPU-b", Work.UNLOAD, "d", "team-a", 0.0)
    assert queue.ask("GPU-b", Work.UNLOAD, "e", "team-b", 0.0) in queue.waiting("GPU-b")
    assert queue.beside("GPU-b") is None and queue.holder("GPU-b") == unload2


def test_a_load_goes_beside_an_unload_only_in_its_fair_turn() -> None:
    queue = GpuQueue()
    load = queue.ask("GPU-a", Work.LOAD, "a", "team-a", 0.0)
    sleep = queue.ask("GPU-a", Work.UNLOAD, "b", "team-b", 1.0)
    wake = queue.ask("GPU-a", Work.WAKE, "c", "team-c", 2.0)
    # The sleep's grant lets the next turn in the rotation, a wake, go beside it.
    assert queue.done(load, 3.0) == sleep
    assert queue.beside("GPU-a") == wake and queue.waiting("GPU-a") == []
    # The wake ends first: the unload holds on, and the slot is given to no one meanwhile.
    late = queue.ask("GPU-a", Work.WAKE, "d", "team-d", 3.5)
    assert queue.done(wake, 4.0) is None
    assert queue.holder("GPU-a") == sleep and queue.waiting("GPU-a") == [late]
    assert queue.done(sleep, 5.0) == late and queue.beside("GPU-a") is None
    # A load is never granted beside an unload past a turn that waited before it.
    queue.done(late, 6.0)
    first = queue.ask("GPU-a", Work.EVICT, "e", "team-a", 7.0)
    queued = queue.ask("GPU-a", Work.UNLOAD, "f", "team-b", 7.1)
    behind = queue.ask("GPU-a", Work.WAKE, "g", "team-c", 7.2)
    assert queue.holder("GPU-a") == first and queue.waiting("GPU-a") == [queued, behind]
    assert queue.done(first, 8.0) == queued and queue.beside("GPU-a") == behind
    # A wake beside an unload that gives up leaves the unload holding.
    assert queue.done(behind, 8.5) is None and queue.holder("GPU-a") == queued
    assert queue.done(queued, 9.0) is None and queue._slots == {}


def test_loads_measured_apart_share_the_slot_up_to_the_bound_and_never_with_a_window() -> None:
    queue = GpuQueue(parallel=2)
    a = queue.ask("GPU-a", Work.LOAD, "a", "ns-a", 0.0, apart=True)
    b = queue.ask("GPU-a", Work.WAKE, "b", "ns-b", 0.1, apart=True)
    c = queue.ask("GPU-a", Work.LOAD, "c", "ns-a", 0.2, apart=True)
    assert queue.shared("GPU-a") == [a, b] and queue.holder("GPU-a") is None
    windowed = queue.ask("GPU-a", Work.LOAD, "w", "ns-c", 0.3)
    late = queue.ask("GPU-a", Work.LOAD, "d", "ns-d", 0.4, apart=True)
    assert not queue.granted(c) and not queue.granted(windowed)
    # The windowed load's namespace was never served: it is next in line, and waits for a and
    # b to end; nothing measured apart overtakes it meanwhile.
    assert queue.done_all(a, 1.0) == []
    assert not queue.granted(c) and not queue.granted(late)
    assert queue.done_all(b, 2.0) == [windowed] and queue.holder("GPU-a") == windowed
    assert queue.shared("GPU-a") == []
    assert queue.done_all(windowed, 3.0) == [late, c] and queue.shared("GPU-a") == [late, c]
    assert queue.deadline_of(late) is None
    assert queue.done(c, 4.0) is None
    assert queue.done(late, 5.0) is None and queue.waiting("GPU-a") == []


def test_loads_measured_apart_keep_the_namespaces_turns() -> None:
    """A namespace with many loads queued delays another's by at most one turn per share."""
    queue = GpuQueue(parallel=1)
    first = queue.ask("GPU-a", Work.LOAD, "a0", "busy", 0.0, apart=True)
    for i in range(1, 5):
        queue.ask("GPU-a", Work.LOAD, f"a{i}", "busy", 0.0, apart=True)
    other = queue.ask("GPU-a", Work.LOAD, "b0", "quiet", 1.0, apart=True)
    assert queue.done_all(first, 2.0) == [other]


def test_unloads_and_wakes_beside_them_are_not_shared_by_loads_measured_apart() -> None:
    queue = GpuQueue(parallel=4)
    unload = queue.ask("GPU-a", Work.UNLOAD, "u", "ns", 0.0)
    apart = queue.ask("GPU-a", Work.WAKE, "p", "ns", 0.1, apart=True)
    assert queue.beside("GPU-a") is None and not queue.granted(apart)
    assert queue.done_all(unload, 1.0) == [apart]
    other_gpu = queue.ask("GPU-b", Work.LOAD, "x", "ns", 1.0)
    assert queue.granted(other_gpu), "turns of different GPUs never wait for each other"


def test_unloads_of_models_measured_apart_share_the_slot_with_their_wakes() -> None:
    """A scale-down's unloads of models measured apart and a burst of wakes go side by side,
    within the bound, and a windowed turn still waits for them all."""
    queue = GpuQueue(parallel=3)
    unloads = [queue.ask("GPU-a", Work.UNLOAD, f"u{i}", "", 0.0, apart=True) for i in range(2)]
    wake = queue.ask("GPU-a", Work.WAKE, "w0", "ns", 0.1, apart=True)
    evict = queue.ask("GPU-a", Work.EVICT, "e", "", 0.2, apart=True)
    assert queue.shared("GPU-a") == [*unloads, wake] and queue.holder("GPU-a") is None
    assert not queue.granted(evict)  # past the bound: in line
    windowed = queue.ask("GPU-a", Work.UNLOAD, "x", "", 0.3)
    assert queue.done_all(unloads[0], 1.0) == [evict]
    assert not queue.granted(windowed)
    for turn in (unloads[1], wake):
        assert queue.done_all(turn, 2.0) == []
    assert queue.done_all(evict, 3.0) == [windowed] and queue.holder("GPU-a") == windowed
