"""policy.finals on Triton's own answer shapes (built with its generated protos): which answers
end a request, which empty final answers are dropped, and answers cut anywhere across DATA."""

from __future__ import annotations

import pytest
from tritonclient.grpc import service_pb2

from proxy.grpc import framing
from proxy.policy.finals import ASK, Finals, answer_facts, request_facts
from proxy.policy.naming import HOLD
from proxy.policy.wire import MessageScan


def request(request_id: str = "", ask: bool | None = None) -> bytes:
    message = service_pb2.ModelInferRequest(model_name="m", id=request_id)
    if ask is not None:
        message.parameters["triton_enable_empty_final_response"].bool_param = ask
    message.raw_input_contents.append(b"\x01" * 8)
    serialized: bytes = message.SerializeToString()
    return serialized


def answer(request_id: str, final: bool, outputs: int = 1, error: str = "", size: int = 1) -> bytes:
    response = service_pb2.ModelStreamInferResponse(error_message=error)
    if not error:
        inner = response.infer_response
        inner.model_name = "m"
        inner.id = request_id
        inner.parameters["triton_final_response"].bool_param = final
        for _ in range(outputs):
            inner.outputs.add(name="OUT", datatype="BYTES").shape.append(1)
            inner.raw_output_contents.append(b"x" * size)
    return framing.grpc_message(response.SerializeToString())


def test_a_request_asks_as_its_last_entry_says_and_ask_overrides_the_tenants() -> None:
    assert request_facts(request("a")) == (b"a", False)
    assert request_facts(request("a", ask=True)) == (b"a", True)
    assert request_facts(request("b", ask=False)) == (b"b", False)
    # The tenant's "false" followed by the relay's ASK: the parser (Triton's, here protobuf's)
    # keeps the last entry, true.
    sent = request("b", ask=False) + ASK
    parsed = service_pb2.ModelInferRequest.FromString(sent)
    assert parsed.parameters["triton_enable_empty_final_response"].bool_param is True
    assert request_facts(sent) == (b"b", True)


def test_the_scan_of_a_large_message_sees_the_ask_as_a_parser_does() -> None:
    for ask in (None, False, True):
        scan = MessageScan(b"triton_enable_empty_final_response")
        message = request("x", ask=ask)
        for pos in range(0, len(message), 7):
            scan.feed(message[pos : pos + 7])
        scan.finish()
        assert scan.watched is bool(ask)
        assert scan.field(3) == b"x"


def test_what_ends_a_request() -> None:
    assert answer_facts(answer("a", True)[5:]) == (True, False, b"a")
    assert answer_facts(answer("a", False)[5:]) == (False, False, b"a")
    assert answer_facts(answer("a", True, outputs=0)[5:]) == (True, True, b"a")
    assert answer_facts(answer("", False, error="bad shape")[5:]) == (True, False, None)


def test_empty_finals_pass_only_to_requests_that_asked() -> None:
    finals = Finals()
    finals.sent(b"asked", True)
    finals.sent(b"quiet", False)
    stream = [
        answer("quiet", False),
        answer("asked", False),
        answer("quiet", True, outputs=0),  # Triton's, because the relay asked: dropped
        answer("asked", True, outputs=0),  # the tenant asked for it: passed on
    ]
    out, ended, dropped = finals.feed(b"".join(stream))
    assert out == stream[0] + stream[1] + stream[3]
    assert (ended, dropped) == (2, len(stream[2]))
    assert finals.pending == 0


@pytest.mark.parametrize("step", [1, 5, 64, 4096])
def test_answers_cut_anywhere_give_the_same_result(step: int) -> None:
    finals = Finals()
    for i in range(3):
        finals.sent(str(i).encode(), False)
    big = answer("2", True, size=HOLD + 100)  # over HOLD: decided from its start, never held
    assert len(big) > HOLD + 5
    stream = answer("0", True) + answer("1", False) + answer("1", True, outputs=0) + big
    out = b""
    ended = 0
    held_most = 0
    for pos in range(0, len(stream), step):
        piece, count, _ = finals.feed(stream[pos : pos + step])
        out += piece
        ended += count
        held_most = max(held_most, len(stream[: pos + step]) - len(out))
    assert out == answer("0", True) + answer("1", False) + big
    assert ended == 3
    assert held_most <= HOLD + 5 + step + len(answer("1", False))


def test_an_error_ends_a_request_and_answers_not_ending_one_hold_it() -> None:
    finals = Finals()
    finals.sent(b"a", False)
    finals.sent(b"b", False)
    _, ended, _ = finals.feed(answer("a", False) + answer("", False, error="boom"))
    assert (ended, finals.pending) == (1, 1)
