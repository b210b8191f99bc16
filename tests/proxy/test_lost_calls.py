"""A call lost with the proxy's connection to the node gateway, its answer not begun. The
gateway's process ending closes that connection under the calls in flight while its keeper goes
on listening; Triton may have run them. A model marked idempotent (`--idempotent`, a host's
`idempotent` line) has such a call sent again, so its client sees its answer: REST sent again by
the proxy, gRPC refused with REFUSED_STREAM, which gRPC clients send again themselves. Any other
model's call fails as before (502, UNAVAILABLE), once. Against the real Triton behind a
forwarder standing in for the gateway, with http.client and tritonclient as the tenants."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from sim.triton import TritonServer, free_port
from tests.proxy.conftest import RunningProxy, proxy_settings
from tests.proxy.forwarder import Forwarder

pytestmark = pytest.mark.triton

DELAY_MS = 200
"""How long the model takes per call (the forwarder holds its answer back until the cut)."""


@pytest.fixture
def gateway(served_triton: TritonServer) -> Iterator[tuple[Forwarder, Forwarder]]:
    """Stand-ins for the node gateway's REST and gRPC ports."""
    rest = Forwarder(free_port(), served_triton.http_url)
    rpc = Forwarder(free_port(), served_triton.grpc_url)
    for forwarder in (rest, rpc):
        threading.Thread(target=forwarder.serve_forever, daemon=True).start()
    yield rest, rpc
    for forwarder in (rest, rpc):
        forwarder.shutdown()
        forwarder.server_close()


def proxy(
    served_triton: TritonServer, gateway: tuple[Forwarder, Forwarder], idempotent: bool
) -> RunningProxy:
    rest, rpc = gateway
    return RunningProxy(
        proxy_settings(
            served_triton,
            model_id="sleepy",
            triton_http_url=f"127.0.0.1:{rest.server_address[1]}",
            triton_grpc_url=f"127.0.0.1:{rpc.server_address[1]}",
            idempotent=idempotent,
        )
    )


def resent(running: RunningProxy) -> dict[str, float]:
    """The proxy's count of requests sent again, by protocol."""
    with urllib.request.urlopen(running.metrics_url, timeout=5) as answer:
        text = answer.read().decode()
    return {
        sample.labels["protocol"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "tritonshare_proxy_resent_requests_total"
    }


def rest_call(address: str) -> str:
    connection = http.client.HTTPConnection(address, timeout=30)
    body = {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [DELAY_MS]}]}
    try:
        connection.request("POST", "/v2/models/sleepy/infer", json.dumps(body).encode())
        answer = connection.getresponse()
        text = answer.read()
        if answer.status == 200:
            assert json.loads(text)["outputs"][0]["data"] == [DELAY_MS]
        return str(answer.status)
    finally:
        connection.close()


def grpc_call(address: str) -> str:
    client = grpcclient.InferenceServerClient(address)
    tensor = grpcclient.InferInput("DELAY_MS", [1], "INT32")
    tensor.set_data_from_numpy(np.array([DELAY_MS], dtype=np.int32))
    try:
        result = client.infer("sleepy", [tensor], client_timeout=30)
        assert result.as_numpy("OUTPUT0").tolist() == [DELAY_MS]
        return "OK"
    except grpcclient.InferenceServerException as e:
        return str(e.status())
    finally:
        client.close()


def cut_in_flight(call: Callable[[str], str], address: str, forwarder: Forwarder) -> str:
    """Make `call`, cut the forwarder's connections once its request went through whole (Triton
    runs it; its answer is held back), and return its outcome."""
    forwarder.hold()
    with ThreadPoolExecutor(1) as pool:
        outcome = pool.submit(call, address)
        deadline = time.monotonic() + 20
        while forwarder.sent < 1:
            assert not outcome.done(), outcome.result()
            assert time.monotonic() < deadline, "the call never went through the gateway"
            time.sleep(0.01)
        assert forwarder.cut() >= 1
        return outcome.result(40)


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
@pytest.mark.parametrize("idempotent", [True, False])
def test_a_call_lost_with_the_gateway_is_answered_if_its_model_is_idempotent_else_fails_once(
    served_triton: TritonServer,
    gateway: tuple[Forwarder, Forwarder],
    protocol: str,
    idempotent: bool,
) -> None:
    running = proxy(served_triton, gateway, idempotent=idempotent)
    forwarder, call, address = (
        (gateway[0], rest_call, running.http_url)
        if protocol == "rest"
        else (gateway[1], grpc_call, running.grpc_url)
    )
    try:
        outcome = cut_in_flight(call, address, forwarder)
        if idempotent:
            assert outcome in ("200", "OK"), outcome
            assert forwarder.sent == 1, "sent again once, on a new connection"
            assert resent(running) == {"http" if protocol == "rest" else "grpc": 1.0}
        else:
            assert outcome in ("502", "StatusCode.UNAVAILABLE"), outcome
            assert forwarder.sent == 0, "failed at the cut, not sent again"
            assert resent(running) == {}
        # The next call goes on a new connection and is answered.
        assert call(address) in ("200", "OK")
    finally:
        running.stop()
