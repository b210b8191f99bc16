"""Strict HTTP/1.1 framing: what the relay forwards, and the smuggling shapes it refuses."""

from __future__ import annotations

import pytest

from proxy.http1.framing import ChunkedFraming, parse_request_head, parse_response_head
from proxy.policy.refusals import ProxyError, http_status


def test_a_request_head_is_reserialized_without_hop_by_hop_headers() -> None:
    head = parse_request_head(
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Upgrade\r\n"
        b"Upgrade: h2c\r\nContent-Length: 5\r\nInference-Header-Content-Length: 3"
    )
    assert (head.method, head.target, head.content_length, head.keep_alive) == (
        "POST",
        "/v2/models/m/infer",
        5,
        True,
    )
    assert head.serialize("/v2/models/m/infer") == (
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: 3\r\n"
        b"Content-Length: 5\r\n\r\n"
    )


def test_the_json_part_of_a_binary_body_is_read_with_the_head() -> None:
    """Inference-Header-Content-Length says how much of the body is JSON (`policy.shapes` reads
    that much); sent twice it is refused, as the relay cannot know which one Triton reads."""
    base = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n"
    assert parse_request_head(base + b"inference-header-content-length:  30 ").json_bytes == 30
    assert parse_request_head(base + b"Inference-Header-Content-Length: x").json_bytes == -1
    assert parse_request_head(base.rstrip()).json_bytes == -1
    twice = base + b"Inference-Header-Content-Length: 3\r\nInference-Header-Content-Length: 30"
    with pytest.raises(ProxyError, match="more than once") as refused:
        parse_request_head(twice)
    assert http_status(refused.value) == 400


def test_keep_alive_follows_the_version_and_connection_header() -> None:
    assert not parse_request_head(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close").keep_alive
    assert not parse_request_head(b"GET / HTTP/1.0").keep_alive
    assert parse_request_head(b"GET / HTTP/1.0\r\nConnection: keep-alive").keep_alive


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: 5, 6", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: -1", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: +5", 400),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked", 501),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked", 501),
        (b"POST / HTTP/1.1\r\nX: a\r\n folded", 400),
        (b"POST / HTTP/1.1\r\nX: a\nContent-Length: 5", 400),
        (b"POST / HTTP/1.1\r\nContent-Length : 5", 400),
        (b"POST / HTTP/1.1\r\nX: a\x00b", 400),
        # Gaps of an earlier parser: every control byte but HTAB in a value (RFC 9110 5.5), and Host
        # missing, twice, or not host[:port] in an HTTP/1.1 request (RFC 9112 3.2).
        (b"POST / HTTP/1.1\r\nHost: h\r\nX: a\x01b", 400),
        (b"POST / HTTP/1.1\r\nHost: h\r\nX: a\x7fb", 400),
        (b"POST / HTTP/1.1\r\nHost: h\r\nX: a\x1bb", 400),
        (b"POST / HTTP/1.1\r\nHost: h\x01", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: 0", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nHost: a", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nhost: b", 400),
        (b"POST / HTTP/1.1\r\nHost: a b", 400),
        (b"POST / HTTP/1.1\r\nHost: a/b", 400),
        (b"POST / HTTP/1.1\r\nHost: user@a", 400),
        (b"POST /a b HTTP/1.1", 400),
        (b"POST /a\tb HTTP/1.1", 400),
        (b"POST /a HTTP/2.0", 400),
        (b"post\x01 /a HTTP/1.1", 400),
        (b"", 400),
    ],
)
def test_ambiguous_requests_are_refused(head: bytes, status: int) -> None:
    with pytest.raises(ProxyError) as caught:
        parse_request_head(head)
    assert http_status(caught.value) == status


def test_response_heads() -> None:
    head = parse_response_head(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nContent-Type: x")
    assert (head.status, head.content_length, head.chunked, head.keep_alive) == (
        200,
        12,
        False,
        True,
    )
    sse = parse_response_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked")
    assert sse.chunked and sse.content_length is None
    assert not parse_response_head(b"HTTP/1.1 200 OK\r\nConnection: close").keep_alive
    with pytest.raises(ProxyError):
        parse_response_head(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2")


def test_chunked_framing_finds_the_end_across_any_split() -> None:
    body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nTrailer: x\r\n\r\n"
    following = b"GET / HTTP/1.1\r\n\r\n"
    for split in range(len(body) + 1):
        framing = ChunkedFraming()
        first = framing.feed(body[:split] + (following if split == len(body) else b""))
        if split == len(body):
            assert first == len(body)
            continue
        assert first == -1
        assert framing.feed(body[split:] + following) == len(body) - split
        assert framing.payload == 11


@pytest.mark.parametrize(
    "body",
    [
        b"x\r\n",
        b"1_0\r\n",
        b"0x5\r\n",
        b"-5\r\n",
        b"5\nhello\r\n",
        b"5\r\nhelloXX\r\n",
        b"f" * 5000,
    ],
)
def test_bad_chunked_bodies_are_refused(body: bytes) -> None:
    with pytest.raises(ProxyError):
        ChunkedFraming().feed(body)


@pytest.mark.parametrize(
    "head",
    [
        b"GET / HTTP/1.0",  # HTTP/1.0 has no Host requirement
        b"GET / HTTP/1.1\r\nHost: ",  # empty: a target without an authority
        b"GET / HTTP/1.1\r\nHost: triton.example:8000",
        b"GET / HTTP/1.1\r\nHost: 10.0.0.7:9000",
        b"GET / HTTP/1.1\r\nHost: [fe80::1]:9000",
        b"GET / HTTP/1.1\r\nHost: h\r\nX: tab\there, obs-text \xe9",
    ],
)
def test_valid_hosts_and_values_pass(head: bytes) -> None:
    parse_request_head(head)


@pytest.mark.parametrize(
    ("value", "wbits"),
    [(b"gzip", 31), (b"deflate", 15), (b"GZip", 31), (b"identity", 0), (b"", 0)],
)
def test_the_content_codings_triton_inflates_are_read(value: bytes, wbits: int) -> None:
    head = parse_request_head(
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Encoding: "
        + value
        + b"\r\nContent-Length: 3"
    )
    assert head.encoding == wbits
    assert b"Content-Encoding: " + value in head.serialize("/v2/models/m/infer")


@pytest.mark.parametrize(
    ("encoding", "status", "why"),
    [
        (b"Content-Encoding: br", 415, "send gzip, deflate"),
        (b"Content-Encoding: gzip, gzip", 415, "send gzip, deflate"),
        (b"Content-Encoding: x-gzip", 415, "send gzip, deflate"),
        (b"Content-Encoding: gzip\r\nContent-Encoding: gzip", 400, "more than once"),
    ],
)
def test_other_or_repeated_content_codings_are_refused(
    encoding: bytes, status: int, why: str
) -> None:
    """Triton inflates gzip and deflate; anything else it refuses anyway, and a list or a repeat
    could be read differently by Triton and by the count of the inflated size."""
    head = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n" + encoding + b"\r\nContent-Length: 3"
    with pytest.raises(ProxyError, match=why) as caught:
        parse_request_head(head)
    assert http_status(caught.value) == status
