"""Compressed gRPC requests (grpc-encoding gzip or deflate) through the proxy, in both gRPC modes,
against the real Triton: they are routed on their decompressed model name exactly as uncompressed
ones, and a message that inflates past the proxy's limit is refused without being inflated."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from functools import partial

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from proxy.grpc import messages
from proxy.grpc.messages import inflate_small
from proxy.policy import wire
from sim.triton import TritonServer
from tests.proxy.conftest import RunningProxy, proxy_settings, running_proxy

pytestmark = pytest.mark.triton
SERVICE = "/inference.GRPCInferenceService/"
COMPRESSIONS = {"gzip": grpc.Compression.Gzip, "deflate": grpc.Compression.Deflate}
WIDE = 256
"""Values per request: grpc sends a message uncompressed when compressing would not shrink it."""


def _inputs(values: list[float]) -> list[grpcclient.InferInput]:
    """tritonclient's aio client takes the same InferInput type as the synchronous one."""
    tensor = np.array([values], np.float32)
    infer_input = grpcclient.InferInput("INPUT0", list(tensor.shape), "FP32")
    infer_input.set_data_from_numpy(tensor)
    return [infer_input]


def _infer(model: str, values: list[float], request_id: str = "") -> bytes:
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, len(values)])
    request.raw_input_contents.append(np.array(values, np.float32).tobytes())
    data: bytes = request.SerializeToString()
    return data


def _call(address: str, request: bytes, compression: grpc.Compression) -> tuple[str, str, bytes]:
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(SERVICE + "ModelInfer", None, None)
        try:
            response = call(request, timeout=30, compression=compression)
        except grpc.RpcError as e:
            return e.code().name, e.details() or "", b""
    return "OK", "", response


@pytest.fixture
def inflated(monkeypatch: pytest.MonkeyPatch) -> list[bytes | None]:
    """The grpc-encoding of every message the relay decompressed during the test: proof that the
    client really compressed (grpc sends a message plain when compressing would not shrink it)."""
    seen: list[bytes | None] = []

    def counting(encoding: bytes | None, data: bytes, limit: int) -> bytes | None:
        seen.append(encoding)
        return inflate_small(encoding, data, limit)

    monkeypatch.setattr(messages, "inflate_small", counting)
    return seen


@pytest.mark.parametrize("algorithm", sorted(COMPRESSIONS))
def test_a_compressed_infer_is_answered(
    proxy: RunningProxy, grpc_mode: str, algorithm: str, inflated: list[bytes | None]
) -> None:
    client = grpcclient.InferenceServerClient(proxy.grpc_url)
    try:
        inputs = _inputs([1.0, 2.5] * WIDE)
        result = client.infer("add_one", inputs, compression_algorithm=algorithm)
    finally:
        client.close()
    assert result.as_numpy("OUTPUT0").tolist() == [[2.0, 3.5] * WIDE]
    # The relay really read a compressed message (grpc core decompresses in grpcio mode).
    assert inflated == ([algorithm.encode()] if grpc_mode == "relay" else [])


async def test_a_compressed_infer_is_answered_to_an_asyncio_client(proxy: RunningProxy) -> None:
    async with aioclient.InferenceServerClient(proxy.grpc_url) as client:
        inputs = _inputs([4.0] * WIDE)
        result = await client.infer("add_one", inputs, compression_algorithm="gzip")
        assert result.as_numpy("OUTPUT0").tolist() == [[5.0] * WIDE]
        ready = await client.is_server_ready()  # rewritten to ModelReady: sent uncompressed
        assert ready


@pytest.mark.parametrize("algorithm", sorted(COMPRESSIONS))
def test_a_compressed_request_for_another_model_gets_tritons_unknown_model_answer(
    proxy: RunningProxy,
    served_triton: TritonServer,
    grpc_mode: str,
    algorithm: str,
    inflated: list[bytes | None],
) -> None:
    compression = COMPRESSIONS[algorithm]
    from_triton = _call(served_triton.grpc_url, _infer("ghost", [1.0] * WIDE), compression)
    assert from_triton[0] == "NOT_FOUND"
    # Triton's answer, and the id the proxy serves.
    served = "; this pod serves 'add_one'"
    code, details, rest = _call(proxy.grpc_url, _infer("ghost", [1.0] * WIDE), compression)
    assert (code, details, rest) == (from_triton[0], from_triton[1] + served, from_triton[2])
    code, details, _ = _call(proxy.grpc_url, _infer("identity", [1.0] * WIDE), compression)
    assert (code, details) == (from_triton[0], from_triton[1].replace("ghost", "identity") + served)
    assert inflated == ([algorithm.encode()] * 2 if grpc_mode == "relay" else [])


def test_a_compressed_message_naming_the_model_twice_is_refused(
    proxy: RunningProxy, grpc_mode: str, inflated: list[bytes | None]
) -> None:
    smuggle = _infer("add_one", [1.0] * WIDE) + wire.encode_string(1, b"identity")
    code, details, _ = _call(proxy.grpc_url, smuggle, grpc.Compression.Gzip)
    assert (code, "more than once" in details) == ("INVALID_ARGUMENT", True)
    assert inflated == ([b"gzip"] if grpc_mode == "relay" else [])


def test_a_compressed_stream_message_for_another_model_gets_the_in_stream_error(
    proxy: RunningProxy, grpc_mode: str, inflated: list[bytes | None]
) -> None:
    answers: queue.Queue[tuple[grpcclient.InferResult | None, Exception | None]] = queue.Queue()

    def collect(
        into: queue.Queue[tuple[grpcclient.InferResult | None, Exception | None]],
        result: grpcclient.InferResult | None,
        error: Exception | None,
    ) -> None:
        into.put((result, error))

    client = grpcclient.InferenceServerClient(proxy.grpc_url)
    try:
        client.start_stream(partial(collect, answers), compression_algorithm="deflate")
        client.async_stream_infer("identity", _inputs([1.0] * WIDE), request_id="other")
        client.async_stream_infer("add_one", _inputs([7.0] * WIDE), request_id="own")
        first = answers.get(timeout=30)
        second = answers.get(timeout=30)
    finally:
        client.stop_stream()
        client.close()
    assert first[0] is None and isinstance(first[1], InferenceServerException)
    assert "Request for unknown model: 'identity' is not found" in str(first[1])
    assert second[1] is None and second[0] is not None
    assert second[0].as_numpy("OUTPUT0").tolist() == [[8.0] * WIDE]
    assert second[0].get_response().id == "own"
    assert inflated == ([b"deflate"] * 2 if grpc_mode == "relay" else [])


def test_a_small_message_inflating_past_the_limit_is_refused(
    served_triton: TritonServer, grpc_mode: str
) -> None:
    """Ten MiB of zeros gzip to about ten KiB; the inflate cap is 1 MiB (grpcio mode: grpc core
    checks the inflated size against the message limit)."""
    bomb = _infer("add_one", [0.0] * (10 * 1024 * 1024 // 4))
    settings = proxy_settings(
        served_triton, grpc_mode=grpc_mode, max_body_bytes=1024**2, max_inflated_bytes=1024**2
    )
    with running_proxy(settings) as running:
        code, details, _ = _call(running.grpc_url, bomb, grpc.Compression.Gzip)
        assert code == "RESOURCE_EXHAUSTED"
        if grpc_mode == "relay":
            assert "inflates to more than the limit of 1048576 bytes" in details
            assert "--max-inflated" in details
        # The connection and the proxy still serve a good compressed call.
        good = _call(running.grpc_url, _infer("add_one", [1.0] * WIDE), grpc.Compression.Gzip)
        assert good[0] == "OK"


def _stream_requests(requests: list[bytes]) -> Iterator[bytes]:
    yield from requests


def test_a_compressed_stream_keeps_going_after_a_refusal_raw(
    proxy: RunningProxy, grpc_mode: str, inflated: list[bytes | None]
) -> None:
    """The same with raw gRPC on one stream: the refusal echoes the request id, then the next
    message is answered by Triton."""
    with grpc.insecure_channel(proxy.grpc_url) as channel:
        stream = channel.stream_stream(SERVICE + "ModelStreamInfer", None, None)
        requests = [_infer("ghost", [1.0] * WIDE, "a"), _infer("add_one", [2.0] * WIDE, "b")]
        responses = stream(
            _stream_requests(requests), timeout=30, compression=grpc.Compression.Gzip
        )
        answers = [service_pb2.ModelStreamInferResponse.FromString(raw) for raw in responses]
    assert [a.error_message for a in answers] == [
        "Request for unknown model: 'ghost' is not found; this pod serves 'add_one'",
        "",
    ]
    assert [a.infer_response.id for a in answers] == ["a", "b"]
    output = np.frombuffer(answers[1].infer_response.raw_output_contents[0], np.float32)
    assert output.tolist() == [3.0] * WIDE
    assert inflated == ([b"gzip"] * 2 if grpc_mode == "relay" else [])


def test_a_large_compressed_stream_message_for_another_model_leaves_the_stream_open(
    served_triton: TritonServer, grpc_mode: str
) -> None:
    """Over 4 MiB even compressed (so in several frames): the relay reads the name from the
    inflated prefix and refuses it before Triton sees any of it, as for an uncompressed one."""
    values = np.random.default_rng(7).integers(0, 16, 10 * 1024 * 1024, dtype=np.uint8)
    request = service_pb2.ModelInferRequest(model_name="add_one", id="big")
    request.raw_input_contents.append(values.tobytes())  # about 5.5 MiB gzipped
    good = service_pb2.ModelInferRequest(model_name="identity", id="good")
    good.inputs.add(name="INPUT_FP32", datatype="FP32", shape=[WIDE])
    good.raw_input_contents.append(np.ones(WIDE, np.float32).tobytes())
    settings = proxy_settings(served_triton, model_id="identity", grpc_mode=grpc_mode)
    requests = [request.SerializeToString(), good.SerializeToString()]
    with running_proxy(settings) as running, grpc.insecure_channel(running.grpc_url) as channel:
        stream = channel.stream_stream(SERVICE + "ModelStreamInfer", None, None)
        responses = stream(
            _stream_requests(requests), timeout=60, compression=grpc.Compression.Gzip
        )
        answers = [service_pb2.ModelStreamInferResponse.FromString(raw) for raw in responses]
    assert [a.error_message for a in answers] == [
        "Request for unknown model: 'add_one' is not found; this pod serves 'identity'",
        "",
    ]
    assert [a.infer_response.id for a in answers] == ["big", "good"]


def test_a_small_compressed_stream_message_inflating_large_for_another_model_keeps_the_next(
    proxy: RunningProxy, grpc_mode: str
) -> None:
    """A few KiB compressed, over 64 KiB inflated (read in pieces, not inline): refused from its
    prefix with the in-stream error, and the messages after it in the same stream are answered."""
    big = _infer("ghost", [0.0] * (256 * 1024), "a")  # 1 MiB of zeros: a few KiB gzipped
    requests = [big, _infer("add_one", [2.0] * WIDE, "b"), _infer("add_one", [3.0] * WIDE, "c")]
    with grpc.insecure_channel(proxy.grpc_url) as channel:
        stream = channel.stream_stream(SERVICE + "ModelStreamInfer", None, None)
        responses = stream(
            _stream_requests(requests), timeout=30, compression=grpc.Compression.Gzip
        )
        answers = [service_pb2.ModelStreamInferResponse.FromString(raw) for raw in responses]
    assert [a.error_message for a in answers] == [
        "Request for unknown model: 'ghost' is not found; this pod serves 'add_one'",
        "",
        "",
    ]
    assert [a.infer_response.id for a in answers] == ["a", "b", "c"]
