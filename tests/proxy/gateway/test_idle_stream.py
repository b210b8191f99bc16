"""An open ModelStreamInfer stream with no request at Triton holds none of the node's in-flight
slots. Under `--max-in-flight-node` a namespace may have as few as one request at Triton while
another pod sends; a stream that kept a slot for as long as it stayed open took that one for
good, and every other request of the namespace waited out its queue timeout. Real gateway and
Triton; pods played by source addresses."""

from __future__ import annotations

import http.client
import time
from pathlib import Path

import pytest

from common.callers import Caller
from sim.triton import TritonServer
from tests.proxy.gateway.conftest import gateway_settings, publish, running_gateway
from tests.proxy.gateway.test_fair_share import sleepy, tenant_of
from tests.proxy.gateway.test_stream_flood import StreamFlood, infer_message

pytestmark = pytest.mark.triton

STREAMER = "127.1.0.71"
CALLER = "127.1.0.72"
PROMPT = 5.0
"""Seconds a unary call may take beside the idle stream (the queue timeout is 30)."""


def post_within(url: str, source: str, body: bytes, seconds: float) -> tuple[int, bytes]:
    host, port = url.split(":")
    connection = http.client.HTTPConnection(
        host, int(port), timeout=seconds, source_address=(source, 0)
    )
    try:
        connection.request("POST", "/v2/models/sleepy/infer", body=body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_an_idle_open_stream_leaves_its_namespaces_one_slot_to_a_unary_call(
    served_triton: TritonServer, tmp_path: Path
) -> None:
    """Node budget 1 and two pods of one namespace: the namespace's part is one request at
    Triton. A pod's stream, answered and left open, holds no slot: the other pod's unary call
    is answered at once, and the stream's next message is answered too."""
    table = tmp_path / "callers.json"
    publish(
        table,
        Caller(STREAMER, "sleepy", "team-a/streamer", "uid-s"),
        Caller(CALLER, "sleepy", "team-a/caller", "uid-c"),
    )
    with running_gateway(gateway_settings(served_triton, table, max_in_flight_node=1)) as gateway:
        stream = StreamFlood(gateway.grpc_url, STREAMER)
        try:
            stream.send([infer_message(1, "r0")])
            assert not stream.answers(1)[0].error_message
            for _ in range(3):
                started = time.monotonic()
                status, body = post_within(gateway.http_url, CALLER, sleepy(1), PROMPT)
                assert status == 200, body
                assert time.monotonic() - started < PROMPT
            streamer = tenant_of(gateway, STREAMER)
            assert streamer is not None and streamer.limiter.in_flight == 0
            stream.send([infer_message(1, "r1")])
            answer = stream.answers(1)[0]
            assert not answer.error_message and answer.infer_response.id == "r1", answer
        finally:
            stream.close()
