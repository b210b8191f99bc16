"""gRPC edge cases that exercise the relay's framing: messages too large to hold back whole,
flow-control credit for messages Triton never sees, HPACK state across many calls, and drain.

Each runs in both gRPC modes unless it pins down behaviour only the relay has.
"""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from proxy.grpc.intake import HOLD_LIMIT
from proxy.policy import wire
from sim.triton import TritonServer
from tests.proxy.conftest import RunningProxy, proxy_settings, running_proxy, wait_until
from tests.proxy.test_isolation import _grpc

SERVICE = "/inference.GRPCInferenceService/"
BIG = 5 * 1024 * 1024


def _infer(model: str, payload: int) -> bytes:
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, payload // 4])
    request.raw_input_contents.append(b"\x00" * payload)
    data: bytes = request.SerializeToString()
    return data


def test_a_large_message_for_another_model_gets_tritons_answer(
    proxy: RunningProxy, served_triton: TritonServer
) -> None:
    """Past HOLD_LIMIT and over several DATA frames (Triton's frame size is 4 MiB) the relay
    passes all but the last byte on before the check."""
    request = _infer("identity_missing", BIG)
    from_triton = _grpc(served_triton.grpc_url, "ModelInfer", request)
    assert from_triton[0] == "NOT_FOUND"
    code, details, body = from_triton
    served = (code, f"{details}; this pod serves 'add_one'", body)  # and the id the pod serves
    assert _grpc(proxy.grpc_url, "ModelInfer", request) == served
    # The name comes first and a second one at the very end: caught after the whole message.
    smuggle = _infer("add_one", BIG) + wire.encode_string(1, b"identity")
    code, details, _ = _grpc(proxy.grpc_url, "ModelInfer", smuggle)
    assert (code, "more than once" in details) == ("INVALID_ARGUMENT", True)


def test_refused_messages_give_their_flow_control_credit_back(proxy: RunningProxy) -> None:
    """Triton never receives (or, for a large message it then resets, never credits) refused bytes,
    so the proxy must credit them to the tenant: 27 MiB of refusals on one connection would
    otherwise exhaust Triton's 4 MiB connection window."""
    with grpc.insecure_channel(proxy.grpc_url) as channel:
        infer = channel.unary_unary(SERVICE + "ModelInfer", None, None)
        for refused in [_infer("identity", 6 * HOLD_LIMIT)] * 128 + [_infer("identity", BIG)] * 3:
            with pytest.raises(grpc.RpcError) as caught:
                infer(refused, timeout=30)
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        request = service_pb2.ModelInferRequest(model_name="add_one")
        request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2])
        request.raw_input_contents.append(np.array([1, 2], np.float32).tobytes())
        response = service_pb2.ModelInferResponse.FromString(infer(request.SerializeToString()))
        assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [2, 3]


def test_header_compression_stays_in_step_over_many_calls(proxy: RunningProxy) -> None:
    """Clients index metadata in HPACK's dynamic table; every call must still decode right."""
    ready = service_pb2.ModelReadyRequest(name="add_one").SerializeToString()
    with grpc.insecure_channel(proxy.grpc_url) as channel:
        call = channel.unary_unary(SERVICE + "ModelReady", None, None)
        for i in range(60):
            metadata = (("x-tenant-call", f"{i % 7}"), ("x-trace", "t" * (i * 40)))
            answer = service_pb2.ModelReadyResponse.FromString(call(ready, metadata=metadata))
            assert answer.ready


@pytest.mark.triton
async def test_drain_finishes_calls_in_flight_and_takes_no_new_ones(
    served_triton: TritonServer, grpc_mode: str
) -> None:
    settings = proxy_settings(served_triton, model_id="sleepy", grpc_mode=grpc_mode)
    with running_proxy(settings) as running:
        request = service_pb2.ModelInferRequest(model_name="sleepy")
        request.inputs.add(name="DELAY_MS", datatype="INT32", shape=[1])
        request.raw_input_contents.append(np.array([1500], np.int32).tobytes())
        async with grpc.aio.insecure_channel(running.grpc_url) as channel:
            infer = channel.unary_unary(SERVICE + "ModelInfer", None, None)
            slow = asyncio.ensure_future(infer(request.SerializeToString(), timeout=30))
            await wait_until(lambda: running.proxy.limiter.in_flight == 1, "the call starting")
            stopping = asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(running.proxy.grpc.stop(20), running.loop)
            )
            response = service_pb2.ModelInferResponse.FromString(await slow)
            assert response.model_name == "sleepy"
            await stopping
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await infer(request.SerializeToString(), timeout=10)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert running.proxy.limiter.in_flight == 0


def test_a_large_stream_message_smuggling_a_second_name_ends_the_stream(
    served_triton: TritonServer,
) -> None:
    """Relay only: a ModelStreamInfer message past HOLD_LIMIT that spans several DATA frames (over
    Triton's 4 MiB frame size) names our model first, so it is relayed while it arrives; the
    second name at its end is only seen when it is whole, when part of it is already at Triton,
    so the relay answers the error in the stream and then ends the stream."""
    settings = proxy_settings(served_triton, model_id="text_stream", grpc_mode="relay")
    with running_proxy(settings) as running, grpc.insecure_channel(running.grpc_url) as channel:
        stream = channel.stream_stream(SERVICE + "ModelStreamInfer", None, None)
        request = service_pb2.ModelInferRequest(model_name="text_stream", id="big")
        request.raw_input_contents.append(b"\x00" * (5 * 1024 * 1024))
        smuggle = request.SerializeToString() + wire.encode_string(1, b"add_one")
        responses = stream(iter([smuggle]), timeout=30)
        answers = []
        with pytest.raises(grpc.RpcError) as caught:
            for raw in responses:
                answers.append(service_pb2.ModelStreamInferResponse.FromString(raw))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "stream ends here" in (caught.value.details() or "")
        assert len(answers) == 1
        assert "field 1 occurs more than once" in answers[0].error_message
        assert answers[0].infer_response.id == "big"
