"""The namespace router of ModelMesh's clients, against the simulated API server through the
official client: a namespace with a TritonModel made from a ModelMesh InferenceService gets the
`modelmesh-serving` Service (gRPC 8033, REST 8008) selecting its model hosts, and the routes
ConfigMap its hosts' proxies read lists every TritonModel of the namespace with its own Service's
ClusterIP; a namespace without one gets neither; a deleted model leaves the routes."""

from __future__ import annotations

import json
from typing import Any

import kubernetes.client
import pytest

from binder.app import Binder
from binder.tritonmodels.meshwriter import ISVC_LABEL, routes_document
from proxy.mesh import Route, parse_routes
from tests.binder.simcluster import eventually
from tests.binder.tritonmodels import test_tritonmodels
from tests.binder.tritonmodels.test_tritonmodels import GROUP, PLURAL, VERSION, model

apiserver = test_tritonmodels.apiserver
custom = test_tritonmodels.custom
binder = test_tritonmodels.binder


@pytest.fixture
def core(kube_api: kubernetes.client.ApiClient) -> Any:
    return kubernetes.client.CoreV1Api(kube_api)


def _routes(core: Any) -> list[dict[str, Any]] | None:
    found = core.list_namespaced_config_map(
        "default", field_selector="metadata.name=tritonshare-mesh-routes"
    ).items
    if not found:
        return None
    routes: list[dict[str, Any]] = json.loads(found[0].data["routes.json"])
    return routes


def _service(core: Any, name: str) -> Any:
    """The Service as the API server wrote it (a dict), or None."""
    answer = core.list_namespaced_service(
        "default", field_selector=f"metadata.name={name}", _preload_content=False
    )
    found = json.loads(answer.data)["items"]
    return found[0] if found else None


async def test_a_modelmesh_namespace_gets_its_router_service_and_routes(
    binder: Binder, custom: Any, core: Any
) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("plain", 1))
    await eventually(lambda: _service(core, "plain"), what="the model's own Service")
    assert _service(core, "modelmesh-serving") is None and _routes(core) is None, (
        "no ModelMesh InferenceService here: no router"
    )
    mesh = model("mnist", 1)
    mesh["metadata"]["labels"] = {ISVC_LABEL: "mnist"}
    mesh["spec"]["modelName"] = "mnist-v2"
    mesh["spec"]["maxConcurrency"] = 3
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, mesh)
    service = await eventually(lambda: _service(core, "modelmesh-serving"), what="the router")
    assert service["spec"]["selector"] == {"tritonshare.io/model-host": "true"}
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        ("grpc", 8033, "mesh-grpc"),
        ("http", 8008, "mesh-http"),
    ]

    def both() -> list[dict[str, Any]] | None:
        routes = _routes(core)
        return routes if routes is not None and len(routes) == 2 else None

    routes = await eventually(both, what="both models routed")
    ips = {n: _service(core, n)["spec"]["clusterIP"] for n in ("plain", "mnist")}
    assert routes == [
        {"model": "mnist-v2", "address": ips["mnist"], "http": 9000, "grpc": 9001,
         "maxConcurrency": 3},
        {"model": "plain", "address": ips["plain"], "http": 9000, "grpc": 9001},
    ]  # fmt: skip
    # What the host's proxy reads of it.
    assert parse_routes(json.dumps(routes).encode())[0] == Route(
        "mnist-v2", ips["mnist"], 9000, 9001, 3
    )

    custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "plain")
    await eventually(lambda: len(_routes(core) or []) == 1, what="the deleted model's route gone")


def test_a_model_without_a_cluster_ip_yet_is_not_routed() -> None:
    assert routes_document({"a": ("a", "", 0)}) == "[]"


async def test_a_modelmesh_serving_of_modelmesh_s_own_is_left_until_it_goes(
    binder: Binder, custom: Any, core: Any
) -> None:
    theirs: dict[str, Any] = {
        "metadata": {"name": "modelmesh-serving"},
        "spec": {"selector": {"modelmesh-service": "modelmesh-serving"}, "ports": [{"port": 8033}]},
    }
    core.create_namespaced_service("default", theirs, _preload_content=False)
    for name in ("mnist", "fashion"):
        mesh = model(name, 1)
        mesh["metadata"]["labels"] = {ISVC_LABEL: name}
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, mesh)
    await eventually(lambda: len(_routes(core) or []) == 2, what="both routed")
    assert _service(core, "modelmesh-serving")["spec"]["selector"] == theirs["spec"]["selector"]
    core.delete_namespaced_service("modelmesh-serving", "default", _preload_content=False)
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "mnist", {"spec": {"maxConcurrency": 2}}
    )

    def ours() -> bool:
        service = _service(core, "modelmesh-serving")
        return service is not None and service["spec"]["selector"] == {
            "tritonshare.io/model-host": "true"
        }

    await eventually(ours, what="the binder's own modelmesh-serving at the namespace's next change")
