"""The REST relay prepares each distinct head once: the same decision as parsing afresh, bounded.

Heads are parsed, routed and re-serialized once and then reused by their exact bytes, on the way in
(`RestRelay.prepare`) and on the way back (`UpstreamPool.response_head`). Reuse must never change
a decision: a head that differs by one byte is prepared on its own, a malformed head is refused
every time, and the memory stays bounded however many distinct heads a client sends.
"""

from __future__ import annotations

import json

import pytest

from proxy.http1.framing import parse_request_head, parse_response_head
from proxy.http1.listener import RestRelay
from proxy.http1.relay import ClientConnection
from proxy.http1.upstream import Upstream, UpstreamPool
from proxy.metrics import ProxyMetrics
from proxy.policy.limiter import Limiter
from proxy.policy.refusals import ProxyError
from proxy.policy.routing import Answer, Forward, HttpRouter
from proxy.processflags import ProxyState
from proxy.settings import parse_settings
from proxy.table import ModelTable, Served


def _relay() -> RestRelay:
    settings = parse_settings(
        ["--model-id", "m", "--triton-http-url", "127.0.0.1:1", "--triton-grpc-url", "127.0.0.1:2"],
        {},
    )
    limiter = Limiter(0, 0, 1.0)
    metrics = ProxyMetrics(limiter, "m")
    return RestRelay(
        settings, limiter, metrics, ProxyState(), ModelTable.of_one(Served("m", limiter, metrics))
    )


def _head(path: str, extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: h\r\nContent-Length: 2{extra}".encode()


def test_a_repeated_head_is_prepared_once_and_decides_as_a_fresh_parse() -> None:
    relay = _relay()
    block = _head("/v2/models/m/infer")
    first = relay.prepare(block)
    assert relay.prepare(bytes(block)) is first  # equal bytes, another object: reused
    head, decision, upstream = first
    assert head == parse_request_head(block)
    assert decision == HttpRouter("m").decide("POST", "/v2/models/m/infer")
    assert isinstance(decision, Forward)
    assert upstream == head.serialize(decision.path)
    # Only the body length differs: another head, another framing.
    longer, _, _ = relay.prepare(block.replace(b"Content-Length: 2", b"Content-Length: 3"))
    assert (head.content_length, longer.content_length) == (2, 3)


@pytest.mark.parametrize(
    ("path", "forwarded"),
    [
        ("/v2/models/m/infer", True),
        ("/v2/models/n/infer", False),  # one byte apart: another model, answered locally
        ("/v2/models/M/infer", False),
        ("/v2/repository/index", False),
    ],
)
def test_heads_one_byte_apart_are_decided_apart(path: str, forwarded: bool) -> None:
    relay = _relay()
    relay.prepare(_head("/v2/models/m/infer"))  # ours first, so the others could be confused
    _, decision, upstream = relay.prepare(_head(path))
    assert isinstance(decision, Forward) is forwarded
    assert (upstream != b"") is forwarded
    if not forwarded:
        assert isinstance(decision, Answer)


def test_a_malformed_head_is_refused_every_time() -> None:
    relay = _relay()
    block = _head("/v2/models/m/infer", "\r\nContent-Length: 3")
    for _ in range(2):
        with pytest.raises(ProxyError, match="Content-Length more than once"):
            relay.prepare(block)


def test_memory_stays_bounded_with_endless_distinct_heads() -> None:
    relay = _relay()
    for i in range(2000):
        relay.prepare(_head("/v2/models/m/infer", f"\r\nX-Request: {i}"))
    big = _head("/v2/models/m/infer", "\r\nX-Big: " + "a" * 8000)
    assert relay.prepare(big) is not relay.prepare(big)  # too large to keep: prepared each time
    assert len(relay._prepared) <= 256


def test_response_heads_are_parsed_once_and_malformed_ones_refused() -> None:
    pool = UpstreamPool("127.0.0.1", 1)
    block = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 17"
    head = pool.response_head(block)
    assert pool.response_head(bytes(block)) is head
    assert head == parse_response_head(block)
    other = pool.response_head(block.replace(b"17", b"18"))
    assert other.content_length == 18
    for _ in range(2):
        with pytest.raises(ProxyError):
            pool.response_head(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2")


class _Transport:
    """Keeps what is written; knows whether it was closed."""

    def __init__(self) -> None:
        self.data = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def _connection() -> tuple[ClientConnection, _Transport, Upstream, _Transport]:
    """A tenant connection and one idle upstream connection in its relay's pool."""
    relay = _relay()
    tenant, tenant_side = ClientConnection(relay), _Transport()
    tenant.connection_made(tenant_side)  # type: ignore[arg-type]
    upstream, triton_side = Upstream(relay.pool), _Transport()
    upstream.connection_made(triton_side)  # type: ignore[arg-type]
    relay.pool.put(upstream)
    return tenant, tenant_side, upstream, triton_side


_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def test_a_connection_repeating_its_head_is_decided_as_a_fresh_parse() -> None:
    """Each connection remembers its last head; a head that begins with the same bytes but is
    another head (longer, or one byte apart) is prepared on its own, and refused if malformed."""
    tenant, tenant_side, upstream, triton_side = _connection()
    ours = _head("/v2/models/m/infer") + b"\r\n\r\n{}"
    for _ in range(2):  # the second time from the connection's memory of its last head
        tenant.data_received(ours)
        assert triton_side.data.endswith(ours)
        upstream.data_received(_OK)
        assert tenant_side.data.endswith(_OK)
    # The same first bytes, then another digit: a 3-byte body, not a 2-byte one and a stray byte.
    tenant.data_received(_head("/v2/models/m/infer").replace(b": 2", b": 23") + b"\r\n\r\n")
    tenant.data_received(b"{" + b" " * 21 + b"}")  # inference bodies are JSON (`shapes`)
    assert triton_side.data.endswith(b"Content-Length: 23\r\n\r\n{" + b" " * 21 + b"}")
    upstream.data_received(_OK)
    # The same head, then a second Host: refused, never forwarded.
    tenant.data_received(ours)
    upstream.data_received(_OK)
    sent = len(triton_side.data)
    tenant.data_received(_head("/v2/models/m/infer") + b"\r\nHost: other\r\n\r\n{}")
    assert len(triton_side.data) == sent
    assert tenant_side.data.startswith(b"HTTP/1.1 400", tenant_side.data.rfind(b"HTTP/1.1 "))
    assert tenant_side.closed


def test_a_connection_repeating_its_head_for_another_model_is_answered_locally() -> None:
    tenant, tenant_side, upstream, triton_side = _connection()
    tenant.data_received(_head("/v2/models/m/infer") + b"\r\n\r\n{}")
    upstream.data_received(_OK)
    sent = len(triton_side.data)
    tenant.data_received(_head("/v2/models/mm/infer") + b"\r\n\r\n{}")
    assert len(triton_side.data) == sent
    assert tenant_side.data.endswith(
        b"Request for unknown model: 'mm' is not found; this pod serves 'm'\"}"
    )


def test_an_upstream_repeating_its_response_head_is_read_as_a_fresh_parse() -> None:
    """Each upstream connection remembers its last response head; one that begins with the same
    bytes but is another head is parsed on its own, and a malformed one fails the exchange."""
    tenant, tenant_side, upstream, _ = _connection()
    request = _head("/v2/models/m/infer") + b"\r\n\r\n{}"
    for response in (_OK, _OK, _OK.replace(b": 2\r\n\r\nok", b": 20\r\n\r\n" + b"y" * 20)):
        tenant.data_received(request)
        upstream.data_received(response)
        assert tenant_side.data.endswith(response)
        assert upstream.client is None  # the response ended where its own head says
    tenant.data_received(request)
    upstream.data_received(_OK.replace(b"\r\n\r\n", b"\r\nContent-Length: 3\r\n\r\n"))
    assert tenant_side.data.rsplit(b"HTTP/1.1 ", 1)[1].startswith(b"502")


def test_a_head_request_reads_no_body_under_a_remembered_head() -> None:
    """The remembered framing is that of a request with a body to come back: an answer to HEAD
    carries the same head and no body, and ends with its head."""
    tenant, tenant_side, upstream, _ = _connection()
    tenant.data_received(_head("/v2/models/m/infer") + b"\r\n\r\n{}")
    upstream.data_received(_OK)
    tenant.data_received(b"HEAD /v2/models/m HTTP/1.1\r\nHost: h\r\n\r\n")
    upstream.data_received(_OK[:-2])
    assert upstream.client is None
    assert tenant_side.data.endswith(_OK + _OK[:-2])
    tenant.data_received(_head("/v2/models/m/infer") + b"\r\n\r\n{}")
    upstream.data_received(_OK)  # the same connection again: the last exchange ended cleanly
    assert tenant_side.data.endswith(_OK[:-2] + _OK)


def test_triton_gets_the_checked_head_whether_or_not_it_is_sent_as_received() -> None:
    """A head whose re-serialization is its own bytes goes as received (without a copy); any
    other is sent re-serialized, every time, and a pipelined request waits for its turn."""
    tenant, _, upstream, triton_side = _connection()
    checked = _head("/v2/models/m/infer") + b"\r\n\r\n{}"
    other = b"POST /v2/models/m/infer HTTP/1.1\r\ncontent-length: 2\r\nConnection: x\r\nHost: h"
    for _ in range(2):
        tenant.data_received(other + b"\r\n\r\n{}")
        assert triton_side.data.endswith(b"HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}")
        upstream.data_received(_OK)
    triton_side.data = b""
    tenant.data_received(checked + checked)
    assert triton_side.data == checked
    upstream.data_received(_OK)
    assert triton_side.data == checked + checked


def _unanswered(body: bytes) -> bytes:
    """The node gateway's answer that Triton lost the request, as `framing.answer` writes it."""
    return (
        b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/json\r\nConnection: close\r\n"
        b"Tritonshare-Unanswered: 1\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


@pytest.mark.parametrize("pieces", [1, 2, 5])
def test_the_gateways_words_for_a_lost_request_reach_the_client_in_any_pieces(
    pieces: int,
) -> None:
    """A model not marked idempotent: its request lost under Triton is answered 502 with the
    gateway's words (why Triton lost it), however the gateway's answer arrives."""
    tenant, tenant_side, upstream, _ = _connection()
    tenant.data_received(_head("/v2/models/m/infer") + b"\r\n\r\n{}")
    words = "Triton at 10.0.0.1:8000 started again and did not have model m loaded again; retry"
    answer = _unanswered(json.dumps({"error": words}).encode())
    step = -(-len(answer) // pieces)
    for start in range(0, len(answer), step):
        upstream.data_received(answer[start : start + step])
    reply = tenant_side.data.rsplit(b"HTTP/1.1 ", 1)[1]
    assert reply.startswith(b"502")
    assert json.loads(reply.split(b"\r\n\r\n", 1)[1]) == {"error": words}


@pytest.mark.parametrize(
    "body", [b"not json", b'{"error": 3}', json.dumps({"error": "x" * 5000}).encode()]
)
def test_a_lost_request_whose_words_cannot_be_read_says_triton_exited(body: bytes) -> None:
    """Words that are not the gateway's JSON, or longer than the proxy reads, are not passed on."""
    tenant, tenant_side, upstream, _ = _connection()
    tenant.data_received(_head("/v2/models/m/infer") + b"\r\n\r\n{}")
    upstream.data_received(_unanswered(body))
    reply = tenant_side.data.rsplit(b"HTTP/1.1 ", 1)[1]
    assert reply.startswith(b"502")
    assert b"Triton exited with the request unanswered" in reply
