"""The binder's InferenceService controller against the simulated API server serving KServe's
CRDs (deploy/kserve-crds) beside the chart's, through the official client: ModelMesh's
example-onnx-mnist becomes a TritonModel it owns whose replica is placed, its status reads as
ModelMesh writes it once the replica is loaded, a spec change reaches the TritonModel, deleting
it deletes the TritonModel (garbage collection by the simulated controller manager), refusals
read with ModelMesh's reasons and a Warning Event, and a namespace not labelled
modelmesh-enabled is left alone. Every call the binder makes is one deploy/'s RBAC grants."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from binder.app import Binder
from common.contract import Keys
from common.hosted import loaded_condition
from sim.apiserver import ApiServerSettings, RunningApiServer, start_in_thread
from sim.controllers.manager import ControllerManager
from tests.binder.objects import GI
from tests.binder.simcluster import MakeBinder, add_node, eventually
from tests.binder.tritonmodels import test_tritonmodels
from tests.conftest import require_executable
from tests.deploy.rendering import CHART, DEPLOY, render
from tests.e2e.test_rbac import describe, grants_for

KSERVE, ISVC_VERSION, ISVCS = "serving.kserve.io", "v1beta1", "inferenceservices"
MODELS = ("tritonshare.io", "v1alpha1", "tritonmodels")
NS = "modelmesh-serving"
HOSTED = "tritonshare.io/hosted-models"
MODELMESH = {"serving.kserve.io/deploymentMode": "ModelMesh"}
STORAGE_CONFIG = {
    "localMinIO": json.dumps(
        {
            "type": "s3",
            "access_key_id": "AKIAIOSFODNN7EXAMPLE",
            "secret_access_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "endpoint_url": "http://minio:9000",
            "default_bucket": "modelmesh-example-models",
            "region": "us-south",
        }
    )
}

# ModelMesh's own runtime manifest (config/runtimes/triton-2.x.yaml), as it ships.
TRITON_2X: dict[str, Any] = {
    "apiVersion": "serving.kserve.io/v1alpha1",
    "kind": "ServingRuntime",
    "metadata": {
        "name": "triton-2.x",
        "labels": {"name": "modelmesh-serving-triton-2.x-SR"},
        "annotations": {"maxLoadingConcurrency": "2"},
    },
    "spec": {
        "supportedModelFormats": [
            {"name": "keras", "version": "2", "autoSelect": True},
            {"name": "onnx", "version": "1", "autoSelect": True},
            {"name": "pytorch", "version": "1", "autoSelect": True},
            {"name": "tensorflow", "version": "1", "autoSelect": True},
            {"name": "tensorflow", "version": "2", "autoSelect": True},
            {"name": "tensorrt", "version": "7", "autoSelect": True},
        ],
        "multiModel": True,
        "grpcEndpoint": "port:8085",
        "grpcDataEndpoint": "port:8001",
        "containers": [
            {
                "name": "triton",
                "image": "tritonserver-2:replace",
                "command": ["/bin/sh"],
                "args": [
                    "-c",
                    'mkdir -p /models/_triton_models; chmod 777 /models/_triton_models; exec '
                    'tritonserver "--model-repository=/models/_triton_models" '
                    '"--model-control-mode=explicit" "--strict-model-config=false" '
                    '"--strict-readiness=false" "--allow-http=true" "--allow-sagemaker=false" ',
                ],
                "resources": {
                    "requests": {"cpu": "500m", "memory": "1Gi"},
                    "limits": {"cpu": "5", "memory": "1Gi"},
                },
                "livenessProbe": {
                    "exec": {
                        "command": [
                            "curl", "--fail", "--silent", "--show-error", "--max-time", "9",
                            "http://localhost:8000/v2/health/live",
                        ]
                    },
                    "initialDelaySeconds": 5,
                    "periodSeconds": 30,
                    "timeoutSeconds": 10,
                },
            }
        ],
        "builtInAdapter": {
            "serverType": "triton",
            "runtimeManagementPort": 8001,
            "memBufferBytes": 134217728,
            "modelLoadingTimeoutMillis": 90000,
        },
    },
}  # fmt: skip


@pytest.fixture
def apiserver() -> Iterator[RunningApiServer]:
    """The simulated API server serving the chart's CRDs and KServe's."""
    crds = (CHART / "crds", DEPLOY / "kserve-crds" / "kserve-crds.yaml")
    server = start_in_thread(settings=ApiServerSettings(crds=crds))
    try:
        yield server
    finally:
        server.stop()


# The custom objects client and the garbage collector, as the TritonModel tests have them (over
# this module's API server).
custom = test_tritonmodels.custom
gc = test_tritonmodels.gc


def namespace(core: Any, name: str, enabled: bool = True) -> None:
    labels = {"modelmesh-enabled": "true"} if enabled else {}
    core.create_namespace({"metadata": {"name": name, "labels": labels}})


@pytest.fixture
async def binder(
    kube_api: kubernetes.client.ApiClient, core: Any, custom: Any, make_binder: MakeBinder
) -> Binder:
    for node in ("n1", "n2"):
        add_node(kube_api, node, [16 * GI])
    namespace(core, NS)
    custom.create_namespaced_custom_object(KSERVE, "v1alpha1", NS, "servingruntimes", TRITON_2X)
    data = {k: base64.b64encode(v.encode()).decode() for k, v in STORAGE_CONFIG.items()}
    core.create_namespaced_secret(NS, {"metadata": {"name": "storage-config"}, "data": data})
    return await make_binder()


def isvc(
    name: str,
    predictor: dict[str, Any],
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": f"{KSERVE}/{ISVC_VERSION}",
        "kind": "InferenceService",
        "metadata": {
            "name": name,
            "annotations": MODELMESH if annotations is None else annotations,
        },
        "spec": {"predictor": predictor},
    }


MNIST = {
    "model": {
        "modelFormat": {"name": "onnx"},
        "runtime": "triton-2.x",
        "storage": {"key": "localMinIO", "path": "onnx/mnist.onnx"},
    }
}


def create(custom: Any, obj: dict[str, Any], ns: str = NS) -> None:
    custom.create_namespaced_custom_object(KSERVE, ISVC_VERSION, ns, ISVCS, obj)


def read_isvc(custom: Any, name: str, ns: str = NS) -> dict[str, Any]:
    found: dict[str, Any] = custom.get_namespaced_custom_object(
        KSERVE, ISVC_VERSION, ns, ISVCS, name
    )
    return found


def model_status(custom: Any, name: str) -> dict[str, Any]:
    return dict((read_isvc(custom, name).get("status") or {}).get("modelStatus") or {})


def tritonmodel(custom: Any, name: str, ns: str = NS) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = custom.get_namespaced_custom_object(
            *MODELS[:2], ns, MODELS[2], name
        )
    except kubernetes.client.ApiException as e:
        if e.status == 404:
            return None
        raise
    return found


def conditions(obj: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {
        c["type"]: (c["status"], c.get("reason", ""))
        for c in (obj.get("status") or {}).get("conditions") or []
    }


def set_loaded(
    core: Any, name: str, model: str, status: str = "True", reason: str = "ModelReady"
) -> None:
    """What the agent writes on the host `name` for the model's replica there, and the kubelet
    (the host Ready)."""
    host = core.read_namespaced_pod(name, NS)
    entries = json.loads((host.metadata.annotations or {}).get(HOSTED) or "[]")
    message = f"{reason}: the files could not be read" if status == "False" else ""
    loaded = [
        {"type": loaded_condition(Keys(), model, e["replica"]), "status": status,
         "reason": reason, "message": message}
        for e in entries if e["model"] == model
    ]  # fmt: skip
    core.patch_namespaced_pod_status(
        name,
        NS,
        {"status": {"conditions": [*loaded, {"type": "Ready", "status": "True"}]}},
        _content_type="application/strategic-merge-patch+json",
    )


def warnings(core: Any, name: str, ns: str = NS) -> list[Any]:
    events = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
    return [e for e in events if e.type == "Warning"]


async def test_example_onnx_mnist_is_served_as_an_owned_tritonmodel_and_reads_as_modelmesh(
    binder: Binder, custom: Any, core: Any, apiserver: RunningApiServer, gc: ControllerManager
) -> None:
    create(custom, isvc("example-onnx-mnist", MNIST))
    model = await eventually(
        lambda: tritonmodel(custom, "example-onnx-mnist"), what="a TritonModel"
    )
    owner = read_isvc(custom, "example-onnx-mnist")
    (ref,) = model["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
        "InferenceService", "example-onnx-mnist", owner["metadata"]["uid"], True
    )  # fmt: skip
    spec = model["spec"]
    assert spec["storageUri"] == "s3://modelmesh-example-models/onnx/mnist.onnx"
    assert "gpuMemory" not in spec, "none declared: the binder learns it"
    assert {k: v for k, v in model["metadata"]["annotations"].items() if "s3-" in k} == {
        "tritonshare.io/s3-endpoint": "minio:9000",
        "tritonshare.io/s3-usehttps": "0",
        "tritonshare.io/s3-region": "us-south",
    }
    # The storage key's credential, in KServe's keys, in the same namespace only.
    secret = core.read_namespaced_secret(spec["storageSecret"], NS)
    assert sorted(secret.data) == ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
    assert base64.b64decode(secret.data["AWS_ACCESS_KEY_ID"]).decode() == "AKIAIOSFODNN7EXAMPLE"

    def placed() -> dict[str, Any] | None:
        now = tritonmodel(custom, "example-onnx-mnist")
        entries = ((now or {}).get("status") or {}).get("placements") or []
        return entries[0] if entries else None

    entry = await eventually(placed, what="its replica placed")
    await eventually(
        lambda: (
            model_status(custom, "example-onnx-mnist").get("states", {}).get("activeModelState")
            == "Loading"
        ),
        what="Loading while the replica loads",
    )
    status = read_isvc(custom, "example-onnx-mnist")["status"]
    assert status["modelStatus"]["transitionStatus"] == "InProgress"
    assert conditions(read_isvc(custom, "example-onnx-mnist"))["PredictorReady"][0] == "False"

    await eventually(lambda: _has_host(core, entry["host"]), what="the host pod")
    set_loaded(core, entry["host"], "example-onnx-mnist")

    def loaded() -> dict[str, Any] | None:
        obj = read_isvc(custom, "example-onnx-mnist")
        ms = (obj.get("status") or {}).get("modelStatus") or {}
        return obj if ms.get("states", {}).get("activeModelState") == "Loaded" else None

    obj = await eventually(loaded, what="Loaded once the TritonModel is Ready")
    status = obj["status"]
    assert status["url"] == f"grpc://modelmesh-serving.{NS}:8033"
    assert status["components"]["predictor"] == {
        "url": f"grpc://modelmesh-serving.{NS}:8033",
        "grpcUrl": f"grpc://modelmesh-serving.{NS}:8033",
        "restUrl": f"http://modelmesh-serving.{NS}:8008",
    }
    assert status["modelStatus"] == {
        "transitionStatus": "UpToDate",
        "states": {"activeModelState": "Loaded", "targetModelState": ""},
        "copies": {"totalCopies": 1, "failedCopies": 0},
    }
    assert conditions(obj) == {"PredictorReady": ("True", "Loaded"), "Ready": ("True", "Loaded")}

    # Looked at again, nothing changed: nothing is written.
    def status_writes() -> int:
        return sum(
            1
            for r in apiserver.audit.writes(user_agent="tritonshare-binder/")
            if r.resource == "inferenceservices" and r.subresource == "status"
        )

    written = status_writes()
    assert written > 0
    assert binder.inferenceservices is not None
    binder.inferenceservices.resync()
    await asyncio.sleep(1.0)
    assert status_writes() == written

    # A spec change reaches the TritonModel: new files, and a GPU memory of its own.
    custom.patch_namespaced_custom_object(
        KSERVE, ISVC_VERSION, NS, ISVCS, "example-onnx-mnist",
        {"metadata": {"annotations": {"tritonshare.io/gpu-memory": "2Gi"}},
         "spec": {"predictor": {"model": {"storage": {"path": "onnx/mnist-v2.onnx"}}}}},
    )  # fmt: skip

    def moved() -> dict[str, Any] | None:
        now = tritonmodel(custom, "example-onnx-mnist") or {}
        spec = now.get("spec") or {}
        wanted = ("s3://modelmesh-example-models/onnx/mnist-v2.onnx", "2Gi")
        return now if (spec.get("storageUri"), spec.get("gpuMemory")) == wanted else None

    await eventually(moved, what="the TritonModel follows the spec")

    custom.delete_namespaced_custom_object(KSERVE, ISVC_VERSION, NS, ISVCS, "example-onnx-mnist")
    await eventually(
        lambda: tritonmodel(custom, "example-onnx-mnist") is None, what="the TritonModel collected"
    )

    grants = grants_for("tritonshare-binder", render(require_executable("kubectl"), "base"))
    calls = [r for r in apiserver.audit if r.user_agent.startswith("tritonshare-binder/")]
    denied = sorted({describe(c) for c in calls if not any(g.allows(c) for g in grants)})
    assert not denied
    made = {(c.api_group, c.resource, c.subresource, c.verb) for c in calls}
    assert {
        (KSERVE, "inferenceservices", "", "watch"),
        (KSERVE, "servingruntimes", "", "watch"),
        (KSERVE, "clusterservingruntimes", "", "watch"),
        (KSERVE, "inferenceservices", "status", "patch"),
        ("tritonshare.io", "tritonmodels", "", "create"),
        ("tritonshare.io", "tritonmodels", "", "patch"),
        ("", "secrets", "", "get"),
        ("", "secrets", "", "create"),
        ("", "configmaps", "", "get"),
    } <= made


def _has_host(core: Any, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, NS)
    except kubernetes.client.ApiException:
        return False
    return True


async def test_the_framework_form_with_a_storage_uri(binder: Binder, custom: Any) -> None:
    predictor = {"onnx": {"storageUri": "https://models.example.com/mnist", "resources": {
        "requests": {"cpu": "1"}}}, "minReplicas": 2, "maxReplicas": 5}  # fmt: skip
    create(custom, isvc("mnist", predictor, {**MODELMESH, "autoscaling.knative.dev/target": "5"}))
    model = await eventually(lambda: tritonmodel(custom, "mnist"), what="a TritonModel")
    assert model["spec"]["storageUri"] == "https://models.example.com/mnist"
    assert "storageSecret" not in model["spec"]
    assert model["spec"]["replicas"] == 1, "minReplicas is ModelMesh's to ignore"
    assert "autoscaling" not in model["spec"]
    # Opted in, the scaling fields ModelMesh ignores drive the built-in autoscaler.
    opted = {
        **MODELMESH,
        "autoscaling.knative.dev/target": "5",
        "tritonshare.io/autoscaling": "true",
    }
    create(custom, isvc("scaled", predictor, opted))
    scaled = await eventually(lambda: tritonmodel(custom, "scaled"), what="a TritonModel")
    assert scaled["spec"]["replicas"] == 2
    wanted = {"metric": "concurrency", "target": 5, "minReplicas": 2, "maxReplicas": 5}
    assert {k: scaled["spec"]["autoscaling"][k] for k in wanted} == wanted


@pytest.mark.parametrize(
    ("predictor", "words"),
    [
        ({"model": MNIST["model"], "onnx": {"storageUri": "s3://b/m"}}, "both model and onnx"),
        (
            {"model": {"modelFormat": {"name": "onnx"}, "storageUri": "s3://b/m",
                       "storage": {"key": "localMinIO", "path": "m"}}},
            "both storageUri and storage.path",
        ),
        ({"onnx": {"storageUri": "hdfs://b/m"}}, "scheme hdfs:// is not served"),
        ({"model": {"modelFormat": {"name": "onnx"}}}, "names no storage"),
    ],
)  # fmt: skip
async def test_an_invalid_spec_reads_invalid_predictor_spec_with_an_event(
    binder: Binder, custom: Any, core: Any, predictor: dict[str, Any], words: str
) -> None:
    create(custom, isvc("bad", predictor))
    ms = await eventually(
        lambda: (
            model_status(custom, "bad").get("transitionStatus") == "InvalidSpec"
            and model_status(custom, "bad")
        ),
        what="InvalidSpec",
    )
    failure = ms["lastFailureInfo"]
    assert failure["reason"] == "InvalidPredictorSpec"
    assert words in failure["message"]
    assert failure["time"]
    assert conditions(read_isvc(custom, "bad"))["Ready"] == ("False", "InvalidPredictorSpec")
    events = await eventually(lambda: warnings(core, "bad"), what="a Warning Event")
    assert events[0].reason == "InvalidPredictorSpec" and words in events[0].message
    assert tritonmodel(custom, "bad") is None


async def test_a_tensorflow_model_reads_no_supporting_runtime_within_10_s(
    binder: Binder, custom: Any, core: Any
) -> None:
    predictor = {"tensorflow": {"storage": {"key": "localMinIO", "path": "tf/mnist"}}}
    create(custom, isvc("tf-mnist", predictor))
    ms = await eventually(
        lambda: (
            (model_status(custom, "tf-mnist").get("lastFailureInfo") or {}).get("reason")
            == "NoSupportingRuntime"
            and model_status(custom, "tf-mnist")
        ),
        within=10,
        what="NoSupportingRuntime",
    )
    assert "tf2onnx" in ms["lastFailureInfo"]["message"]
    assert ms["states"]["activeModelState"] == "FailedToLoad"
    events = await eventually(lambda: warnings(core, "tf-mnist"), what="a Warning Event")
    assert events[0].reason == "NoSupportingRuntime"
    assert tritonmodel(custom, "tf-mnist") is None


async def test_only_modelmesh_services_of_labelled_namespaces_are_served(
    binder: Binder, custom: Any, core: Any
) -> None:
    namespace(core, "elsewhere", enabled=False)
    create(custom, isvc("mnist", {"onnx": {"storageUri": "s3://b/m"}}), "elsewhere")
    # In the labelled namespace: one left to KServe's default mode, one Serverless.
    create(custom, isvc("plain", {"onnx": {"storageUri": "s3://b/plain"}}, {}))
    serverless = {"serving.kserve.io/deploymentMode": "Serverless"}
    create(custom, isvc("knative", {"onnx": {"storageUri": "s3://b/k"}}, serverless))
    # A marker served after them: by then the others were looked at.
    create(custom, isvc("marker", {"onnx": {"storageUri": "s3://b/marker"}}))
    await eventually(lambda: tritonmodel(custom, "marker"), what="the marker served")
    assert tritonmodel(custom, "mnist", "elsewhere") is None
    assert not read_isvc(custom, "mnist", "elsewhere").get("status")
    assert tritonmodel(custom, "plain") is None and tritonmodel(custom, "knative") is None
    assert not read_isvc(custom, "plain").get("status")

    # KServe's ConfigMap making ModelMesh the default serves the unannotated one (at a resync).
    core.create_namespaced_config_map(
        "tritonshare-system",
        {"metadata": {"name": "inferenceservice-config"},
         "data": {"deploy": json.dumps({"defaultDeploymentMode": "ModelMesh"})}},
    )  # fmt: skip
    assert binder.inferenceservices is not None
    binder.inferenceservices.resync(reread=True)  # what the periodic resync does
    await eventually(lambda: tritonmodel(custom, "plain"), what="the default mode followed")
    assert tritonmodel(custom, "knative") is None


async def test_a_namespace_moves_by_a_label_of_its_own_with_a_secret_of_its_choosing(
    kube_api: kubernetes.client.ApiClient, core: Any, custom: Any, make_binder: MakeBinder
) -> None:
    """Beside a running ModelMesh (which serves modelmesh-enabled namespaces) the binder serves
    those labelled with the key it is given; a tritonshare.io/storage-secret annotation names a
    Secret of KServe's keys instead of the storage key's credential."""
    add_node(kube_api, "n1", [16 * GI])
    core.create_namespace(
        {"metadata": {"name": "moved", "labels": {"tritonshare.io/modelmesh": "true"}}}
    )
    namespace(core, "still-modelmesh")
    custom.create_namespaced_custom_object(
        KSERVE, "v1alpha1", "moved", "servingruntimes", TRITON_2X
    )
    binder = await make_binder(modelmesh_namespace_label="tritonshare.io/modelmesh")
    assert binder.inferenceservices is not None
    create(custom, isvc("left", {"onnx": {"storageUri": "s3://b/left"}}), "still-modelmesh")
    mine = {**MODELMESH, "tritonshare.io/storage-secret": "my-s3"}
    create(custom, isvc("mnist", {"onnx": {"storageUri": "s3://b/mnist"}}, mine), "moved")
    model = await eventually(lambda: tritonmodel(custom, "mnist", "moved"), what="served")
    assert (model["spec"]["storageUri"], model["spec"]["storageSecret"]) == (
        "s3://b/mnist",
        "my-s3",
    )
    assert tritonmodel(custom, "left", "still-modelmesh") is None
    assert not read_isvc(custom, "left", "still-modelmesh").get("status")


async def test_a_tritonmodel_of_the_name_it_does_not_own_is_left_and_said(
    binder: Binder, custom: Any, core: Any
) -> None:
    theirs = {
        "apiVersion": "tritonshare.io/v1alpha1",
        "kind": "TritonModel",
        "metadata": {"name": "taken"},
        "spec": {"storageUri": "s3://b/theirs", "gpuMemory": "1Gi", "replicas": 0},
    }
    custom.create_namespaced_custom_object(*MODELS[:2], NS, MODELS[2], theirs)
    create(custom, isvc("taken", {"onnx": {"storageUri": "s3://b/mine"}}))
    failure = await eventually(
        lambda: model_status(custom, "taken").get("lastFailureInfo"), what="the refusal"
    )
    assert failure["reason"] == "InvalidPredictorSpec"
    assert "is not this InferenceService's" in failure["message"]
    model = tritonmodel(custom, "taken")
    assert model is not None and model["spec"]["storageUri"] == "s3://b/theirs"


async def test_a_model_that_fails_to_load_reads_blocked_by_failed_load(
    binder: Binder, custom: Any, core: Any
) -> None:
    create(custom, isvc("broken", {"onnx": {"storageUri": "s3://b/broken"}}))

    def placed() -> dict[str, Any] | None:
        entries = ((tritonmodel(custom, "broken") or {}).get("status") or {}).get("placements")
        return entries[0] if entries else None

    entry = await eventually(placed, what="its replica placed")
    await eventually(lambda: _has_host(core, entry["host"]), what="the host pod")
    set_loaded(core, entry["host"], "broken", "False", "FetchFailed")
    ms = await eventually(
        lambda: (
            model_status(custom, "broken").get("transitionStatus") == "BlockedByFailedLoad"
            and model_status(custom, "broken")
        ),
        what="BlockedByFailedLoad",
    )
    assert ms["states"]["activeModelState"] == "FailedToLoad"
    assert ms["lastFailureInfo"]["reason"] == "ModelLoadFailed"
    assert "could not be read" in ms["lastFailureInfo"]["message"]
    assert conditions(read_isvc(custom, "broken"))["Ready"] == ("False", "ModelLoadFailed")
