"""A model leaving a model host: its clients are sent back to its Service. While the host's
loader lists it `leaving` (its Service no longer routes here), the host's proxy still answers its
requests, and ends each connection they come on after the answer (REST: `Connection: close` in
the answer; gRPC: GOAWAY), so that a keep-alive client reconnects through the Service rather than
finding the model gone from this host; the other models' connections stay open. Against the real
Triton, with http.client and grpcio as the tenants."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from sim.triton import TritonServer, free_port
from tests.proxy.conftest import RunningProxy, proxy_settings, running_proxy

pytestmark = pytest.mark.triton

BODIES = {
    "add_one": {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
    "identity": {"name": "INPUT_FP32", "shape": [5], "datatype": "FP32", "data": [1, 2, 3, 4, 5]},
}


def write_table(path: Path, leaving: set[str]) -> None:
    entries = [{"model": m} | ({"leaving": True} if m in leaving else {}) for m in ("add_one",)]
    entries.append({"model": "identity"})
    temporary = path.with_suffix(".new")
    temporary.write_text(json.dumps(entries))
    temporary.replace(path)


@pytest.fixture
def table(tmp_path: Path) -> Path:
    path = tmp_path / "models.json"
    write_table(path, set())
    return path


@pytest.fixture
def host(served_triton: TritonServer, table: Path) -> Iterator[RunningProxy]:
    settings = proxy_settings(
        served_triton, model_id="", models_file=table, models_check_seconds=0.05
    )
    with running_proxy(settings) as running:
        yield running


def _infer(connection: http.client.HTTPConnection, model: str) -> http.client.HTTPResponse:
    connection.request(
        "POST",
        f"/v2/models/{model}/infer",
        json.dumps({"inputs": [BODIES[model]]}).encode(),
        {"Content-Type": "application/json"},
    )
    answer = connection.getresponse()
    body = answer.read()
    assert answer.status == 200, (answer.status, body)
    return answer


def test_a_leaving_model_s_rest_clients_are_told_to_reconnect(
    host: RunningProxy, table: Path
) -> None:
    address = host.http_url
    leaving = http.client.HTTPConnection(address, timeout=10)
    staying = http.client.HTTPConnection(address, timeout=10)
    try:
        assert _infer(leaving, "add_one").getheader("Connection") is None
        write_table(table, {"add_one"})
        deadline = time.monotonic() + 10
        while True:  # until the proxy has reread its table: each answer 200 meanwhile
            answer = _infer(leaving, "add_one")
            if answer.getheader("Connection") == "close":
                break
            assert time.monotonic() < deadline, "no answer said Connection: close"
            time.sleep(0.05)
        # The answer said so, and the proxy closed the connection after it: the client's next
        # request opens a new one, and is answered.
        assert leaving.sock is None
        assert _infer(leaving, "add_one").status == 200
        # Another model's keep-alive connection stays open.
        for _ in range(3):
            assert _infer(staying, "identity").getheader("Connection") is None
            assert staying.sock is not None
    finally:
        leaving.close()
        staying.close()


def test_a_model_gone_from_the_host_closes_the_connection_it_came_on(
    host: RunningProxy, table: Path
) -> None:
    """A keep-alive connection that outlived its model's time on the host (no request came while
    it was `leaving`): the host's answer for it is 503 with `Retry-After` (the model is served
    elsewhere: retry), says `Connection: close` and ends the connection, so the client's retry
    goes through the model's Service instead of finding the model gone again."""
    connection = http.client.HTTPConnection(host.http_url, timeout=10)
    try:
        assert _infer(connection, "add_one").getheader("Connection") is None
        entries = [{"model": "identity"}]
        temporary = table.with_suffix(".new")
        temporary.write_text(json.dumps(entries))
        temporary.replace(table)
        deadline = time.monotonic() + 10
        while True:  # until the proxy has reread its table
            connection.request(
                "POST",
                "/v2/models/add_one/infer",
                json.dumps({"inputs": [BODIES["add_one"]]}).encode(),
                {"Content-Type": "application/json"},
            )
            answer = connection.getresponse()
            body = answer.read()
            if answer.status != 200:
                break
            assert time.monotonic() < deadline, "the host went on serving add_one"
            time.sleep(0.05)
        assert answer.status == 503, (answer.status, body)
        assert b"no longer served on this host" in body and b"retry" in body, body
        assert answer.getheader("Retry-After") == "1"
        assert answer.getheader("Connection") == "close"
        assert connection.sock is None
    finally:
        connection.close()


@contextlib.contextmanager
def _watched(
    address: str,
) -> Iterator[tuple[grpc.Channel, list[grpc.ChannelConnectivity], threading.Event]]:
    """A channel to `address`, the connectivity states grpc's poller thread told of it (after
    the fact), and an event set at each."""
    channel = grpc.insecure_channel(address)
    states: list[grpc.ChannelConnectivity] = []
    changed = threading.Event()

    def seen(state: grpc.ChannelConnectivity) -> None:
        states.append(state)
        changed.set()

    before = set(threading.enumerate())
    channel.subscribe(seen)
    pollers = set(threading.enumerate()) - before  # grpc's connectivity poller
    try:
        yield channel, states, changed
    finally:
        channel.unsubscribe(seen)
        # The poller sees the unsubscription within 0.2 s; a channel closed under it makes it
        # raise in its thread (grpc/grpc#18995), which fails whichever test runs next.
        for poller in pollers:
            poller.join(5)
        channel.close()


def test_a_leaving_model_s_grpc_clients_are_sent_goaway(host: RunningProxy, table: Path) -> None:
    with _watched(host.grpc_url) as (channel, states, changed):
        _goaway_after_answers(channel, states, changed, table)


def _goaway_after_answers(
    channel: grpc.Channel,
    states: list[grpc.ChannelConnectivity],
    changed: threading.Event,
    table: Path,
) -> None:
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
    request = service_pb2.ModelInferRequest(model_name="add_one", inputs=[tensor._get_tensor()])
    request.raw_input_contents.append(tensor._get_content())
    stub.ModelInfer(request, timeout=10)
    # grpc's poller thread tells the subscriber of each state after the fact: wait for READY.
    deadline = time.monotonic() + 10
    while not states or states[-1] != grpc.ChannelConnectivity.READY:
        assert time.monotonic() < deadline, f"the channel never read READY: {states}"
        changed.clear()
        changed.wait(0.05)
    mark = len(states)
    write_table(table, {"add_one"})
    deadline = time.monotonic() + 10
    # Each call answered; once the proxy has its new table, the connection gets GOAWAY
    # after the answer and the channel leaves READY (to reconnect for the next call).
    while all(state == grpc.ChannelConnectivity.READY for state in states[mark:]):
        assert time.monotonic() < deadline, f"the channel stayed on its connection: {states}"
        changed.clear()
        stub.ModelInfer(request, timeout=10)
        changed.wait(0.05)
    stub.ModelInfer(request, timeout=10)  # on a new connection


def test_a_grpc_call_for_a_model_gone_from_the_host_is_told_to_retry(
    host: RunningProxy, table: Path
) -> None:
    """A gRPC call for a model that just left the host: UNAVAILABLE (with `retry-after`),
    which gRPC clients retry, not Triton's NOT_FOUND, and its connection gets GOAWAY."""
    client = grpcclient.InferenceServerClient(host.grpc_url)
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
    try:
        client.infer("add_one", [tensor])
        temporary = table.with_suffix(".new")
        temporary.write_text(json.dumps([{"model": "identity"}]))
        temporary.replace(table)
        deadline = time.monotonic() + 10
        while True:  # until the proxy has reread its table
            try:
                client.infer("add_one", [tensor], client_timeout=10)
            except InferenceServerException as e:
                error = e
                break
            assert time.monotonic() < deadline, "the host went on serving add_one"
            time.sleep(0.05)
        assert error.status() == "StatusCode.UNAVAILABLE", (error.status(), str(error))
        assert "no longer served on this host" in str(error), str(error)
    finally:
        client.close()


def test_a_leaving_model_s_grpc_call_refused_for_an_unreachable_triton_is_sent_goaway(
    served_triton: TritonServer, tmp_path: Path
) -> None:
    """While the node pod stops, its host lists every model `leaving` and its gateway and Triton
    go: a call the host cannot send (Triton unreachable) is answered UNAVAILABLE, and its
    connection gets GOAWAY as after an answered call, so that the client's channel reconnects
    through the model's Service (to a stand-in that serves it) rather than failing each call on
    this host until the node pod is back. A model not leaving keeps its connection."""
    table = tmp_path / "models.json"
    write_table(table, {"add_one"})
    settings = proxy_settings(
        served_triton,
        model_id="",
        models_file=table,
        models_check_seconds=0.05,
        triton_grpc_url=f"127.0.0.1:{free_port()}",  # nothing listens: Triton is gone
        connect_retry_seconds=0.2,
    )
    with running_proxy(settings) as host:
        for model, leaves in (("identity", False), ("add_one", True)):
            assert _left_its_connection(host.grpc_url, model) == leaves, model


def _left_its_connection(address: str, model: str) -> bool:
    """Whether a channel whose call for `model` is refused UNAVAILABLE (Triton unreachable)
    leaves READY within 3 s of the refusal (its connection got GOAWAY)."""
    with _watched(address) as (channel, states, changed):
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as error:
            stub.ModelInfer(service_pb2.ModelInferRequest(model_name=model), timeout=10)
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "unreachable" in (error.value.details() or ""), error.value.details()
        deadline = time.monotonic() + 10
        while grpc.ChannelConnectivity.READY not in states:
            assert time.monotonic() < deadline, f"the channel never read READY: {states}"
            changed.clear()
            changed.wait(0.05)
        ready_at = states.index(grpc.ChannelConnectivity.READY)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            if any(state != grpc.ChannelConnectivity.READY for state in states[ready_at:]):
                return True
            changed.clear()
            changed.wait(0.05)
        return False
