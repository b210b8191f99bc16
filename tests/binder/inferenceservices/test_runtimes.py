"""The runtime chosen as ModelMesh chooses (named; auto-selected by priority, the namespace's
before the cluster's), and what the node's Triton serves."""

from __future__ import annotations

from typing import Any

import pytest

from binder.inferenceservices.predictor import InvalidSpecError, ModelFormat, Predictor, Storage
from binder.inferenceservices.runtimes import (
    NO_SUPPORTING_RUNTIME,
    RUNTIME_NOT_RECOGNIZED,
    Runtime,
    choose,
    runtime_of,
)

TRITON_FORMATS = [
    {"name": "keras", "version": "2", "autoSelect": True},
    {"name": "onnx", "version": "1", "autoSelect": True},
    {"name": "pytorch", "version": "1", "autoSelect": True},
    {"name": "tensorflow", "version": "2", "autoSelect": True},
    {"name": "tensorrt", "version": "7", "autoSelect": True},
]
MLSERVER_FORMATS = [
    {"name": "sklearn", "version": "0", "autoSelect": True},
    {"name": "xgboost", "version": "1", "autoSelect": True},
    {"name": "lightgbm", "version": "3", "autoSelect": True},
]


def runtime(
    name: str,
    formats: list[dict[str, Any]],
    *,
    server: str = "triton",
    multi: bool = True,
    cluster: bool = False,
    disabled: bool = False,
) -> Runtime:
    spec: dict[str, Any] = {"supportedModelFormats": formats, "multiModel": multi}
    if server:
        spec["builtInAdapter"] = {"serverType": server}
    if disabled:
        spec["disabled"] = True
    return runtime_of({"metadata": {"name": name}, "spec": spec}, cluster=cluster)


def predictor(name: str, version: str | None = None, runtime: str | None = None) -> Predictor:
    return Predictor(ModelFormat(name, version), runtime, Storage(uri="s3://b/m"))


def refusal(*args: Any, **kwargs: Any) -> InvalidSpecError:
    with pytest.raises(InvalidSpecError) as refused:
        choose(*args, **kwargs)
    return refused.value


def test_a_named_runtime_must_exist_be_multi_model_and_list_the_format() -> None:
    triton = runtime("triton-2.x", TRITON_FORMATS)
    assert (
        choose(predictor("onnx", runtime="triton-2.x"), [triton], [], tenant_code=False) is triton
    )
    # The namespace's before the cluster's of the same name.
    cluster = runtime("triton-2.x", TRITON_FORMATS, cluster=True)
    assert (
        choose(predictor("onnx", runtime="triton-2.x"), [triton], [cluster], tenant_code=False)
        is triton
    )
    assert (
        choose(predictor("onnx", runtime="triton-2.x"), [], [cluster], tenant_code=False) is cluster
    )

    missing = refusal(predictor("onnx", runtime="nope"), [triton], [], tenant_code=False)
    assert missing.reason == RUNTIME_NOT_RECOGNIZED
    single = runtime("single", TRITON_FORMATS, multi=False)
    one = refusal(predictor("onnx", runtime="single"), [single], [], tenant_code=False)
    assert (one.reason, "not multiModel" in one.message) == (RUNTIME_NOT_RECOGNIZED, True)
    off = runtime("off", TRITON_FORMATS, disabled=True)
    assert refusal(predictor("onnx", runtime="off"), [off], [], tenant_code=False).reason == (
        RUNTIME_NOT_RECOGNIZED
    )
    wrong = refusal(predictor("onnx", "2", runtime="triton-2.x"), [triton], [], tenant_code=False)
    assert (wrong.reason, "does not list" in wrong.message) == (NO_SUPPORTING_RUNTIME, True)


def test_auto_select_takes_the_highest_priority_the_namespaces_first() -> None:
    low = runtime("low", [{"name": "onnx", "autoSelect": True, "priority": 1}])
    high = runtime("high", [{"name": "onnx", "autoSelect": True, "priority": 5}], cluster=True)
    not_auto = runtime("manual", [{"name": "onnx", "priority": 9}])
    assert choose(predictor("onnx"), [low, not_auto], [high], tenant_code=False) is high
    same = runtime("same", [{"name": "onnx", "autoSelect": True, "priority": 1}], cluster=True)
    assert choose(predictor("onnx"), [low], [same], tenant_code=False) is low
    single = runtime("single", [{"name": "onnx", "autoSelect": True, "priority": 9}], multi=False)
    assert choose(predictor("onnx"), [single, low], [], tenant_code=False) is low
    none = refusal(predictor("onnx"), [not_auto], [], tenant_code=False)
    assert none.reason == NO_SUPPORTING_RUNTIME


def test_a_runtime_tritonshare_cannot_serve_is_passed_over_for_one_it_can() -> None:
    mlserver = runtime(
        "mlserver", [{"name": "onnx", "autoSelect": True, "priority": 9}], server="mlserver"
    )
    triton = runtime("triton", TRITON_FORMATS)
    assert choose(predictor("onnx"), [mlserver, triton], [], tenant_code=False) is triton


@pytest.mark.parametrize(
    ("name", "runtimes", "words"),
    [
        ("tensorflow", "triton", "tf2onnx"),
        ("keras", "triton", "tf2onnx"),
        ("sklearn", "mlserver", "skl2onnx"),
        ("xgboost", "mlserver", "onnxmltools"),
        ("lightgbm", "mlserver", "onnxmltools"),
        ("pytorch", "triton", "--tenant-code-namespaces"),
        ("openvino_ir", "ovms", "export the model to ONNX"),
    ],
)
def test_a_format_the_nodes_triton_cannot_serve_is_refused_with_what_to_do(
    name: str, runtimes: str, words: str
) -> None:
    by_name = {
        "triton": runtime("triton-2.x", TRITON_FORMATS),
        "mlserver": runtime("mlserver-1.x", MLSERVER_FORMATS, server="mlserver"),
        "ovms": runtime("ovms-1.x", [{"name": "openvino_ir", "autoSelect": True}], server="ovms"),
    }
    refused = refusal(predictor(name), [by_name[runtimes]], [], tenant_code=False)
    assert refused.reason == NO_SUPPORTING_RUNTIME
    assert words in refused.message


def test_pytorch_is_served_for_a_namespace_allowed_tenant_code() -> None:
    triton = runtime("triton-2.x", TRITON_FORMATS)
    assert choose(predictor("pytorch"), [triton], [], tenant_code=True) is triton


def test_a_triton_model_repository_is_served_by_a_triton_runtime() -> None:
    triton = runtime("triton-2.x", TRITON_FORMATS, cluster=True)
    assert choose(predictor("triton"), [], [triton], tenant_code=False) is triton
