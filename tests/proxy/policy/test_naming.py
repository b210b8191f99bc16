"""Triton's answers renamed from a model's private name to its public id (policy.naming and
http1.answers), on the generated protobuf types and on Triton's JSON, cut anywhere."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2, service_pb2

from proxy.http1.answers import AnswerNames as RestAnswerNames
from proxy.policy import naming
from proxy.policy.naming import ANSWERS, AnswerNames, NamingError, rename_json, rename_message

PRIVATE = b"ns-a.resnet50.1a2b3c4d5e"
PUBLIC = b"resnet50"


def framed(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


def infer_response(name: str, payload: int = 12) -> service_pb2.ModelInferResponse:
    response = service_pb2.ModelInferResponse(model_name=name, model_version="1", id="r1")
    response.outputs.add(name="OUTPUT0", datatype="FP32", shape=[1, payload // 4])
    response.raw_output_contents.append(
        bytes(range(256)) * (payload // 256) + b"\x07" * (payload % 256)
    )
    return response


def test_each_answer_type_names_the_public_id() -> None:
    infer = infer_response(PRIVATE.decode()).SerializeToString()
    assert rename_message(ANSWERS["ModelInfer"], infer, PRIVATE, PUBLIC) == (
        infer_response(PUBLIC.decode()).SerializeToString()
    )
    stream = service_pb2.ModelStreamInferResponse(
        error_message=f"unexpected shape for model '{PRIVATE.decode()}'",
        infer_response=infer_response(PRIVATE.decode()),
    ).SerializeToString()
    decoded = service_pb2.ModelStreamInferResponse.FromString(
        rename_message(ANSWERS["ModelStreamInfer"], stream, PRIVATE, PUBLIC)
    )
    assert decoded.infer_response.model_name == "resnet50"
    assert decoded.error_message == "unexpected shape for model 'resnet50'"
    config = service_pb2.ModelConfigResponse(
        config=model_config_pb2.ModelConfig(
            name=PRIVATE.decode(),
            instance_group=[
                model_config_pb2.ModelInstanceGroup(name=PRIVATE.decode() + "_0"),
                model_config_pb2.ModelInstanceGroup(name="mine"),
            ],
        )
    ).SerializeToString()
    renamed = service_pb2.ModelConfigResponse.FromString(
        rename_message(ANSWERS["ModelConfig"], config, PRIVATE, PUBLIC)
    )
    assert renamed.config.name == "resnet50"
    assert [g.name for g in renamed.config.instance_group] == ["resnet50_0", "mine"]
    stats = service_pb2.ModelStatisticsResponse()
    for version in ("1", "2"):
        stats.model_stats.add(name=PRIVATE.decode(), version=version)
    renamed_stats = service_pb2.ModelStatisticsResponse.FromString(
        rename_message(ANSWERS["ModelStatistics"], stats.SerializeToString(), PRIVATE, PUBLIC)
    )
    assert [s.name for s in renamed_stats.model_stats] == ["resnet50", "resnet50"]
    metadata = service_pb2.ModelMetadataResponse(name=PRIVATE.decode(), platform="python")
    assert (
        service_pb2.ModelMetadataResponse.FromString(
            rename_message(ANSWERS["ModelMetadata"], metadata.SerializeToString(), PRIVATE, PUBLIC)
        ).name
        == "resnet50"
    )


def test_only_the_private_name_itself_is_renamed() -> None:
    # Another model's name, and the private name inside tensor data, stay as they are.
    other = infer_response("neighbour")
    other.raw_output_contents[0] = PRIVATE
    data = other.SerializeToString()
    assert rename_message(ANSWERS["ModelInfer"], data, PRIVATE, PUBLIC) is data
    own = infer_response(PRIVATE.decode())
    own.raw_output_contents[0] = PRIVATE
    renamed = service_pb2.ModelInferResponse.FromString(
        rename_message(ANSWERS["ModelInfer"], own.SerializeToString(), PRIVATE, PUBLIC)
    )
    assert renamed.model_name == "resnet50" and renamed.raw_output_contents[0] == PRIVATE


@pytest.mark.parametrize("private", [PRIVATE, b"p", b"x" * 128])
@pytest.mark.parametrize("kind", ["ModelInfer", "ModelStreamInfer"])
@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=400_000), max_size=8))
def test_answers_cut_anywhere_are_renamed_as_whole(
    kind: str, private: bytes, cuts: list[int]
) -> None:
    """Small and large answers (large: renamed from their first bytes, the inner length's varint
    growing or shrinking by a byte) in one stream, fed in any pieces: the same bytes as
    renaming each whole, which are what Triton would send for the public id."""
    messages = []
    for payload in (12, 70_000, 300_000, 16_370 - len(private)):
        response = infer_response(private.decode(), payload)
        if kind == "ModelStreamInfer":
            stream = service_pb2.ModelStreamInferResponse(infer_response=response)
            messages.append(stream.SerializeToString())
        else:
            messages.append(response.SerializeToString())
    data = b"".join(framed(m) for m in messages)
    names = AnswerNames(ANSWERS[kind], private, PUBLIC)
    out = b""
    last = 0
    for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        out += names.feed(data[last:cut])
        last = cut
    expected = []
    for message in messages:
        if kind == "ModelStreamInfer":
            parsed = service_pb2.ModelStreamInferResponse.FromString(message)
            parsed.infer_response.model_name = PUBLIC.decode()
        else:
            parsed = service_pb2.ModelInferResponse.FromString(message)
            parsed.model_name = PUBLIC.decode()
        expected.append(framed(parsed.SerializeToString()))
    assert out == b"".join(expected)
    assert not names.holding


def test_what_cannot_be_renamed_fails_rather_than_passes() -> None:
    names = AnswerNames(ANSWERS["ModelInfer"], PRIVATE, PUBLIC)
    with pytest.raises(NamingError, match="compressed"):
        names.feed(b"\x01\x00\x00\x00\x03abc")
    large = infer_response(PRIVATE.decode(), 100_000).SerializeToString()
    # The name after the payload (not as serializers write it): never passed on.
    moved = large[2 + len(PRIVATE) :] + large[: 2 + len(PRIVATE)]
    with pytest.raises(NamingError, match="before the model's name"):
        AnswerNames(ANSWERS["ModelInfer"], PRIVATE, PUBLIC).feed(framed(moved))
    config = b"\x0a" + b"\x80\x80\x08" + b"\x00" * 10
    with pytest.raises(NamingError, match="only an inference answer"):
        AnswerNames(ANSWERS["ModelConfig"], PRIVATE, PUBLIC).feed(
            b"\x00" + (naming.HOLD + 1).to_bytes(4, "big") + config
        )


def test_rest_json_members_and_errors() -> None:
    body = json.dumps(
        {
            "id": '"model_name":"' + PRIVATE.decode() + '"',  # inside a string: escaped
            "model_name": PRIVATE.decode(),
            "outputs": [{"name": "OUTPUT0", "data": [PRIVATE.decode()]}],
        },
        separators=(",", ":"),
    ).encode()
    renamed = json.loads(rename_json(body, -1, False, PRIVATE, PUBLIC))
    assert renamed["model_name"] == "resnet50"
    assert renamed["id"] == '"model_name":"' + PRIVATE.decode() + '"'
    assert renamed["outputs"][0]["data"] == [PRIVATE.decode()]
    error = b"{\"error\":\"unexpected inference input 'X' for model '" + PRIVATE + b"'\"}"
    assert rename_json(error, -1, True, PRIVATE, PUBLIC) == error.replace(PRIVATE, PUBLIC)
    # The binary tensor extension: only the JSON header is read.
    header = b'{"model_name":"' + PRIVATE + b'"}'
    binary = header + b'"model_name":"' + PRIVATE + b'"'
    assert rename_json(binary, len(header), False, PRIVATE, PUBLIC) == (
        b'{"model_name":"' + PUBLIC + b'"}' + binary[len(header) :]
    )


def _response(head: list[str], body: bytes) -> bytes:
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@settings(max_examples=80, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=300_000), max_size=6))
def test_rest_answers_cut_anywhere(cuts: list[int]) -> None:
    small_json = b'{"model_name":"' + PRIVATE + b'","model_version":"1","outputs":[]}'
    binary = b"\x00" * 1000
    large_json = b'{"id":"x","model_name":"' + PRIVATE + b'","outputs":[' + b"1," * 100_000 + b"1]}"
    events = b"".join(
        b'data: {"model_name":"' + PRIVATE + b'","text_output":"hi %d"}\n\n' % i for i in range(3)
    )
    # Triton's events cut across chunks (the first inside the name): renamed event by event.
    chunked = b"".join(b"%x\r\n" % len(e) + e + b"\r\n" for e in [events[:40], events[40:]])
    renamed_events = events.replace(PRIVATE, PUBLIC)
    shorter = len(PRIVATE) - len(PUBLIC)
    responses = [
        (
            _response(
                [
                    "HTTP/1.1 200 OK",
                    "Content-Type: application/octet-stream",
                    f"Inference-Header-Content-Length: {len(small_json)}",
                    f"Content-Length: {len(small_json) + len(binary)}",
                ],
                small_json + binary,
            ),
            _response(
                [
                    "HTTP/1.1 200 OK",
                    "Content-Type: application/octet-stream",
                    f"Inference-Header-Content-Length: {len(small_json) - shorter}",
                    f"Content-Length: {len(small_json) - shorter + len(binary)}",
                ],
                small_json.replace(PRIVATE, PUBLIC) + binary,
            ),
        ),
        (
            _response(["HTTP/1.1 200 OK", f"Content-Length: {len(large_json)}"], large_json),
            _response(
                [
                    "HTTP/1.1 200 OK",
                    f"Content-Length: {len(large_json) - len(PRIVATE) + len(PUBLIC)}",
                ],
                large_json.replace(PRIVATE, PUBLIC),
            ),
        ),
        (
            _response(["HTTP/1.1 200 OK", "Transfer-Encoding: chunked"], chunked + b"0\r\n\r\n"),
            _response(
                ["HTTP/1.1 200 OK", "Transfer-Encoding: chunked"],
                b"%x\r\n" % len(renamed_events)
                + renamed_events
                + b"\r\n"  # one chunk: the second completed all three events
                + b"0\r\n\r\n",
            ),
        ),
    ]
    for sent, expected in responses:
        names = RestAnswerNames(PRIVATE, PUBLIC, head_only=False)
        out = b""
        last = 0
        for cut in [*sorted(c % (len(sent) + 1) for c in cuts), len(sent)]:
            out += names.feed(sent[last:cut])
            last = cut
        assert out == expected


def test_rest_answers_on_one_connection_reuse_their_head_only_when_it_is_the_same() -> None:
    names = RestAnswerNames(PRIVATE, PUBLIC, head_only=False)
    answers = []
    for data in (b"[1]", b"[1]", b"[1,2]", b"[1]"):
        body = b'{"model_name":"' + PRIVATE + b'","outputs":' + data + b"}"
        head = ["HTTP/1.1 200 OK", f"Content-Length: {len(body)}"]
        names.reset(head_only=False)
        answers.append(names.feed(_response(head, body)))
        renamed = body.replace(PRIVATE, PUBLIC)
        assert answers[-1] == _response(
            ["HTTP/1.1 200 OK", f"Content-Length: {len(renamed)}"], renamed
        )
    names.reset(head_only=True)  # a HEAD request's answer: its length is not its body's
    bare = _response(["HTTP/1.1 200 OK", "Content-Length: 77"], b"")
    assert names.feed(bare) == bare


@pytest.mark.parametrize("payload", [0, 12, 70_000])
def test_a_whole_inference_answer_spliced_at_its_name_is_the_same_as_renamed(payload: int) -> None:
    first, renamed = naming.name_fields(PRIVATE, PUBLIC)
    data = framed(infer_response(PRIVATE.decode(), payload).SerializeToString())
    fast = AnswerNames(ANSWERS["ModelInfer"], PRIVATE, PUBLIC, first, renamed).feed(data)
    assert fast == AnswerNames(ANSWERS["ModelInfer"], PRIVATE, PUBLIC).feed(data)
    assert fast == framed(infer_response(PUBLIC.decode(), payload).SerializeToString())


def test_rest_an_answer_quoting_its_private_name_in_its_data_keeps_it_there() -> None:
    """The spliced common case must not skip an answer that holds the private name elsewhere."""
    names = RestAnswerNames(PRIVATE, PUBLIC, head_only=False)
    body = b'{"model_name":"' + PRIVATE + b'","outputs":[{"data":["' + PRIVATE + b'"]}]}'
    head = ["HTTP/1.1 200 OK", f"Content-Length: {len(body)}"]
    expected = body.replace(b'"model_name":"' + PRIVATE, b'"model_name":"' + PUBLIC)
    for _ in range(2):  # the second under the last head: the spliced path's checks
        names.reset(head_only=False)
        out = names.feed(_response(head, body))
        assert out == _response(["HTTP/1.1 200 OK", f"Content-Length: {len(expected)}"], expected)
