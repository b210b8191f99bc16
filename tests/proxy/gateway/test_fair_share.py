"""A pod's share of Triton's queue at the node gateway: its declared concurrency, or the default.

A pod that bypasses its own proxy (exec into it, or any client from its address) reaches the
gateway directly; the gateway's per-pod limit is what bounds how much of Triton's queue it takes.
The pod plays by connecting from its address with real clients, the gateway runs in front of the
real Triton, and the `sleepy` model holds requests in flight for as long as asked.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from common.callers import Caller
from proxy.gateway.tenants import Tenant
from sim.triton import TritonServer
from tests.proxy.gateway.conftest import (
    RunningGateway,
    gateway_settings,
    publish,
    running_gateway,
)
from tests.proxy.gateway.test_inflate_attacks import grpc_call

pytestmark = pytest.mark.triton

FLOODER = "127.1.0.21"
NEIGHBOUR = "127.1.0.22"
INFER = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
).encode()


def sleepy(ms: int) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [ms]}]}
    ).encode()


def post(url: str, source: str, path: str, body: bytes) -> tuple[int, bytes]:
    host, port = url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30, source_address=(source, 0))
    try:
        connection.request("POST", path, body=body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def tenant_of(gateway: RunningGateway, address: str) -> Tenant | None:
    return next((t for t in gateway.gateway.tenants if t.caller.address == address), None)


def wait_for(predicate: object, what: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what} did not happen within {within:g} s"
        time.sleep(0.01)


@pytest.fixture
def flooded(
    served_triton: TritonServer, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[RunningGateway, int]]:
    """The gateway with the flooding pod declaring `request.param` (0: none) and a ceiling of
    3; yields the gateway and the limit the flooder should get."""
    declared = request.param
    table = tmp_path / "callers.json"
    publish(
        table,
        Caller(FLOODER, "sleepy", "team-a/flooder", "uid-a", declared),
        Caller(NEIGHBOUR, "add_one", "team-b/neighbour", "uid-b"),
    )
    settings = gateway_settings(served_triton, table, max_in_flight_per_pod=3)
    with running_gateway(settings) as running:
        yield running, declared or 3


@pytest.mark.parametrize("flooded", [2, 0], indirect=True, ids=["declared-2", "default-3"])
def test_a_pod_bypassing_its_proxy_gets_its_share_and_no_more(
    flooded: tuple[RunningGateway, int],
) -> None:
    gateway, limit = flooded
    results: list[int] = []
    path = "/v2/models/sleepy/infer"

    def slow() -> None:
        results.append(post(gateway.http_url, FLOODER, path, sleepy(1500))[0])

    threads = [threading.Thread(target=slow, daemon=True) for _ in range(2 * limit)]
    for thread in threads:
        thread.start()
    try:
        wait_for(
            lambda: (
                (tenant := tenant_of(gateway, FLOODER)) is not None
                and (tenant.limiter.in_flight, tenant.limiter.queued) == (limit, limit)
            ),
            f"{limit} requests in flight and {limit} waiting",
        )
        # Past its share and the queue: refused at once, as Triton's clients expect.
        status, body = post(gateway.http_url, FLOODER, path, sleepy(1))
        assert status == 503, body
        assert b"queue is full" in body
        message = bytes.fromhex("0a06736c65657079")  # ModelInferRequest(model_name="sleepy")
        answer = grpc_call(
            gateway.grpc_url,
            FLOODER,
            "/inference.GRPCInferenceService/ModelInfer",
            message,
            "identity",
        )
        assert answer.get("grpc-status") == "8", answer  # RESOURCE_EXHAUSTED
        # Another pod's model is served meanwhile.
        assert post(gateway.http_url, NEIGHBOUR, "/v2/models/add_one/infer", INFER)[0] == 200
    finally:
        for thread in threads:
            thread.join(60)
    assert results == [200] * (2 * limit)  # the ones within the share and the queue all served


def test_every_pod_has_a_limit_by_default(served_triton: TritonServer, tmp_path: Path) -> None:
    """With the gateway's defaults, a pod that declares nothing gets 64 in flight, one that
    declares more gets 64, one that declares less gets what it declared (the queue as long)."""
    table = tmp_path / "callers.json"
    publish(
        table,
        Caller(FLOODER, "sleepy", "team-a/flooder", "uid-a"),
        Caller(NEIGHBOUR, "add_one", "team-b/neighbour", "uid-b", 4),
        Caller("127.1.0.23", "identity", "team-c/greedy", "uid-c", 10_000),
    )
    with running_gateway(gateway_settings(served_triton, table)) as gateway:
        for address in (FLOODER, NEIGHBOUR, "127.1.0.23"):
            post(gateway.http_url, address, "/v2/health/live", b"")
        limits = {
            address: (tenant.limiter.limit, tenant.limiter.queue_limit)
            for address in (FLOODER, NEIGHBOUR, "127.1.0.23")
            if (tenant := tenant_of(gateway, address)) is not None
        }
    assert limits == {FLOODER: (64, 64), NEIGHBOUR: (4, 4), "127.1.0.23": (64, 64)}


def test_beside_another_sending_pod_a_flooding_pod_gets_its_share_of_the_node_alone_all(
    served_triton: TritonServer, tmp_path: Path
) -> None:
    """`--max-in-flight-node`: a pod sending alone keeps its own limit (3); while a neighbour
    sends too, it has at most its share of the node's budget (2 // 2 = 1) at Triton, its other
    requests waiting in its queue, none refused; when the neighbour stops, its limit is back."""
    table = tmp_path / "callers.json"
    publish(
        table,
        Caller(FLOODER, "sleepy", "team-a/flooder", "uid-a"),
        Caller(NEIGHBOUR, "add_one", "team-b/neighbour", "uid-b"),
    )
    settings = gateway_settings(served_triton, table, max_in_flight_per_pod=3, max_in_flight_node=2)
    path = "/v2/models/sleepy/infer"
    results: list[int] = []

    def slow(ms: int) -> threading.Thread:
        thread = threading.Thread(
            target=lambda: results.append(post(gateway.http_url, FLOODER, path, sleepy(ms))[0]),
            daemon=True,
        )
        thread.start()
        return thread

    with running_gateway(settings) as gateway:
        alone = [slow(1000) for _ in range(3)]
        wait_for(
            lambda: (t := tenant_of(gateway, FLOODER)) is not None and t.limiter.in_flight == 3,
            "a pod alone with its own limit's 3 requests at Triton",
        )
        flooder = tenant_of(gateway, FLOODER)
        assert flooder is not None
        stop = threading.Event()
        answered: list[int] = []

        def neighbour() -> None:
            while not stop.is_set():
                answered.append(
                    post(gateway.http_url, NEIGHBOUR, "/v2/models/add_one/infer", INFER)[0]
                )

        steady = threading.Thread(target=neighbour, daemon=True)
        steady.start()
        try:
            wait_for(lambda: flooder.limiter.limit == 1, "the flooder held to its share, 1")
            scraped = generate_latest(gateway.gateway.metrics.registry).decode()
            assert "tritonshare_gateway_pods_sending 2.0" in scraped
            assert "tritonshare_gateway_in_flight_budget 2.0" in scraped
            assert (
                'tritonshare_gateway_concurrency_limit{model="sleepy",pod="team-a/flooder"} 1.0'
                in scraped
            )
            for thread in alone:
                thread.join(30)
            beside = [slow(300) for _ in range(3)]
            most = 0
            while any(thread.is_alive() for thread in beside):
                most = max(most, flooder.limiter.in_flight)
                time.sleep(0.005)
            assert most == 1, f"{most} of the flooder's requests at Triton beside a neighbour"
        finally:
            stop.set()
            steady.join(30)
        assert answered and set(answered) == {200}
        wait_for(
            lambda: flooder.limiter.limit == 3,
            "the flooder's own limit back a second after the neighbour stopped",
            within=10.0,
        )
        again = [slow(1000) for _ in range(3)]
        wait_for(lambda: flooder.limiter.in_flight == 3, "3 of the flooder's requests at Triton")
        for thread in again:
            thread.join(30)
    assert results == [200] * 9  # waited, never refused
