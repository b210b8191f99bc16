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
