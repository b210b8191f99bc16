"""Requests on a ModelStreamInfer stream count against the pod's in-flight limit, one each.

A stream is one call but carries any number of requests: counted once, one pod with one stream
could put as many requests into Triton's queue as it likes, and every other pod's request on
the node waited behind them. Each request message now holds one of the pod's slots from when it
goes to Triton until its answer ends it (`policy.finals`); with none free, the stream's
messages wait in the gateway, bounded by the stream's window. Real gateway, real Triton, pods
played by source addresses; `sleepy` holds a request for as long as asked (one instance, so
Triton's queue is first come, first served), `text_stream` is decoupled.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from common.callers import Caller
from sim.triton import TritonServer
from tests.proxy.conftest import proxy_settings, running_proxy
from tests.proxy.gateway.conftest import (
    RunningGateway,
    gateway_settings,
    publish,
    running_gateway,
)
from tests.proxy.gateway.test_fair_share import post, sleepy, tenant_of, wait_for

pytestmark = pytest.mark.triton

FLOODER = "127.1.0.31"
NEIGHBOUR = "127.1.0.32"
LIMIT = 2
FLOOD = 24
DELAY_MS = 200


def infer_message(delay_ms: int, request_id: str, padding: int = 0) -> bytes:
    """A ModelStreamInfer request for sleepy; `padding` bytes in a parameter make it a large
    message, which the relay sends on as it comes (its slot taken before its first byte)."""
    request = service_pb2.ModelInferRequest(model_name="sleepy", id=request_id)
    if padding:
        request.parameters["padding"].string_param = "x" * padding
    tensor = request.inputs.add()
    tensor.name = "DELAY_MS"
    tensor.datatype = "INT32"
    tensor.shape.append(1)
    request.raw_input_contents.append(np.array([delay_ms], dtype=np.int32).tobytes())
    serialized: bytes = request.SerializeToString()
    return b"\x00" + len(serialized).to_bytes(4, "big") + serialized


class StreamFlood:
    """One ModelStreamInfer stream from `source` over a real HTTP/2 client (h2): `send` writes
    request messages without reading anything; `answers` then reads the stream's answers."""

    def __init__(self, url: str, source: str) -> None:
        host, port = url.split(":")
        self.sock = socket.create_connection(
            (host, int(port)), timeout=60, source_address=(source, 0)
        )
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.h2.initiate_connection()
        self.sid = self.h2.get_next_available_stream_id()
        self.h2.send_headers(
            self.sid,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", "/inference.GRPCInferenceService/ModelStreamInfer"),
                (":authority", url),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ],
        )
        self.sock.sendall(self.h2.data_to_send())
        self._data = b""
        self.rest = b""
        # The relay's SETTINGS (its 256 KiB stream window) and connection WINDOW_UPDATE come
        # first: read them, so the flood is sent in as few round trips as the windows allow.
        settled = False
        while not settled:
            events = self.h2.receive_data(self.sock.recv(65536))
            settled = any(isinstance(e, h2.events.RemoteSettingsChanged) for e in events)
        self.sock.sendall(self.h2.data_to_send())

    def send(self, messages: list[bytes]) -> None:
        """Send what the windows take now, the rest from a thread as they open (the thread
        reads nothing: window updates are read when `answers` reads)."""
        data = b"".join(messages)
        window = min(self.h2.local_flow_control_window(self.sid), len(data))
        for pos in range(0, window, self.h2.max_outbound_frame_size):
            self.h2.send_data(
                self.sid, data[pos : min(pos + self.h2.max_outbound_frame_size, window)]
            )
        self.sock.sendall(self.h2.data_to_send())
        self.rest = data[window:]

    def send_rest(self) -> None:
        """Send what the windows held back (while reading answers)."""
        size = min(self.h2.local_flow_control_window(self.sid), len(self.rest))
        for pos in range(0, size, self.h2.max_outbound_frame_size):
            self.h2.send_data(
                self.sid, self.rest[pos : min(pos + self.h2.max_outbound_frame_size, size)]
            )
        self.rest = self.rest[size:]

    def answers(
        self, count: int, within: float = 60.0
    ) -> list[service_pb2.ModelStreamInferResponse]:
        """Read until `count` whole answers came; they are returned parsed."""
        out: list[service_pb2.ModelStreamInferResponse] = []
        deadline = time.monotonic() + within
        while len(out) < count:
            assert time.monotonic() < deadline, f"only {len(out)} of {count} answers came"
            data = self.sock.recv(65536)
            assert data, f"the connection closed after {len(out)} of {count} answers"
            for event in self.h2.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    self._data += event.data
                    self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                assert not isinstance(event, h2.events.StreamEnded | h2.events.StreamReset), (
                    f"the stream ended after {len(out)} of {count} answers: {event}"
                )
            if self.rest:
                self.send_rest()
            self.sock.sendall(self.h2.data_to_send())
            while len(self._data) >= 5:
                size = int.from_bytes(self._data[1:5], "big")
                if len(self._data) < 5 + size:
                    break
                message, self._data = self._data[5 : 5 + size], self._data[5 + size :]
                out.append(service_pb2.ModelStreamInferResponse.FromString(message))
        return out

    def close(self) -> None:
        self.sock.close()


def triton_successes(triton: TritonServer, model: str) -> int:
    """How many of `model`'s requests Triton has executed, from its statistics."""
    with urllib.request.urlopen(f"http://{triton.http_url}/v2/models/{model}/stats") as answer:
        stats = json.load(answer)
    return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])


@pytest.fixture
def gateway(served_triton: TritonServer, tmp_path: Path) -> Iterator[RunningGateway]:
    table = tmp_path / "callers.json"
    publish(
        table,
        Caller(FLOODER, "sleepy", "team-a/flooder", "uid-a"),
        Caller(NEIGHBOUR, "sleepy", "team-b/neighbour", "uid-b"),
        Caller("127.0.0.1", "text_stream", "team-c/streamer", "uid-c"),
    )
    settings = gateway_settings(served_triton, table, max_in_flight_per_pod=LIMIT)
    with running_gateway(settings) as running:
        yield running


@pytest.mark.parametrize("padding", [0, 20_000], ids=["small-messages", "large-messages"])
def test_one_stream_cannot_queue_more_than_its_pods_share_at_triton(
    gateway: RunningGateway, served_triton: TritonServer, padding: int
) -> None:
    """A pod sends FLOOD requests on one stream and reads nothing; a neighbour's request to the
    same Triton model comes right after. Before: all FLOOD went to Triton's queue at once, and
    the neighbour's request ran after every one of them (about FLOOD x 200 ms). Now at most
    LIMIT are at Triton, the rest wait in the gateway, and the neighbour's request runs after
    at most a few of them; the flooder still gets every answer."""
    before = triton_successes(served_triton, "sleepy")
    flood = StreamFlood(gateway.grpc_url, FLOODER)
    peak = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            tenant = tenant_of(gateway, FLOODER)
            if tenant is not None:
                peak = max(peak, tenant.limiter.in_flight)
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        flood.send([infer_message(DELAY_MS, f"flood-{i}", padding) for i in range(FLOOD)])
        wait_for(
            lambda: triton_successes(served_triton, "sleepy") > before, "the flood reaching Triton"
        )
        started = time.monotonic()
        status, body = post(gateway.http_url, NEIGHBOUR, "/v2/models/sleepy/infer", sleepy(1))
        waited = time.monotonic() - started
        assert status == 200, body
        ahead = triton_successes(served_triton, "sleepy") - before - 1
        # Before: ahead == FLOOD and the neighbour waited for all of them (FLOOD x 200 ms). Now
        # it waits for what was at Triton when it came (at most LIMIT); the flood goes on
        # meanwhile, so a request or two more may end before the statistics are read. Bounds
        # with room for a loaded box, each far from the flood's whole.
        assert ahead <= LIMIT + 3, f"{ahead} flood requests ran before the neighbour's"
        assert waited < FLOOD * DELAY_MS / 1000 / 2, waited
        answers = flood.answers(FLOOD)
    finally:
        done.set()
        watcher.join(10)
        flood.close()
    assert sorted(a.infer_response.id for a in answers) == sorted(
        f"flood-{i}" for i in range(FLOOD)
    )
    assert all(not a.error_message for a in answers)
    assert peak <= LIMIT, f"the flooder had {peak} requests in flight"
    wait_for(lambda: tenant_of(gateway, FLOODER).limiter.in_flight == 0, "the slots returned")  # type: ignore[union-attr]


def stream_texts(
    client: grpcclient.InferenceServerClient, requests: int, repeat: int, *, ask: bool
) -> list[object]:
    results: list[object] = []
    client.start_stream(callback=lambda result, error: results.append(error or result))
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"chunk"], dtype=np.object_))
    count = grpcclient.InferInput("repeat", [1], "INT32")
    count.set_data_from_numpy(np.array([repeat], dtype=np.int32))
    delay = grpcclient.InferInput("delay_ms", [1], "INT32")
    delay.set_data_from_numpy(np.array([20], dtype=np.int32))
    for i in range(requests):
        client.async_stream_infer(
            "text_stream",
            [text, count, delay],
            request_id=f"r{i}",
            enable_empty_final_response=ask,
        )
    expected = requests * (repeat + int(ask))
    deadline = time.monotonic() + 30
    while len(results) < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # anything more (an empty final the client did not ask for) would come now
    client.stop_stream()
    return results


@pytest.mark.parametrize("hops", ["gateway", "proxy-and-gateway"])
@pytest.mark.parametrize("ask", [False, True], ids=["client-asks-nothing", "client-asks-final"])
def test_a_decoupled_models_requests_each_hold_a_slot_until_their_last_answer(
    gateway: RunningGateway, served_triton: TritonServer, ask: bool, hops: str
) -> None:
    """More requests than the limit on one stream of a decoupled model, each answered three
    times: every request is answered in full (their slots come back as their last answers end
    them, marked because the relays ask Triton for the empty final answer), and the client
    sees exactly what Triton would have sent it: the empty final answers only if it asked.
    Through the pod's own proxy too, which counts the same way for its own limit (it asks, the
    gateway passes the empty final answers on to it, and it drops those its client did not
    ask for)."""
    requests = 3 * LIMIT
    with contextlib.ExitStack() as hops_used:
        url = gateway.grpc_url
        if hops == "proxy-and-gateway":
            settings = proxy_settings(
                served_triton,
                model_id="text_stream",
                triton_http_url=gateway.http_url,
                triton_grpc_url=gateway.grpc_url,
                source_address="127.0.0.1",
                container_concurrency=LIMIT,
            )
            url = hops_used.enter_context(running_proxy(settings)).grpc_url
        with grpcclient.InferenceServerClient(url) as client:
            results = stream_texts(client, requests, 3, ask=ask)
    finals = []
    texts: dict[str, list[bytes]] = {}
    for result in results:
        assert not isinstance(result, InferenceServerException), result
        response = result.get_response()  # type: ignore[attr-defined]
        if response.parameters["triton_final_response"].bool_param:
            assert not response.outputs
            finals.append(response.id)
            continue
        output = result.as_numpy("text_output").reshape(-1)[0]  # type: ignore[attr-defined]
        texts.setdefault(response.id, []).append(output)
    assert texts == {f"r{i}": [b"chunk 0", b"chunk 1", b"chunk 2"] for i in range(requests)}
    assert sorted(finals) == (sorted(f"r{i}" for i in range(requests)) if ask else [])
    tenant = tenant_of(gateway, "127.0.0.1")
    assert tenant is not None
    wait_for(lambda: tenant.limiter.in_flight == 0, "every slot given back")


def test_a_stream_message_finding_the_queue_full_is_refused_alone_and_the_stream_goes_on(
    gateway: RunningGateway,
) -> None:
    """The pod's two slots are taken and its queue (two) is full of other streams' requests:
    its first stream's next two requests are each refused in the stream, saying why, while
    the stream and its request at Triton go on."""
    first = StreamFlood(gateway.grpc_url, FLOODER)
    others = [StreamFlood(gateway.grpc_url, FLOODER) for _ in range(3)]
    try:
        first.send([infer_message(1500, "a0")])
        wait_for(
            lambda: (
                (tenant := tenant_of(gateway, FLOODER)) is not None
                and tenant.limiter.in_flight == 1
            ),
            "the first stream's request at Triton",
        )
        for number, other in enumerate(others):
            other.send([infer_message(1500, f"o{number}")])
        wait_for(
            lambda: (
                (tenant := tenant_of(gateway, FLOODER)) is not None
                and (tenant.limiter.in_flight, tenant.limiter.queued) == (LIMIT, LIMIT)
            ),
            f"{LIMIT} requests in flight and {LIMIT} waiting",
        )
        first.send([infer_message(1, "a1"), infer_message(1, "a2")])
        answers = first.answers(3)
    finally:
        for flood in (first, *others):
            flood.close()
    refused = {a.infer_response.id: a.error_message for a in answers if a.error_message}
    assert set(refused) == {"a1", "a2"}, answers
    assert all("queue is full" in message for message in refused.values()), refused
    served = [a for a in answers if not a.error_message]
    assert [a.infer_response.id for a in served] == ["a0"]


def test_with_a_limit_of_one_a_streams_requests_follow_each_other(
    served_triton: TritonServer, tmp_path: Path
) -> None:
    """With one slot, a stream's second request finds its first still in flight and queues;
    when the first ends, the slot the stream keeps is the second's (it would otherwise wait
    for a slot nobody gives back, until the queue's timeout)."""
    table = tmp_path / "callers.json"
    publish(table, Caller(FLOODER, "sleepy", "team-a/flooder", "uid-a", 1))
    with running_gateway(gateway_settings(served_triton, table)) as running:
        flood = StreamFlood(running.grpc_url, FLOODER)
        try:
            flood.send([infer_message(50, f"r{i}") for i in range(4)])
            started = time.monotonic()
            answers = flood.answers(4, within=10)
            took = time.monotonic() - started
        finally:
            flood.close()
    assert [a.infer_response.id for a in answers] == ["r0", "r1", "r2", "r3"]
    assert not any(a.error_message for a in answers)
    assert took < 5, took
