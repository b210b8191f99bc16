"""An InferenceService's predictor as ModelMesh reads it: both spec forms, the annotations, the
fields ModelMesh ignores, and every invalid spec with ModelMesh's reason."""

from __future__ import annotations

from typing import Any

import pytest

from binder.inferenceservices.predictor import (
    INVALID_PREDICTOR_SPEC,
    InvalidSpecError,
    ModelFormat,
    Storage,
    deployment_mode,
    parse,
)


def isvc(predictor: Any, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "m", "namespace": "ns", "annotations": annotations or {}},
        "spec": {"predictor": predictor},
    }


def test_the_model_form() -> None:
    predictor = parse(
        isvc(
            {
                "model": {
                    "modelFormat": {"name": "ONNX", "version": "1"},
                    "runtime": "triton-2.x",
                    "storage": {
                        "key": "localMinIO",
                        "path": "onnx/mnist.onnx",
                        "parameters": {"bucket": "b"},
                        "schemaPath": "schema.json",
                    },
                    "protocolVersion": "grpc-v2",
                }
            }
        )
    )
    assert predictor.format == ModelFormat("onnx", "1")
    assert predictor.runtime == "triton-2.x"
    assert predictor.protocol == "grpc-v2"
    assert predictor.storage == Storage(
        key="localMinIO", path="onnx/mnist.onnx", parameters=(("bucket", "b"),),
        schema_path="schema.json",
    )  # fmt: skip


def test_the_framework_form_with_the_annotations_and_the_ignored_fields() -> None:
    annotations = {
        "serving.kserve.io/secretKey": "localMinIO",
        "serving.kserve.io/schemaPath": "s.json",
        "autoscaling.knative.dev/target": "10",
    }
    predictor = parse(
        isvc(
            {
                "minReplicas": 2,
                "maxReplicas": 4,
                "scaleMetric": "concurrency",
                "containerConcurrency": 8,
                "tensorflow": {
                    "storageUri": "s3://bucket/tf/model",
                    "resources": {"limits": {"cpu": "2", "memory": "4Gi"}},
                },
            },
            annotations,
        )
    )
    assert predictor.format == ModelFormat("tensorflow")
    assert predictor.runtime is None
    assert predictor.storage == Storage(
        uri="s3://bucket/tf/model", key="localMinIO", schema_path="s.json"
    )


@pytest.mark.parametrize(
    ("predictor", "words"),
    [
        (None, "spec.predictor is required"),
        (
            {"model": {"modelFormat": {"name": "onnx"}, "storageUri": "s3://b/m"},
             "onnx": {"storageUri": "s3://b/m"}},
            "both model and onnx",
        ),
        ({"onnx": {"storageUri": "s3://b/m"}, "pytorch": {"storageUri": "s3://b/m"}},
         "onnx and pytorch"),
        ({"model": {"modelFormat": {"name": "onnx"}, "storageUri": "s3://b/m",
                    "storage": {"key": "k", "path": "p"}}},
         "both storageUri and storage.path"),
        ({"onnx": {"storageUri": "hdfs://b/m"}}, "scheme hdfs:// is not served"),
        ({"onnx": {"storageUri": "http://host/m"}}, "publish them over https://"),
        ({"onnx": {"storageUri": "pvc://claim/m"}}, "pvc:// is not served"),
        ({"onnx": {"storageUri": "s3:/b"}}, "is not a URI"),
        ({"model": {"modelFormat": {"name": "onnx"}}}, "names no storage"),
        ({"onnx": {}}, "names no storage"),
        ({"model": {"storageUri": "s3://b/m"}}, "modelFormat.name is required"),
        ({"minReplicas": 1}, "names no model"),
        ({"containers": [{"name": "c", "image": "i"}]}, "custom predictor"),
        ({"onnx": {"storageUri": "s3://b/m", "protocolVersion": "v1"}}, "v1 is not served"),
    ],
)  # fmt: skip
def test_every_invalid_spec_is_refused_with_modelmeshs_reason(predictor: Any, words: str) -> None:
    with pytest.raises(InvalidSpecError) as refused:
        parse(isvc(predictor))
    assert refused.value.reason == INVALID_PREDICTOR_SPEC
    assert words in refused.value.message


def test_the_deployment_mode_is_the_annotation_else_the_default() -> None:
    annotated = isvc({}, {"serving.kserve.io/deploymentMode": "ModelMesh"})
    assert deployment_mode(annotated, "Serverless") == "ModelMesh"
    assert deployment_mode(isvc({}), "ModelMesh") == "ModelMesh"
    assert deployment_mode(isvc({}), "Serverless") == "Serverless"
