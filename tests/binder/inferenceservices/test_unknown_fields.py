"""An InferenceService's unknown field, with tritonshare's KServe CRDs (deploy/kserve-crds) on the
simulated API server, through the official client, as KServe's own CRDs have the API server
treat it: `fieldValidation=Strict` (kubectl's default: `kubectl apply` fails) refuses it in the
server's words, naming it; without the parameter it is dropped with a Warning, as structural
pruning drops it; every field KServe declares, ModelMesh's ignored ones among them, is kept as
written."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiException

from tests.binder.inferenceservices import test_inferenceservices as isvcs
from tests.conftest import require_executable

apiserver = isvcs.apiserver
custom = isvcs.custom
KSERVE, VERSION, PLURAL = isvcs.KSERVE, isvcs.ISVC_VERSION, isvcs.ISVCS


@pytest.fixture(autouse=True)
def namespace(core: Any) -> None:
    isvcs.namespace(core, isvcs.NS)


def _typo(where: str) -> dict[str, Any]:
    """ModelMesh's example with one misspelt field at `where`."""
    body = isvcs.isvc("typo", copy.deepcopy(isvcs.MNIST))
    spec = body["spec"]
    if where == "spec.predicter":
        spec["predicter"] = spec["predictor"]
    elif where == "spec.predictor.model.stroageUri":
        spec["predictor"]["model"]["stroageUri"] = "s3://bucket/onnx/mnist.onnx"
    elif where == "spec.predictor.model.storage.bucket":
        spec["predictor"]["model"]["storage"]["bucket"] = "modelmesh-example-models"
    elif where == "spec.predictor.onnx.storageURI":
        spec["predictor"] = {"onnx": {"storageURI": "s3://bucket/onnx/mnist.onnx"}}
    elif where == "spec.predictor.minReplica":
        spec["predictor"]["minReplica"] = 2
    return body


@pytest.mark.parametrize(
    "where",
    [
        "spec.predicter",
        "spec.predictor.model.stroageUri",
        "spec.predictor.model.storage.bucket",
        "spec.predictor.onnx.storageURI",
        "spec.predictor.minReplica",
    ],
)
def test_strict_refuses_an_unknown_field_naming_it(custom: Any, where: str) -> None:
    with pytest.raises(ApiException) as refused:
        custom.create_namespaced_custom_object(
            KSERVE, VERSION, isvcs.NS, PLURAL, _typo(where), field_validation="Strict"
        )
    assert refused.value.status == 400
    message = json.loads(refused.value.body or "{}")["message"]
    assert message.endswith(f'strict decoding error: unknown field "{where}"'), message
    with pytest.raises(ApiException) as missing:
        custom.get_namespaced_custom_object(KSERVE, VERSION, isvcs.NS, PLURAL, "typo")
    assert missing.value.status == 404, "a refused create stores nothing"


def test_kubectl_apply_refuses_it_as_it_does_with_kserves_crds(kubeconfig: Path) -> None:
    """kubectl asks for Strict field validation by default (since 1.27)."""
    manifest = kubeconfig.parent / "typo.yaml"
    body = _typo("spec.predictor.model.stroageUri")
    body["metadata"]["namespace"] = isvcs.NS
    manifest.write_text(yaml.safe_dump(body))
    kubectl = require_executable("kubectl")
    applied = subprocess.run(
        [kubectl, "--kubeconfig", str(kubeconfig), "apply", "-f", str(manifest)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert applied.returncode == 1, applied.stdout
    assert (
        'strict decoding error: unknown field "spec.predictor.model.stroageUri"' in applied.stderr
    ), applied.stderr


def test_without_strict_the_field_is_dropped_with_a_warning(custom: Any) -> None:
    where = "spec.predictor.model.stroageUri"
    _, code, headers = custom.create_namespaced_custom_object_with_http_info(
        KSERVE, VERSION, isvcs.NS, PLURAL, _typo(where)
    )
    assert code == 201
    assert headers["Warning"] == f'299 - "unknown field \\"{where}\\""'
    stored = custom.get_namespaced_custom_object(KSERVE, VERSION, isvcs.NS, PLURAL, "typo")
    assert "stroageUri" not in stored["spec"]["predictor"]["model"]


def test_every_field_kserve_declares_is_kept(custom: Any) -> None:
    model = {
        "modelFormat": {"name": "onnx", "version": "1"},
        "runtime": "triton-2.x",
        "protocolVersion": "v2",
        "storage": {
            "key": "localMinIO",
            "path": "onnx/mnist.onnx",
            "schemaPath": "schema/mnist.json",
            "parameters": {"bucket": "modelmesh-example-models"},
        },
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
        "env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "args": ["--x"],
    }
    predictor = {
        "model": model,
        "minReplicas": 1,
        "maxReplicas": 3,
        "scaleMetric": "concurrency",
        "scaleTarget": 5,
        "containerConcurrency": 4,
        "timeout": 60,
        "serviceAccountName": "sa",
        "nodeSelector": {"pool": "gpu"},
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
    }
    annotations = {**isvcs.MODELMESH, "autoscaling.knative.dev/target": "5"}
    body = isvcs.isvc("full", predictor, annotations)
    body["spec"]["transformer"] = {"containers": [{"name": "t", "image": "t:1"}]}
    _, code, headers = custom.create_namespaced_custom_object_with_http_info(
        KSERVE, VERSION, isvcs.NS, PLURAL, body, field_validation="Strict"
    )
    assert code == 201 and "Warning" not in headers
    stored = custom.get_namespaced_custom_object(KSERVE, VERSION, isvcs.NS, PLURAL, "full")
    assert stored["spec"] == body["spec"]
