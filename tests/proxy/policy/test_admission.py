"""The one admission decision (`policy.admission.admit`), rule by rule, and the same verdict
rendered by each relay for the same facts.

The end-to-end tests (tests/proxy/http1, tests/proxy/grpc, test_parking.py, test_residency.py)
check what a tenant sees over a socket; these check the decision itself and that the REST gate
and the gRPC relays ask it rather than deciding beside it.
"""

from __future__ import annotations

import itertools
import json

import pytest

from proxy.http1.framing import RequestHead, parse_request_head
from proxy.http1.gate import FORWARD, HEALTH, SLOT_FIRST, admit
from proxy.metrics import ProxyMetrics
from proxy.policy import admission, refusals
from proxy.policy.limiter import Limiter
from proxy.policy.routing import Answer, Forward, GrpcForward, GrpcRouter, HttpRouter
from proxy.processflags import ProxyState
from proxy.table import Entry, Served


def _state(draining: bool = False, asleep: bool = False) -> ProxyState:
    state = ProxyState()
    state.draining = draining
    state.model_asleep = asleep
    return state


def _limiter(quarantined: bool = False, unready: bool = False) -> Limiter:
    limiter = Limiter(1, 0, 1.0)
    limiter.refusal = refusals.QuarantinedError("quarantined") if quarantined else None
    limiter.unready = "the node pod is stopping" if unready else ""
    return limiter


def _verdict(
    *,
    readiness: bool = False,
    model_ready: bool = False,
    limited: bool = False,
    parked: bool = False,
    quarantined: bool = False,
    unready: bool = False,
    draining: bool = False,
    asleep: bool = False,
) -> int:
    return admission.admit(
        readiness,
        model_ready,
        limited,
        parked,
        _limiter(quarantined, unready),
        _state(draining, asleep),
    )


def test_a_quarantined_pod_is_refused_every_call_its_readiness_first() -> None:
    for readiness, model_ready, limited in itertools.product((False, True), repeat=3):
        assert (
            _verdict(
                readiness=readiness,
                model_ready=model_ready,
                limited=limited,
                quarantined=True,
                draining=True,
                asleep=True,
                unready=True,
            )
            == admission.QUARANTINED
        )


def test_inference_waits_for_a_slot_and_the_rest_goes_at_once() -> None:
    assert _verdict(limited=True) == admission.SLOT_FIRST
    assert _verdict() == admission.FORWARD
    # The proxy's state answers readiness calls only: inference goes on while draining.
    assert _verdict(limited=True, draining=True, asleep=True) == admission.SLOT_FIRST
    assert _verdict(readiness=True) == admission.FORWARD
    assert _verdict(model_ready=True) == admission.FORWARD


def test_the_pods_readiness_is_answered_here_in_order_draining_stopping_asleep() -> None:
    assert _verdict(readiness=True, draining=True, unready=True, asleep=True) == admission.DRAINING
    assert _verdict(readiness=True, unready=True, asleep=True) == admission.STOPPING
    assert _verdict(readiness=True, asleep=True) == admission.ASLEEP
    # The model's own readiness: not the pod's drain or sleep, but the node pod stopping is.
    assert _verdict(model_ready=True, draining=True, asleep=True) == admission.FORWARD
    assert _verdict(model_ready=True, unready=True) == admission.STOPPING


def test_a_parked_model_is_not_ready_and_its_other_calls_wait_for_its_wake() -> None:
    assert _verdict(model_ready=True, parked=True) == admission.PARKED
    assert _verdict(parked=True) == admission.SLOT_FIRST  # metadata, config: wake it
    assert _verdict(parked=True, limited=True) == admission.SLOT_FIRST
    assert _verdict(model_ready=True, parked=True, unready=True) == admission.STOPPING


def _rest(method: str, path: str) -> tuple[Forward, RequestHead]:
    head = parse_request_head(f"{method} {path} HTTP/1.1\r\nHost: h".encode())
    decision = HttpRouter("m").decide(method, path)
    assert isinstance(decision, Forward)
    return decision, head


def _served(parked: bool) -> Served:
    limiter = Limiter(1, 0, 1.0)
    return Served("m", limiter, ProxyMetrics(limiter, "m"), Entry("m", parked=parked))


@pytest.mark.parametrize(
    ("draining", "asleep", "unready", "parked", "quarantined"),
    list(itertools.product((False, True), repeat=5)),
)
def test_rest_and_grpc_take_the_same_verdict_for_the_same_call(
    draining: bool, asleep: bool, unready: bool, parked: bool, quarantined: bool
) -> None:
    """For each call both protocols have (inference, metadata, the pod's and the model's
    readiness), the REST gate's verdict is admission's as the gRPC router's decision gives its
    facts: one decision, two renderings."""
    state = _state(draining, asleep)
    grpc_router = GrpcRouter("m")
    calls = [
        ("POST", "/v2/models/m/infer", "ModelInfer"),
        ("GET", "/v2/models/m", "ModelMetadata"),
        ("GET", "/v2/health/ready", "ServerReady"),
        ("GET", "/v2/models/m/ready", "ModelReady"),
    ]
    for method, path, kind in calls:
        rest, head = _rest(method, path)
        limiter = _limiter(quarantined, unready)
        verdict = admit(head, rest, _served(parked), limiter, 1 << 20, state)
        grpc = grpc_router.decide(kind, _model_message(kind))
        assert isinstance(grpc, GrpcForward), kind
        expected = admission.admit(
            grpc.readiness, grpc.route == "ModelReady", grpc.limited, parked, limiter, state
        )
        assert _rendered(verdict) == expected, (kind, verdict)


def _model_message(kind: str) -> bytes:
    """The gRPC request of `kind` naming model `m` (field 1), or the empty ServerReady one."""
    return b"" if kind == "ServerReady" else b"\x0a\x01m"


def _rendered(verdict: object) -> int:
    """Which admission verdict the REST gate's answer renders."""
    if verdict in (FORWARD, HEALTH):
        return admission.FORWARD
    if verdict == SLOT_FIRST:
        return admission.SLOT_FIRST
    if isinstance(verdict, tuple):
        assert isinstance(verdict[0], refusals.QuarantinedError)
        return admission.QUARANTINED
    assert isinstance(verdict, Answer)
    body = json.loads(verdict.body)
    if verdict.status == 200:
        assert body == {"ready": True}
        return admission.ASLEEP
    if verdict.status == 400:
        assert "scaled to zero" in body["error"]
        return admission.PARKED
    assert verdict.status == 503
    return admission.STOPPING if body.get("nodeStopping") else admission.DRAINING
