"""The REST connection's request cycle (`http1.cycle.RequestCycle`), pure: bytes in, events out.

No socket, no event loop: each test feeds a cycle what a tenant sent and reads what the
connection is to do with the request at its head, and what the cycle decided for it (its head,
body offset, model, limiter, verdict, answer or refusal). The end-to-end tests (test_relay.py,
tests/proxy/test_forwarding.py, ...) check what a tenant sees over a socket.
"""

from __future__ import annotations

from proxy.http1.cycle import (
    ANSWER,
    NEED_DATA,
    REFUSE,
    REFUSE_CLOSE,
    RELAY,
    TOO_LARGE,
    UNREADABLE,
    RequestCycle,
)
from proxy.http1.framing import MAX_HEAD_BYTES
from proxy.http1.gate import FORWARD, HEALTH, SLOT_FIRST
from proxy.http1.listener import RestRelay
from proxy.metrics import ProxyMetrics
from proxy.policy import refusals
from proxy.policy.limiter import Limiter
from proxy.processflags import ProxyState
from proxy.settings import parse_settings
from proxy.table import ModelTable, Served

INFER = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}"


def _relay(state: ProxyState | None = None, *flags: str) -> RestRelay:
    argv = ["--model-id", "m", "--triton-http-url", "127.0.0.1:1", "--triton-grpc-url", "x:2"]
    settings = parse_settings([*argv, *flags], {})
    limiter = Limiter(0, 0, 1.0)
    metrics = ProxyMetrics(limiter, "m")
    table = ModelTable.of_one(Served("m", limiter, metrics))
    return RestRelay(settings, limiter, metrics, state or ProxyState(), table)


def test_an_inference_request_is_relayed_once_its_limiter_gives_a_slot() -> None:
    relay = _relay()
    cycle = RequestCycle(relay)
    assert cycle.next_request(INFER) == RELAY
    assert cycle.verdict == SLOT_FIRST
    assert cycle.route == "infer" and cycle.head.method == "POST"
    assert INFER[cycle.body :] == b"{}"
    served = relay.models["m"]
    assert cycle.served is served and cycle.limiter is served.limiter
    assert cycle.upstream_head.startswith(b"POST /v2/models/m/infer HTTP/1.1\r\n")


def test_the_same_head_again_is_known_and_decided_the_same() -> None:
    cycle = RequestCycle(_relay())
    assert cycle.next_request(INFER) == RELAY
    first = (cycle.head, cycle.upstream_head, cycle.body)
    assert not cycle.verbatim  # a new head is sent as re-serialized
    pipelined = INFER + INFER  # the next request follows the first's body
    assert cycle.next_request(pipelined[len(INFER) :]) == RELAY
    assert (cycle.head, cycle.upstream_head, cycle.body) == first
    # Known: re-serializing gave the very bytes received, so they go to Triton as they came.
    assert cycle.verbatim


def test_a_head_in_pieces_needs_data_until_whole() -> None:
    cycle = RequestCycle(_relay())
    for cut in (1, 20, INFER.index(b"\r\n\r\n") + 3):
        assert cycle.next_request(INFER[:cut]) == NEED_DATA
    assert cycle.next_request(INFER) == RELAY


def test_a_head_over_the_bound_is_refused_and_the_connection_closes() -> None:
    cycle = RequestCycle(_relay())
    assert cycle.next_request(b"GET / HTTP/1.1\r\nX: " + b"a" * MAX_HEAD_BYTES) == TOO_LARGE
    assert isinstance(cycle.error, refusals.HeadTooLargeError)


def test_an_ambiguous_head_is_unreadable() -> None:
    cycle = RequestCycle(_relay())
    smuggled = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n"
    smuggled += b"Transfer-Encoding: chunked\r\n\r\n"
    assert cycle.next_request(smuggled) == UNREADABLE
    assert cycle.route == "unreadable"
    assert refusals.http_status(cycle.error) == 400  # type: ignore[arg-type]


def test_another_model_is_answered_here_and_its_body_dropped() -> None:
    cycle = RequestCycle(_relay())
    request = INFER.replace(b"/models/m/", b"/models/n/")
    assert cycle.next_request(request) == ANSWER
    assert cycle.answer.status == 404
    assert request[cycle.body :] == b"{}"  # read and dropped by the connection


def test_health_calls_are_relayed_as_health_calls_and_answered_here_while_draining() -> None:
    state = ProxyState()
    cycle = RequestCycle(_relay(state))
    ready = b"GET /v2/health/ready HTTP/1.1\r\nHost: h\r\n\r\n"
    assert cycle.next_request(ready) == RELAY
    assert cycle.verdict == HEALTH and cycle.health.route == cycle.route
    live = b"GET /v2/health/live HTTP/1.1\r\nHost: h\r\n\r\n"
    assert cycle.next_request(live) == RELAY and cycle.verdict in (HEALTH, FORWARD)
    state.draining = True
    assert cycle.next_request(ready) == ANSWER
    assert cycle.answer.status == 503


def test_a_quarantined_pod_is_refused_and_the_connection_goes_on() -> None:
    relay = _relay()
    relay.models["m"].limiter.refusal = refusals.QuarantinedError("quarantined: ask")
    cycle = RequestCycle(relay)
    assert cycle.next_request(INFER) == REFUSE
    assert isinstance(cycle.error, refusals.QuarantinedError)
    assert INFER[cycle.body :] == b"{}"


def test_a_body_over_max_body_is_refused_before_it_is_read_and_the_connection_closes() -> None:
    cycle = RequestCycle(_relay(None, "--max-body", "1Ki"))
    assert cycle.next_request(INFER.replace(b"Length: 2", b"Length: 2048")) == REFUSE_CLOSE
    assert refusals.http_status(cycle.error) == 413  # type: ignore[arg-type]
