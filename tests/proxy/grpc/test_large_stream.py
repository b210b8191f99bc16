"""Large ModelStreamInfer messages (over several DATA frames) through the proxy in both gRPC
modes, against the real Triton: one naming another model is refused from its first bytes, so the
stream goes on as Triton's own does, and flow control keeps moving while refused bytes are dropped.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from proxy.policy import wire
from sim.triton import TritonServer
from tests.proxy.conftest import proxy_settings, running_proxy

pytestmark = pytest.mark.triton
SERVICE = "/inference.GRPCInferenceService/"
FRAMES = 5 * 1024 * 1024
"""Over Triton's 4 MiB frame size: a grpc client must send such a message in several frames."""


def _request(model: str, request_id: str, values: int) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name="INPUT_FP32", datatype="FP32", shape=[values])
    request.raw_input_contents.append(np.arange(values, dtype=np.float32).tobytes())
    return request


def _stream(address: str, requests: list[bytes]) -> list[service_pb2.ModelStreamInferResponse]:
    def sent() -> Iterator[bytes]:
        yield from requests

    options = [("grpc.max_receive_message_length", -1)]  # the large message's echo comes back
    with grpc.insecure_channel(address, options) as channel:
        stream = channel.stream_stream(SERVICE + "ModelStreamInfer", None, None)
        return [
            service_pb2.ModelStreamInferResponse.FromString(raw)
            for raw in stream(sent(), timeout=120)
        ]


def _echoed(answer: service_pb2.ModelStreamInferResponse) -> list[float]:
    output = np.frombuffer(answer.infer_response.raw_output_contents[0], np.float32)
    values: list[float] = output.tolist()
    return values


def test_a_large_message_for_another_model_gets_the_in_stream_error_and_the_stream_goes_on(
    served_triton: TritonServer, grpc_mode: str
) -> None:
    ghost = _request("ghost", "big", 16).SerializeToString()
    [from_triton] = _stream(served_triton.grpc_url, [ghost])
    assert from_triton.error_message == "Request for unknown model: 'ghost' is not found"
    settings = proxy_settings(served_triton, model_id="identity", grpc_mode=grpc_mode)
    with running_proxy(settings) as running:
        answers = _stream(
            running.grpc_url,
            [
                _request("add_one", "big", FRAMES // 4).SerializeToString(),
                _request("identity", "good", 3).SerializeToString(),
                # Our own large message is relayed while it arrives and answered too.
                _request("identity", "large", FRAMES // 4).SerializeToString(),
            ],
        )
    assert [a.error_message for a in answers] == [
        from_triton.error_message.replace("ghost", "add_one") + "; this pod serves 'identity'",
        "",
        "",
    ]
    assert [a.infer_response.id for a in answers] == ["big", "good", "large"]
    assert _echoed(answers[1]) == [0.0, 1.0, 2.0]
    assert len(_echoed(answers[2])) == FRAMES // 4


def test_many_large_refused_messages_in_a_row_do_not_stall_the_stream(
    served_triton: TritonServer, grpc_mode: str
) -> None:
    """About 13 MiB of refused messages, far more than Triton's windows: the proxy must credit
    the dropped bytes back or the tenant could not send the last message."""
    settings = proxy_settings(served_triton, model_id="identity", grpc_mode=grpc_mode)
    refused = [_request("add_one", f"r{i}", 25_000).SerializeToString() for i in range(30)]
    refused += [_request("text_stream", f"f{i}", FRAMES // 4).SerializeToString() for i in range(2)]
    with running_proxy(settings) as running:
        answers = _stream(
            running.grpc_url, [*refused, _request("identity", "last", 2).SerializeToString()]
        )
    assert [a.infer_response.id for a in answers] == [f"r{i}" for i in range(30)] + [
        "f0",
        "f1",
        "last",
    ]
    assert all("is not found" in a.error_message for a in answers[:-1])
    assert answers[-1].error_message == ""
    assert _echoed(answers[-1]) == [0.0, 1.0]


def test_a_large_message_naming_the_model_last_is_still_checked_and_relayed(
    served_triton: TritonServer, grpc_mode: str
) -> None:
    """A crafted field order (the name after the tensor): the relay cannot read the name from the
    first bytes, holds a little, then relays it early and checks it whole, as before."""
    unnamed = _request("", "late", FRAMES // 4).SerializeToString()
    late = unnamed + wire.encode_string(1, b"identity")
    settings = proxy_settings(served_triton, model_id="identity", grpc_mode=grpc_mode)
    with running_proxy(settings) as running:
        [answer] = _stream(running.grpc_url, [late])
    assert answer.error_message == ""
    assert answer.infer_response.id == "late"
    assert len(_echoed(answer)) == FRAMES // 4


def test_a_large_unary_infer_for_another_model_gets_tritons_answer(
    served_triton: TritonServer, grpc_mode: str
) -> None:
    request = _request("ghost", "", FRAMES // 4).SerializeToString()
    other = _request("add_one", "", FRAMES // 4).SerializeToString()
    with (
        grpc.insecure_channel(served_triton.grpc_url) as channel,
        pytest.raises(grpc.RpcError) as direct,
    ):
        channel.unary_unary(SERVICE + "ModelInfer", None, None)(request, timeout=60)
    settings = proxy_settings(served_triton, model_id="identity", grpc_mode=grpc_mode)
    with running_proxy(settings) as running, grpc.insecure_channel(running.grpc_url) as channel:
        infer = channel.unary_unary(SERVICE + "ModelInfer", None, None)
        with pytest.raises(grpc.RpcError) as proxied:
            infer(other, timeout=60)
        good = service_pb2.ModelInferResponse.FromString(
            infer(_request("identity", "", 2).SerializeToString(), timeout=60)
        )
    assert proxied.value.code() == direct.value.code() == grpc.StatusCode.NOT_FOUND
    assert (
        proxied.value.details()
        == (direct.value.details() or "").replace("ghost", "add_one")
        + "; this pod serves 'identity'"
    )
    assert good.model_name == "identity"
