"""A request that has not reached its upstream waits while the upstream restarts. When nothing
listens at the proxy's upstream (the node gateway, or Triton behind it, restarting), a REST
request and a gRPC call are held and sent once it listens again (within
--connect-retry), instead of failing at once; past the bound they still fail as
before (502 / UNAVAILABLE). Against the real Triton, behind a TCP forwarder that starts late as a
restarted gateway does, with http.client and tritonclient as the tenants."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from sim.triton import TritonServer
from tests.proxy.conftest import proxy_settings, running_proxy
from tests.proxy.forwarder import Forwarder

pytestmark = pytest.mark.triton

RESTART = 1.0
"""Seconds nothing listens at the upstream after the requests were sent."""


def held_port() -> socket.socket:
    """A port bound and not listening: a connection to it is refused (nothing listens, as while
    the upstream restarts), and no other process of the machine can take it meanwhile."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


@pytest.fixture
def held() -> Iterator[list[socket.socket]]:
    sockets = [held_port(), held_port()]
    yield sockets
    for sock in sockets:
        sock.close()


@pytest.fixture
def ports(held: list[socket.socket]) -> tuple[int, int]:
    return held[0].getsockname()[1], held[1].getsockname()[1]


@pytest.fixture
def forwarders(served_triton: TritonServer, ports: tuple[int, int]) -> Iterator[list[Forwarder]]:
    started: list[Forwarder] = []
    yield started
    for forwarder in started:
        forwarder.shutdown()
        forwarder.server_close()


def _rest(address: str) -> tuple[int, float]:
    began = time.monotonic()
    connection = http.client.HTTPConnection(address, timeout=30)
    body = {
        "inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]
    }
    try:
        connection.request("POST", "/v2/models/add_one/infer", json.dumps(body).encode())
        answer = connection.getresponse()
        answer.read()
        return answer.status, time.monotonic() - began
    finally:
        connection.close()


def _grpc(address: str) -> tuple[str, float]:
    began = time.monotonic()
    client = grpcclient.InferenceServerClient(address)
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
    try:
        client.infer("add_one", [tensor], client_timeout=30)
        return "OK", time.monotonic() - began
    except grpcclient.InferenceServerException as e:
        return str(e.status()), time.monotonic() - began
    finally:
        client.close()


def test_requests_wait_while_the_upstream_restarts(
    served_triton: TritonServer,
    ports: tuple[int, int],
    held: list[socket.socket],
    forwarders: list[Forwarder],
) -> None:
    http_port, grpc_port = ports
    settings = proxy_settings(
        served_triton,
        triton_http_url=f"127.0.0.1:{http_port}",
        triton_grpc_url=f"127.0.0.1:{grpc_port}",
    )
    with running_proxy(settings) as running, ThreadPoolExecutor(2) as pool:
        rest = pool.submit(_rest, running.http_url)
        rpc = pool.submit(_grpc, running.grpc_url)
        time.sleep(RESTART)  # the upstream is restarting: nothing listens
        for port, target, holder in (
            (http_port, served_triton.http_url, held[0]),
            (grpc_port, served_triton.grpc_url, held[1]),
        ):
            holder.close()  # the upstream is back: it listens on the port held until now
            forwarder = Forwarder(port, target)
            threading.Thread(target=forwarder.serve_forever, daemon=True).start()
            forwarders.append(forwarder)
        status, took = rest.result(30)
        assert status == 200 and took >= RESTART, (status, took)
        code, took = rpc.result(30)
        assert code == "OK" and took >= RESTART, (code, took)
