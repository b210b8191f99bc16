"""The node's byte budget (`proxy.policy.holdings`) with a fake clock: what each pod may read
between walks, who is paused, who is shed and when. The attack through a real gateway is
tests/proxy/gateway/test_held_bytes.py."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest

from proxy.gateway.callerbook import CallerBook
from proxy.gateway.metrics import GatewayMetrics
from proxy.policy.holdings import GRACE, ByteBudget
from proxy.policy.share import UNLIMITED, LoopShare, LoopShares
from tests.proxy.gateway.test_loop_share import Clock, pod

LIMIT = 1_000_000


def budget() -> tuple[ByteBudget, LoopShares, Clock]:
    clock = Clock()
    # A loop share that never pauses for the loop's sake (busy share 100 %, CPU never advances):
    # only the byte budget holds pods back here.
    loop = LoopShares(1.0, clock.later, clock=clock, cpu=lambda: 0.0)
    return ByteBudget(LIMIT, loop, clock=clock), loop, clock


def paused(share: LoopShare) -> bool:
    """Whether its round pauses it (read anew each time: it changes under the clock)."""
    return share.paused


def read(share: LoopShare, size: int) -> None:
    share.charge(0.0, 0.0, size)


def test_a_pod_alone_may_read_up_to_the_budget_and_no_further() -> None:
    clock = Clock()
    loop = LoopShares(1.0, clock.later, clock=clock, cpu=lambda: 0.0)
    walks: list[float] = []
    node = ByteBudget(LIMIT, loop, clock=clock, on_hold=lambda: walks.append(clock.now))
    state, share = pod(loop)
    for _ in range(99):
        read(share, 10_000)
    assert state.reading()
    read(share, 20_000)  # 1,010,000 read since the last walk, none of it known to be forwarded
    assert not state.reading()
    assert node.holds == 1
    assert walks == [clock.now]  # to learn at once what it really holds
    assert node.busy


def test_a_walk_that_finds_the_bytes_forwarded_lets_the_pod_read_again() -> None:
    node, loop, _ = budget()
    state, share = pod(loop)
    read(share, LIMIT + 1)
    assert not state.reading()
    assert node.measured({share: 0}) == []  # it held nothing after all: Triton took it
    assert state.reading()
    assert share.read == 0 and share.allowance == LIMIT


def test_pods_that_arrive_between_walks_share_what_is_left() -> None:
    _, loop, _ = budget()
    first_state, first = pod(loop)
    second_state, second = pod(loop)
    read(first, 1)
    read(second, 1)
    # Two pods reading: each slice is a part of what is left once the other's is counted, so
    # together they stop at the budget (one read past it each at most).
    for _ in range(200):
        if first_state.reading():
            read(first, 5_000)
        if second_state.reading():
            read(second, 5_000)
    assert not first_state.reading() and not second_state.reading()
    assert first.read + second.read <= LIMIT + 2 * 5_000


def test_over_the_budget_a_pod_under_its_share_still_reads_up_to_it() -> None:
    node, loop, clock = budget()
    hog_state, hog = pod(loop)
    light_state, light = pod(loop)
    read(light, 1)
    node.measured({hog: 900_000, light: 0})
    clock.advance(0.1)
    read(hog, 200_000)  # the node is now past its budget: the hog is over its share
    assert not hog_state.reading()
    read(light, 400_000)  # under its share of 500,000: never held back by the hog
    assert light_state.reading()
    read(light, 150_000)  # past its share
    assert not light_state.reading()


def test_a_pod_over_its_share_is_shed_after_the_grace_and_only_then() -> None:
    node, loop, clock = budget()
    hog_state, hog = pod(loop)
    _, light = pod(loop)
    read(light, 1)
    assert node.measured({hog: 1_500_000, light: 100}) == []
    assert not hog_state.reading()
    clock.advance(GRACE / 2)
    read(light, 1)
    assert node.measured({hog: 1_500_000, light: 100}) == []
    clock.advance(GRACE / 2)
    read(light, 1)
    # Over its share (500,000) by a million: it must give up that much.
    assert node.measured({hog: 1_500_000, light: 100}) == [(hog, 1_000_000)]
    assert node.sheds == 1
    # Its connections closed, it holds little: it reads again.
    assert node.measured({hog: 10_000, light: 100}) == []
    assert hog_state.reading()


def test_a_pod_over_its_share_while_the_node_is_under_budget_is_left_alone() -> None:
    node, loop, clock = budget()
    big_state, big = pod(loop)
    _, small = pod(loop)
    read(small, 1)
    for _ in range(3):
        assert node.measured({big: 800_000, small: 100}) == []
        clock.advance(GRACE)
        read(small, 1)
    assert big_state.reading()
    assert big.allowance == (LIMIT - 800_100) // 2
    assert node.busy  # over half the budget: walked every PERIOD
    node.measured({big: 400_000, small: 100})
    assert not node.busy


def test_a_loop_round_ending_does_not_resume_a_pod_the_budget_holds() -> None:
    clock = Clock()
    loop = LoopShares(0.5, clock.later, clock=clock, cpu=clock)
    node = ByteBudget(LIMIT, loop, clock=clock)
    events: list[str] = []  # the pod's pauses and resumes, in order (each is idempotent)
    share = loop.share(lambda: events.append("pause"), lambda: events.append("resume"))
    neighbour_state, neighbour = pod(loop)
    neighbour.charge(clock.now, clock.now, 1)
    clock.advance(0.011)  # a round with two active pods: 5 ms each
    started = clock.now
    clock.now += 0.006
    share.charge(started, clock.now, LIMIT + 1)  # past its loop budget and the byte budget
    assert paused(share) and share.held
    assert events[-1] == "pause"
    clock.advance(0.05)  # rounds end: the loop would let it read again
    assert not paused(share)
    assert events[-1] == "pause"
    node.measured({share: 0, neighbour: 0})
    assert events[-1] == "resume"
    assert neighbour_state.reading()


def test_without_a_budget_a_pod_reads_without_counting() -> None:
    clock = Clock()
    loop = LoopShares(1.0, clock.later, clock=clock, cpu=lambda: 0.0)
    state, share = pod(loop)
    read(share, 10 * LIMIT)
    assert state.reading()
    assert share.allowance == UNLIMITED


def test_the_gateways_metrics_show_the_budget_node_wide(tmp_path: Path) -> None:
    node, loop, _ = budget()
    _, share = pod(loop)
    read(share, 2 * LIMIT)  # stopped: one pause
    _, other = pod(loop)
    read(other, 1)
    node.measured({share: 1_500_000, other: 0})
    metrics = GatewayMetrics(CallerBook(tmp_path / "callers.json", max_age=60), list, node)
    text = generate_latest(metrics.registry).decode()
    assert "tritonshare_gateway_held_bytes 1.5e+06" in text
    assert "tritonshare_gateway_budget_bytes 1e+06" in text
    assert "tritonshare_gateway_budget_pauses_total 1.0" in text
    assert "tritonshare_gateway_budget_sheds_total 0.0" in text


def test_a_namespaces_many_pods_share_what_one_pod_of_another_namespace_has() -> None:
    """Over the budget, team-b's one pod keeps half of it beside team-a's three pods, which share
    the other half: a pod of team-a past a sixth is held and, past the grace, shed."""
    node, loop, clock = budget()
    crowd = [pod(loop, "team-a") for _ in range(3)]
    alone_state, alone = pod(loop, "team-b")
    held = {share: 300_000 for _, share in crowd} | {alone: 450_000}
    assert node.measured(held) == []
    assert node.fair_of(alone) == LIMIT // 2
    assert node.fair_of(crowd[0][1]) == LIMIT // 2 // 3
    assert alone_state.reading()  # under its half
    assert not any(state.reading() for state, _ in crowd)
    clock.advance(GRACE)
    shed = node.measured(held)
    assert sorted(excess for _, excess in shed) == [300_000 - LIMIT // 6] * 3
    assert alone not in dict(shed)
