"""Turns at each GPU's load slot, in fake time: first come first served per GPU, GPUs
independent, a waiter that gives up keeps the others' order, and each turn's budget."""

from __future__ import annotations

from agent.gpuqueue import GpuQueue, Turn, Work


def test_turns_on_one_gpu_are_granted_first_come_first_served() -> None:
    queue = GpuQueue()
    first = queue.ask("GPU-a", Work.LOAD, "m1", "team-a", 0.0)
    second = queue.ask("GPU-a", Work.UNLOAD, "m2", "team-b", 1.0)
    third = queue.ask("GPU-a", Work.LOAD, "m3", "team-a", 2.0)
    assert queue.holder("GPU-a") == first
    assert queue.waiting("GPU-a") == [second, third]
    assert queue.done(first, 3.0) == second
    assert queue.holder("GPU-a") == second and queue.waiting("GPU-a") == [third]
    assert queue.done(second, 4.0) == third
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
    assert queue.deadline("GPU-a") is None and queue.overdue(1000.0) == []
    queue.done(unload, 50.0)
    # Granted at 50, not asked at 12: the wait does not use the turn's budget.
    assert queue.holder("GPU-a") == later and queue.deadline("GPU-a") == 80.0


def test_without_a_budget_no_turn_is_ever_overdue() -> None:
    queue = GpuQueue()
    queue.ask("GPU-a", Work.LOAD, "m1", "ns", 0.0)
    assert queue.deadline("GPU-a") is None and queue.overdue(1e9) == []
    assert queue.deadline("GPU-b") is None
