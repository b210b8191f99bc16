"""The gRPC relays' check of an inference request's inputs against its data
(`proxy.policy.tensors`): read as a protobuf parser reads them, whole and in pieces alike."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from proxy.policy import tensors, wire
from proxy.policy.refusals import MalformedRequestError
from proxy.policy.routing import GrpcAnswer, GrpcForward, GrpcRouter


def request(
    shape: list[int], datatype: str = "FP32", raw: list[bytes] | None = None
) -> service_pb2.ModelInferRequest:
    message = service_pb2.ModelInferRequest(model_name="m", id="req-1")
    message.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    message.raw_input_contents.extend(raw if raw is not None else [])
    return message


def strings(*values: bytes) -> bytes:
    return b"".join(len(v).to_bytes(4, "little") + v for v in values)


def refusal(message: bytes) -> str:
    """The whole check's refusal of `message`, or "" when it passes."""
    try:
        tensors.check_request(message)
    except MalformedRequestError as e:
        return str(e)
    return ""


def scanned(message: bytes, cuts: list[int]) -> str:
    """The check of `message` read in pieces cut at `cuts` (`wire.MessageScan`'s path)."""
    scan = tensors.InferScan()
    start = 0
    for cut in [*sorted(cuts), len(message)]:
        scan.feed(message[start:cut])
        start = max(start, cut)
    scan.finish()
    try:
        scan.check()
    except MalformedRequestError as e:
        return str(e)
    return ""


def typed(shape: list[int], datatype: str, **contents: list[object]) -> bytes:
    message = request(shape, datatype)
    message.inputs[0].contents.MergeFrom(service_pb2.InferTensorContents(**contents))
    data: bytes = message.SerializeToString()
    return data


BOMB = request([1, 2**62], raw=[b""]).SerializeToString()
FITS = request([1, 4], raw=[bytes(16)]).SerializeToString()


def two_inputs() -> bytes:
    message = request([2], raw=[bytes(8), strings(b"a", b"bc")])
    message.inputs.add(name="TEXT", datatype="BYTES", shape=[2])
    data: bytes = message.SerializeToString()
    return data


def typed_and_raw() -> bytes:
    message = request([1], raw=[bytes(4)])
    message.inputs[0].contents.fp32_contents.append(1.0)
    data: bytes = message.SerializeToString()
    return data


def one_raw_for_two() -> bytes:
    message = request([1], raw=[bytes(4)])
    message.inputs.add(name="X", datatype="FP32", shape=[1, 2**62])
    data: bytes = message.SerializeToString()
    return data


PASSING = {
    "fits": FITS,
    "no inputs": service_pb2.ModelInferRequest(model_name="m").SerializeToString(),
    "zero elements": request([3, 0], raw=[b""]).SerializeToString(),
    "BYTES": request([1, 3], "BYTES", [strings(b"a", b"", b"xyz")]).SerializeToString(),
    "BYTES and FP32": two_inputs(),
    "typed fp32": typed([2, 2], "FP32", fp32_contents=[1.0, 2.0, 3.0, 4.0]),
    "typed int": typed([3], "INT32", int_contents=[1, -1, 300]),
    "typed bytes": typed([2], "BYTES", bytes_contents=[b"a", b""]),
    "UINT64": request([2], "UINT64", [bytes(16)]).SerializeToString(),
}
REFUSED = {
    "[1, 2**62] over zero bytes": (BOMB, "more than 0 elements"),
    "no data": (request([1, 2**62]).SerializeToString(), "contents hold 0"),
    "negative": (request([-1, -4], raw=[bytes(16)]).SerializeToString(), "dimension -1"),
    "short raw": (request([1, 4], raw=[bytes(12)]).SerializeToString(), "has 12 bytes"),
    "long raw": (request([1, 4], raw=[bytes(20)]).SerializeToString(), "has 20 bytes"),
    "half a value": (request([1], "FP64", [bytes(4)]).SerializeToString(), "has 4 bytes"),
    "BYTES past the end": (
        request([2], "BYTES", [strings(b"a") + b"\xff\xff\xff\x7fb"]).SerializeToString(),
        "is not whole strings",
    ),
    "BYTES, a cut prefix": (
        request([2], "BYTES", [strings(b"a") + b"\x00\x00"]).SerializeToString(),
        "is not whole strings",
    ),
    "BYTES, one string too many": (
        request([1], "BYTES", [strings(b"a", b"b")]).SerializeToString(),
        "holds 2 strings",
    ),
    "BYTES without prefixes": (
        request([4], "BYTES", [b"abcd"]).SerializeToString(),
        "is not whole strings",
    ),
    "typed, fewer": (typed([4], "FP32", fp32_contents=[1.0]), "contents hold 1"),
    "typed, huge": (typed([1, 2**62], "FP32", fp32_contents=[1.0]), "contents hold 1"),
    "typed and raw": (typed_and_raw(), "has typed contents beside raw_input_contents"),
    "one raw for two inputs": (one_raw_for_two(), "raw_input_contents number 1, but it has 2"),
    "two raws for one input": (
        request([1], raw=[bytes(4), bytes(4)]).SerializeToString(),
        "raw_input_contents number 2, but it has 1 inputs",
    ),
    "unknown datatype": (request([1], "FP8", [bytes(1)]).SerializeToString(), "'FP8'"),
    "an input after the raw data": (
        service_pb2.ModelInferRequest(model_name="m", raw_input_contents=[b""]).SerializeToString()
        + wire.encode_string(5, wire.encode_string(2, b"FP32") + b"\x18\x00"),
        "an input after its raw_input_contents",
    ),
}


def test_the_request_that_killed_the_model_is_refused_and_one_that_fits_passes() -> None:
    assert "input 'INPUT0' declares the shape [1,4611686018427387904]" in refusal(BOMB)
    assert "but its raw_input_contents has 0 bytes" in refusal(BOMB)
    assert refusal(FITS) == ""


@pytest.mark.parametrize("message", PASSING.values(), ids=PASSING.keys())
def test_data_that_matches_the_shapes_passes(message: bytes) -> None:
    assert refusal(message) == ""


@pytest.mark.parametrize(("message", "why"), REFUSED.values(), ids=REFUSED.keys())
def test_data_that_does_not_match_the_shapes_is_refused(message: bytes, why: str) -> None:
    assert why in refusal(message)
    assert refusal(message).startswith("the inference request")


def test_fields_are_read_as_a_protobuf_parser_reads_them() -> None:
    tensor = wire.encode_string(1, b"INPUT0") + wire.encode_string(2, b"BYTES")
    tensor += wire.encode_string(2, b"FP32")  # a parser keeps the last: FP32
    tensor += b"\x18\x01" + wire.encode_string(3, b"\x02")  # [1] unpacked, then [2] packed
    tensor += b"\x15\x00\x00\x00\x00"  # field 2 as a fixed32: another wire type, ignored
    message = wire.encode_string(1, b"m") + wire.encode_string(5, tensor)
    assert refusal(message + wire.encode_string(7, bytes(8))) == ""
    assert "[1,2] (more than 1 elements)" in refusal(message + wire.encode_string(7, bytes(4)))
    # Contents in two occurrences of the field merge, packed and unpacked values alike.
    halves = wire.encode_string(5, b"\x35" + bytes(4)) + wire.encode_string(
        5, b"\x32\x04" + bytes(4)
    )
    assert refusal(wire.encode_string(5, tensor + halves)) == ""


def test_a_negative_dimension_is_refused_as_a_dimension() -> None:
    message = request([5, -2], raw=[bytes(40)]).SerializeToString()
    why = refusal(message)
    assert "'INPUT0': an input's shape has the dimension -2" in why
    assert why.endswith("declare each dimension as the count of its elements")


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(sorted({**PASSING, **{k: v for k, (v, _) in REFUSED.items()}}.items())),
    st.lists(st.integers(0, 200), max_size=8),
)
def test_read_in_pieces_it_answers_as_read_whole(case: tuple[str, bytes], cuts: list[int]) -> None:
    _, message = case
    assert scanned(message, cuts) == refusal(message)


def test_inputs_too_large_to_hold_in_a_message_read_in_pieces_are_refused() -> None:
    message = typed([20_000], "FP32", fp32_contents=[0.5] * 20_000)
    assert refusal(message) == ""  # held whole anyway
    why = scanned(message, [100, 50_000])
    assert f"more than {tensors.INPUTS_HELD} bytes" in why
    assert "raw_input_contents" in why


def test_the_router_refuses_unary_and_stream_messages_with_the_reason() -> None:
    router = GrpcRouter("m")
    answer = router.decide("ModelInfer", BOMB)
    assert isinstance(answer, GrpcAnswer)
    assert answer.code == "INVALID_ARGUMENT"
    assert "input 'INPUT0'" in answer.details
    assert isinstance(router.decide("ModelInfer", FITS), GrpcForward)
    in_stream = router.decide_stream_message(BOMB)
    assert in_stream is not None
    response = service_pb2.ModelStreamInferResponse.FromString(in_stream)
    assert "input 'INPUT0'" in response.error_message
    assert response.infer_response.id == "req-1"
    assert router.decide_stream_message(FITS) is None
    # Read in pieces: the same refusals once whole.
    scan = tensors.InferScan()
    scan.feed(BOMB)
    scan.finish()
    scanned_answer = router.decide_scanned("ModelInfer", scan)
    assert isinstance(scanned_answer, GrpcAnswer)
    assert scanned_answer.details == answer.details


@pytest.mark.parametrize(
    ("data", "count"),
    [
        (strings(b"a", b"", b"xyz" * 40), 3),
        (strings(), 0),
        (strings(b"a") + b"\x05\x00\x00\x00ab", -1),  # the last string runs past the end
        (strings(b"a") + b"\x05\x00", -1),  # a cut length
    ],
)
def test_bytes_data_walked_in_any_pieces_counts_alike(data: bytes, count: int) -> None:
    whole = tensors.StringWalk()
    whole.feed(data, 0, len(data))
    assert whole.finish() == count
    for step in (1, 2, 3, 5):
        walk = tensors.StringWalk()
        for pos in range(0, len(data), step):
            walk.feed(data, pos, min(pos + step, len(data)))
        assert walk.finish() == count, step
