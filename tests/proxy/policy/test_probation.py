"""policy.probation with policy.limiter: two probationers' requests never overlap at Triton,
they take turns bounded in requests and time, by namespace then by pod, a waiter past its bound
is refused, other pods never wait, and a pod leaves the lane after its clean turns."""

from __future__ import annotations

import asyncio
import time

import pytest

from proxy.policy.limiter import Limiter
from proxy.policy.probation import MAX_HELD_NAMESPACES, HeldRequests, ProbationLane
from proxy.policy.refusals import HeldError, OverloadedError, QueueTimeoutError, retry_after


def probationer(
    lane: ProbationLane, limit: int = 0, queue: int = 8, timeout: float = 30.0
) -> Limiter:
    limiter = Limiter(limit, queue, timeout)
    limiter.probation = lane
    lane.join(limiter)
    return limiter


async def test_a_second_probationer_waits_until_the_first_has_nothing_in_flight() -> None:
    lane = ProbationLane(turn_requests=3)
    a, b = probationer(lane), probationer(lane)
    assert a.try_acquire() and a.try_acquire()
    waiting = asyncio.get_running_loop().create_task(b.acquire())
    await asyncio.sleep(0)
    assert (b.in_flight, b.queued, lane.holder) == (0, 1, a)
    assert a.try_acquire(), "its turn has room for a third request"
    assert not a.try_acquire(), "another probationer waits: a spent turn admits no new request"
    a.release()
    a.release()
    await asyncio.sleep(0)
    assert not waiting.done(), "one of a's requests is still at Triton"
    a.release()
    await waiting
    assert (a.in_flight, b.in_flight, lane.holder) == (0, 1, b)


async def test_a_probationer_that_always_has_requests_waiting_cannot_starve_another() -> None:
    """Pod a keeps more requests than its limit at all times; pod b's one request gets its turn
    as soon as a's in-flight ones drain, and never beside them."""
    lane = ProbationLane(turn_requests=2)
    a, b = probationer(lane, limit=2), probationer(lane, limit=2)
    done = 0

    async def a_sends() -> None:
        nonlocal done
        for _ in range(50):
            await a.acquire()
            assert b.in_flight == 0, "a request of a was at Triton beside b's"
            await asyncio.sleep(0)
            done += 1
            a.release()

    senders = [asyncio.get_running_loop().create_task(a_sends()) for _ in range(4)]
    await asyncio.sleep(0)
    assert lane.holder is a and a.queued == 2
    await b.acquire()
    served_after = done
    assert a.in_flight == 0
    await asyncio.sleep(0)
    b.release()
    await asyncio.gather(*senders)
    assert done == 200
    assert served_after <= 4, f"b waited for {served_after} of a's requests, not one turn"


async def test_a_waiting_probationer_is_bound_by_its_queue_and_timeout() -> None:
    lane = ProbationLane()
    a, b = probationer(lane), probationer(lane, queue=1, timeout=0.05)
    assert a.try_acquire()
    with pytest.raises(QueueTimeoutError):
        await b.acquire()
    waiting = asyncio.get_running_loop().create_task(b.acquire())
    await asyncio.sleep(0)
    with pytest.raises(OverloadedError):
        await b.acquire()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    a.release()
    assert lane.holder is None, "nothing waits any more: the lane is free"
    assert b.try_acquire() and lane.holder is b


async def test_pods_not_on_probation_never_wait_for_the_lane() -> None:
    lane = ProbationLane()
    a, other = probationer(lane), Limiter(0, 8, 30.0)
    assert a.try_acquire()
    assert other.try_acquire() and other.try_acquire()
    assert lane.holder is a


async def test_leaving_probation_hands_the_lane_on_and_lets_the_pods_waiters_go() -> None:
    lane = ProbationLane()
    a, b = probationer(lane), probationer(lane)
    assert a.try_acquire()
    waiting = asyncio.get_running_loop().create_task(b.acquire())
    await asyncio.sleep(0)
    a.probation = None
    lane.leave(a)
    await waiting
    assert lane.holder is b and b.in_flight == 1
    b.probation = None
    lane.leave(b)
    a.release()
    b.release()
    assert lane.holder is None


async def test_a_turn_triton_died_under_closes_the_lane_until_the_witness_has_looked() -> None:
    """The next probationer's request would fail at the dead Triton too and be named with the
    pod that killed it: it waits until the witness reopens the lane (or the hold ends)."""
    lane = ProbationLane(hold_seconds=30.0)
    failed = {"a": 0}
    a = Limiter(0, 8, 30.0)
    a.probation = lane
    lane.join(a, lambda: failed["a"])
    b = probationer(lane)
    assert a.try_acquire()
    waiting = asyncio.get_running_loop().create_task(b.acquire())
    await asyncio.sleep(0)
    a.release()
    failed["a"] += 1  # the relay counts the answer just after it frees the slot
    for _ in range(3):
        await asyncio.sleep(0)
    assert not waiting.done() and lane.closed, "b waits while Triton may be dead"
    lane.reopen()  # the witness has taken its snapshot
    await waiting
    assert lane.holder is b


async def test_a_turn_that_ended_well_passes_the_lane_on_at_once() -> None:
    lane = ProbationLane(hold_seconds=30.0)
    a = Limiter(0, 8, 30.0)
    a.probation = lane
    lane.join(a, lambda: 0)
    b = probationer(lane)
    assert a.try_acquire()
    waiting = asyncio.get_running_loop().create_task(b.acquire())
    await asyncio.sleep(0)
    a.release()
    await asyncio.wait_for(waiting, 5)
    assert lane.holder is b and not lane.closed


@pytest.mark.parametrize("namespaces", [("x", "y"), ("x", "x")])
async def test_under_the_node_budget_probationers_never_overlap_and_both_are_served(
    namespaces: tuple[str, str],
) -> None:
    """At the node gateway the slots come from the namespaces' pools (`policy.inflight`): the
    lane still keeps two probationers apart, and neither waits for ever."""
    from proxy.policy.inflight import InFlightShares

    loop = asyncio.get_running_loop()
    shares = InFlightShares(8, loop.call_later)
    lane = ProbationLane()
    a, b = probationer(lane), probationer(lane)
    shares.add(a, namespaces[0])
    shares.add(b, namespaces[1])
    overlaps = 0
    served = {id(a): 0, id(b): 0}

    async def sends(me: Limiter, other: Limiter) -> None:
        nonlocal overlaps
        for _ in range(30):
            await me.acquire()
            overlaps += other.in_flight > 0
            await asyncio.sleep(0)
            served[id(me)] += 1
            me.release()

    async with asyncio.timeout(10):
        await asyncio.gather(*(sends(a, b) for _ in range(3)), *(sends(b, a) for _ in range(3)))
    assert overlaps == 0
    assert served == {id(a): 90, id(b): 90}
    assert (a.in_flight, b.in_flight, lane.holder) == (0, 0, None)


async def test_a_turn_is_bounded_in_time_once_another_waits() -> None:
    now = [0.0]
    lane = ProbationLane(turn_requests=100, turn_seconds=0.5, clock=lambda: now[0])
    a, b = probationer(lane), probationer(lane)
    assert a.try_acquire()
    waiting = asyncio.get_running_loop().create_task(b.acquire())
    await asyncio.sleep(0)
    assert a.try_acquire(), "within its turn's time"
    now[0] = 0.6
    assert not a.try_acquire(), "past its turn's time, with b waiting"
    a.release()
    a.release()
    await waiting
    assert lane.holder is b
    assert b.try_acquire(), "b's new turn has its own time"


async def test_a_holder_whose_spent_turn_has_nothing_in_flight_passes_the_lane_on() -> None:
    """At the gateway a turn may begin with no slot free for it: once spent, it does not keep
    the lane while it waits for one."""
    now = [0.0]
    lane = ProbationLane(turn_seconds=0.5, clock=lambda: now[0])
    a, b = probationer(lane), probationer(lane)
    lane.holder = a  # its turn began, its namespace has no slot for it yet
    waiting = asyncio.get_running_loop().create_task(b.acquire())
    await asyncio.sleep(0)
    now[0] = 1.0
    assert not a.try_acquire()
    await waiting
    assert lane.holder is b


async def test_turns_go_by_namespace_then_by_pod() -> None:
    """Namespace x puts three pods on probation, y one: y's pod gets every other turn."""
    lane = ProbationLane(turn_requests=1)
    x = [Limiter(0, 8, 30.0) for _ in range(3)]
    y = Limiter(0, 8, 30.0)
    for pod, namespace in [(x[0], "x"), (x[1], "x"), (x[2], "x"), (y, "y")]:
        pod.probation = lane
        lane.join(pod, namespace=namespace)
    assert x[0].try_acquire()
    loop = asyncio.get_running_loop()
    order: list[Limiter] = []

    async def one(pod: Limiter) -> None:
        await pod.acquire()
        order.append(pod)
        await asyncio.sleep(0)
        pod.release()

    tasks = [loop.create_task(one(pod)) for pod in (x[1], x[2], y, y)]
    await asyncio.sleep(0)
    x[0].release()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert order == [y, x[1], y, x[2]]


async def test_a_pod_leaves_the_lane_after_its_clean_turns_and_not_after_a_failed_one() -> None:
    lane = ProbationLane(clean_turns=3)
    failed = [0]
    cleared: list[str] = []
    a = Limiter(0, 8, 30.0)
    a.probation = lane

    def clear() -> None:
        cleared.append("a")
        a.probation = None
        lane.leave(a)

    lane.join(a, lambda: failed[0], namespace="x", on_clear=clear)
    b = probationer(lane)

    async def turn(fail: bool = False, contested: bool = True) -> None:
        assert a.try_acquire() and lane.holder is a
        other = asyncio.get_running_loop().create_task(b.acquire()) if contested else None
        await asyncio.sleep(0)
        a.release()
        failed[0] += fail
        for _ in range(3):
            await asyncio.sleep(0)
        lane.reopen()  # the witness, after a failed turn
        if other is not None:
            await other
            b.release()

    for _ in range(5):
        await turn(contested=False)
    assert cleared == [], "turns no other probationer waited for count for nothing"
    await turn()
    await turn()
    await turn(fail=True)
    await turn()
    await turn()
    assert cleared == [], "a failed turn starts the count over"
    lane.present(a)  # named at an exit
    await turn()
    await turn()
    assert cleared == []
    await turn()
    assert cleared == ["a"] and lane.holder is None and lane.waiting == 0
    assert a.try_acquire() and lane.holder is None, "off the lane: it no longer takes turns"


async def test_a_request_the_lane_held_counts_as_sent_when_it_takes_its_slot() -> None:
    """The crash witness names the last pod to send when none is at Triton: a request that
    waited for the lane is sent when the lane lets it go, not when it arrived. Before, only a
    request that took its slot at once counted, and the pod that sent last looked idle."""
    now = [0.0]
    lane = ProbationLane()
    a = probationer(lane)
    b = Limiter(0, 8, 30.0, clock=lambda: now[0])
    b.probation = lane
    lane.join(b)
    assert a.try_acquire()
    waiting = asyncio.get_running_loop().create_task(b.acquire())
    await asyncio.sleep(0)
    now[0] = 7.0
    a.release()
    await waiting
    assert (b.in_flight, b.last) == (1, 7.0)


async def test_the_lane_stays_quiet_between_two_pods_turns() -> None:
    """A harm one probationer's request leaves behind lands before the next pod's requests are
    at Triton: the crash witness then names the first alone. The pod whose turn ended may go
    on at once; another waits the gap after its last answer."""
    lane = ProbationLane(gap_seconds=0.2)
    a, b = probationer(lane), probationer(lane)
    assert a.try_acquire()
    a.release()
    await asyncio.sleep(0)  # the turn is judged
    assert a.try_acquire(), "the same pod: no gap"
    a.release()
    await asyncio.sleep(0)
    ended = time.monotonic()
    assert not b.try_acquire(), "another pod: quiet first"
    await asyncio.wait_for(b.acquire(), 5)
    assert time.monotonic() - ended >= 0.19 and lane.holder is b
    assert not a.try_acquire()


async def test_a_held_probationers_new_request_waits_for_the_hold_to_end_or_its_bound() -> None:
    """While held (a load the agent watches settles), a new request waits, counted as held, and
    goes on when the hold ends; past `hold_seconds` it goes on all the same. A pod's quarantine
    still refuses at once; a pod not held never waits."""
    lane = ProbationLane()
    held, free = probationer(lane), Limiter(0, 8, 30.0)
    held.hold(True)
    waiting = asyncio.get_running_loop().create_task(held.acquire())
    assert free.try_acquire()
    await asyncio.wait_for(free.acquire(), 5)  # a pod not held never waits
    await asyncio.sleep(0.05)
    assert not waiting.done() and (held.in_flight, held.held) == (0, 1)
    held.hold(False)
    await asyncio.wait_for(waiting, 5)
    assert (held.in_flight, held.held) == (1, 1)
    held.release()
    held.hold(True)
    held.hold_seconds = 0.1
    started = time.monotonic()
    await asyncio.wait_for(held.acquire(), 5)
    assert time.monotonic() - started >= 0.1 and held.in_flight == 1, "bounded: it went on"
    held.release()
    held.refusal = QueueTimeoutError("quarantined")
    with pytest.raises(QueueTimeoutError):
        await asyncio.wait_for(held.acquire(), 0.05)


async def test_a_held_probationers_request_waits_its_bound_at_most_a_restore_included() -> None:
    """A probationer's request that first waited for Triton's restore (an exit) is held only what
    is left of `hold_seconds` since it arrived: a crasher's loads in a row keep the hold on from
    one to the next, and the restore plus a whole hold outlasted a 10 s client deadline."""
    lane = ProbationLane()
    held = probationer(lane)
    held.hold_seconds, held.restore_seconds = 1.0, 30.0
    restoring = held.restoring = asyncio.Event()
    held.hold(True)
    started = time.monotonic()
    waiting = asyncio.get_running_loop().create_task(held.acquire())
    await asyncio.sleep(0.8)  # Triton takes this long to have the model again
    held.restoring = None
    restoring.set()
    await asyncio.wait_for(waiting, 5)
    waited = time.monotonic() - started
    assert held.in_flight == 1 and waited < 1.5, (
        f"held {waited:.2f} s: the restore's wait came on top"
    )


async def test_a_held_pod_takes_no_slot_without_waiting_for_the_hold() -> None:
    """The relays try a slot first and wait for one only when that fails: a held pod's try
    fails, so its request waits for the hold in `acquire`."""
    limiter = Limiter(0, 8, 30.0)
    limiter.hold(True)
    assert not limiter.try_acquire() and limiter.in_flight == 0
    waiting = asyncio.get_running_loop().create_task(limiter.acquire())
    await asyncio.sleep(0.05)
    assert not waiting.done()
    limiter.hold(False)
    await asyncio.wait_for(waiting, 5)
    assert limiter.in_flight == 1 and limiter.try_acquire()


async def test_a_probationer_held_for_a_suspects_trial_is_refused_not_held() -> None:
    """During a suspect's trial (its load in flight or settling) a held probationer's new
    request is refused at once, asking the client to retry, instead of going on to Triton after
    its bound; its requests go again once the trial is over."""
    limiter = Limiter(0, 8, 30.0)
    limiter.hold(True, trial=True)
    assert not limiter.try_acquire()
    with pytest.raises(HeldError) as refused:
        await asyncio.wait_for(limiter.acquire(), 1)
    assert "under suspicion" in str(refused.value) and retry_after(refused.value) > 0
    assert (limiter.in_flight, limiter.held) == (0, 0)
    limiter.hold(True)  # a plain hold again: it waits
    waiting = asyncio.get_running_loop().create_task(limiter.acquire())
    await asyncio.sleep(0.05)
    assert not waiting.done()
    limiter.hold(False)
    await asyncio.wait_for(waiting, 5)
    assert limiter.in_flight == 1


async def test_held_requests_are_counted_by_namespace_outcome_and_seconds_with_bounded_series() -> (
    None
):
    counts = HeldRequests()
    limiter = Limiter(0, 8, 30.0)
    limiter.on_held = lambda outcome, seconds: counts.record("team-a", outcome, seconds)
    limiter.hold(True)
    limiter.hold_seconds = 0.05
    await asyncio.wait_for(limiter.acquire(), 5)  # past its bound: it went on
    limiter.release()
    limiter.hold(True, trial=True)
    with pytest.raises(HeldError):
        await limiter.acquire()
    assert counts.requests == {("team-a", "timed_out"): 1, ("team-a", "refused"): 1}
    assert counts.seconds["team-a"] >= 0.05
    for n in range(MAX_HELD_NAMESPACES + 5):
        counts.record(f"ns-{n}", "released", 1.0)
    assert len(counts.seconds) == MAX_HELD_NAMESPACES + 1, "the rest under one series"
    assert counts.requests["", "released"] == 6
