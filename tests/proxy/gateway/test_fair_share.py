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
