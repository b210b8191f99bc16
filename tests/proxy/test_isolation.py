"""Every row of the isolation table (docs/proxy.md) against a real Triton, REST and gRPC.

A request naming another model must get from the proxy exactly what Triton itself answers for a
model it does not have (status, content type and body), so a tenant cannot tell a model on the
same node from one that does not exist.
"""

from __future__ import annotations

import http.client
import json

import grpc
import pytest
from tritonclient.grpc import service_pb2

from proxy.policy import wire
from sim.triton import TritonServer
from tests.proxy.conftest import RunningProxy

pytestmark = pytest.mark.triton
SERVICE = "/inference.GRPCInferenceService/"


def fetch(
    address: str, method: str, path: str, body: bytes | None = None
) -> tuple[int, str, bytes]:
    host, port = address.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request(method, path, body=body)
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read()
    finally:
        connection.close()


INFER_BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
).encode()
OTHER_MODEL_REQUESTS = [
    (method, path)
    for path in (
        "/v2/models/{m}",
        "/v2/models/{m}/versions/1",
        "/v2/models/{m}/ready",
        "/v2/models/{m}/versions/1/ready",
        "/v2/models/{m}/config",
        "/v2/models/{m}/stats",
        "/v2/models/{m}/infer",
        "/v2/models/{m}/versions/2/infer",
        "/v2/models/{m}/generate",
        "/v2/models/{m}/generate_stream",
    )
    for method in ("GET", "POST")
]


def _naming_the_served_id(answer: tuple[int, str, bytes]) -> tuple[int, str, bytes]:
    """Triton's answer as the proxy gives it: a 404 also names the id the pod serves."""
    status, content_type, body = answer
    if status == 404:
        body = body.replace(b' is not found"}', b" is not found; this pod serves 'add_one'\"}")
    return status, content_type, body


@pytest.mark.parametrize(("method", "path"), OTHER_MODEL_REQUESTS)
def test_another_model_is_answered_as_triton_answers_an_unknown_one(
    proxy: RunningProxy, served_triton: TritonServer, method: str, path: str
) -> None:
    body = INFER_BODY if method == "POST" else None
    triton_ghost = fetch(served_triton.http_url, method, path.format(m="ghost"), body)
    proxy_ghost = fetch(proxy.http_url, method, path.format(m="ghost"), body)
    assert proxy_ghost == _naming_the_served_id(triton_ghost)
    # identity IS loaded on this Triton: the proxy must not reveal that.
    proxy_identity = fetch(proxy.http_url, method, path.format(m="identity"), body)
    expected = (
        triton_ghost[0],
        triton_ghost[1],
        triton_ghost[2].replace(b"'ghost'", b"'identity'"),
    )
    assert proxy_identity == _naming_the_served_id(expected)


@pytest.mark.parametrize(
    "path",
    [
        "/v2/models/add%5Fone/ready",
        "/v2/models/ADD_ONE/ready",
        "/v2/models/add_one/ready/",
        "//v2/models/add_one/ready",
        "/v2/models//add_one/ready",
        "/v2/models/add_one/./ready",
        "/v2/models/add_one/versions/-1/ready",
        "/v2/models/../ready",
        "/v2/models/" + "a" * 3000 + "/ready",
        "/v2/foo",
        "/v2/",
    ],
)
def test_adversarial_paths_get_the_same_answer_as_from_triton(
    proxy: RunningProxy, served_triton: TritonServer, path: str
) -> None:
    assert fetch(proxy.http_url, "GET", path) == fetch(served_triton.http_url, "GET", path)


@pytest.mark.parametrize(
    ("row", "method", "path"),
    [
        ("R1", "GET", "/v2"),
        ("R2", "GET", "/v2/health/live"),
        ("R4", "GET", "/v2/models/add_one"),
        ("R4", "GET", "/v2/models/add_one/versions/1"),
        ("R5", "GET", "/v2/models/add_one/ready"),
        ("R5", "GET", "/v2/models/add_one/versions/1/ready"),
        ("R5", "GET", "/v2/models/add_one/versions/9/ready"),
        ("R6", "GET", "/v2/models/add_one/config"),
        ("R9", "POST", "/v2/models/add_one/infer"),
        ("R9", "POST", "/v2/models/add_one/versions/1/infer"),
        ("R9", "GET", "/v2/models/add_one/infer"),
    ],
)
def test_own_model_routes_answer_as_triton_does(
    proxy: RunningProxy, served_triton: TritonServer, row: str, method: str, path: str
) -> None:
    body = INFER_BODY if method == "POST" else None
    proxied = fetch(proxy.http_url, method, path, body)
    direct = fetch(served_triton.http_url, method, path, body)
    if row in ("R2", "R5") and direct[0] == 200:
        # Triton's status with the protocol's JSON body, which Triton leaves out (test_health).
        assert (proxied[0], proxied[1]) == (200, "application/json"), row
        assert direct[2] == b"" and proxied[2].startswith(b"{"), row
    else:
        assert proxied == direct, row


def test_server_readiness_is_the_own_models(served_triton: TritonServer, grpc_mode: str) -> None:
    from tests.proxy.conftest import proxy_settings, running_proxy

    # R3: a proxy for a model Triton does not have is not ready, though Triton itself is.
    assert fetch(served_triton.http_url, "GET", "/v2/health/ready")[0] == 200
    with running_proxy(
        proxy_settings(served_triton, grpc_mode=grpc_mode, model_id="not_loaded")
    ) as running:
        assert fetch(running.http_url, "GET", "/v2/health/ready")[0] == 400
        with grpc.insecure_channel(running.grpc_url) as channel:
            ready = channel.unary_unary(SERVICE + "ServerReady", None, None)(b"", timeout=10)
            assert not service_pb2.ServerReadyResponse.FromString(ready).ready


def test_statistics_of_all_models_are_narrowed(proxy: RunningProxy) -> None:
    # R8
    status, _, body = fetch(proxy.http_url, "GET", "/v2/models/stats")
    assert status == 200
    assert [m["name"] for m in json.loads(body)["model_stats"]] == ["add_one"]
    with grpc.insecure_channel(proxy.grpc_url) as channel:
        raw = channel.unary_unary(SERVICE + "ModelStatistics", None, None)(b"", timeout=10)
    names = [m.name for m in service_pb2.ModelStatisticsResponse.FromString(raw).model_stats]
    assert names == ["add_one"]


@pytest.mark.parametrize(
    ("row", "method", "path"),
    [
        ("R13", "GET", "/v2/models/add_one/trace/setting"),
        ("R13", "POST", "/v2/models/identity/trace/setting"),
        ("R14", "POST", "/v2/repository/index"),
        ("R14", "POST", "/v2/repository/models/identity/unload"),
        ("R14", "POST", "/v2/repository/models/add_one/unload"),
        ("R15", "GET", "/v2/systemsharedmemory/status"),
        ("R15", "POST", "/v2/systemsharedmemory/region/r/register"),
        ("R16", "GET", "/v2/cudasharedmemory/status"),
        ("R16", "POST", "/v2/cudasharedmemory/region/r/unregister"),
        ("R17", "GET", "/v2/trace/setting"),
        ("R17", "POST", "/v2/trace/setting"),
        ("R18", "GET", "/v2/logging"),
        ("R18", "POST", "/v2/logging"),
    ],
)
def test_platform_apis_are_refused_and_never_reach_triton(
    proxy: RunningProxy, served_triton: TritonServer, row: str, method: str, path: str
) -> None:
    status, _, body = fetch(proxy.http_url, method, path, b"{}" if method == "POST" else None)
    assert status == 403, row
    assert b"reserved for the platform" in body
    for model in ("identity", "add_one"):
        assert fetch(served_triton.http_url, "GET", f"/v2/models/{model}/ready")[0] == 200


def test_unknown_routes_are_not_found(proxy: RunningProxy, served_triton: TritonServer) -> None:
    # R19
    for path in ("/metrics", "/v1/models/add_one:predict", "/v2/models/add_one/explain"):
        assert fetch(proxy.http_url, "GET", path)[0] == 404


def _grpc(address: str, kind: str, request: bytes) -> tuple[str, str, bytes]:
    with grpc.insecure_channel(address) as channel:
        try:
            response = channel.unary_unary(SERVICE + kind, None, None)(request, timeout=30)
        except grpc.RpcError as e:
            return e.code().name, e.details() or "", b""
    return "OK", "", response


def _grpc_naming_the_served_id(answer: tuple[str, str, bytes]) -> tuple[str, str, bytes]:
    """Triton's answer as the proxy gives it: a NOT_FOUND also names the id the pod serves."""
    code, details, body = answer
    if code == "NOT_FOUND":
        details += "; this pod serves 'add_one'"
    return code, details, body


@pytest.mark.parametrize(
    ("kind", "request_type"),
    [
        ("ModelReady", service_pb2.ModelReadyRequest),
        ("ModelMetadata", service_pb2.ModelMetadataRequest),
        ("ModelConfig", service_pb2.ModelConfigRequest),
        ("ModelStatistics", service_pb2.ModelStatisticsRequest),
    ],
)
def test_grpc_another_model_is_answered_as_triton_answers_an_unknown_one(
    proxy: RunningProxy, served_triton: TritonServer, kind: str, request_type: type
) -> None:
    ghost = request_type(name="ghost").SerializeToString()
    identity = request_type(name="identity").SerializeToString()
    from_triton = _grpc_naming_the_served_id(_grpc(served_triton.grpc_url, kind, ghost))
    assert _grpc(proxy.grpc_url, kind, ghost) == from_triton
    code, details, body = _grpc(proxy.grpc_url, kind, identity)
    assert (code, details, body) == (
        from_triton[0],
        from_triton[1].replace("'ghost'", "'identity'"),
        from_triton[2],
    )
    own = request_type(name="add_one").SerializeToString()
    assert _grpc(proxy.grpc_url, kind, own)[0] == "OK"


def test_grpc_infer_for_another_model_matches_triton(
    proxy: RunningProxy, served_triton: TritonServer
) -> None:
    for name in ("ghost", ""):
        request = service_pb2.ModelInferRequest(model_name=name).SerializeToString()
        assert _grpc(proxy.grpc_url, "ModelInfer", request) == _grpc_naming_the_served_id(
            _grpc(served_triton.grpc_url, "ModelInfer", request)
        )


def test_grpc_duplicated_name_cannot_smuggle_another_model(
    proxy: RunningProxy, served_triton: TritonServer
) -> None:
    request = service_pb2.ModelReadyRequest(name="add_one").SerializeToString()
    smuggle = request + service_pb2.ModelReadyRequest(name="identity").SerializeToString()
    # Triton itself would read the last name and say identity is ready.
    ready = _grpc(served_triton.grpc_url, "ModelReady", smuggle)[2]
    assert service_pb2.ModelReadyResponse.FromString(ready).ready
    code, details, _ = _grpc(proxy.grpc_url, "ModelReady", smuggle)
    assert code == "INVALID_ARGUMENT"
    assert "more than once" in details
    code, _, _ = _grpc(proxy.grpc_url, "ModelReady", request + request)
    assert code == "INVALID_ARGUMENT"


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
def test_grpc_platform_apis_are_refused(
    proxy: RunningProxy, served_triton: TritonServer, kind: str
) -> None:
    request = wire.encode_string(1, b"identity")  # RepositoryModelUnload: repository_name=1
    request += wire.encode_string(2, b"identity")  # ... and model_name=2
    code, details, _ = _grpc(proxy.grpc_url, kind, request)
    assert code == "PERMISSION_DENIED"
    assert "reserved for the platform" in details
    ready = service_pb2.ModelReadyRequest(name="identity").SerializeToString()
    assert service_pb2.ModelReadyResponse.FromString(
        _grpc(served_triton.grpc_url, "ModelReady", ready)[2]
    ).ready


def test_grpc_unknown_methods_and_services_are_unimplemented(proxy: RunningProxy) -> None:
    for method in (SERVICE + "Nope", "/other.Service/ModelInfer", "/grpc.health.v1.Health/Check"):
        with grpc.insecure_channel(proxy.grpc_url) as channel:
            with pytest.raises(grpc.RpcError) as caught:
                channel.unary_unary(method, None, None)(b"", timeout=10)
            assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
