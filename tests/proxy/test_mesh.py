"""The namespace router's ports of a model host (`proxy.mesh`): against the real Triton, two host
proxies (A serves add_one, B serves identity) and tritonclient as ModelMesh's clients calling A's
mesh ports: A's own model is served by A's own entry (its limiter and metrics), B's is relayed
to B (standing for its Service, which the routes file names), any other name gets the unknown
model answer, and ModelMesh's `mm-vmodel-id` header names the model. The routes file's grammar
and the views' rule (a model served here is served here) are checked without Triton."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from proxy.mesh import MeshTable, Route, RoutesError, parse_routes
from proxy.metrics import ProxyMetrics
from proxy.policy.limiter import Limiter
from proxy.policy.routing import Answer, Forward, HttpRouter
from proxy.table import Entry, ModelTable, Served
from sim.triton import TritonServer
from tests.proxy.conftest import RunningProxy, proxy_settings, running_proxy
from tests.proxy.test_host import _scrape

ADD_ONE = np.arange(4, dtype=np.float32).reshape(1, 4)
FLAT = np.arange(5, dtype=np.float32)


def _served(model: str) -> Served:
    limiter = Limiter(0, 0, 1.0)
    return Served(model, limiter, ProxyMetrics(limiter, model), Entry(model))


def _views(local: list[str], routes: list[Route]) -> MeshTable:
    table = ModelTable(lambda entry: _served(entry.model), drain_seconds=1.0)
    table.set_models([Entry(m) for m in local])

    def relayed(route: Route) -> Served:
        served = _served(route.model)
        served.route = (route.address, route.http, route.grpc)
        return served

    mesh = MeshTable(table, relayed)
    mesh.set_routes(routes)
    return mesh


def test_the_router_serves_its_own_relays_the_namespace_and_refuses_other_names() -> None:
    routes = [Route("add_one", "10.0.0.1"), Route("identity", "10.0.0.2")]
    mesh = _views(["add_one"], routes)
    router = HttpRouter("", names=mesh.names)
    own = router.decide("POST", "/v2/models/add_one/infer")
    assert isinstance(own, Forward) and own.model == "add_one" and own.limited
    assert mesh.models["add_one"] is mesh.table.models["add_one"]  # the table's own entry
    assert mesh.models["add_one"].route is None
    relayed = router.decide("POST", "/v2/models/identity/infer")
    assert isinstance(relayed, Forward) and relayed.model == "identity"
    assert mesh.models["identity"].route == ("10.0.0.2", 9000, 9001)
    for name in ("other", "Identity", "identity%2F..", "team-b.identity"):
        answer = router.decide("POST", f"/v2/models/{name}/infer")
        assert isinstance(answer, Answer) and answer.status in (400, 404), name
    # The routes change: a model gone from them is refused; one served here stays served here.
    mesh.set_routes([Route("add_one", "10.0.0.9")])
    assert isinstance(router.decide("POST", "/v2/models/identity/infer"), Answer)
    assert mesh.models["add_one"].route is None
    mesh.table.set_models([])
    mesh.rebuild()
    assert mesh.models["add_one"].route == ("10.0.0.9", 9000, 9001)


@pytest.mark.parametrize(
    "text",
    [
        '[{"model": "m", "address": "model.team-b.svc"}]',  # a name, not an address
        '[{"model": "../m", "address": "10.0.0.1"}]',
        '[{"model": "m", "address": "10.0.0.1", "http": 70000}]',
        '[{"model": "m", "address": "10.0.0.1", "maxConcurrency": -1}]',
        '{"model": "m"}',
    ],
)
def test_a_routes_file_off_its_grammar_is_refused(text: str) -> None:
    with pytest.raises(RoutesError):
        parse_routes(text.encode())


def test_a_routes_file_is_read() -> None:
    text = b'[{"model": "m", "address": "10.0.0.1", "grpc": 9101, "maxConcurrency": 2}]'
    assert parse_routes(text) == [Route("m", "10.0.0.1", 9000, 9101, 2)]


def _write(path: Path, entries: list[dict[str, object]]) -> None:
    temporary = path.with_suffix(".new")
    temporary.write_text(json.dumps(entries))
    temporary.replace(path)


@pytest.fixture
def hosts(
    served_triton: TritonServer, tmp_path: Path
) -> Iterator[tuple[RunningProxy, RunningProxy]]:
    """Host A (add_one) with mesh ports and routes to host B (identity)."""
    _write(tmp_path / "b-models", [{"model": "identity"}])
    b_settings = proxy_settings(
        served_triton, model_id="", models_file=tmp_path / "b-models", models_check_seconds=0.05
    )
    with running_proxy(b_settings) as b:
        _write(tmp_path / "a-models", [{"model": "add_one"}])
        routes = [
            {"model": "add_one", "address": "127.0.0.1", "http": 1, "grpc": 1},
            {
                "model": "identity",
                "address": "127.0.0.1",
                "http": b.proxy.rest.port,
                "grpc": b.proxy.grpc.port,
            },
        ]
        _write(tmp_path / "a-routes", routes)
        a_settings = proxy_settings(
            served_triton,
            model_id="",
            models_file=tmp_path / "a-models",
            routes_file=tmp_path / "a-routes",
            models_check_seconds=0.05,
            listen_mesh_http=("127.0.0.1", 0),
            listen_mesh_grpc=("127.0.0.1", 0),
        )
        with running_proxy(a_settings) as a:
            yield a, b


def _mesh_urls(a: RunningProxy) -> tuple[str, str]:
    assert a.proxy.mesh_rest is not None and a.proxy.mesh_grpc is not None
    return f"127.0.0.1:{a.proxy.mesh_rest.port}", f"127.0.0.1:{a.proxy.mesh_grpc.port}"


def _requests(running: RunningProxy, model: str) -> float:
    return sum(
        value
        for (name, labels), value in _scrape(running).items()
        if name == "tritonshare_proxy_requests_total" and ("model", model) in labels
    )


def test_the_mesh_ports_serve_each_model_of_the_namespace(
    hosts: tuple[RunningProxy, RunningProxy],
) -> None:
    a, b = hosts
    rest_url, grpc_url = _mesh_urls(a)
    rest = httpclient.InferenceServerClient(rest_url)
    rpc = grpcclient.InferenceServerClient(grpc_url)
    try:
        for client, module in ((rest, httpclient), (rpc, grpcclient)):
            tensor = module.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(ADD_ONE)
            result = client.infer("add_one", [tensor])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_ONE + 1)
            flat = module.InferInput("INPUT_FP32", [5], "FP32")
            flat.set_data_from_numpy(FLAT)
            result = client.infer("identity", [flat])  # relayed to B
            np.testing.assert_array_equal(result.as_numpy("OUTPUT_FP32"), FLAT)
            assert client.is_model_ready("identity")
            with pytest.raises(InferenceServerException, match="unknown model: 'text_stream'"):
                client.infer("text_stream", [tensor])  # loaded in Triton, not the namespace's
    finally:
        rest.close()
        rpc.close()
    # Served where the model is: A's own entry counts add_one, B counts identity.
    assert _requests(a, "add_one") >= 2 and _requests(a, "identity") == 0
    assert _requests(b, "identity") >= 2
    # A's own ports relay nothing: identity is not A's.
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://{a.http_url}/v2/models/identity", timeout=10)
    assert refused.value.code == 404
    refused.value.close()


def test_the_mm_vmodel_id_header_names_the_model(
    hosts: tuple[RunningProxy, RunningProxy],
) -> None:
    a, _ = hosts
    _, grpc_url = _mesh_urls(a)
    with grpc.insecure_channel(grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for model, name, data, out in (
            ("identity", "INPUT_FP32", FLAT, FLAT),
            ("add_one", "INPUT0", ADD_ONE, ADD_ONE + 1),
        ):
            request = service_pb2.ModelInferRequest(model_name="")
            tensor = request.inputs.add(name=name, datatype="FP32", shape=list(data.shape))
            request.raw_input_contents.append(data.tobytes())
            del tensor
            answer = stub.ModelInfer(request, metadata=(("mm-vmodel-id", model),), timeout=10)
            got = np.frombuffer(answer.raw_output_contents[0], dtype=np.float32)
            np.testing.assert_array_equal(got, out.reshape(-1))
        request = service_pb2.ModelInferRequest(model_name="identity")
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(request, metadata=(("mm-vmodel-id", "team-b-model"),), timeout=10)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
