"""The allow/deny decision as a pure function: every row of docs/proxy.md and adversarial paths."""

from __future__ import annotations

import json

import pytest
from tritonclient.grpc import service_pb2

from proxy.policy import wire
from proxy.policy.routing import (
    Answer,
    Forward,
    GrpcAnswer,
    GrpcForward,
    GrpcRouter,
    HttpRouter,
    health_body,
)

OWN = "add_one"
http = HttpRouter(OWN)
grpc_router = GrpcRouter(OWN)


@pytest.mark.parametrize(
    ("row", "method", "path", "upstream", "limited"),
    [
        ("R1", "GET", "/v2", "/v2", False),
        ("R2", "GET", "/v2/health/live", "/v2/health/live", False),
        ("R3", "GET", "/v2/health/ready", "/v2/models/add_one/ready", False),
        ("R4", "GET", "/v2/models/add_one", "/v2/models/add_one", False),
        ("R4", "GET", "/v2/models/add_one/versions/1", "/v2/models/add_one/versions/1", False),
        ("R5", "GET", "/v2/models/add_one/ready", "/v2/models/add_one/ready", False),
        ("R5", "GET", "/v2/models/add_one/versions/12/ready", None, False),
        ("R6", "GET", "/v2/models/add_one/config", None, False),
        ("R7", "GET", "/v2/models/add_one/stats", None, False),
        ("R8", "GET", "/v2/models/stats", "/v2/models/add_one/stats", False),
        ("R8", "GET", "/v2/models/stats?x=1", "/v2/models/add_one/stats?x=1", False),
        ("R9", "POST", "/v2/models/add_one/infer", None, True),
        ("R9", "POST", "/v2/models/add_one/versions/1/infer", None, True),
        ("R10", "POST", "/v2/models/add_one/generate", None, True),
        ("R11", "POST", "/v2/models/add_one/generate_stream", None, True),
        ("R9", "POST", "/v2/models/add_one/infer?a=b", None, True),
    ],
)
def test_own_model_and_safe_server_routes_are_forwarded(
    row: str, method: str, path: str, upstream: str | None, limited: bool
) -> None:
    decision = http.decide(method, path)
    assert isinstance(decision, Forward), row
    assert decision.path == (upstream or path)
    assert decision.limited is limited
    assert decision.readiness is (row == "R3")


@pytest.mark.parametrize(
    ("method", "path", "status", "body"),
    [
        ("GET", "/v2/models/identity", 404, "Request for unknown model: 'identity' is not found"),
        ("GET", "/v2/models/identity/versions/1", 404, "unknown model: 'identity'"),
        ("GET", "/v2/models/identity/ready", 400, "Model version not ready"),
        ("GET", "/v2/models/identity/config", 404, "unknown model: 'identity'"),
        ("GET", "/v2/models/identity/stats", 400, "requested model 'identity' is not available"),
        ("POST", "/v2/models/identity/infer", 404, "unknown model: 'identity'"),
        ("POST", "/v2/models/identity/generate", 404, "unknown model: 'identity'"),
        ("POST", "/v2/models/identity/generate_stream", 404, "unknown model: 'identity'"),
        ("GET", "/v2/models/identity/infer", 405, "Method Not Allowed"),
    ],
)
def test_another_model_gets_tritons_unknown_model_answer(
    method: str, path: str, status: int, body: str
) -> None:
    decision = http.decide(method, path)
    assert isinstance(decision, Answer)
    assert decision.status == status
    assert body in decision.body.decode()


@pytest.mark.parametrize(
    "path",
    [
        "/v2/models/add_one/trace/setting",
        "/v2/models/identity/versions/1/trace/setting",
        "/v2/repository/index",
        "/v2/repository/models/identity/load",
        "/v2/repository/models/add_one/unload",
        "/v2/systemsharedmemory/status",
        "/v2/systemsharedmemory/region/r/register",
        "/v2/cudasharedmemory/region/r/unregister",
        "/v2/trace/setting",
        "/v2/logging",
    ],
)
def test_platform_apis_are_refused(path: str) -> None:
    for method in ("GET", "POST"):
        decision = http.decide(method, path)
        assert isinstance(decision, Answer)
        assert decision.status == 403
        assert b"reserved for the platform" in decision.body


@pytest.mark.parametrize(
    "path",
    [
        # Percent-encoding: Triton does not decode, so these name other (unknown) models.
        "/v2/models/add%5Fone/infer",
        "/v2/models/%61dd_one/infer",
        "/v2/models/add_one%2Finfer",
        # Dot segments are literal names to Triton.
        "/v2/models/../infer",
        "/v2/models/add_one/../identity/infer",
        "/v2/models/identity/../add_one/infer",
        # Case: Triton model names are case-sensitive.
        "/v2/models/ADD_ONE/infer",
        "/v2/models/Add_One/infer",
        # Very long names.
        "/v2/models/" + "a" * 5000 + "/infer",
        "/v2/models/add_one" + "x" * 300 + "/infer",
    ],
)
def test_adversarial_names_never_reach_triton(path: str) -> None:
    decision = http.decide("POST", path)
    assert isinstance(decision, Answer)
    assert decision.status in (400, 404, 405), path


@pytest.mark.parametrize(
    "path",
    [
        "//v2/models/add_one/infer",
        "/v2//models/add_one/infer",
        "/v2/models//add_one/infer",
        "/v2/models/add_one//infer",
        "/v2/models/add_one/infer/",
        "/v2/models/add_one/",
        "/v2/",
        "/V2/models/add_one/infer",
        "/v2/Models/add_one/infer",
        "/v2/models/add_one/INFER",
        "/v2/models/add_one/versions/-1/infer",
        "/v2/models/add_one/versions/1.0/infer",
        "/v2/models/add_one/versions//infer",
        "/v2/models/add_one/versions/1/versions/1/infer",
        "/v2/models/add_one/infer/../../identity/infer",
        "/v2/models/add_one/./infer",
        "/v2/models/add_one/infer%00",
        "/v2/models/add_one/infer\n",
        "/metrics",
        "/",
        "",
        "*",
        "http://127.0.0.1/v2/models/add_one/infer",
        "/v2/healthz",
        "/v2/health/ready/",
        "/v2/repositoryx",
    ],
)
def test_paths_outside_tritons_grammar_are_not_found(path: str) -> None:
    decision = http.decide("POST", path)
    assert isinstance(decision, Answer)
    assert decision.status in (404, 403), path
    if decision.status == 404:
        assert decision.body == b'{"error":"Not Found"}'


def test_leading_zeros_in_a_version_are_tritons_business() -> None:
    # Triton reads version "01" as 1 for its own model; the proxy forwards, the name is ours.
    assert isinstance(http.decide("GET", "/v2/models/add_one/versions/01/ready"), Forward)


def _infer(name: str) -> bytes:
    data: bytes = service_pb2.ModelInferRequest(model_name=name, id="r1").SerializeToString()
    return data


@pytest.mark.parametrize("kind", ["ServerLive", "ServerMetadata"])
def test_grpc_server_reads_pass(kind: str) -> None:
    decision = grpc_router.decide(kind, b"")
    assert isinstance(decision, GrpcForward)
    assert decision.method == kind


def test_grpc_server_ready_is_the_own_models_readiness() -> None:
    decision = grpc_router.decide("ServerReady", b"")
    assert isinstance(decision, GrpcForward)
    assert decision.method == "ModelReady" and decision.readiness
    assert service_pb2.ModelReadyRequest.FromString(decision.request).name == OWN


@pytest.mark.parametrize("kind", ["ModelReady", "ModelMetadata", "ModelConfig", "ModelInfer"])
def test_grpc_per_model_calls(kind: str) -> None:
    own = grpc_router.decide(kind, _infer(OWN))
    assert isinstance(own, GrpcForward)
    assert own.request == _infer(OWN)  # forwarded byte for byte
    assert own.limited is (kind == "ModelInfer")
    other = grpc_router.decide(kind, _infer("identity"))
    assert isinstance(other, GrpcAnswer)
    if kind == "ModelReady":
        assert (other.code, other.response) == ("OK", b"")
    else:
        assert other.code == "NOT_FOUND"
        assert (
            other.details
            == "Request for unknown model: 'identity' is not found; this pod serves 'add_one'"
        )
    smuggled = grpc_router.decide(kind, _infer(OWN) + _infer("identity"))
    assert isinstance(smuggled, GrpcAnswer) and smuggled.code == "INVALID_ARGUMENT"


def test_grpc_statistics_are_narrowed_to_the_own_model() -> None:
    everything = grpc_router.decide("ModelStatistics", b"")
    assert isinstance(everything, GrpcForward)
    assert service_pb2.ModelStatisticsRequest.FromString(everything.request).name == OWN
    other = grpc_router.decide("ModelStatistics", wire.encode_string(1, b"identity"))
    assert isinstance(other, GrpcAnswer) and other.code == "INVALID_ARGUMENT"
    assert other.details == "requested model 'identity' is not available"


@pytest.mark.parametrize(
    "kind",
    [
        "RepositoryIndex",
        "RepositoryModelLoad",
        "RepositoryModelUnload",
        "SystemSharedMemoryStatus",
        "SystemSharedMemoryRegister",
        "SystemSharedMemoryUnregister",
        "CudaSharedMemoryStatus",
        "CudaSharedMemoryRegister",
        "CudaSharedMemoryUnregister",
        "TraceSetting",
        "LogSettings",
    ],
)
def test_grpc_platform_apis_are_refused(kind: str) -> None:
    decision = grpc_router.decide(kind, wire.encode_string(1, OWN.encode()))
    assert isinstance(decision, GrpcAnswer) and decision.code == "PERMISSION_DENIED"


def test_grpc_unknown_methods_are_unimplemented() -> None:
    decision = grpc_router.decide("ModelInferX", b"")
    assert isinstance(decision, GrpcAnswer) and decision.code == "UNIMPLEMENTED"


def test_each_stream_message_is_checked() -> None:
    assert grpc_router.decide_stream_message(_infer(OWN)) is None
    refusal = grpc_router.decide_stream_message(_infer("identity"))
    assert refusal is not None
    response = service_pb2.ModelStreamInferResponse.FromString(refusal)
    assert (
        response.error_message
        == "Request for unknown model: 'identity' is not found; this pod serves 'add_one'"
    )
    assert response.infer_response.id == "r1"
    smuggled = grpc_router.decide_stream_message(_infer(OWN) + _infer("identity"))
    assert smuggled is not None
    assert (
        "more than once" in service_pb2.ModelStreamInferResponse.FromString(smuggled).error_message
    )


def test_a_hosts_404_names_the_first_ids_it_serves() -> None:
    """A client that sent the wrong name learns the right one: a pod's id, a host's first five
    (never another pod's or host's: the router knows only its own)."""
    names = {f"m{i}" for i in range(7)}
    host = HttpRouter("", names=names)
    answer = host.decide("POST", "/v2/models/resnet-50/infer")
    assert isinstance(answer, Answer) and answer.status == 404
    assert json.loads(answer.body)["error"] == (
        "Request for unknown model: 'resnet-50' is not found; this host serves 'm0', 'm1', "
        "'m2', 'm3', 'm4' and 2 more"
    )
    empty = GrpcRouter("", names=set()).decide("ModelInfer", _infer("resnet-50"))
    assert isinstance(empty, GrpcAnswer) and empty.code == "NOT_FOUND"
    assert empty.details.endswith("; this host serves no model yet")


@pytest.mark.parametrize(
    ("path", "health"),
    [
        ("/v2/health/live", True),
        ("/v2/health/ready", True),
        ("/v2/models/add_one/ready", True),
        ("/v2/models/add_one/versions/1/ready", True),
        ("/v2/models/add_one", False),
        ("/v2/models/add_one/infer", False),
        ("/v2", False),
    ],
)
def test_health_and_readiness_calls_are_marked_for_their_protocol_body(
    path: str, health: bool
) -> None:
    decision = http.decide("GET", path)
    assert isinstance(decision, Forward)
    assert decision.health is health


def test_health_bodies_are_the_open_inference_protocols() -> None:
    assert json.loads(health_body("server_live", "", True)) == {"live": True}
    assert json.loads(health_body("server_ready", "", False)) == {"ready": False}
    assert json.loads(health_body("ready", 'a"b', True)) == {"name": 'a"b', "ready": True}
