"""The node gateway against the real Triton: who may connect, what each pod reaches, and how
access follows the caller table (a pod deleted, a table gone stale, the gateway restarted).

Each test plays pods by connecting from their addresses (127.1.0.x); the full path (tritonclient,
the pod's proxy leaving from the pod's address, the gateway, Triton) is exercised too.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from proxy.settings import Settings
from sim.triton import TritonServer
from tests.proxy.conftest import proxy_settings, running_proxy
from tests.proxy.gateway.conftest import (
    RunningGateway,
    caller,
    gateway_settings,
    publish,
    running_gateway,
)

pytestmark = pytest.mark.triton

ADD_ONE_POD = "127.1.0.7"
IDENTITY_POD = "127.1.0.8"
STRANGER = "127.1.0.9"
INFER = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
).encode()


def fetch(
    gateway: RunningGateway, source: str, method: str, path: str, body: bytes | None = None
) -> tuple[int, bytes]:
    host, port = gateway.http_url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10, source_address=(source, 0))
    try:
        connection.request(method, path, body=body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def refused(gateway: RunningGateway, source: str, url: str) -> bool:
    """True when a connection from `source` to `url` is closed without an answer."""
    host, port = url.split(":")
    try:
        with socket.create_connection(
            (host, int(port)), timeout=10, source_address=(source, 0)
        ) as sock:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            return sock.recv(1024) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def scrape(gateway: RunningGateway) -> str:
    with urllib.request.urlopen(gateway.metrics_url, timeout=10) as response:
        return str(response.read().decode())


def poll(predicate: object, what: str, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {within:g} s")
        time.sleep(0.02)


def through(gateway: RunningGateway, triton: TritonServer, source: str) -> Settings:
    """A pod's proxy in front of `gateway`, its connections leaving from `source`."""
    return proxy_settings(
        triton,
        triton_http_url=gateway.http_url,
        triton_grpc_url=gateway.grpc_url,
        source_address=source,
    )


@pytest.fixture
def gateway(served_triton: TritonServer, table: Path) -> Iterator[RunningGateway]:
    publish(table, caller(ADD_ONE_POD, "add_one"), caller(IDENTITY_POD, "identity"))
    with running_gateway(gateway_settings(served_triton, table)) as running:
        yield running


def test_each_pod_reaches_its_own_model_and_no_other(gateway: RunningGateway) -> None:
    status, body = fetch(gateway, ADD_ONE_POD, "POST", "/v2/models/add_one/infer", INFER)
    assert status == 200
    assert json.loads(body)["outputs"][0]["data"] == [2, 3, 4]
    # The neighbour's model is answered as Triton answers a model it does not have.
    status, body = fetch(gateway, ADD_ONE_POD, "POST", "/v2/models/identity/infer", INFER)
    assert status == 404
    assert b"unknown model: 'identity'" in body
    # From the other pod's address, the same request is its own.
    assert fetch(gateway, IDENTITY_POD, "GET", "/v2/models/identity/ready")[0] == 200
    status, body = fetch(gateway, IDENTITY_POD, "POST", "/v2/models/add_one/infer", INFER)
    assert status == 404
    assert b"unknown model: 'add_one'" in body


def test_an_address_that_is_no_caller_is_refused_before_a_byte_is_read(
    gateway: RunningGateway,
) -> None:
    for url in (gateway.http_url, gateway.grpc_url):
        assert refused(gateway, STRANGER, url)
    # The node's own address is no caller either (the agent never writes it).
    assert refused(gateway, "127.0.0.1", gateway.http_url)
    metrics = scrape(gateway)
    assert (
        'tritonshare_gateway_refused_connections_total{protocol="http",reason="not_a_caller"} 2.0'
        in metrics
    )
    assert (
        'tritonshare_gateway_refused_connections_total{protocol="grpc",reason="not_a_caller"} 1.0'
        in metrics
    )
    assert "tritonshare_gateway_callers 2.0" in metrics


def test_the_full_path_from_tritonclient_through_the_pods_proxy(
    gateway: RunningGateway, served_triton: TritonServer
) -> None:
    settings = through(gateway, served_triton, ADD_ONE_POD)
    data = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    with running_proxy(settings) as proxy:
        with httpclient.InferenceServerClient(proxy.http_url) as rest:
            tensor = httpclient.InferInput("INPUT0", [1, 3], "FP32")
            tensor.set_data_from_numpy(data)
            assert rest.infer("add_one", [tensor]).as_numpy("OUTPUT0").tolist() == [[2, 3, 4]]
            assert rest.is_server_ready()
        with grpcclient.InferenceServerClient(proxy.grpc_url) as grpc:
            tensor = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
            tensor.set_data_from_numpy(data)
            assert grpc.infer("add_one", [tensor]).as_numpy("OUTPUT0").tolist() == [[2, 3, 4]]
    metrics = scrape(gateway)
    assert 'pod="team/add_one-pod"' in metrics
    assert 'tritonshare_gateway_requests_total{code="200",model="add_one"' in metrics


def test_health_answers_carry_the_protocols_bodies_at_the_gateway_and_through_it(
    gateway: RunningGateway, served_triton: TritonServer
) -> None:
    wanted = {
        "/v2/health/live": {"live": True},
        "/v2/models/add_one/ready": {"name": "add_one", "ready": True},
    }
    for path, body in wanted.items():
        status, answer = fetch(gateway, ADD_ONE_POD, "GET", path)
        assert (status, json.loads(answer)) == (200, body), path
    wanted["/v2/health/ready"] = {"ready": True}
    with running_proxy(through(gateway, served_triton, ADD_ONE_POD)) as proxy:
        host, port = proxy.http_url.split(":")
        for path, body in wanted.items():
            connection = http.client.HTTPConnection(host, int(port), timeout=10)
            try:
                connection.request("GET", path)
                response = connection.getresponse()
                assert response.status == 200, path
                assert response.getheader("Content-Type") == "application/json", path
                assert json.loads(response.read()) == body, path
            finally:
                connection.close()


def test_a_proxy_leaving_from_a_stranger_address_gets_nothing(
    gateway: RunningGateway, served_triton: TritonServer
) -> None:
    settings = through(gateway, served_triton, STRANGER)
    data = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    with (
        running_proxy(settings) as proxy,
        httpclient.InferenceServerClient(proxy.http_url) as rest,
    ):
        tensor = httpclient.InferInput("INPUT0", [1, 3], "FP32")
        tensor.set_data_from_numpy(data)
        with pytest.raises(InferenceServerException):
            rest.infer("add_one", [tensor])


def test_streams_reach_the_own_decoupled_model(served_triton: TritonServer, table: Path) -> None:
    publish(table, caller("127.0.0.1", "text_stream"))
    results: list[object] = []
    with (
        running_gateway(gateway_settings(served_triton, table)) as gateway,
        grpcclient.InferenceServerClient(gateway.grpc_url) as client,
    ):
        client.start_stream(callback=lambda result, error: results.append(error or result))
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"chunk"], dtype=np.object_))
        repeat = grpcclient.InferInput("repeat", [1], "INT32")
        repeat.set_data_from_numpy(np.array([3], dtype=np.int32))
        client.async_stream_infer("text_stream", [text, repeat])
        poll(lambda: len(results) >= 3, "three streamed answers")
        client.stop_stream()
    texts = []
    for result in results:
        assert not isinstance(result, InferenceServerException), result
        texts.append(result.as_numpy("text_output").reshape(-1)[0])  # type: ignore[attr-defined]
    assert texts == [b"chunk 0", b"chunk 1", b"chunk 2"]


def test_a_pod_that_leaves_the_table_loses_its_open_connections_at_once(
    gateway: RunningGateway, table: Path
) -> None:
    host, port = gateway.http_url.split(":")
    connection = http.client.HTTPConnection(
        host, int(port), timeout=10, source_address=(ADD_ONE_POD, 0)
    )
    connection.request("GET", "/v2/models/add_one/ready")
    assert connection.getresponse().status == 200
    # The agent saw the pod deleted: it rewrites the table without it.
    publish(table, caller(IDENTITY_POD, "identity"))
    poll(lambda: gateway.gateway.book.lookup(ADD_ONE_POD) is None, "the gateway rereading")
    with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
        connection.request("GET", "/v2/models/add_one/ready")
        connection.getresponse().read()
    connection.close()
    assert refused(gateway, ADD_ONE_POD, gateway.http_url)
    assert fetch(gateway, IDENTITY_POD, "GET", "/v2/models/identity/ready")[0] == 200


def test_a_moved_address_is_its_new_pods_only(gateway: RunningGateway, table: Path) -> None:
    assert fetch(gateway, ADD_ONE_POD, "GET", "/v2/models/add_one/ready")[0] == 200
    # The address now belongs to another pod with another model (an IP reused after a delete).
    publish(table, caller(ADD_ONE_POD, "identity", pod="other/identity"))
    poll(
        lambda: (c := gateway.gateway.book.lookup(ADD_ONE_POD)) is not None and "identity" in c,
        "the gateway rereading",
    )
    assert fetch(gateway, ADD_ONE_POD, "GET", "/v2/models/add_one/ready")[0] == 400
    assert fetch(gateway, ADD_ONE_POD, "GET", "/v2/models/identity/ready")[0] == 200


def test_a_table_the_agent_stopped_refreshing_refuses_everyone(
    served_triton: TritonServer, table: Path
) -> None:
    publish(table, caller(ADD_ONE_POD, "add_one"), written_at=time.time() - 5)
    # A started gateway has no last fresh table to serve: a grace does not apply.
    settings = gateway_settings(
        served_triton, table, table_max_age_seconds=2, table_stale_grace_seconds=300
    )
    with running_gateway(settings) as gateway:
        assert refused(gateway, ADD_ONE_POD, gateway.http_url)
        assert 'reason="no_table"' in scrape(gateway)
        with urllib.request.urlopen(gateway.metrics_url.replace("/metrics", "/healthz")) as r:
            assert r.status == 200
        # The agent writes again: access comes back.
        publish(table, caller(ADD_ONE_POD, "add_one"))
        poll(lambda: not gateway.gateway.book.problem, "the table being fresh again")
        assert fetch(gateway, ADD_ONE_POD, "GET", "/v2/models/add_one/ready")[0] == 200


def readiness(gateway: RunningGateway) -> tuple[int, str]:
    url = gateway.metrics_url.replace("/metrics", "/readyz")
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_a_lost_agent_leaves_the_last_callers_served_until_the_grace_ends(
    served_triton: TritonServer, table: Path
) -> None:
    publish(table, caller(ADD_ONE_POD, "add_one"))
    settings = gateway_settings(
        served_triton, table, table_max_age_seconds=1, table_stale_grace_seconds=8
    )
    with running_gateway(settings) as gateway:
        assert fetch(gateway, ADD_ONE_POD, "GET", "/v2/models/add_one/ready")[0] == 200
        # The agent is gone: nobody rewrites the table. Past its max age the gateway says so...
        poll(lambda: "not refreshing" in readiness(gateway)[1], "the table going stale")
        status, why = readiness(gateway)
        assert status == 503 and "serving only the pods of the last fresh table" in why
        assert "tritonshare_gateway_caller_table_stale 1.0" in scrape(gateway)
        # ...yet keeps serving the pod the last fresh table had, and only that pod.
        assert fetch(gateway, ADD_ONE_POD, "GET", "/v2/models/add_one/ready")[0] == 200
        assert refused(gateway, STRANGER, gateway.http_url)
        with urllib.request.urlopen(gateway.metrics_url.replace("/metrics", "/healthz")) as r:
            assert r.status == 200
        # The grace ends: everyone is refused, as with no table.
        poll(lambda: "--table-stale-grace (8 s) ago" in readiness(gateway)[1], "the grace ending")
        assert refused(gateway, ADD_ONE_POD, gateway.http_url)
        metrics = scrape(gateway)
        assert "tritonshare_gateway_caller_table_stale 0.0" in metrics
        assert 'reason="no_table"' in metrics


def test_a_table_gone_during_the_grace_refuses_everyone_at_once(
    served_triton: TritonServer, table: Path
) -> None:
    publish(table, caller(ADD_ONE_POD, "add_one"))
    settings = gateway_settings(
        served_triton, table, table_max_age_seconds=1, table_stale_grace_seconds=300
    )
    with running_gateway(settings) as gateway:
        poll(lambda: "not refreshing" in readiness(gateway)[1], "the table going stale")
        assert fetch(gateway, ADD_ONE_POD, "GET", "/v2/models/add_one/ready")[0] == 200
        table.unlink()
        poll(lambda: refused(gateway, ADD_ONE_POD, gateway.http_url), "the refusal")
        assert "no caller table" in readiness(gateway)[1]


def test_no_table_means_no_caller_and_not_ready(served_triton: TritonServer, table: Path) -> None:
    with running_gateway(gateway_settings(served_triton, table)) as gateway:
        assert refused(gateway, ADD_ONE_POD, gateway.http_url)
        ready_url = gateway.metrics_url.replace("/metrics", "/readyz")
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(ready_url, timeout=10)
        assert error.value.code == 503
        assert b"no caller table" in error.value.read()


def test_a_restarted_gateway_serves_the_callers_at_once(
    served_triton: TritonServer, table: Path
) -> None:
    publish(table, caller(ADD_ONE_POD, "add_one"))
    settings = gateway_settings(served_triton, table)
    with running_gateway(settings) as first:
        assert fetch(first, ADD_ONE_POD, "GET", "/v2/models/add_one/ready")[0] == 200
    # The table stays on the shared volume: the next gateway reads it before it listens.
    with running_gateway(settings) as second:
        assert fetch(second, ADD_ONE_POD, "GET", "/v2/models/add_one/ready")[0] == 200


def test_a_flood_of_strangers_costs_the_callers_nothing(gateway: RunningGateway) -> None:
    host, port = gateway.http_url.split(":")
    held = []
    try:
        for i in range(300):
            sock = socket.socket()
            sock.bind((f"127.1.1.{i % 250 + 1}", 0))
            sock.settimeout(10)
            held.append(sock)
            with contextlib.suppress(ConnectionResetError):  # the reset may beat connect()
                sock.connect((host, int(port)))
            if i % 50 == 0:
                assert fetch(gateway, ADD_ONE_POD, "GET", "/v2/models/add_one/ready")[0] == 200
        for sock in held:
            with contextlib.suppress(ConnectionResetError, OSError):
                assert sock.recv(1) == b""
    finally:
        for sock in held:
            sock.close()
    status, body = fetch(gateway, ADD_ONE_POD, "POST", "/v2/models/add_one/infer", INFER)
    assert status == 200, body
    # Every stranger was turned away at accept: none holds a relay or a connection to Triton.
    assert [t.caller.address for t in gateway.gateway.tenants] == [ADD_ONE_POD]


def test_a_pod_cannot_take_every_connection_of_the_gateway(
    served_triton: TritonServer, table: Path
) -> None:
    publish(table, caller(ADD_ONE_POD, "add_one"), caller(IDENTITY_POD, "identity"))
    settings = gateway_settings(served_triton, table, max_connections_per_pod=3)
    with running_gateway(settings) as gateway:
        host, port = gateway.http_url.split(":")
        held = []
        try:
            for _ in range(3):
                connection = http.client.HTTPConnection(
                    host, int(port), timeout=10, source_address=(ADD_ONE_POD, 0)
                )
                connection.request("GET", "/v2/models/add_one/ready")
                assert connection.getresponse().status == 200
                held.append(connection)
            assert refused(gateway, ADD_ONE_POD, gateway.http_url)
            # The other pod is not affected.
            assert fetch(gateway, IDENTITY_POD, "GET", "/v2/models/identity/ready")[0] == 200
            assert 'reason="too_many_connections"' in scrape(gateway)
        finally:
            for connection in held:
                connection.close()
        poll(
            lambda: fetch(gateway, ADD_ONE_POD, "GET", "/v2/models/add_one/ready")[0] == 200,
            "a connection slot freed",
        )


def _keep_alive_answer(connection: http.client.HTTPConnection) -> tuple[int, str]:
    """One inference on a kept connection: its status and its Connection header."""
    connection.request("POST", "/v2/models/add_one/infer", body=INFER)
    response = connection.getresponse()
    response.read()
    return response.status, (response.getheader("Connection") or "").lower()


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_a_pod_leaving_its_service_is_not_ready_and_its_clients_reconnect(
    gateway: RunningGateway, served_triton: TritonServer, table: Path
) -> None:
    """While the node pod stops, the agent's table says a model pod leaves its Service: the
    gateway answers its readiness not ready, saying why, and serves its inference; its proxy
    (its next look, every --model-check-seconds) turns each answer's connection `close` and its
    gRPC connections GOAWAY, until the table no longer says so."""
    why = "the node pod is stopping (deleted or replaced): this pod leaves its Service"
    settings = replace(through(gateway, served_triton, ADD_ONE_POD), model_check_seconds=0.1)
    tensor = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.array([[1.0, 2.0, 3.0]], dtype=np.float32))
    with running_proxy(settings) as proxy:
        host, port = proxy.http_url.split(":")
        ready_url = f"http://{proxy.http_url}/v2/health/ready"
        kept = http.client.HTTPConnection(host, int(port), timeout=10)
        grpc = grpcclient.InferenceServerClient(proxy.grpc_url)
        try:
            assert _keep_alive_answer(kept) == (200, "")
            assert grpc.is_server_ready()
            leaving = replace(caller(ADD_ONE_POD, "add_one"), stopping=why)
            publish(table, leaving, caller(IDENTITY_POD, "identity"))
            poll(
                lambda: fetch(gateway, ADD_ONE_POD, "GET", "/v2/models/add_one/ready")[0] == 503,
                "the gateway rereading its table",
            )
            _, body = fetch(gateway, ADD_ONE_POD, "GET", "/v2/models/add_one/ready")
            assert json.loads(body) == {"error": why, "nodeStopping": True}
            # Its inference is served; the neighbour's readiness is Triton's.
            assert fetch(gateway, ADD_ONE_POD, "POST", "/v2/models/add_one/infer", INFER)[0] == 200
            assert fetch(gateway, IDENTITY_POD, "GET", "/v2/models/identity/ready")[0] == 200
            # Through the pod's proxy: its readiness probe fails, and each answer closes.
            poll(lambda: _keep_alive_answer(kept) == (200, "close"), "the proxy's next look")
            kept.close()
            assert _status(ready_url) == 503
            assert not grpc.is_server_ready()
            # A gRPC call is answered, and its channel reconnects for the next one.
            assert grpc.infer("add_one", [tensor]).as_numpy("OUTPUT0").tolist() == [[2, 3, 4]]
            assert grpc.infer("add_one", [tensor]).as_numpy("OUTPUT0").tolist() == [[2, 3, 4]]
            # The node serves it again (a new gateway's table): kept alive again.
            publish(table, caller(ADD_ONE_POD, "add_one"), caller(IDENTITY_POD, "identity"))
            poll(lambda: _keep_alive_answer(kept) == (200, ""), "the proxy's next look")
            assert _status(ready_url) == 200
            assert grpc.is_server_ready()
        finally:
            kept.close()
            grpc.close()
