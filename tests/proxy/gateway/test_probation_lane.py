"""The probation lane through a real gateway in front of the real Triton: two pods on probation
(the agent's caller table says so, as after an exit of Triton they were both at) take turns at
Triton; a held probationer waits, or through a suspect's trial is refused, and its namespace's
held requests show in the metrics. A pod that keeps two fast requests overlapping at all times
cannot hold the lane: its neighbour is answered within a turn's bound (before the bound, it got no
answer in 30 s). With clean turns counted, a pod taking turns with another probationer leaves the
lane after them."""

from __future__ import annotations

import http.client
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from common.callers import Caller
from sim.triton import TritonServer
from tests.proxy.gateway.conftest import RunningGateway, gateway_settings, publish, running_gateway
from tests.proxy.gateway.test_fair_share import INFER, post, tenant_of, wait_for

pytestmark = pytest.mark.triton

ATTACKER = "127.1.0.51"
NEIGHBOUR = "127.1.0.52"
PATH = "/v2/models/add_one/infer"


@pytest.fixture
def on_probation(served_triton: TritonServer, tmp_path: Path) -> Iterator[RunningGateway]:
    """A gateway whose caller table has both pods on probation, as after an ambiguous exit;
    no pod leaves the lane early, so the turns alone are tested."""
    table = tmp_path / "callers.json"
    publish(
        table,
        Caller(ATTACKER, "add_one", "team-a/attacker", "uid-a", probation=True),
        Caller(NEIGHBOUR, "add_one", "team-b/neighbour", "uid-b", probation=True),
    )
    settings = gateway_settings(served_triton, table, probation_clean_turns=0)
    with running_gateway(settings) as gateway:
        yield gateway


def test_a_pod_keeping_requests_overlapping_cannot_hold_the_lane(
    on_probation: RunningGateway,
) -> None:
    gateway = on_probation
    stop = threading.Event()
    sent = [0]

    def overlapping() -> None:
        """One of the attacker's two keep-alive connections, sending as fast as it is answered."""
        host, port = gateway.http_url.split(":")
        connection = http.client.HTTPConnection(
            host, int(port), timeout=30, source_address=(ATTACKER, 0)
        )
        try:
            while not stop.is_set():
                connection.request("POST", PATH, body=INFER)
                connection.getresponse().read()
                sent[0] += 1
        finally:
            connection.close()

    attackers = [threading.Thread(target=overlapping, daemon=True) for _ in range(2)]
    for thread in attackers:
        thread.start()
    try:
        wait_for(lambda: sent[0] > 200, "the attacker's requests flowing")
        attacker = tenant_of(gateway, ATTACKER)
        assert attacker is not None and attacker.limiter.probation is not None
        waits = []
        for _ in range(5):
            started = time.monotonic()
            status, body = post(gateway.http_url, NEIGHBOUR, PATH, INFER)
            waits.append(time.monotonic() - started)
            assert status == 200, body
        assert max(waits) < 10.0, f"the neighbour waited {max(waits):.1f} s for a turn"
        assert attacker.limiter.probation is not None, "still on probation: the turns held"
    finally:
        stop.set()
        for thread in attackers:
            thread.join(30)


def test_a_probationer_sending_one_request_at_a_time_gets_a_whole_turn_beside_a_busy_one(
    on_probation: RunningGateway,
) -> None:
    """Beside the attacker's two back-to-back clients, the neighbour's client sends one request
    after another on one connection: its turn stays its own between them (up to the turn's
    bound), so its requests take a few turns, not one each. Before, its turn passed on as soon as
    its one request was answered: a turn and a quiet gap per answer (7 answers in 30 s)."""
    gateway = on_probation
    stop = threading.Event()
    sent = [0]
    host, port = gateway.http_url.split(":")

    def connect(source: str) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(host, int(port), timeout=30, source_address=(source, 0))

    def overlapping() -> None:
        connection = connect(ATTACKER)
        try:
            while not stop.is_set():
                connection.request("POST", PATH, body=INFER)
                connection.getresponse().read()
                sent[0] += 1
        finally:
            connection.close()

    attackers = [threading.Thread(target=overlapping, daemon=True) for _ in range(2)]
    for thread in attackers:
        thread.start()
    neighbour = connect(NEIGHBOUR)
    try:
        wait_for(lambda: sent[0] > 50, "the attacker's requests flowing")
        attacker = tenant_of(gateway, ATTACKER)
        assert attacker is not None and attacker.limiter.probation is not None
        lane = attacker.turns.lane
        turns = lane.turns
        for _ in range(6):
            neighbour.request("POST", PATH, body=INFER)
            answer = neighbour.getresponse()
            assert answer.status == 200, answer.read()
            answer.read()
        taken = lane.turns - turns
        assert taken <= 7, f"{taken} turns of the lane for the neighbour's 6 requests"
    finally:
        neighbour.close()
        stop.set()
        for thread in attackers:
            thread.join(30)


def test_a_pod_taking_clean_turns_with_another_probationer_leaves_the_lane(
    served_triton: TritonServer, tmp_path: Path
) -> None:
    """Turns nobody waited for cost a probationer nothing and count for nothing: before, a pod
    alone on the lane left it after its clean turns, and was at Triton with the other
    probationer at its next exit (one more exit of Triton, every model down). Taking turns with
    another probationer, it leaves after them (the first of the two to have them; the other,
    alone on the lane then, stays)."""
    table = tmp_path / "callers.json"
    publish(
        table,
        Caller(ATTACKER, "add_one", "team-a/attacker", "uid-a", probation=True),
        Caller(NEIGHBOUR, "add_one", "team-b/neighbour", "uid-b", probation=True),
    )
    settings = gateway_settings(served_triton, table, probation_clean_turns=3)
    with running_gateway(settings) as gateway:
        for _ in range(4):
            assert post(gateway.http_url, NEIGHBOUR, PATH, INFER)[0] == 200
        neighbour = tenant_of(gateway, NEIGHBOUR)
        assert neighbour is not None and neighbour.limiter.probation is not None, "alone: stays"
        stop = threading.Event()

        def sends(source: str) -> None:
            while not stop.is_set():
                post(gateway.http_url, source, PATH, INFER)

        senders = [threading.Thread(target=sends, args=(a,)) for a in (ATTACKER, NEIGHBOUR)]
        for sender in senders:
            sender.start()
        try:
            wait_for(lambda: tenant_of(gateway, ATTACKER) is not None, "the other pod sending")
            attacker = tenant_of(gateway, ATTACKER)
            assert attacker is not None
            pods = (neighbour, attacker)
            wait_for(lambda: any(p.limiter.probation is None for p in pods), "one leaving", 60)
        finally:
            stop.set()
            for sender in senders:
                sender.join(60)
        left = [p for p in pods if p.limiter.probation is None]
        assert left and all(p.caller.probation for p in left), "only its turns end"


def test_a_held_probationer_waits_or_during_a_trial_is_refused_and_the_metrics_count_it(
    served_triton: TritonServer, tmp_path: Path
) -> None:
    table = tmp_path / "callers.json"
    held = Caller(ATTACKER, "add_one", "team-a/attacker", "uid-a", probation=True, held=True)
    publish(table, replace(held, trial=True))
    with running_gateway(gateway_settings(served_triton, table)) as gateway:
        host, port = gateway.http_url.split(":")
        connection = http.client.HTTPConnection(
            host, int(port), timeout=30, source_address=(ATTACKER, 0)
        )
        try:
            connection.request("POST", PATH, body=INFER)
            answer = connection.getresponse()
            body = answer.read()
            assert answer.status == 503 and answer.getheader("Retry-After") == "2", body
            assert b"under suspicion" in body
        finally:
            connection.close()
        publish(table, held)  # a plain hold: the request waits, then goes when it ends
        attacker = tenant_of(gateway, ATTACKER)
        assert attacker is not None
        wait_for(lambda: attacker.limiter._trial is None, "the trial over")
        answered: list[int] = []
        sender = threading.Thread(
            target=lambda: answered.append(post(gateway.http_url, ATTACKER, PATH, INFER)[0])
        )
        sender.start()
        wait_for(lambda: attacker.limiter.held == 1, "the request held")
        publish(table, replace(held, held=False))
        sender.join(30)
        assert answered == [200]
        with urllib.request.urlopen(gateway.metrics_url, timeout=10) as response:
            text = response.read().decode()
        labels = 'namespace="team-a",outcome='
        assert f'tritonshare_gateway_probation_held_requests_total{{{labels}"refused"}} 1.0' in text
        assert (
            f'tritonshare_gateway_probation_held_requests_total{{{labels}"released"}} 1.0' in text
        )
        assert 'tritonshare_gateway_probation_held_seconds_total{namespace="team-a"}' in text
        assert "uid-a" not in text.split("probation_held")[1], "by namespace, not by pod"
