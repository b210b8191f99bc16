"""The REST relay's request-head parser (`proxy.http1.framing`) against h11's, head by head.

h11 (python-hyper's sans-IO HTTP/1.1) is the oracle. On a corpus of valid and hostile heads, and
on heads mutated at random, the rule is: whatever h11 refuses, the proxy refuses; whatever the
proxy accepts, h11 reads the same way (method, target, version, Host, and above all where the
body ends: Content-Length or chunked). The proxy may be stricter than h11 where RFC 9110/9112 let
a server refuse, and each such head is listed in DEVIATIONS with the rule that allows it: a relay
refuses what a server behind it might read differently.
"""

from __future__ import annotations

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.http1.framing import RequestHead, parse_request_head
from proxy.policy.refusals import ProxyError, http_status

VALID = [
    b"GET /v2/health/live HTTP/1.1\r\nHost: proxy",
    b"POST /v2/models/m/infer HTTP/1.1\r\nHost: 10.0.0.7:9000\r\nContent-Length: 12",
    b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked",
    b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: Chunked",
    b"POST /v2/models/m/infer?x=1 HTTP/1.1\r\nHost: [fe80::1]:9000\r\nContent-Length: 005",
    b"GET /v2 HTTP/1.0",
    b"GET /v2 HTTP/1.1\r\nHost:h\r\nX:\r\nY: tab\there\r\nZ: obs-text \xe9",
    b"GET * HTTP/1.1\r\nHost: h",
    b"GET http://h/v2 HTTP/1.1\r\nHost: h",
    b"GET /v2 HTTP/1.1\r\nhOsT: h\r\nConnection: keep-alive, Upgrade\r\nUpgrade: h2c",
]
HOSTILE = [
    b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked",
    b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
    b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length : 5",
    b"POST / HTTP/1.1",
    b"POST / HTTP/1.1\r\nHost: a\r\nHost: b",
    b"GET /a b HTTP/1.1\r\nHost: h",
    b"GET  /a HTTP/1.1\r\nHost: h",
    b"GET /a HTTP/1.1 \r\nHost: h",
    b"G\x01T /a HTTP/1.1\r\nHost: h",
    b"GET /a\x7f HTTP/1.1\r\nHost: h",
    b"GET /\xe9 HTTP/1.1\r\nHost: h",
    b"GET /a HTTP/1.1\r\nHost: h\r\n: empty",
    b"GET /a HTTP/1.1\r\nHost: h\r\nX-\xe9: v",
    b"GET /a HTTP/1.1\r\n Host: h",
    b"",
]
DEVIATIONS = {
    b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nTransfer-Encoding: chunked": (
        "RFC 9112 6.1: a server MAY reject both; a relay must, or smuggling begins there"
    ),
    b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 5": (
        "RFC 9112 6.3 (5): repeated lengths are an unrecoverable error unless equal; refused all"
    ),
    b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5, 5": "the same, as a list",
    b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999": (
        "more than 18 digits: no body that large is forwarded, and no parser may overflow"
    ),
    b"POST / HTTP/1.1\r\nHost: h\r\nX: a\r\n folded": "RFC 9112 5.2: obs-fold MAY be rejected",
    b"POST / HTTP/1.1\r\nHost: h\r\nX: a\nContent-Length: 5": (
        "RFC 9112 2.2: a bare LF MAY be taken as a line end; the relay does not"
    ),
    b"POST / HTTP/1.1\r\nHost: h\r\nX: a\x01b": "RFC 9110 5.5: no control byte in a value",
    b"POST / HTTP/1.1\r\nHost: h\r\nX: a\x7fb": "RFC 9110 5.5: DEL is not a field-vchar",
    b"POST / HTTP/1.1\r\nHost: a b": "RFC 9112 3.2: 400 for an invalid Host value",
    b"POST / HTTP/1.1\r\nHost: h:80:80": "RFC 9112 3.2: 400 for an invalid Host value",
    b"POST / HTTP/1.1\r\nHost: user@h": "RFC 9112 3.2: 400 for an invalid Host value",
    b"GET /a HTTP/1.2\r\nHost: h": "only HTTP/1.0 and 1.1 are relayed (Triton speaks 1.1)",
    b"GET /a HTTP/2.0\r\nHost: h": "HTTP/2 is not relayed on the REST port",
}


def h11_reading(head: bytes) -> h11.Request | None:
    """h11's reading of `head` as a server, or None when it refuses it."""
    connection = h11.Connection(h11.SERVER)
    try:
        connection.receive_data(head + b"\r\n\r\n")
        event = connection.next_event()
    except h11.RemoteProtocolError:
        return None
    assert isinstance(event, h11.Request), event
    return event


def ours(head: bytes) -> RequestHead | None:
    try:
        return parse_request_head(head)
    except ProxyError as e:
        assert http_status(e) in (400, 501)
        return None


def assert_read_alike(head: bytes, mine: RequestHead, theirs: h11.Request) -> None:
    fields: dict[bytes, list[bytes]] = {}
    for name, value in theirs.headers:
        fields.setdefault(bytes(name), []).append(bytes(value))
    assert mine.method.encode() == theirs.method, head
    assert mine.target.encode("latin-1") == theirs.target, head
    assert mine.version == b"HTTP/" + theirs.http_version, head
    lengths = fields.get(b"content-length", [])
    assert mine.content_length == (int(lengths[0]) if lengths else None), head
    assert mine.chunked == (b"transfer-encoding" in fields), head
    hosts = [line for line in mine.headers if line.lower().startswith(b"host:")]
    assert [h.split(b":", 1)[1].strip(b" \t") for h in hosts] == fields.get(b"host", []), head


@pytest.mark.parametrize("head", VALID)
def test_valid_heads_are_read_as_h11_reads_them(head: bytes) -> None:
    mine, theirs = ours(head), h11_reading(head)
    assert mine is not None and theirs is not None
    assert_read_alike(head, mine, theirs)


@pytest.mark.parametrize("head", HOSTILE)
def test_heads_h11_refuses_are_refused(head: bytes) -> None:
    assert h11_reading(head) is None
    assert ours(head) is None


@pytest.mark.parametrize("head", sorted(DEVIATIONS))
def test_where_the_proxy_is_stricter_than_h11_it_refuses(head: bytes) -> None:
    """h11 reads these; RFC 9110/9112 let a server refuse them (DEVIATIONS says which rule)."""
    assert h11_reading(head) is not None, "h11 refuses it now: move it to HOSTILE"
    assert ours(head) is None, DEVIATIONS[head]


INSERTS = st.sampled_from(
    [
        b"\x00",
        b"\x01",
        b"\x7f",
        b"\t",
        b" ",
        b"\r",
        b"\n",
        b"\r\n",
        b":",
        b",",
        b"\xe9",
        b"\r\nContent-Length: 7",
        b"\r\nTransfer-Encoding: chunked",
        b"\r\nHost: x",
        b"\r\n folded",
        b"chunked",
        b"0",
    ]
)


@settings(max_examples=600, deadline=None)
@given(
    base=st.sampled_from(VALID),
    edits=st.lists(st.tuples(st.integers(0, 200), INSERTS), min_size=1, max_size=3),
)
def test_a_mutated_head_the_proxy_accepts_h11_reads_alike(
    base: bytes, edits: list[tuple[int, bytes]]
) -> None:
    head = base
    for at, insert in edits:
        at = min(at, len(head))
        head = head[:at] + insert + head[at:]
    if b"\r\n\r\n" in head:
        return  # the relay splits heads at the blank line before parsing: not one head
    mine = ours(head)
    if mine is None:
        return  # refusing is always safe
    theirs = h11_reading(head)
    assert theirs is not None, f"the proxy accepts {head!r}, which h11 refuses"
    assert_read_alike(head, mine, theirs)
