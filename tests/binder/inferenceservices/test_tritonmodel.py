"""The TritonModel an InferenceService becomes: owned by it, its files, GPU memory and, on the
opt-in annotation, the scaling fields ModelMesh ignores; patched only where its spec differs."""

from __future__ import annotations

from typing import Any

import pytest

from binder.inferenceservices.predictor import InvalidSpecError
from binder.inferenceservices.storage import Files
from binder.inferenceservices.tritonmodel import (
    Scaling,
    Wanted,
    gpu_memory_of,
    new_model,
    patch_for,
    scaling_of,
)

P = "tritonshare.io/"
OPT_IN = f"{P}autoscaling"


def isvc(predictor: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": "m", "namespace": "ns", "uid": "u-1", "annotations": annotations},
        "spec": {"predictor": predictor},
    }


def test_the_new_model_is_owned_and_carries_files_secret_and_settings() -> None:
    files = Files("s3://b/m", (("s3-endpoint", "minio:9000"),))
    model = new_model(isvc({}, {}), Wanted(files, "creds", "1Gi"), P)
    assert model["metadata"]["ownerReferences"] == [
        {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "name": "m",
         "uid": "u-1", "controller": True}
    ]  # fmt: skip
    assert model["metadata"]["annotations"] == {f"{P}s3-endpoint": "minio:9000"}
    assert model["spec"] == {
        "storageUri": "s3://b/m", "gpuMemory": "1Gi", "storageSecret": "creds", "replicas": 1
    }  # fmt: skip


def test_a_patch_names_only_what_changed_and_removes_what_went() -> None:
    before = Wanted(Files("s3://b/m", (("s3-region", "eu-west-1"),)), "creds", "1Gi")
    model = new_model(isvc({}, {}), before, P)
    assert patch_for(model, before, P) is None
    after = Wanted(Files("s3://b/m2"), None, "2Gi")
    assert patch_for(model, after, P) == {
        "spec": {"storageUri": "s3://b/m2", "gpuMemory": "2Gi", "storageSecret": None},
        "metadata": {"annotations": {f"{P}s3-region": None}},
    }


def test_scaling_is_honoured_only_on_the_opt_in() -> None:
    predictor = {"minReplicas": 2, "maxReplicas": 6, "scaleMetric": "rps", "scaleTarget": 40,
                 "containerConcurrency": 8, "onnx": {"storageUri": "s3://b/m"}}  # fmt: skip
    assert scaling_of(isvc(predictor, {}), OPT_IN) is None
    scaling = scaling_of(isvc(predictor, {OPT_IN: "true"}), OPT_IN)
    assert scaling == Scaling(
        {"metric": "rps", "target": 40.0, "minReplicas": 2, "maxReplicas": 6}, 2, 8
    )
    knative = scaling_of(
        isvc({"onnx": {}}, {OPT_IN: "true", "autoscaling.knative.dev/target": "5"}), OPT_IN
    )
    assert knative == Scaling({"metric": "concurrency", "target": 5.0, "minReplicas": 1}, 1, None)
    model = new_model(isvc({}, {}), Wanted(Files("s3://b/m"), None, "1Gi", scaling), P)
    assert (model["spec"]["replicas"], model["spec"]["maxConcurrency"]) == (2, 8)
    # The CRD's defaults in the stored autoscaling are not a difference.
    model["spec"]["autoscaling"] = {**model["spec"]["autoscaling"], "window": "60s"}
    assert patch_for(model, Wanted(Files("s3://b/m"), None, "1Gi", scaling), P) is None
    off = patch_for(model, Wanted(Files("s3://b/m"), None, "1Gi"), P)
    assert off == {"spec": {"autoscaling": None, "maxConcurrency": None}}


@pytest.mark.parametrize(
    ("predictor", "annotations", "words"),
    [
        ({"scaleMetric": "cpu", "scaleTarget": 50}, {}, "scaleMetric cpu"),
        ({}, {}, "needs a target"),
        ({"scaleTarget": 1, "minReplicas": 3, "maxReplicas": 2}, {}, "under minReplicas"),
        ({"scaleTarget": 1, "minReplicas": -1}, {}, "0 or more"),
    ],
)
def test_scaling_it_cannot_honour_is_refused(
    predictor: dict[str, Any], annotations: dict[str, str], words: str
) -> None:
    with pytest.raises(InvalidSpecError, match=words):
        scaling_of(isvc(predictor, {OPT_IN: "true", **annotations}), OPT_IN)


@pytest.mark.parametrize(("value", "words"), [("lots", "not a quantity"), ("1Mi", "under 64Mi")])
def test_a_gpu_memory_annotation_must_be_a_quantity_of_64mi_or_more(value: str, words: str) -> None:
    assert gpu_memory_of(isvc({}, {f"{P}gpu-memory": "3Gi"}), f"{P}gpu-memory") == "3Gi"
    with pytest.raises(InvalidSpecError, match=words):
        gpu_memory_of(isvc({}, {f"{P}gpu-memory": value}), f"{P}gpu-memory")


def test_without_the_annotation_the_model_declares_no_gpu_memory_and_an_old_guess_goes() -> None:
    """No annotation: the TritonModel has no spec.gpuMemory (the binder learns it); one made
    with the binder's old guess written in its spec loses it."""
    assert gpu_memory_of(isvc({}, {}), f"{P}gpu-memory") is None
    learned = Wanted(Files("s3://b/m"), None, None)
    model = new_model(isvc({}, {}), learned, P)
    assert "gpuMemory" not in model["spec"]
    assert patch_for(model, learned, P) is None
    guessed = new_model(isvc({}, {}), Wanted(Files("s3://b/m"), None, "1Gi"), P)
    assert patch_for(guessed, learned, P) == {"spec": {"gpuMemory": None}}


def test_the_schema_path_is_an_annotation_of_the_model_and_follows_the_spec() -> None:
    with_schema = Wanted(Files("s3://b/m", schema_path="onnx/schema.json"), None, "1Gi")
    model = new_model(isvc({}, {}), with_schema, P)
    assert model["metadata"]["annotations"] == {f"{P}schema-path": "onnx/schema.json"}
    without = Wanted(Files("s3://b/m"), None, "1Gi")
    assert patch_for(model, without, P) == {"metadata": {"annotations": {f"{P}schema-path": None}}}
