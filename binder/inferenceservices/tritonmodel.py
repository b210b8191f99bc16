"""The TritonModel an InferenceService becomes: same name, same namespace, owned by it
(`ownerReferences`, controller: true, so deleting the InferenceService deletes it), its files
(`storageUri`, the S3 settings as its `s3-*` annotations, the schema's path as its
`schema-path` one, `storageSecret`) and its GPU memory
(the InferenceService's `tritonshare.io/gpu-memory` annotation; without it none, so the binder
books the model at its first estimate, then by what it measured: `binder.cluster.modelsizes`),
and, on the InferenceService's `tritonshare.io/autoscaling: "true"`, the scaling
fields ModelMesh ignores (`Scaling`). The InferenceService's spec owns these fields: a change
there is patched here; the TritonModel's `replicas` is set at creation and left to whatever
scales it since. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from binder.inferenceservices.predictor import InvalidSpecError
from binder.inferenceservices.storage import Files
from common.quantity import QuantityError, parse_quantity
from common.storage import SCHEMA_OPTION

API_VERSION = "serving.kserve.io/v1beta1"
KIND = "InferenceService"
MODEL_API_VERSION = "tritonshare.io/v1alpha1"
ISVC_LABEL = "serving.kserve.io/inferenceservice"
S3_OPTIONS = ("s3-endpoint", "s3-usehttps", "s3-region")
MIN_GPU_MEMORY = 64 << 20
"""The least a TritonModel's spec.gpuMemory may be (its CRD's rule)."""


@dataclass(frozen=True)
class Wanted:
    """What the InferenceService asks of its TritonModel."""

    files: Files
    storage_secret: str | None
    gpu_memory: str | None
    """The annotation's declared size; None: learned (`binder.cluster.modelsizes`)."""
    scaling: Scaling | None = None
    """The scaling fields ModelMesh ignores, honoured on the InferenceService's opt-in."""


@dataclass(frozen=True)
class Scaling:
    """What a TritonModel takes of KServe's scaling fields: its built-in autoscaler
    (`spec.autoscaling`), its first replicas, and `containerConcurrency` as `maxConcurrency`."""

    autoscaling: dict[str, Any]
    replicas: int
    max_concurrency: int | None


KNATIVE_TARGET = "autoscaling.knative.dev/target"


def scaling_of(obj: Mapping[str, Any], annotation: str) -> Scaling | None:
    """With `annotation` "true" on the InferenceService, its predictor's `minReplicas`,
    `maxReplicas`, `scaleMetric` (concurrency or rps), `scaleTarget` (or Knative's target
    annotation) and `containerConcurrency` as the TritonModel's; None without it.
    InvalidSpecError when what it says cannot be honoured."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    if str(annotations.get(annotation) or "").lower() != "true":
        return None
    predictor = (obj.get("spec") or {}).get("predictor") or {}
    metric = str(predictor.get("scaleMetric") or "concurrency")
    if metric not in ("concurrency", "rps"):
        raise InvalidSpecError(
            f"scaleMetric {metric} is not served by the built-in autoscaler: write concurrency "
            f"or rps, or remove {annotation}"
        )
    target = predictor.get("scaleTarget") or annotations.get(KNATIVE_TARGET)
    try:
        wanted = float(target) if target is not None else None
    except ValueError:
        wanted = None
    if wanted is None or wanted <= 0:
        raise InvalidSpecError(
            f"{annotation} asks for autoscaling, which needs a target: write "
            f"spec.predictor.scaleTarget (or the {KNATIVE_TARGET} annotation), a number above 0"
        )
    low = _count(predictor, "minReplicas", 1)
    high = _count(predictor, "maxReplicas", 0)
    if high and high < low:
        raise InvalidSpecError(f"maxReplicas {high} is under minReplicas {low}")
    autoscaling: dict[str, Any] = {"metric": metric, "target": wanted, "minReplicas": low}
    if high:
        autoscaling["maxReplicas"] = high
    concurrency = _count(predictor, "containerConcurrency", 0) or None
    return Scaling(autoscaling, max(low, 1), concurrency)


def _count(predictor: Mapping[str, Any], field: str, default: int) -> int:
    value = predictor.get(field, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidSpecError(f"spec.predictor.{field} must be a whole number, 0 or more")
    return value


def gpu_memory_of(obj: Mapping[str, Any], annotation: str) -> str | None:
    """The InferenceService's declared GPU memory: its `annotation`, else None (the TritonModel
    declares none, and the binder learns it: `binder.cluster.modelsizes`); InvalidSpecError when
    the annotation is no quantity of at least 64Mi."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    value = str(annotations.get(annotation) or "").strip()
    if not value:
        return None
    try:
        size = parse_quantity(value, what=annotation)
    except QuantityError as e:
        raise InvalidSpecError(
            f"annotation {annotation}={value!r} is not a quantity (such as 2Gi): {e}"
        ) from e
    if size < MIN_GPU_MEMORY:
        raise InvalidSpecError(
            f"annotation {annotation}={value!r} is under 64Mi, the least a model may ask"
        )
    return value


def owner_reference(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
    }


def owner_of(model: Mapping[str, Any]) -> str | None:
    """The name of the InferenceService that controls the TritonModel, or None."""
    for ref in (model.get("metadata") or {}).get("ownerReferences") or []:
        if (
            ref.get("controller")
            and ref.get("kind") == KIND
            and ref.get("apiVersion", "").startswith("serving.kserve.io/")
        ):
            return str(ref.get("name") or "") or None
    return None


def controlled_by(model: Mapping[str, Any], obj: Mapping[str, Any]) -> bool:
    uid = obj["metadata"]["uid"]
    return any(
        ref.get("controller") and ref.get("uid") == uid
        for ref in (model.get("metadata") or {}).get("ownerReferences") or []
    )


def _annotations(wanted: Wanted, prefix: str) -> dict[str, str | None]:
    given = dict(wanted.files.s3)
    annotations = {prefix + option: given.get(option) for option in S3_OPTIONS}
    annotations[prefix + SCHEMA_OPTION] = wanted.files.schema_path or None
    return annotations


def _spec(wanted: Wanted) -> dict[str, Any]:
    scaling = wanted.scaling
    return {
        "storageUri": wanted.files.uri,
        "gpuMemory": wanted.gpu_memory,
        "storageSecret": wanted.storage_secret,
        "autoscaling": scaling.autoscaling if scaling is not None else None,
        "maxConcurrency": scaling.max_concurrency if scaling is not None else None,
    }


def _differs(current: Any, wanted: Any) -> bool:
    """Whether `current` lacks what `wanted` says (an object: only the fields `wanted` sets, the
    ones the CRD defaults left alone)."""
    if isinstance(wanted, dict) and isinstance(current, dict):
        return any(_differs(current.get(k), v) for k, v in wanted.items())
    return bool(current != wanted)


def new_model(obj: Mapping[str, Any], wanted: Wanted, prefix: str) -> dict[str, Any]:
    """The TritonModel to create for the InferenceService."""
    meta = obj["metadata"]
    annotations = {k: v for k, v in _annotations(wanted, prefix).items() if v is not None}
    spec = {k: v for k, v in _spec(wanted).items() if v is not None}
    replicas = wanted.scaling.replicas if wanted.scaling is not None else 1
    return {
        "apiVersion": MODEL_API_VERSION,
        "kind": "TritonModel",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": {ISVC_LABEL: meta["name"]},
            "annotations": annotations,
            "ownerReferences": [owner_reference(obj)],
        },
        "spec": {**spec, "replicas": replicas},
    }


def patch_for(model: Mapping[str, Any], wanted: Wanted, prefix: str) -> dict[str, Any] | None:
    """The merge patch that brings the TritonModel to `wanted` (None: it is there)."""
    patch: dict[str, Any] = {}
    spec = model.get("spec") or {}
    changed = {k: v for k, v in _spec(wanted).items() if _differs(spec.get(k), v)}
    if changed:
        patch["spec"] = changed
    annotations = (model.get("metadata") or {}).get("annotations") or {}
    moved = {k: v for k, v in _annotations(wanted, prefix).items() if annotations.get(k) != v}
    if moved:
        patch["metadata"] = {"annotations": moved}
    return patch or None
