"""The node's shared budgets at the gateway are split by namespace first, then among a
namespace's pods: a namespace cannot take more of the node by creating more pods.

Team-a runs seven pods, team-b one. While both send, team-b's pod gets what a namespace with one
pod gets, half of the node's in-flight budget, of its event loop's rounds and of its byte
budget, as it would beside a single pod of team-a; team-a's seven pods share the other half
(at Triton one request each at most, four together, taken in turn). Through a real gateway in
front of the real Triton.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from common.callers import Caller
from proxy.policy.share import ROUND
from sim.triton import TritonServer
from tests.proxy.gateway.conftest import RunningGateway, gateway_settings, publish, running_gateway
from tests.proxy.gateway.test_fair_share import post, sleepy, tenant_of, wait_for

pytestmark = pytest.mark.triton

CROWD = [f"127.1.0.{30 + i}" for i in range(7)]
"""The seven pods of team-a."""
ALONE = "127.1.0.40"
"""Team-b's one pod."""
PATH = "/v2/models/sleepy/infer"


@pytest.fixture
def crowded(served_triton: TritonServer, tmp_path: Path) -> Iterator[RunningGateway]:
    """A gateway with an in-flight budget of 8 for the node, 8 per pod, and a byte budget, whose
    caller table holds team-a's seven pods and team-b's one, all calling `sleepy`."""
    table = tmp_path / "callers.json"
    publish(
        table,
        *(Caller(a, "sleepy", f"team-a/crowd-{i}", f"uid-a{i}") for i, a in enumerate(CROWD)),
        Caller(ALONE, "sleepy", "team-b/alone", "uid-b"),
    )
    settings = gateway_settings(
        served_triton,
        table,
        max_in_flight_per_pod=8,
        max_in_flight_node=8,
        max_buffered_bytes=64 * 1024**2,
    )
    with running_gateway(settings) as gateway:
        yield gateway


def send(gateway: RunningGateway, address: str, count: int, ms: int) -> list[threading.Thread]:
    results: list[int] = []

    def one() -> None:
        results.append(post(gateway.http_url, address, PATH, sleepy(ms))[0])

    threads = [threading.Thread(target=one, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads


def test_a_namespace_with_one_pod_gets_half_the_in_flight_budget_beside_seven_pods(
    crowded: RunningGateway,
) -> None:
    gateway = crowded
    threads: list[threading.Thread] = []
    try:
        for address in CROWD:
            threads += send(gateway, address, 2, 300)  # 4.2 s of Triton's one instance
        wait_for(
            lambda: all(
                (t := tenant_of(gateway, a)) is not None and t.limiter.sending for a in CROWD
            ),
            "team-a's seven pods sending",
        )
        threads += send(gateway, ALONE, 4, 150)
        wait_for(
            lambda: (t := tenant_of(gateway, ALONE)) is not None and t.limiter.in_flight == 4,
            "team-b's one pod with half the node's budget (4 of 8) at Triton",
            within=10.0,
        )
        alone = tenant_of(gateway, ALONE)
        assert alone is not None and alone.limiter.limit == 4
        crowd = [tenant_of(gateway, a) for a in CROWD]
        # Team-a's half, 4, split among its seven pods: one each at most, in turn.
        assert [t.limiter.limit for t in crowd if t is not None] == [1] * 7
        scraped = generate_latest(gateway.gateway.metrics.registry).decode()
        assert "tritonshare_gateway_namespaces_sending 2.0" in scraped
        assert 'tritonshare_gateway_namespace_pods_sending{namespace="team-a"} 7.0' in scraped
        assert 'tritonshare_gateway_namespace_pods_sending{namespace="team-b"} 1.0' in scraped
    finally:
        for thread in threads:
            thread.join(60)


def test_a_namespace_with_one_pod_gets_half_the_loops_rounds_and_byte_budget_beside_seven_pods(
    crowded: RunningGateway,
) -> None:
    """While all eight pods send, the part of each round of the loop a pod is sure of, and its
    share of the byte budget: team-b's pod half of each, each of team-a's a seventh of the
    other half."""
    gateway = crowded
    stop = threading.Event()
    answered: list[int] = []

    def steady(address: str) -> None:
        while not stop.is_set():
            answered.append(post(gateway.http_url, address, PATH, sleepy(1))[0])

    threads = [threading.Thread(target=steady, args=(a,), daemon=True) for a in [*CROWD, ALONE]]
    for thread in threads:
        thread.start()
    try:
        wait_for(
            lambda: all(tenant_of(gateway, a) is not None for a in [*CROWD, ALONE]),
            "all eight pods connected",
        )
        alone = tenant_of(gateway, ALONE)
        crowd = tenant_of(gateway, CROWD[0])
        assert alone is not None and crowd is not None
        # Rounds begin as the pods are read from: one that began with all eight active.
        wait_for(
            lambda: alone.share.fair == ROUND / 2 and crowd.share.fair == ROUND / 2 / 7,
            "team-b's pod sure of half of each round, team-a's of a seventh of the other half",
            within=10.0,
        )
        budget = gateway.gateway.budget
        assert budget is not None
        # Counted at each walk and whenever a pod reads past its allowance.
        wait_for(
            lambda: (
                budget.fair_of(alone.share) == budget.limit // 2
                and budget.fair_of(crowd.share) == budget.limit // 2 // 7
            ),
            "team-b's pod with half the byte budget, team-a's with a seventh of the other half",
            within=20.0,
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert answered and set(answered) == {200}
