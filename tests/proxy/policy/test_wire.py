"""The protobuf wire reader against the real generated Triton protos."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from proxy.policy import wire


def test_reads_the_model_name_of_a_real_infer_request() -> None:
    request = service_pb2.ModelInferRequest(model_name="add_one", model_version="1", id="x")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(b"\x00" * 16)
    assert wire.model_name(request.SerializeToString()) == b"add_one"


def test_an_absent_name_reads_as_empty() -> None:
    assert wire.model_name(service_pb2.ModelStatisticsRequest().SerializeToString()) == b""


def test_a_name_sent_twice_is_refused_even_when_equal() -> None:
    # Protobuf parsers merge concatenated messages and keep the last name: this is the smuggle.
    first = service_pb2.ModelInferRequest(model_name="add_one").SerializeToString()
    second = service_pb2.ModelInferRequest(model_name="other").SerializeToString()
    merged = service_pb2.ModelInferRequest.FromString(first + second)
    assert merged.model_name == "other"
    with pytest.raises(wire.WireError, match="more than once"):
        wire.model_name(first + second)
    with pytest.raises(wire.WireError, match="more than once"):
        wire.model_name(first + first)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x0a\x05abc", "past the message's end"),
        (b"\x0a", "ends inside a varint"),
        (b"\x08\x01", "wire type 0, not a string"),
        (b"\x13", "unsupported wire type 3"),
        (b"\x0b", "wire type 3, not a string"),
        (b"\x02\x00", "field number 0"),
        (b"\x0a" + b"\xff" * 11, "longer than 10 bytes"),
        (b"\x11\x00\x00", "runs past"),
    ],
)
def test_malformed_messages_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(wire.WireError, match=message):
        wire.model_name(data)


def test_other_fields_of_every_wire_type_are_skipped() -> None:
    data = (
        b"\x10\x96\x01"  # field 2, varint
        + b"\x19" + b"\x00" * 8  # field 3, fixed64
        + b"\x25" + b"\x00" * 4  # field 4, fixed32
        + wire.encode_string(1, b"m")
    )  # fmt: skip
    assert wire.model_name(data) == b"m"


def test_narrowing_sets_the_name_exactly_once() -> None:
    request = service_pb2.ModelStatisticsRequest(name="", version="3").SerializeToString()
    narrowed = wire.with_string_field(request + wire.encode_string(1, b""), 1, b"add_one")
    parsed = service_pb2.ModelStatisticsRequest.FromString(narrowed)
    assert (parsed.name, parsed.version) == ("add_one", "3")
    assert wire.model_name(narrowed) == b"add_one"


def test_encoded_answers_parse_as_triton_messages() -> None:
    assert service_pb2.ServerReadyResponse.FromString(wire.encode_bool(1, True)).ready
    assert not service_pb2.ServerReadyResponse.FromString(wire.encode_bool(1, False)).ready


@given(
    name=st.text(max_size=200),
    request_id=st.text(max_size=20),
    payload=st.binary(max_size=2000),
    inputs=st.integers(0, 4),
)
def test_reads_the_same_name_protobuf_does(
    name: str, request_id: str, payload: bytes, inputs: int
) -> None:
    request = service_pb2.ModelInferRequest(model_name=name, id=request_id)
    for i in range(inputs):
        request.inputs.add(name=f"IN{i}", datatype="BYTES", shape=[1])
        request.raw_input_contents.append(payload)
    data = request.SerializeToString()
    assert wire.model_name(data) == name.encode()
    assert wire.string_fields(data, (3,)).get(3, b"") == request_id.encode()


@given(
    name=st.text(max_size=200),
    request_id=st.text(max_size=20),
    payload=st.binary(max_size=2000),
    inputs=st.integers(0, 3),
    cut=st.integers(0, 10_000),
)
def test_a_prefix_gives_the_name_protobuf_serialized_or_not_yet(
    name: str, request_id: str, payload: bytes, inputs: int, cut: int
) -> None:
    """Any prefix of a message protobuf serialized: the exact name once it is complete in the
    prefix, else "not yet"; never another name and never an error."""
    request = service_pb2.ModelInferRequest(model_name=name, id=request_id)
    for i in range(inputs):
        request.inputs.add(name=f"IN{i}", datatype="BYTES", shape=[1])
        request.raw_input_contents.append(payload)
    data = request.SerializeToString()
    prefix = data[: min(cut, len(data))]
    found = wire.prefix_string(prefix, 1)
    if name:
        header = len(wire.encode_string(1, name.encode()))  # serializers write field 1 first
        assert found == (name.encode() if len(prefix) >= header else None)
    else:
        assert found is None  # proto3 omits an empty name: it may still come, as far as we know
    if len(prefix) == len(data):
        assert wire.prefix_string(prefix, 3, ordered=True) in (request_id.encode(), None)
        if inputs:  # a later field shows the id is complete or absent
            assert wire.prefix_string(prefix, 3, ordered=True) == request_id.encode()


def test_a_prefix_reads_the_first_of_a_field_and_past_other_wire_types() -> None:
    fields = b"\x10\x96\x01" + b"\x19" + b"\x00" * 8 + b"\x25" + b"\x00" * 4
    data = fields + wire.encode_string(1, b"m") + wire.encode_string(1, b"x")
    assert wire.prefix_string(data, 1) == b"m"  # the duplicate is the whole message's check
    assert wire.prefix_string(data[: len(fields) + 2], 1) is None
    assert wire.prefix_string(b"\x0a\x85", 1) is None  # the length varint is cut
    assert wire.prefix_string(wire.encode_string(5, b"i") + b"\x0a\x01m", 3, ordered=True) == b""
    assert wire.prefix_string(wire.encode_string(5, b"i") + b"\x0a\x01m", 1) == b"m"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x08\x01", "wire type 0, not a string"),
        (b"\x13", "unsupported wire type 3"),
        (b"\x02\x00", "field number 0"),
        (b"\x10" + b"\xff" * 11, "longer than 10 bytes"),
    ],
)
def test_a_malformed_prefix_is_refused(data: bytes, message: str) -> None:
    with pytest.raises(wire.WireError, match=message):
        wire.prefix_string(data, 1)


_PIECES = [
    b"\x0a\x01m", b"\x0a\x00", b"\x12\x02ab", b"\x08\x01", b"\x0a\x85", b"\x3a\x85",
    b"\x3a\x81\x01" + b"x" * 129, b"\x02\x00", b"\x13", b"\x80\x01\x00", b"\x0a\x05ab",
    b"\x19" + b"\x00" * 8,
]  # fmt: skip
"""Fields and broken fields, well-formed or not, to string together."""


@given(data=st.binary(max_size=60) | st.lists(st.sampled_from(_PIECES), max_size=6).map(b"".join))
def test_the_name_reader_answers_as_the_general_field_reader(data: bytes) -> None:
    """`model_name`'s loop for the usual shape gives the same name, or the same error, as
    `string_fields` on any bytes: malformed, duplicated, truncated or not."""
    try:
        expected: bytes | str = wire.string_fields(data, (1,)).get(1, b"")
    except wire.WireError as e:
        expected = str(e)
    try:
        got: bytes | str = wire.model_name(data)
    except wire.WireError as e:
        got = str(e)
    assert got == expected


def _answers(read: object, number: int) -> bytes | str:
    try:
        return read(number)  # type: ignore[operator, no-any-return]
    except wire.WireError as e:
        return str(e)


_MORE_PIECES = [*_PIECES, b"\x1a\x03abc", b"\x1a\x00", b"\x18\x05", b"\x1d" + b"\x00" * 3,
                b"\x0a\x80\x80\x04" + b"n" * 70_000]  # fmt: skip


@given(
    data=st.binary(max_size=60) | st.lists(st.sampled_from(_MORE_PIECES), max_size=6).map(b"".join),
    cuts=st.lists(st.integers(min_value=0, max_value=80_000), max_size=5),
)
def test_a_message_read_in_pieces_answers_as_the_whole_message(
    data: bytes, cuts: list[int]
) -> None:
    """`MessageScan`, fed the message cut anywhere, gives fields 1 and 3 (or the error) exactly
    as `string_fields` does on the whole message; a value past CAPTURE is kept only that far."""
    scan = wire.MessageScan()
    pos = 0
    for cut in sorted(c for c in cuts if c <= len(data)):
        scan.feed(data[pos:cut])
        pos = cut
    scan.feed(data[pos:])
    scan.finish()
    for number in (1, 3):
        expected = _answers(lambda n: wire.string_fields(data, (n,)).get(n, b""), number)
        if isinstance(expected, bytes):
            expected = expected[: wire.CAPTURE]
        assert _answers(scan.field, number) == expected
