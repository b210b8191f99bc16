"""A call lost with the proxy's connection to the node gateway, its answer not begun. The
gateway's process ending closes that connection under the calls in flight while its keeper goes
on listening; Triton may have run them. A model marked idempotent (`--idempotent`, a host's
`idempotent` line), or marked neither way with a config in Triton that allows it (no sequence
batcher, not decoupled), has such a call sent again, so its client sees its answer: REST sent
again by the proxy, gRPC refused with REFUSED_STREAM, which gRPC clients send again themselves.
A model marked not idempotent, or a stateful one, has its call fail (502, UNAVAILABLE), once.
Against the real Triton behind a forwarder standing in for the gateway, with http.client and
tritonclient as the tenants."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from proxy.table import RESENDS
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
    served_triton: TritonServer,
    gateway: tuple[Forwarder, Forwarder],
    idempotent: bool | None,
    model_id: str = "sleepy",
) -> RunningProxy:
    rest, rpc = gateway
    return RunningProxy(
        proxy_settings(
            served_triton,
            model_id=model_id,
            triton_http_url=f"127.0.0.1:{rest.server_address[1]}",
            triton_grpc_url=f"127.0.0.1:{rpc.server_address[1]}",
            idempotent=idempotent,
        )
    )


def learned(running: RunningProxy, model_id: str = "sleepy") -> bool:
    """Whether the proxy's read of the model's config in Triton lets its calls run twice,
    polled until it has read it."""
    served = running.app.table.models[model_id]
    deadline = time.monotonic() + 30
    while served.learned is None:
        assert time.monotonic() < deadline, "the proxy never read the model's config"
        time.sleep(0.02)
    return served.learned


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


def cut_in_flight(
    call: Callable[[str], str], address: str, forwarder: Forwarder, cuts: int = 1
) -> str:
    """Make `call`, cut the forwarder's connections `cuts` times, each once the request went
    through whole (Triton runs it; its answer is held back), and return its outcome."""
    forwarder.hold()
    with ThreadPoolExecutor(1) as pool:
        outcome = pool.submit(call, address)
        for cut in range(1, cuts + 1):
            deadline = time.monotonic() + 20
            while forwarder.sent < 1:
                assert not outcome.done(), (cut, outcome.result())
                assert time.monotonic() < deadline, f"the call never went through (cut {cut})"
                time.sleep(0.01)
            assert forwarder.cut(hold_next=cut < cuts) >= 1
        return outcome.result(40)


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
@pytest.mark.parametrize("idempotent", [True, None, False])
def test_a_call_lost_with_the_gateway_is_answered_unless_its_model_opts_out_else_fails_once(
    served_triton: TritonServer,
    gateway: tuple[Forwarder, Forwarder],
    protocol: str,
    idempotent: bool | None,
) -> None:
    """Marked idempotent, or marked neither way (sleepy has no sequence batcher): sent again;
    marked not idempotent: fails."""
    running = proxy(served_triton, gateway, idempotent=idempotent)
    forwarder, call, address = (
        (gateway[0], rest_call, running.http_url)
        if protocol == "rest"
        else (gateway[1], grpc_call, running.grpc_url)
    )
    try:
        if idempotent is None:
            assert learned(running), "sleepy's config allows its calls to run twice"
        outcome = cut_in_flight(call, address, forwarder)
        if idempotent is not False:
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


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_a_call_lost_again_is_sent_again_up_to_its_bound(
    served_triton: TritonServer, gateway: tuple[Forwarder, Forwarder], protocol: str
) -> None:
    """Triton exiting in a row (a neighbour's crashing load loads again) loses a call more than
    once: sent again RESENDS times, it is answered; lost once more, it fails."""
    running = proxy(served_triton, gateway, idempotent=True)
    forwarder, call, address = (
        (gateway[0], rest_call, running.http_url)
        if protocol == "rest"
        else (gateway[1], grpc_call, running.grpc_url)
    )
    counted = "http" if protocol == "rest" else "grpc"
    try:
        assert cut_in_flight(call, address, forwarder, cuts=RESENDS) in ("200", "OK")
        assert resent(running) == {counted: RESENDS}
        outcome = cut_in_flight(call, address, forwarder, cuts=RESENDS + 1)
        assert outcome in ("502", "StatusCode.UNAVAILABLE"), outcome
        assert forwarder.sent == 0, "not sent a fourth time"
        assert resent(running) == {counted: 2 * RESENDS}
    finally:
        running.stop()


def test_a_rest_request_whose_body_came_in_pieces_is_sent_again_whole(
    served_triton: TritonServer, gateway: tuple[Forwarder, Forwarder]
) -> None:
    """The proxy streams a body that was not all there when the request went to Triton: kept as
    it passes, and sent again whole once it was."""
    running = proxy(served_triton, gateway, idempotent=True)
    forwarder = gateway[0]
    body = json.dumps(
        {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [DELAY_MS]}]}
    ).encode()
    head = (
        f"POST /v2/models/sleepy/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    try:
        forwarder.hold()
        host, _, port = running.http_url.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=30) as client:
            client.sendall(head)  # the proxy connects to the gateway and streams the body
            deadline = time.monotonic() + 20
            while not forwarder.begun:
                assert time.monotonic() < deadline, "the proxy never sent the head on"
                time.sleep(0.01)
            client.sendall(body)
            while forwarder.sent < 1:
                assert time.monotonic() < deadline, "the request never went through whole"
                time.sleep(0.01)
            assert forwarder.cut() >= 1
            answer = client.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        assert resent(running) == {"http": 1.0}
    finally:
        running.stop()


def test_a_model_with_a_sequence_batcher_marked_neither_way_is_never_sent_again(
    served_triton: TritonServer, gateway: tuple[Forwarder, Forwarder]
) -> None:
    """A stateful model (each call changes its sequence's state) is not sent again unless it
    is marked idempotent: the proxy reads its config in Triton and keeps no call of it."""
    name = "sleepy_sequence"  # tests/proxy/conftest.py's served_triton
    running = proxy(served_triton, gateway, idempotent=None, model_id=name)
    try:
        assert not learned(running, name)
        assert running.app.table.models[name].resend is False
    finally:
        running.stop()
