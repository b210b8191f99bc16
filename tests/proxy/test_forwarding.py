"""Real clients through the proxy to a real Triton: tritonclient HTTP and gRPC, sync and asyncio,
JSON and binary tensors, generate and server-sent events, ModelStreamInfer, large bodies and
cancellation."""

from __future__ import annotations

import asyncio
import http.client
import json
import queue
import time
from typing import Any

import grpc
import grpc.aio
import numpy as np
import numpy.typing as npt
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcclient_aio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpclient_aio
from tritonclient.grpc import service_pb2

from sim.triton import TritonServer
from tests.proxy.conftest import RunningProxy, proxy_settings, running_proxy, wait_until

pytestmark = pytest.mark.triton


def _http_inputs(data: npt.NDArray[np.float32], binary: bool) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data, binary_data=binary)
    return [tensor]


@pytest.mark.parametrize("binary", [False, True])
def test_tritonclient_http_sync(proxy: RunningProxy, binary: bool) -> None:
    client = httpclient.InferenceServerClient(proxy.http_url)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("add_one")
        assert client.get_model_metadata("add_one")["name"] == "add_one"
        assert client.get_model_config("add_one")["max_batch_size"] == 8
        data = np.arange(6, dtype=np.float32).reshape(1, 6)
        output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
        result = client.infer("add_one", _http_inputs(data, binary), outputs=[output])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + 1)
        with pytest.raises(Exception, match="unknown model: 'identity'"):
            client.infer("identity", _http_inputs(data, binary))
    finally:
        client.close()


async def test_tritonclient_http_aio(proxy: RunningProxy) -> None:
    client = httpclient_aio.InferenceServerClient(proxy.http_url)
    try:
        assert await client.is_server_ready()
        data = np.full((2, 3), 5, dtype=np.float32)
        tensor = httpclient_aio.InferInput("INPUT0", [2, 3], "FP32")
        tensor.set_data_from_numpy(data, binary_data=True)
        results = await asyncio.gather(*(client.infer("add_one", [tensor]) for _ in range(8)))
        for result in results:
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + 1)
        stats = await client.get_inference_statistics()
        assert [m["name"] for m in stats["model_stats"]] == ["add_one"]
    finally:
        await client.close()


def test_tritonclient_grpc_sync(proxy: RunningProxy) -> None:
    client = grpcclient.InferenceServerClient(proxy.grpc_url)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.get_server_metadata().name == "triton"
        assert client.get_model_metadata("add_one").name == "add_one"
        assert client.get_model_config("add_one").config.max_batch_size == 8
        data = np.ones((1, 4), dtype=np.float32)
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(data)
        result = client.infer("add_one", [tensor], request_id="r-7")
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + 1)
        assert result.get_response().id == "r-7"
        stats = client.get_inference_statistics()
        assert [m.name for m in stats.model_stats] == ["add_one"]
        with pytest.raises(Exception, match="unknown model: 'identity'"):
            client.infer("identity", [tensor])
    finally:
        client.close()


async def test_tritonclient_grpc_aio(proxy: RunningProxy) -> None:
    client = grpcclient_aio.InferenceServerClient(proxy.grpc_url)
    try:
        assert await client.is_server_ready()
        data = np.full((1, 3), 2, dtype=np.float32)
        tensor = grpcclient_aio.InferInput("INPUT0", [1, 3], "FP32")
        tensor.set_data_from_numpy(data)
        results = await asyncio.gather(*(client.infer("add_one", [tensor]) for _ in range(8)))
        for result in results:
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + 1)
    finally:
        await client.close()


def test_grpc_stream_checks_each_message(served_triton: TritonServer, grpc_mode: str) -> None:
    """ModelStreamInfer with a decoupled model; a message for another model is answered in the
    stream as Triton answers it, and the stream goes on."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with running_proxy(
        proxy_settings(served_triton, grpc_mode=grpc_mode, model_id="text_stream")
    ) as running:
        client = grpcclient.InferenceServerClient(running.grpc_url)
        try:
            client.start_stream(callback=lambda result, error: answers.put((result, error)))
            text = grpcclient.InferInput("text_input", [1], "BYTES")
            text.set_data_from_numpy(np.array([b"hello"], dtype=object))
            repeat = grpcclient.InferInput("repeat", [1], "INT32")
            repeat.set_data_from_numpy(np.array([3], dtype=np.int32))
            client.async_stream_infer("add_one", [text, repeat], request_id="intruder")
            client.async_stream_infer("text_stream", [text, repeat], request_id="mine")
            seen: list[str] = []
            errors: list[str] = []
            deadline = time.monotonic() + 30
            while len(seen) < 3 or not errors:
                result, error = answers.get(timeout=max(0.1, deadline - time.monotonic()))
                if error is not None:
                    errors.append(str(error))
                else:
                    seen.append(result.as_numpy("text_output")[0].decode())
            assert seen == ["hello 0", "hello 1", "hello 2"]
            assert errors == [
                "Request for unknown model: 'add_one' is not found; this pod serves 'text_stream'"
            ]
        finally:
            client.stop_stream()
            client.close()


def test_generate_and_generate_stream(served_triton: TritonServer) -> None:
    with running_proxy(proxy_settings(served_triton, model_id="text_stream")) as running:
        host, port = running.http_url.split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            body = json.dumps({"text_input": "hi", "repeat": 1})
            connection.request("POST", "/v2/models/text_stream/generate", body=body)
            response = connection.getresponse()
            assert response.status == 200
            assert json.loads(response.read())["text_output"] == "hi 0"

            body = json.dumps({"text_input": "sse", "repeat": 3, "delay_ms": 300})
            connection.request("POST", "/v2/models/text_stream/generate_stream", body=body)
            response = connection.getresponse()
            assert response.status == 200
            assert response.getheader("Content-Type", "").startswith("text/event-stream")
            # Events arrive one by one, while the model is still producing the next one.
            started = time.monotonic()
            first = response.readline()
            first_at = time.monotonic() - started
            rest = response.read()
            total = time.monotonic() - started
            events = [first] + [line + b"\n" for line in rest.split(b"\n") if line]
            texts = [
                json.loads(line.removeprefix(b"data: "))["text_output"]
                for line in events
                if line.startswith(b"data: ")
            ]
            assert texts == ["sse 0", "sse 1", "sse 2"]
            assert total - first_at >= 0.4, "the first event was held back until the end"
        finally:
            connection.close()


def test_large_rest_body_both_ways(served_triton: TritonServer) -> None:
    """6 MiB in and out through REST (aiohttp's default limit is 1 MiB)."""
    with running_proxy(proxy_settings(served_triton, model_id="identity")) as running:
        client = httpclient.InferenceServerClient(running.http_url, network_timeout=120)
        try:
            data = np.random.default_rng(1).random(6 * 1024 * 1024 // 4).astype(np.float32)
            tensor = httpclient.InferInput("INPUT_FP32", [data.size], "FP32")
            tensor.set_data_from_numpy(data, binary_data=True)
            output = httpclient.InferRequestedOutput("OUTPUT_FP32", binary_data=True)
            result = client.infer("identity", [tensor], outputs=[output])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT_FP32"), data)
        finally:
            client.close()


def test_large_grpc_message_both_ways(served_triton: TritonServer, grpc_mode: str) -> None:
    """6 MiB in and out through gRPC (grpc's default limit is 4 MiB)."""
    with running_proxy(
        proxy_settings(served_triton, grpc_mode=grpc_mode, model_id="identity")
    ) as running:
        client = grpcclient.InferenceServerClient(running.grpc_url)
        try:
            data = np.random.default_rng(2).integers(0, 1 << 40, 6 * 1024 * 1024 // 8)
            tensor = grpcclient.InferInput("INPUT_INT64", [data.size], "INT64")
            tensor.set_data_from_numpy(data.astype(np.int64))
            result = client.infer("identity", [tensor])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT_INT64"), data)
        finally:
            client.close()


def test_bodies_over_the_limit_are_refused(served_triton: TritonServer, grpc_mode: str) -> None:
    settings = proxy_settings(
        served_triton, grpc_mode=grpc_mode, model_id="identity", max_body_bytes=64 * 1024
    )
    with running_proxy(settings) as running:
        host, port = running.http_url.split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            connection.request("POST", "/v2/models/identity/infer", body=b"x" * 100_000)
            response = connection.getresponse()
            assert response.status == 413
            assert b"raise --max-body" in response.read()
        finally:
            connection.close()
        with grpc.insecure_channel(running.grpc_url) as channel:
            request = service_pb2.ModelInferRequest(model_name="identity")
            request.raw_input_contents.append(b"x" * 100_000)
            with pytest.raises(grpc.RpcError) as caught:
                channel.unary_unary("/inference.GRPCInferenceService/ModelInfer", None, None)(
                    request.SerializeToString(), timeout=10
                )
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_grpc_cancellation_reaches_triton(
    served_triton: TritonServer, grpc_mode: str
) -> None:
    """A client that cancels a stream mid-way frees its slot and cancels the upstream call."""
    with running_proxy(
        proxy_settings(served_triton, grpc_mode=grpc_mode, model_id="text_stream")
    ) as running:
        async with grpc.aio.insecure_channel(running.grpc_url) as channel:
            stream = channel.stream_stream(
                "/inference.GRPCInferenceService/ModelStreamInfer", None, None
            )(None)
            request = service_pb2.ModelInferRequest(model_name="text_stream", id="c")
            for name, datatype, raw in (
                ("text_input", "BYTES", b"\x03\x00\x00\x00abc"),
                ("repeat", "INT32", np.array([50], np.int32).tobytes()),
                ("delay_ms", "INT32", np.array([100], np.int32).tobytes()),
            ):
                request.inputs.add(name=name, datatype=datatype, shape=[1])
                request.raw_input_contents.append(raw)
            await stream.write(request.SerializeToString())
            first = service_pb2.ModelStreamInferResponse.FromString(await stream.read())
            assert first.error_message == ""
            assert running.proxy.limiter.in_flight == 1
            stream.cancel()
        await wait_until(lambda: running.proxy.limiter.in_flight == 0, "the slot being freed")
        assert running.proxy.limiter.in_flight == 0
        scrape = running.proxy.metrics.registry.get_sample_value(
            "tritonshare_proxy_requests_total",
            {
                "model": "text_stream",
                "protocol": "grpc",
                "route": "ModelStreamInfer",
                "code": "CANCELLED",
            },
        )
        assert scrape == 1.0
