"""Attacks on the gateway's caller keys, and the masquerading CNI they exist for.

A tenant has full rights in its namespace and any number of pods. It knows its own pods' keys
(it can exec into them) and every address on the node; it cannot read another namespace's pods
or the node pod's volume. Each test plays pods by their source addresses (127.1.0.x) and plays a
masquerading CNI (the portmap plugin's SNAT: every pod's traffic to the hostPort arrives from the
node's address) by connecting from 127.0.0.1.
"""

from __future__ import annotations

import http.client
import json
import secrets
import socket
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from common.callerkeys import MAGIC, digest, preamble
from common.callers import Caller
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

POD_A = "127.1.0.17"  # add_one's pod
POD_B = "127.1.0.18"  # identity's pod, another team's
NODE = "127.0.0.1"  # what a masquerading CNI makes every pod's source
KEY_A = secrets.token_bytes(32)
KEY_B = secrets.token_bytes(32)
INFER = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
).encode()


class KeyedConnection(http.client.HTTPConnection):
    """An HTTP connection from `source` that first presents `key` (None: no key), as the proxy
    does."""

    def __init__(self, url: str, source: str, key: bytes | None) -> None:
        host, port = url.split(":")
        super().__init__(host, int(port), timeout=10, source_address=(source, 0))
        self.key = key

    def connect(self) -> None:
        super().connect()
        if self.key is not None:
            self.sock.sendall(preamble(self.key))


def fetch(
    gateway: RunningGateway,
    source: str,
    key: bytes | None,
    method: str,
    path: str,
    body: bytes | None = None,
) -> tuple[int, bytes]:
    connection = KeyedConnection(gateway.http_url, source, key)
    try:
        connection.request(method, path, body=body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def refused(url: str, source: str, first: bytes) -> bool:
    """True when a connection from `source` that sends `first` is closed without an answer."""
    host, port = url.split(":")
    try:
        with socket.create_connection(
            (host, int(port)), timeout=10, source_address=(source, 0)
        ) as sock:
            sock.sendall(first + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
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


def keyed(address: str, model_id: str, key: bytes, pod: str = "") -> Caller:
    return replace(caller(address, model_id, pod), key=digest(key))


ROWS = (keyed(POD_A, "add_one", KEY_A), keyed(POD_B, "identity", KEY_B, "other/identity-pod"))


@pytest.fixture
def gateway(served_triton: TritonServer, table: Path) -> Iterator[RunningGateway]:
    publish(table, *ROWS)
    with running_gateway(gateway_settings(served_triton, table)) as running:
        yield running


def test_a_key_names_its_pod_from_a_masquerading_address(gateway: RunningGateway) -> None:
    status, body = fetch(gateway, NODE, KEY_A, "POST", "/v2/models/add_one/infer", INFER)
    assert status == 200
    assert json.loads(body)["outputs"][0]["data"] == [2, 3, 4]
    # The neighbour's model, from the same (masqueraded) address, is one Triton does not have.
    status, body = fetch(gateway, NODE, KEY_A, "POST", "/v2/models/identity/infer", INFER)
    assert (status, b"unknown model: 'identity'" in body) == (404, True)
    assert fetch(gateway, NODE, KEY_B, "GET", "/v2/models/identity/ready")[0] == 200
    assert fetch(gateway, NODE, KEY_B, "GET", "/v2/models/add_one/ready")[0] == 400


def test_a_key_from_its_own_pods_address_is_served(gateway: RunningGateway) -> None:
    assert fetch(gateway, POD_A, KEY_A, "GET", "/v2/models/add_one/ready")[0] == 200


def test_a_stolen_key_from_another_callers_address_is_refused(gateway: RunningGateway) -> None:
    # Pod B holds A's key (say A's team leaked it): the address says B, the key says A.
    assert refused(gateway.http_url, POD_B, preamble(KEY_A))
    assert refused(gateway.grpc_url, POD_B, preamble(KEY_A))
    assert (
        'tritonshare_gateway_refused_connections_total{protocol="http",'
        'reason="address_mismatch"} 1.0' in scrape(gateway)
    )


def test_a_masqueraded_connection_without_a_key_is_refused(gateway: RunningGateway) -> None:
    # The node's address is no pod's: without a key nothing names the caller.
    assert refused(gateway.http_url, NODE, b"")
    assert refused(gateway.grpc_url, NODE, b"")


@pytest.mark.parametrize(
    "first",
    [
        pytest.param(preamble(secrets.token_bytes(32)), id="guessed-key"),
        pytest.param(MAGIC + KEY_A[:10], id="short-key"),
        pytest.param(b"\x00tsid99\n" + KEY_A, id="other-version"),
        pytest.param(preamble(KEY_A)[1:] + b"\x00", id="misaligned"),
    ],
)
def test_forged_keys_are_refused(gateway: RunningGateway, first: bytes) -> None:
    assert refused(gateway.http_url, NODE, first)
    if first.startswith(MAGIC[:1]) and first[: len(MAGIC)] != MAGIC:
        # A NUL first byte commits to a key even from a caller's own address: one not even of
        # the key's form is refused (a well-formed one the table lacks counts for nothing).
        assert refused(gateway.http_url, POD_A, first)


def test_a_stale_key_counts_for_nothing(served_triton: TritonServer, table: Path) -> None:
    # A replaced node pod makes a new secret: until its proxy asks again, a pod's key is one the
    # table does not hold. From its own address it is known by that, as without a key; under
    # --caller-identity key it is refused; from the node's (masqueraded) address it is refused.
    stale = preamble(secrets.token_bytes(32))
    publish(table, *ROWS)
    with running_gateway(gateway_settings(served_triton, table)) as gateway:
        assert fetch(gateway, POD_A, None, "GET", "/v2/models/add_one/ready")[0] == 200
        connection = KeyedConnection(gateway.http_url, POD_A, None)
        connection.connect()
        connection.sock.sendall(stale)
        connection.request("GET", "/v2/models/identity/ready")
        assert connection.getresponse().status == 400, "A's rows: not B's model"
        connection.close()
        assert refused(gateway.http_url, NODE, stale)
    settings = gateway_settings(served_triton, table, caller_identity="key")
    with running_gateway(settings) as gateway:
        assert refused(gateway.http_url, POD_A, stale)


def test_a_deleted_pods_key_is_worthless(gateway: RunningGateway, table: Path) -> None:
    assert fetch(gateway, NODE, KEY_A, "GET", "/v2/models/add_one/ready")[0] == 200
    connection = KeyedConnection(gateway.http_url, NODE, KEY_A)
    connection.request("GET", "/v2/models/add_one/ready")
    assert connection.getresponse().status == 200
    # The pod is deleted; a new pod of the same name has a new uid and so another key.
    publish(table, ROWS[1], keyed(POD_A, "add_one", secrets.token_bytes(32)))
    poll(lambda: refused(gateway.http_url, NODE, preamble(KEY_A)), "the old key refused")
    # Its open connection, identified by the key, is dropped as an address's would be.
    with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
        connection.request("GET", "/v2/models/add_one/ready")
        connection.getresponse().read()
    connection.close()


def test_a_silent_connection_holds_up_no_one(served_triton: TritonServer, table: Path) -> None:
    publish(table, *ROWS)
    settings = gateway_settings(served_triton, table, caller_key_timeout_seconds=3)
    with running_gateway(settings) as gateway:
        host, port = gateway.http_url.split(":")
        silent = [
            socket.create_connection((host, int(port)), timeout=10, source_address=(NODE, 0))
            for _ in range(8)
        ]
        try:
            poll(lambda: len(gateway.gateway._waiting) == 8, "the gateway waiting for keys")
            assert fetch(gateway, NODE, KEY_A, "GET", "/v2/models/add_one/ready")[0] == 200
            # Served while the silent ones still wait: none of them held it up.
            assert len(gateway.gateway._waiting) == 8
            # The connections that never present a key are reset at the deadline.
            for sock in silent:
                with pytest.raises(ConnectionResetError):
                    sock.recv(1024)
        finally:
            for sock in silent:
                sock.close()


def test_keys_only_refuses_a_callers_address_alone(
    served_triton: TritonServer, table: Path
) -> None:
    publish(table, *ROWS)
    settings = gateway_settings(served_triton, table, caller_identity="key")
    with running_gateway(settings) as gateway:
        assert refused(gateway.http_url, POD_A, b"")
        assert fetch(gateway, POD_A, KEY_A, "GET", "/v2/models/add_one/ready")[0] == 200


def test_by_default_a_keyless_caller_is_known_by_its_address(gateway: RunningGateway) -> None:
    # A proxy of the version before keys, on a CNI that keeps source addresses.
    assert fetch(gateway, POD_A, None, "GET", "/v2/models/add_one/ready")[0] == 200
    assert fetch(gateway, POD_A, None, "GET", "/v2/models/identity/ready")[0] == 400


def test_the_full_path_through_a_masquerading_cni(
    gateway: RunningGateway, served_triton: TritonServer
) -> None:
    """tritonclient, the pod's proxy (its connections arriving from the node's address), the
    gateway, Triton: the REST pool, the gRPC channel and the readiness check present the key."""
    settings = proxy_settings(
        served_triton,
        triton_http_url=gateway.http_url,
        triton_grpc_url=gateway.grpc_url,
        source_address=NODE,
        grpc_mode="relay",
    )
    data = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    with running_proxy(settings) as proxy:
        proxy.proxy.state.caller_key = preamble(KEY_A)
        ready = f"http://127.0.0.1:{proxy.proxy.metrics_server.port}/readyz"
        with urllib.request.urlopen(ready, timeout=10) as response:
            assert response.status == 200
        with httpclient.InferenceServerClient(proxy.http_url) as rest:
            tensor = httpclient.InferInput("INPUT0", [1, 3], "FP32")
            tensor.set_data_from_numpy(data)
            assert rest.infer("add_one", [tensor]).as_numpy("OUTPUT0").tolist() == [[2, 3, 4]]
        with grpcclient.InferenceServerClient(proxy.grpc_url) as grpc:
            tensor = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
            tensor.set_data_from_numpy(data)
            assert grpc.infer("add_one", [tensor]).as_numpy("OUTPUT0").tolist() == [[2, 3, 4]]
    assert 'pod="team/add_one-pod"' in scrape(gateway)


def test_a_flood_of_silent_connections_closes_the_longest_waiting(
    served_triton: TritonServer, table: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("proxy.gateway.app.MAX_WAITING", 4)
    publish(table, *ROWS)
    settings = gateway_settings(served_triton, table, caller_key_timeout_seconds=60)
    with running_gateway(settings) as gateway:
        host, port = gateway.http_url.split(":")
        silent = []
        try:
            for _ in range(6):
                silent.append(
                    socket.create_connection(
                        (host, int(port)), timeout=10, source_address=(NODE, 0)
                    )
                )
                poll(
                    lambda: len(gateway.gateway._waiting) == min(len(silent), 4),
                    "the gateway waiting for its key",
                )
            # The two that waited longest were closed long before their deadline.
            for sock in silent[:2]:
                assert sock.recv(1024) == b""
            assert fetch(gateway, NODE, KEY_A, "GET", "/v2/models/add_one/ready")[0] == 200
        finally:
            for sock in silent:
                sock.close()
