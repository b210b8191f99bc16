"""A model host's several replicas of one model on the node, through the gateway: the caller
table's `spread` (its format, and tables of the version before), the pick (fewest held, ties in
turn), and, with a real Triton, requests of the host for the model reaching both replicas under
their own private names over REST and gRPC, each with its own limit, the model's metrics the
sum, and the spread following the table under open connections.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from common.callers import Caller, CallerTable, CallerTableError, decode, encode, write_table
from proxy.gateway.callerbook import CallerBook
from proxy.metrics import ProxyMetrics
from proxy.policy.limiter import Limiter
from proxy.table import Replicas, Served
from sim.triton import TritonInstall, TritonServer
from tests.conftest import copy_model
from tests.proxy.gateway.conftest import (
    RunningGateway,
    gateway_settings,
    publish,
    running_gateway,
)
from tests.proxy.gateway.test_private_names import _load, grpc_call, infer_request

HOST = "127.1.4.1"
HOST_POD = "team-s/tritonshare-host-0123456789abcdef"
S0, S1 = "team-s.s.00000000", "team-s.s.11111111"
ROW = Caller(HOST, "s", HOST_POD, "uid-s/0", 3, S0)
SPREAD = replace(ROW, spread=((S1, "uid-s/1"),))
INFER = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
).encode()


# -- the table ------------------------------------------------------------------------------------


def test_a_rows_spread_survives_the_round_trip_and_is_absent_from_rows_of_one() -> None:
    decoded = decode(encode(CallerTable("n", 1.0, (SPREAD,)))).callers
    assert decoded == (SPREAD,)
    assert [(r.name_in_triton, r.uid, r.spread) for r in SPREAD.replicas()] == [
        (S0, "uid-s/0", ()),
        (S1, "uid-s/1", ()),
    ]
    assert b'"spread"' not in encode(CallerTable("n", 1.0, (ROW,)))


def test_tables_across_versions_read_as_rows_of_one_replica() -> None:
    """A gateway of the version before reads each row as it did (the keys it knows are the
    same, the preferred replica in `tritonName`); a table of the agent before has no spread."""
    [entry] = json.loads(encode(CallerTable("n", 1.0, (SPREAD,))))["callers"]
    assert entry["tritonName"] == S0 and entry["uid"] == "uid-s/0"
    assert set(entry) - {"spread"} == set(
        json.loads(encode(CallerTable("n", 1.0, (ROW,))))["callers"][0]
    )
    del entry["spread"]
    old = {"format": "tritonshare.io/callers/v1", "node": "n", "writtenAt": 1, "callers": [entry]}
    assert decode(json.dumps(old).encode()).callers == (ROW,)


@pytest.mark.parametrize(
    ("spread", "words"),
    [
        ("S1", "is not a list"),
        (["S1"], "is not an object"),
        ([{"tritonName": S1}], "no tritonName and uid"),
        ([{"tritonName": "a/b", "uid": "u"}], "a/b"),
        ([{"tritonName": S0, "uid": "u"}], f"names replica {S0} twice"),
    ],
)
def test_a_malformed_spread_is_refused(spread: object, words: str) -> None:
    [entry] = json.loads(encode(CallerTable("n", 1.0, (ROW,))))["callers"]
    document = {"format": "tritonshare.io/callers/v1", "node": "n", "writtenAt": 1}
    with pytest.raises(CallerTableError, match=words):
        decode(json.dumps({**document, "callers": [{**entry, "spread": spread}]}).encode())


def test_a_spread_changing_keeps_the_hosts_connections(tmp_path: Path) -> None:
    path, now = tmp_path / "callers.json", [1000.0]
    revoked: list[set[str]] = []
    rows: list[dict[str, Caller]] = []
    book = CallerBook(
        path,
        max_age=60,
        on_revoke=revoked.append,
        on_rows=lambda _, r: rows.append(dict(r)),
        clock=lambda: now[0],
    )
    for caller in (ROW, SPREAD, ROW):
        now[0] += 1
        write_table(path, CallerTable("n", now[0], (caller,)))
        book.check()
    assert revoked == [] and rows == [{"s": SPREAD}, {"s": ROW}]


# -- the pick -------------------------------------------------------------------------------------


def replicas(count: int) -> list[Served]:
    limiter = Limiter(0, 0, 1.0)
    metrics = ProxyMetrics(limiter, "s")
    group = [Served("s", limiter, metrics, triton_name=S0)]
    for index in range(1, count):
        other = Limiter(0, 0, 1.0)
        metrics.also(other)
        group.append(Served("s", other, metrics, triton_name=f"team-s.s.{index:08d}"))
    return group


def test_the_pick_takes_turns_among_idle_replicas() -> None:
    group = replicas(3)
    picks = Replicas(group)
    assert [group.index(picks.pick()) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert group[0].replicas is picks and all(s.spread for s in group)
    assert group[1].replicas is None


def test_the_pick_takes_the_replica_with_fewest_held_then_turns_among_ties() -> None:
    group = replicas(3)
    picks = Replicas(group)
    busy, also_busy = group[0].limiter, group[2].limiter
    assert busy.try_acquire() and busy.try_acquire() and also_busy.try_acquire()
    assert [group.index(picks.pick()) for _ in range(3)] == [1, 1, 1]
    assert group[1].limiter.try_acquire()
    # 2 held, 1 held, 1 held: the ties in turn, from after the last picked.
    assert [group.index(picks.pick()) for _ in range(3)] == [2, 1, 2]
    busy.release()
    busy.release()
    assert group.index(picks.pick()) == 0


def test_the_models_series_add_up_its_replicas() -> None:
    first, second = replicas(2)
    assert first.limiter.try_acquire() and second.limiter.try_acquire()

    def in_flight() -> dict[str, float]:
        return {
            sample.labels["model"]: sample.value
            for family in first.metrics.registry.collect()
            for sample in family.samples
            if sample.name == "tritonshare_proxy_requests_in_flight"
        }

    assert in_flight() == {"s": 2}
    first.metrics.drop(second.limiter)  # that replica left the row's spread
    assert in_flight() == {"s": 1}


# -- through the gateway, with a real Triton ----------------------------------------------------


@pytest.fixture(scope="module")
def triton(
    tmp_path_factory: pytest.TempPathFactory, triton_install: TritonInstall
) -> Iterator[TritonServer]:
    repository = tmp_path_factory.mktemp("spread-models")
    for name in (S0, S1):
        copy_model("add_one", repository, as_name=name)
    server = TritonServer(repository)
    server.start()
    try:
        for name in (S0, S1):
            _load(server, name)
        yield server
    finally:
        server.discard()


@pytest.fixture
def gateway(triton: TritonServer, tmp_path: Path) -> Iterator[tuple[RunningGateway, Path]]:
    table = tmp_path / "callers.json"
    publish(table, SPREAD)
    settings = gateway_settings(triton, table, table_max_age_seconds=3600)
    with running_gateway(settings) as running:
        yield running, table


def successes(triton: TritonServer) -> tuple[int, int]:
    """Triton's successful inferences of each replica."""
    counts = []
    for name in (S0, S1):
        url = f"http://{triton.http_url}/v2/models/{name}/stats"
        with urllib.request.urlopen(url, timeout=10) as answer:
            [stats] = json.loads(answer.read())["model_stats"]
        counts.append(int(stats["inference_stats"]["success"]["count"]))
    return counts[0], counts[1]


class HostConnection:
    """One keep-alive REST connection of the host to the gateway."""

    def __init__(self, gateway: RunningGateway) -> None:
        host, port = gateway.http_url.split(":")
        self.connection = http.client.HTTPConnection(
            host, int(port), timeout=30, source_address=(HOST, 0)
        )

    def infers(self, count: int) -> None:
        """`count` inferences of `s`, one at a time."""
        for _ in range(count):
            self.connection.request("POST", "/v2/models/s/infer", body=INFER)
            response = self.connection.getresponse()
            body = response.read()
            assert response.status == 200, body
            assert json.loads(body)["model_name"] == "s"
            assert S0.encode() not in body and S1.encode() not in body


@pytest.fixture
def connection(gateway: tuple[RunningGateway, Path]) -> Iterator[HostConnection]:
    opened = HostConnection(gateway[0])
    try:
        yield opened
    finally:
        opened.connection.close()


def added(
    triton: TritonServer, before: tuple[int, int], expected: tuple[int, int]
) -> tuple[int, int]:
    """Each replica's inferences since `before`, read until they are `expected` or 10 s have
    passed: Triton counts an inference a moment after its answer has gone."""
    deadline = time.monotonic() + 10
    while True:
        now = successes(triton)
        counts = now[0] - before[0], now[1] - before[1]
        if counts == expected or time.monotonic() > deadline:
            return counts
        time.sleep(0.05)


@pytest.mark.triton
def test_rest_requests_of_a_host_spread_over_its_replicas(
    gateway: tuple[RunningGateway, Path], connection: HostConnection, triton: TritonServer
) -> None:
    running, _ = gateway
    before = successes(triton)
    connection.infers(10)
    # One at a time, none is held when the next is picked: they take turns.
    assert added(triton, before, (5, 5)) == (5, 5)
    tenant = next(t for t in running.gateway.tenants if t.caller.address == HOST)
    own, other = tenant.members["s"], tenant.members[f"s/{S1}"]
    assert (own.caller.name_in_triton, other.caller.name_in_triton) == (S0, S1)
    assert (own.limiter.own_limit, other.limiter.own_limit) == (3, 3), "the row's limit each"
    assert own.metrics is other.metrics and own.limiter is not other.limiter
    with urllib.request.urlopen(running.metrics_url, timeout=10) as answer:
        metrics = answer.read()
    assert any(
        line.startswith("tritonshare_gateway_requests_total{")
        and 'model="s"' in line
        and 'code="200"' in line
        and line.endswith(" 10.0")
        for line in metrics.decode().splitlines()
    ), "the model's requests, both replicas', under its id"


@pytest.mark.triton
@pytest.mark.parametrize("floats", [3, 8192], ids=["small", "large"])
def test_grpc_requests_of_a_host_spread_over_its_replicas(
    gateway: tuple[RunningGateway, Path], triton: TritonServer, floats: int
) -> None:
    running, _ = gateway
    before = successes(triton)
    for _ in range(4):
        fields, answers = grpc_call(
            running.grpc_url, HOST, "ModelInfer", [infer_request("s", floats=floats)]
        )
        assert fields.get("grpc-status") == "0", fields
        assert S0.encode() not in answers[0] and S1.encode() not in answers[0]
    assert added(triton, before, (2, 2)) == (2, 2)


@pytest.mark.triton
def test_the_spread_follows_the_table_under_an_open_connection(
    gateway: tuple[RunningGateway, Path], connection: HostConnection, triton: TritonServer
) -> None:
    running, table = gateway
    connection.infers(2)
    tenant = next(t for t in running.gateway.tenants if t.caller.address == HOST)
    own = tenant.members["s"]
    for row, expected in ((ROW, (4, 0)), (SPREAD, (2, 2))):
        # The other replica drains (or is not loaded yet), then is back.
        publish(table, row)
        deadline = time.monotonic() + 20
        while tenant.rows.get("s") != row:
            assert time.monotonic() < deadline, "the gateway did not follow the table"
            time.sleep(0.02)
        before = successes(triton)
        connection.infers(4)
        assert added(triton, before, expected) == expected
        assert (f"s/{S1}" in tenant.members) == bool(row.spread)
        assert tenant.members["s"] is own, "the replica that stays keeps its limiter"
    assert next(iter(running.gateway.tenants)) is tenant, "the host kept its connections"
