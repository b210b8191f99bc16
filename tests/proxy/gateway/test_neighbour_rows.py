"""A neighbour's rows changing under a model host's steady model, on the real processes.

A model host of team-h serves `a` (add_one) through its proxy and the node gateway, from its own
address, while its neighbour `b` (sleepy, two replicas under private names) joins the host, spreads
over both replicas, moves from one to the other and leaves, again and again, in the gateway's
caller table and the host's models file alike. Every request for `a`, over REST and gRPC, answers
200, and the gateway keeps the host's connections; a request for `b` in flight on the replica that
drains, then on the model that leaves, finishes; a new one for the model gone is refused.
"""

from __future__ import annotations

import http.client
import json
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from common.callers import Caller
from proxy.gateway.tenants import Tenant
from sim.triton import TritonInstall, TritonServer
from tests.conftest import copy_model
from tests.proxy.conftest import PROXY_MODELS, RunningProxy, proxy_settings, running_proxy
from tests.proxy.gateway.conftest import (
    RunningGateway,
    gateway_settings,
    publish,
    running_gateway,
)
from tests.proxy.gateway.test_private_names import _load, fetch

pytestmark = pytest.mark.triton

HOST = "127.1.9.1"
HOST_POD = "team-h/tritonshare-host-0123456789abcdef"
A_PRIVATE = "team-h.a.0a0a0a0a"
B0, B1 = "team-h.b.0b0b0b00", "team-h.b.0b0b0b01"
INFER = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
).encode()


def row(model: str, private: str, ordinal: int, spread: tuple[tuple[str, str], ...] = ()) -> Caller:
    """The host's row for `model`, its own replica `ordinal`, as the agent writes it."""
    return Caller(HOST, model, HOST_POD, f"uid-{model}/{ordinal}", 0, private, spread=spread)


A = row("a", A_PRIVATE, 0)
B_ON_0 = row("b", B0, 0)
B_SPREAD = row("b", B0, 0, ((B1, "uid-b/1"),))
B_ON_1 = row("b", B1, 1)
"""Replica 0 drains (or is not loaded yet): the row's own is replica 1."""


@pytest.fixture(scope="module")
def triton(
    tmp_path_factory: pytest.TempPathFactory, triton_install: TritonInstall
) -> Iterator[TritonServer]:
    repository = tmp_path_factory.mktemp("neighbour-models")
    copy_model("add_one", repository, as_name=A_PRIVATE)
    for name in (B0, B1):
        target = repository / name
        shutil.copytree(PROXY_MODELS / "sleepy", target)
        config = target / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "sleepy"', f'name: "{name}"', 1))
    server = TritonServer(repository)
    server.start()
    try:
        for name in (A_PRIVATE, B0, B1):
            _load(server, name)
        yield server
    finally:
        server.discard()


def write_models(path: Path, *models: str) -> None:
    """The host's models file, replaced whole as the kubelet does."""
    temporary = path.with_suffix(".new")
    temporary.write_text(json.dumps([{"model": model} for model in models]))
    temporary.replace(path)


class Host:
    """The gateway and the host's proxy in front of it, with the table and models file."""

    def __init__(self, gateway: RunningGateway, proxy: RunningProxy, table: Path, models: Path):
        self.gateway = gateway
        self.proxy = proxy
        self.table = table
        self.models = models

    def tenant(self) -> Tenant | None:
        return next((t for t in self.gateway.gateway.tenants if t.caller.address == HOST), None)

    def change(self, *rows: Caller) -> None:
        """Publish the host's `rows` to both the gateway and its proxy; wait until both follow."""
        models = sorted(r.model_id for r in rows)
        write_models(self.models, *models)
        publish(self.table, *rows)
        wanted = {r.model_id: r for r in rows}
        until(lambda: self.gateway.gateway.book.lookup(HOST) == wanted, "the gateway's table")
        until(lambda: sorted(self.proxy.proxy.table.names) == models, "the proxy's table")


def until(predicate: Callable[[], bool], what: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not follow within {within:g} s")
        time.sleep(0.01)


@pytest.fixture
def host(triton: TritonServer, tmp_path: Path) -> Iterator[Host]:
    table, models = tmp_path / "callers.json", tmp_path / "hosted-models"
    publish(table, A)
    write_models(models, "a")
    with running_gateway(gateway_settings(triton, table, table_max_age_seconds=3600)) as gateway:
        settings = proxy_settings(
            triton,
            model_id="",
            models_file=models,
            models_check_seconds=0.02,
            triton_http_url=gateway.http_url,
            triton_grpc_url=gateway.grpc_url,
            source_address=HOST,
            grpc_mode="relay",
        )
        with running_proxy(settings) as proxy:
            yield Host(gateway, proxy, table, models)


class SteadyLoad:
    """Requests for `a` one after another over one REST keep-alive connection and one gRPC
    channel, each answer counted, until stopped."""

    def __init__(self, proxy: RunningProxy) -> None:
        self.proxy = proxy
        self.answers: Counter[str] = Counter()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._rest, name="steady-rest"),
            threading.Thread(target=self._grpc, name="steady-grpc"),
        ]

    def __enter__(self) -> SteadyLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _rest(self) -> None:
        host, port = self.proxy.http_url.split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            while not self._stop.is_set():
                try:
                    connection.request("POST", "/v2/models/a/infer", body=INFER)
                    response = connection.getresponse()
                    body = response.read()
                except (OSError, http.client.HTTPException) as e:
                    self.answers[f"rest {type(e).__name__}"] += 1
                    connection.close()
                    continue
                ok = response.status == 200 and json.loads(body)["outputs"][0]["data"] == [2, 3, 4]
                self.answers["rest 200" if ok else f"rest {response.status} {body[:200]!r}"] += 1
        finally:
            connection.close()

    def _grpc(self) -> None:
        client = grpcclient.InferenceServerClient(self.proxy.grpc_url)
        data = np.array([[1, 2, 3]], dtype=np.float32)
        try:
            while not self._stop.is_set():
                tensor = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
                tensor.set_data_from_numpy(data)
                try:
                    result = client.infer("a", [tensor], client_timeout=30)
                except InferenceServerException as e:
                    self.answers[f"grpc {e.status()} {e.message()}"] += 1
                    continue
                ok = np.array_equal(result.as_numpy("OUTPUT0"), data + 1)
                self.answers["grpc OK" if ok else "grpc wrong answer"] += 1
        finally:
            client.close()


def test_a_steady_model_answers_every_request_while_its_neighbour_comes_moves_and_goes(
    host: Host,
) -> None:
    schedule = [
        (A, B_ON_0),  # b's first replica placed on the host
        (A, B_SPREAD),  # its second loaded: b spreads over both
        (A, B_ON_1),  # the first drains: b's row moves to the second
        (A, B_ON_0),  # and back
        (A,),  # b leaves the host
    ]
    with SteadyLoad(host.proxy) as load:
        until(
            lambda: min(load.answers["rest 200"], load.answers["grpc OK"]) > 0, "the first answers"
        )
        tenant = host.tenant()
        assert tenant is not None
        dropped_at = []
        for _ in range(3):
            for rows in schedule:
                host.change(*rows)
                time.sleep(0.15)
                if host.tenant() is not tenant:
                    dropped_at.append([r.name_in_triton for r in rows])
                    tenant = host.tenant()
    failed = {
        answer: n for answer, n in load.answers.items() if answer not in ("rest 200", "grpc OK")
    }
    assert not failed, f"a's requests failed: {failed} (of {sum(load.answers.values())})"
    assert load.answers["rest 200"] > 10 and load.answers["grpc OK"] > 10
    assert not dropped_at, f"the gateway closed the host's connections at {dropped_at}"


def _slow_b(host: Host, delay_ms: int, answers: list[tuple[int, bytes]]) -> threading.Thread:
    """A request for `b` that Triton holds `delay_ms`, sent through the host's proxy."""
    body = json.dumps(
        {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [delay_ms]}]}
    ).encode()

    def send() -> None:
        status, _, answer = fetch(host.proxy.http_url, "POST", "/v2/models/b/infer", body)
        answers.append((status, answer))

    thread = threading.Thread(target=send, name="slow-b")
    thread.start()
    return thread


def test_a_neighbours_requests_in_flight_finish_on_the_replica_that_drains(host: Host) -> None:
    host.change(A, B_ON_0)
    assert fetch(host.proxy.http_url, "POST", "/v2/models/a/infer", INFER)[0] == 200
    tenant = host.tenant()
    assert tenant is not None
    answers: list[tuple[int, bytes]] = []
    moving = _slow_b(host, 1500, answers)
    until(lambda: "b" in tenant.members and tenant.members["b"].limiter.in_flight == 1, "b sent")
    replica_0 = tenant.members["b"]
    host.change(A, B_ON_1)  # replica 0 drains with b's request in flight on it
    assert host.tenant() is tenant, "the gateway kept the host's connections"
    leaving = _slow_b(host, 1500, answers)
    until(lambda: tenant.members["b"] is not replica_0, "b's new replica")
    until(lambda: tenant.members["b"].limiter.in_flight == 1, "b sent to its new replica")
    assert tenant.members["b"].caller.name_in_triton == B1
    host.change(A)  # b leaves the host with a request in flight
    for thread in (moving, leaving):
        thread.join(30)
    assert [status for status, _ in answers] == [200, 200], answers
    assert host.tenant() is tenant, "the gateway kept the host's connections"
    # The model gone is no longer reached: refused at the proxy and at the gateway alike, as
    # served elsewhere now (503: retry through its Service).
    body = json.dumps(
        {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [1]}]}
    ).encode()
    for url in (host.proxy.http_url, host.gateway.http_url):
        status, _, answer = fetch(url, "POST", "/v2/models/b/infer", body, HOST)
        assert status == 503 and b"'b' is no longer served" in answer, (url, status, answer)
    assert fetch(host.proxy.http_url, "POST", "/v2/models/a/infer", INFER)[0] == 200
