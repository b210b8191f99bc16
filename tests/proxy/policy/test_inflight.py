"""policy.inflight: the node's in-flight budget split among the pods sending, and the limiters'
side of it (a shrunk limit holds waiters back, a grown one lets them go at once)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from proxy.policy.inflight import InFlightShares, share_of
from proxy.policy.limiter import Limiter
from proxy.policy.refusals import QueueTimeoutError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[tuple[float, Callable[[], None]]] = []

    def __call__(self) -> float:
        return self.now

    def later(self, delay: float, callback: Callable[[], None]) -> None:
        self.timers.append((self.now + delay, callback))

    def advance(self, seconds: float) -> None:
        """Move on, running the timers that fall due (and those they set) in order."""
        end = self.now + seconds
        while True:
            due = sorted((t for t in self.timers if t[0] <= end), key=lambda t: t[0])
            if not due:
                break
            self.timers.remove(due[0])
            self.now = due[0][0]
            due[0][1]()
        self.now = end


def node(budget: int, *owns: int) -> tuple[Clock, InFlightShares, list[Limiter]]:
    """Pods each in a namespace of its own."""
    clock = Clock()
    shares = InFlightShares(budget, clock.later, active_seconds=1.0, clock=clock)
    limiters = [Limiter(own, own or 8, 30.0, clock=clock) for own in owns]
    for i, limiter in enumerate(limiters):
        shares.add(limiter, f"team-{i}")
    return clock, shares, limiters


def budget_of(limiter: Limiter) -> object:
    """The node budget `limiter` is in now, read afresh (mypy narrows an attribute)."""
    return limiter.node


def wake(*limiters: Limiter) -> None:
    """Each pod sends one request, answered: all count as sending (for a second)."""
    for limiter in limiters:
        assert limiter.try_acquire()
        limiter.release()


@pytest.mark.parametrize(
    ("own", "budget", "sending", "limit"),
    [
        (64, 8, 1, 64),  # alone: its own
        (64, 8, 2, 4),
        (64, 8, 3, 2),
        (64, 8, 16, 1),  # never below one
        (3, 8, 2, 3),  # never above its own
        (0, 8, 2, 4),  # no limit of its own: the share
        (0, 8, 1, 0),
        (64, 0, 5, 64),  # no budget
    ],
)
def test_the_share(own: int, budget: int, sending: int, limit: int) -> None:
    """Each pod sending in a namespace of its own."""
    assert share_of(own, budget, sending) == limit


@pytest.mark.parametrize(
    ("own", "budget", "namespaces", "pods", "limit"),
    [
        (64, 8, 1, 2, 4),  # one namespace: its pods share the whole budget
        (64, 8, 2, 1, 4),  # alone in its namespace beside one other: half
        (64, 8, 2, 7, 1),  # 4 // 7: never below one
        (64, 16, 2, 3, 2),
        (3, 16, 2, 1, 3),  # never above its own
        (0, 16, 4, 2, 2),
        (64, 2, 3, 1, 1),
    ],
)
def test_the_share_by_namespace(
    own: int, budget: int, namespaces: int, pods: int, limit: int
) -> None:
    assert share_of(own, budget, namespaces, pods) == limit


def test_a_namespace_with_many_pods_shares_what_one_pod_of_another_has() -> None:
    clock = Clock()
    shares = InFlightShares(16, clock.later, active_seconds=1.0, clock=clock)
    crowd = [Limiter(64, 64, 30.0, clock=clock) for _ in range(7)]
    alone = Limiter(64, 64, 30.0, clock=clock)
    for limiter in crowd:
        shares.add(limiter, "team-a")
    shares.add(alone, "team-b")
    for limiter in crowd:
        assert limiter.try_acquire()
    assert [x.limit for x in crowd] == [2] * 7  # 16 // 7 while team-a alone sends
    assert alone.limit == 8  # not sending: what it would have as team-b's first sender
    assert alone.try_acquire()
    assert (shares.namespaces, shares.by_namespace) == (2, {"team-a": 7, "team-b": 1})
    assert [x.limit for x in crowd] == [1] * 7 and alone.limit == 8
    # Team-a's pods stop: team-b's pod sends alone and has its own limit back.
    for limiter in crowd:
        limiter.release()
    clock.advance(2.0)
    assert (shares.namespaces, alone.limit) == (1, 64)
    shares.remove(alone)
    assert (shares.sending, shares.by_namespace) == (0, {})


def test_a_pod_alone_keeps_its_own_limit_and_a_second_sender_halves_it() -> None:
    clock, shares, (a, b) = node(8, 64, 64)
    for _ in range(10):
        assert a.try_acquire()
    assert (shares.sending, a.limit) == (1, 64)
    assert b.limit == 4  # not sending: what it would get as the second sender
    assert b.try_acquire()
    assert (shares.sending, a.limit, b.limit) == (2, 4, 4)
    assert not a.try_acquire()  # 10 in flight against 4 now
    # B stops: once it has had nothing in flight for a second, A has its own limit back.
    b.release()
    clock.advance(0.6)
    assert a.limit == 4  # B took a slot 0.6 s ago: still sending
    clock.advance(1.0)
    assert (shares.sending, a.limit) == (1, 64)
    assert a.try_acquire()


async def test_a_shrunk_limit_holds_waiters_back_and_a_grown_one_lets_them_go_at_once() -> None:
    clock, _, (a, b) = node(2, 4, 4)
    for _ in range(4):
        assert a.try_acquire()
    assert b.try_acquire()  # two sending: 1 each
    waiters = [asyncio.create_task(a.acquire()) for _ in range(2)]
    await asyncio.sleep(0)
    assert (a.in_flight, a.queued) == (4, 2)
    for expected in (3, 2, 1):  # over its limit: a slot given back goes to nobody
        a.release()
        assert (a.in_flight, a.queued) == (expected, 2)
    a.release()  # now under it: the oldest waiter takes the slot
    await asyncio.sleep(0)
    assert (a.in_flight, a.queued) == (1, 1)
    assert waiters[0].done() and not waiters[1].done()
    b.release()
    clock.advance(2.0)  # B stopped sending: A's limit is 4 again, its waiter goes at once
    await asyncio.sleep(0)
    assert (a.limit, a.in_flight, a.queued) == (4, 2, 0)
    assert waiters[1].done()
    await asyncio.gather(*waiters)


def test_a_pod_with_requests_in_flight_or_waiting_still_counts_as_sending() -> None:
    clock, shares, (a, b) = node(8, 64, 64)
    assert a.try_acquire() and b.try_acquire()
    clock.advance(30.0)  # long requests: both still in flight
    assert (shares.sending, a.limit) == (2, 4)
    b.release()
    clock.advance(1.0)
    assert (shares.sending, a.limit) == (1, 64)


def test_a_pod_that_goes_away_gives_its_share_back() -> None:
    _, shares, (a, b, c) = node(9, 64, 64, 64)
    assert a.try_acquire() and b.try_acquire() and c.try_acquire()
    assert [x.limit for x in (a, b, c)] == [3, 3, 3]
    shares.remove(c)
    assert shares.sending == 2
    assert [x.limit for x in (a, b)] == [4, 4]
    assert c.node is None and c.try_acquire()  # on its own now, whatever its limit was


def test_no_sweep_runs_while_nobody_sends() -> None:
    clock, shares, (a,) = node(8, 64)
    assert a.try_acquire()
    a.release()
    clock.advance(5.0)
    assert shares.sending == 0
    assert clock.timers == []  # the sweep stopped with the last sender


def test_a_negative_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="0 or more"):
        InFlightShares(-1, Clock().later)


async def test_seven_pods_of_a_namespace_hold_no_more_at_triton_than_one_pod_of_another() -> None:
    """With more pods sending than its half of the budget has slots, a namespace's pods are
    each held to one request, and together to its half: creating pods gains it nothing."""
    clock = Clock()
    shares = InFlightShares(8, clock.later, active_seconds=1.0, clock=clock)
    crowd = [Limiter(64, 64, 30.0, clock=clock) for _ in range(7)]
    victim = Limiter(64, 64, 30.0, clock=clock)
    for limiter in crowd:
        shares.add(limiter, "team-a")
    shares.add(victim, "team-b")
    wake(*crowd, victim)
    assert victim.try_acquire()
    waiting = [asyncio.create_task(x.acquire()) for x in crowd for _ in range(4)]
    waiting += [asyncio.create_task(victim.acquire()) for _ in range(5)]
    await asyncio.sleep(0)
    assert sum(x.in_flight for x in crowd) == 4
    assert victim.in_flight == 4
    for _ in range(20):  # answers come back: the split holds
        for limiter in [*crowd, victim]:
            if limiter.in_flight:
                limiter.release()
        await asyncio.sleep(0)
        assert sum(x.in_flight for x in crowd) <= 4 and victim.in_flight <= 4
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)


async def test_a_namespaces_pods_take_its_slots_in_turn() -> None:
    """A slot one of the crowd's pods gives back goes to the pod of its namespace that has
    waited longest, not to the giver's own next request: none of them is starved."""
    clock = Clock()
    shares = InFlightShares(4, clock.later, active_seconds=1.0, clock=clock)
    crowd = [Limiter(64, 64, 30.0, clock=clock) for _ in range(5)]
    other = Limiter(64, 64, 30.0, clock=clock)
    for limiter in crowd:
        shares.add(limiter, "team-a")
    shares.add(other, "team-b")
    wake(*crowd, other)
    waiting = [asyncio.create_task(x.acquire()) for x in crowd for _ in range(3)]
    await asyncio.sleep(0)
    assert [x.in_flight for x in crowd] == [1, 1, 0, 0, 0]  # team-a's half of 4, in line
    served, holding = [], {0, 1}
    for giver in (0, 1, 2, 3, 4, 0, 1):
        crowd[giver].release()  # its own next request waits: the slot goes on in turn
        await asyncio.sleep(0)
        now = {i for i, x in enumerate(crowd) if x.in_flight}
        assert len(now) == 2 and giver not in now
        served += sorted(now - holding)
        holding = now
    assert served == [2, 3, 4, 0, 1, 2, 3]
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)


async def test_a_retiring_pods_queue_goes_on_within_its_namespaces_part() -> None:
    """A pod picked no more (a replica that drains) keeps its place in its namespace's part
    until what it holds is answered: its queued requests go on as its namespace's slots come
    free, and together with its namespace's other pods it never holds more than the part (a
    namespace scaling its own model down gains nothing at Triton). Then it leaves the budget."""
    clock = Clock()
    shares = InFlightShares(4, clock.later, active_seconds=1.0, clock=clock)
    retiring, staying = (Limiter(64, 64, 30.0, clock=clock) for _ in range(2))
    other = Limiter(64, 64, 30.0, clock=clock)
    shares.add(retiring, "team-a")
    shares.add(staying, "team-a")
    shares.add(other, "team-b")
    wake(retiring, staying, other)
    queued = [asyncio.create_task(retiring.acquire()) for _ in range(6)]
    await asyncio.sleep(0)
    assert retiring.in_flight == 1 and retiring.queued == 5  # its half of team-a's half of 4
    shares.retire(retiring)
    flood = [asyncio.create_task(staying.acquire()) for _ in range(8)]
    await asyncio.sleep(0)
    for _ in range(20):  # answers come back: the part holds, the queue goes on
        assert retiring.in_flight + staying.in_flight <= 2
        for limiter in (retiring, staying):
            if limiter.in_flight:
                limiter.release()
        await asyncio.sleep(0)
    assert all(task.done() and task.exception() is None for task in queued)
    assert retiring.node is None, "answered: it left the budget"
    assert shares.by_namespace == {"team-a": 1, "team-b": 1}
    for task in flood:
        task.cancel()
    await asyncio.gather(*flood, return_exceptions=True)


def test_a_retiring_pod_with_nothing_held_leaves_the_budget_at_once() -> None:
    _, shares, (a, b) = node(8, 64, 64)
    wake(a, b)
    shares.retire(a)
    assert a.node is None and shares.sending == 1 and b.limit == 64


async def test_a_retiring_pod_whose_queue_gave_up_leaves_the_budget_at_the_sweep() -> None:
    """Its last request gave up waiting for its namespace's slot (nothing of it is answered,
    so no answer takes it out): the next sweep does."""
    clock = Clock()
    shares = InFlightShares(2, clock.later, active_seconds=1.0, clock=clock)
    a, c = Limiter(64, 64, 0.01, clock=clock), Limiter(64, 64, 30.0, clock=clock)
    b = Limiter(64, 64, 30.0, clock=clock)
    shares.add(a, "team-a")
    shares.add(c, "team-a")
    shares.add(b, "team-b")
    wake(a, c, b)
    assert c.try_acquire()  # team-a's one slot
    waiting = asyncio.create_task(a.acquire())
    await asyncio.sleep(0)
    shares.retire(a)
    assert a.node is shares, "a request of it waits: it stays in the budget"
    with pytest.raises(QueueTimeoutError):
        await waiting  # its queue timeout of 10 ms, on the loop's own clock
    clock.advance(0.5)
    assert budget_of(a) is None and shares.by_namespace == {"team-a": 1, "team-b": 1}
