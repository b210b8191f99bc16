"""The REST relay's admission (`gate.admit`): what becomes of a forwarded request, decided from its
head and the proxy's state alone, without a socket.

The end-to-end tests (test_relay.py, test_health.py, test_parking.py, test_isolation.py) check what
a tenant sees; these check the verdict itself, one rule at a time, and that it reads nothing but
its arguments: the same arguments give the same verdict, and no slot is taken.
"""

from __future__ import annotations

import json

import pytest

from proxy.http1.framing import RequestHead, parse_request_head
from proxy.http1.gate import FORWARD, HEALTH, SLOT_FIRST, admit
from proxy.metrics import ProxyMetrics
from proxy.policy import refusals
from proxy.policy.limiter import Limiter
from proxy.policy.routing import Answer, Forward, HttpRouter
from proxy.processflags import ProxyState
from proxy.table import Entry, Served

MAX_BODY = 1024 * 1024


def _request(method: str, path: str, headers: str = "") -> tuple[RequestHead, Forward]:
    head = parse_request_head(f"{method} {path} HTTP/1.1\r\nHost: h{headers}".encode())
    decision = HttpRouter("m").decide(method, path)
    assert isinstance(decision, Forward)
    return head, decision


def _limiter(refusal: refusals.ProxyError | None = None, unready: str = "") -> Limiter:
    """A limiter whose pod is quarantined with `refusal`, or leaves its Service saying
    `unready` (the node gateway sets both)."""
    limiter = Limiter(1, 0, 1.0)
    limiter.refusal = refusal
    limiter.unready = unready
    return limiter


def _served(parked: bool = False) -> Served:
    limiter = Limiter(1, 0, 1.0)
    return Served("m", limiter, ProxyMetrics(limiter, "m"), Entry("m", parked=parked))


@pytest.mark.parametrize(
    ("method", "path", "verdict"),
    [
        ("POST", "/v2/models/m/infer", SLOT_FIRST),  # inference holds a slot of its model
        ("GET", "/v2/models/m", FORWARD),  # metadata does not
        ("GET", "/v2/health/live", HEALTH),
        ("GET", "/v2/health/ready", HEALTH),
        ("GET", "/v2/models/m/ready", HEALTH),
    ],
)
def test_requests_go_to_triton_with_a_slot_only_for_inference(
    method: str, path: str, verdict: int
) -> None:
    head, decision = _request(method, path, "\r\nContent-Length: 2")
    served = _served()
    assert admit(head, decision, served, served.limiter, MAX_BODY, ProxyState()) == verdict
    assert served.limiter.try_acquire()  # admission took no slot


def test_readiness_is_answered_here_while_draining_or_asleep() -> None:
    head, decision = _request("GET", "/v2/health/ready")
    draining = ProxyState()
    draining.draining = True
    refused = admit(head, decision, None, _limiter(), MAX_BODY, draining)
    assert isinstance(refused, Answer)
    assert (refused.status, refused.close) == (503, False)
    assert json.loads(refused.body) == {
        "error": "the model proxy is shutting down: use another replica"
    }
    asleep = ProxyState()
    asleep.model_asleep = True
    ready = admit(head, decision, None, _limiter(), MAX_BODY, asleep)
    assert isinstance(ready, Answer)
    assert (ready.status, json.loads(ready.body)) == (200, {"ready": True})
    # Liveness is Triton's to answer, whatever the proxy's state.
    live_head, live = _request("GET", "/v2/health/live")
    assert admit(live_head, live, None, _limiter(), MAX_BODY, draining) == HEALTH


def test_a_pod_leaving_its_service_is_not_ready_and_its_other_calls_go_on() -> None:
    """The node gateway's answer to a model pod it takes out of its Service as the node pod
    stops: its readiness calls (the server's, as its proxy asks for its kubelet's probe, and its
    model's) 503 saying why and that the node stops; inference and the rest as before."""
    why = "the node pod is stopping"
    for path in ("/v2/health/ready", "/v2/models/m/ready"):
        head, decision = _request("GET", path)
        answer = admit(head, decision, _served(), _limiter(unready=why), MAX_BODY, ProxyState())
        assert isinstance(answer, Answer)
        assert (answer.status, answer.close) == (503, False)
        assert json.loads(answer.body) == {"error": why, "nodeStopping": True}
        assert admit(head, decision, _served(), _limiter(), MAX_BODY, ProxyState()) == HEALTH
    for method, path, verdict in [
        ("POST", "/v2/models/m/infer", SLOT_FIRST),
        ("GET", "/v2/models/m", FORWARD),
        ("GET", "/v2/health/live", HEALTH),
    ]:
        head, decision = _request(method, path)
        leaving = _limiter(unready=why)
        assert admit(head, decision, _served(), leaving, MAX_BODY, ProxyState()) == verdict


def test_a_parked_model_is_not_ready_and_its_other_calls_wait_for_a_slot() -> None:
    parked = _served(parked=True)
    head, ready = _request("GET", "/v2/models/m/ready")
    answer = admit(head, ready, parked, parked.limiter, MAX_BODY, ProxyState())
    assert isinstance(answer, Answer)
    assert answer.status == 400
    head, metadata = _request("GET", "/v2/models/m")
    assert admit(head, metadata, parked, parked.limiter, MAX_BODY, ProxyState()) == SLOT_FIRST


def test_a_quarantined_pod_refuses_every_request_and_keeps_the_connection() -> None:
    quarantined = refusals.QuarantinedError("this pod is quarantined")
    for method, path in [("POST", "/v2/models/m/infer"), ("GET", "/v2/health/ready")]:
        head, decision = _request(method, path)
        verdict = admit(head, decision, _served(), _limiter(quarantined), MAX_BODY, ProxyState())
        assert verdict == (quarantined, False)


def test_a_head_the_body_rules_refuse_is_refused_before_the_quarantine() -> None:
    quarantined = refusals.QuarantinedError("this pod is quarantined")
    head, decision = _request("POST", "/v2/models/m/infer", f"\r\nContent-Length: {MAX_BODY + 1}")
    verdict = admit(head, decision, _served(), _limiter(quarantined), MAX_BODY, ProxyState())
    assert isinstance(verdict, tuple)
    error, close = verdict
    assert isinstance(error, refusals.BodyTooLargeError)
    assert close  # the body cannot be read safely: the connection closes after the answer
