"""ModelStreamInfer streams on a model host, as tritonclient opens them: an idle open stream holds
none of its model's in-flight slots, and a stream whose model leaves the host ends so that its
client opens it again through the model's Service. Real Triton, the host's proxy reading its
models file."""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from sim.triton import TritonServer
from tests.proxy.conftest import RunningProxy, proxy_settings, running_proxy

pytestmark = pytest.mark.triton

PROMPT = 5.0
"""Seconds a unary call may take beside an idle stream (the queue timeout is 30)."""


def write_table(path: Path, entries: list[dict[str, Any]]) -> None:
    temporary = path.with_suffix(".new")
    temporary.write_text(json.dumps(entries))
    temporary.replace(path)


@pytest.fixture
def table(tmp_path: Path) -> Path:
    path = tmp_path / "models.json"
    write_table(path, [{"model": "add_one", "maxConcurrency": 1}, {"model": "identity"}])
    return path


@pytest.fixture
def host(served_triton: TritonServer, table: Path) -> Iterator[RunningProxy]:
    settings = proxy_settings(
        served_triton, model_id="", models_file=table, models_check_seconds=0.05
    )
    with running_proxy(settings) as running:
        yield running


def add_one_inputs() -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
    return [tensor]


class StreamClient:
    """tritonclient's stream, its answers (result or error) queued as they come."""

    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)))

    def infer(self, request_id: str) -> Any:
        self.client.async_stream_infer("add_one", add_one_inputs(), request_id=request_id)
        result, error = self.answers.get(timeout=30)
        assert error is None, error
        return result

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def test_an_idle_open_stream_leaves_its_models_one_slot_to_a_unary_call(
    host: RunningProxy,
) -> None:
    """add_one's limit is one request in flight: a stream answered and left open holds none,
    so a unary call is answered at once, and the stream's next request too."""
    stream = StreamClient(host.grpc_url)
    unary = grpcclient.InferenceServerClient(host.grpc_url)
    try:
        assert stream.infer("s0").get_response().id == "s0"
        for _ in range(3):
            started = time.monotonic()
            answer = unary.infer("add_one", add_one_inputs(), client_timeout=PROMPT)
            assert answer.as_numpy("OUTPUT0") is not None
            assert time.monotonic() - started < PROMPT
        assert stream.infer("s1").get_response().id == "s1"
    finally:
        stream.close()
        unary.close()


def _ended_unavailable(stream: StreamClient, within: float = 10.0) -> str:
    """Wait for the stream's end (its callback's error) and return what it said; it must be
    UNAVAILABLE, which gRPC clients take as "open it again"."""
    result, error = stream.answers.get(timeout=within)
    assert result is None and error is not None, "an answer came where the stream should end"
    assert error.status() == "StatusCode.UNAVAILABLE", (error.status(), str(error))
    return str(error)


def test_an_idle_stream_of_a_model_leaving_the_host_ends_unavailable(
    host: RunningProxy, table: Path
) -> None:
    """add_one is listed leaving (its Service no longer routes here): its open, idle stream
    ends at once with UNAVAILABLE, so that its client opens it again through the Service;
    the host's other model's stream stays open and answered."""
    leaving = StreamClient(host.grpc_url)
    staying = StreamClient(host.grpc_url)
    try:
        assert leaving.infer("l0").get_response().id == "l0"
        staying.client.async_stream_infer("identity", identity_inputs(), request_id="i0")
        assert staying.answers.get(timeout=30)[1] is None
        write_table(
            table,
            [{"model": "add_one", "maxConcurrency": 1, "leaving": True}, {"model": "identity"}],
        )
        said = _ended_unavailable(leaving)
        assert "add_one" in said and "Service" in said, said
        staying.client.async_stream_infer("identity", identity_inputs(), request_id="i1")
        result, error = staying.answers.get(timeout=30)
        assert error is None and result.get_response().id == "i1", error
    finally:
        leaving.close()
        staying.close()


def test_a_stream_of_a_model_gone_from_the_host_ends_unavailable_not_unknown_model(
    host: RunningProxy, table: Path
) -> None:
    """add_one leaves the models file outright (the host no longer serves it): its open stream
    ends UNAVAILABLE; before, each later message got "unknown model" inside the stream, which
    no client retries."""
    stream = StreamClient(host.grpc_url)
    try:
        assert stream.infer("g0").get_response().id == "g0"
        write_table(table, [{"model": "identity"}])
        said = _ended_unavailable(stream)
        assert "unknown model" not in said.lower(), said
    finally:
        stream.close()


def test_a_stream_with_a_request_in_flight_ends_after_its_answer(
    served_triton: TritonServer, table: Path
) -> None:
    """sleepy is listed leaving while a request of its stream is at Triton: the request is
    answered, then the stream ends UNAVAILABLE."""
    write_table(table, [{"model": "sleepy"}, {"model": "identity"}])
    settings = proxy_settings(
        served_triton, model_id="", models_file=table, models_check_seconds=0.05
    )
    with running_proxy(settings) as host:
        stream = StreamClient(host.grpc_url)
        try:
            delay = grpcclient.InferInput("DELAY_MS", [1], "INT32")
            delay.set_data_from_numpy(np.array([1500], dtype=np.int32))
            stream.client.async_stream_infer("sleepy", [delay], request_id="z0")
            sleepy = host.proxy.table.models["sleepy"].limiter
            deadline = time.monotonic() + 10
            while not sleepy.in_flight:
                assert time.monotonic() < deadline, "the request never reached Triton"
                time.sleep(0.01)
            write_table(table, [{"model": "sleepy", "leaving": True}, {"model": "identity"}])
            result, error = stream.answers.get(timeout=30)
            assert error is None and result.get_response().id == "z0", error
            _ended_unavailable(stream)
        finally:
            stream.close()


def identity_inputs() -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT_FP32", [5], "FP32")
    tensor.set_data_from_numpy(np.arange(5, dtype=np.float32))
    return [tensor]
