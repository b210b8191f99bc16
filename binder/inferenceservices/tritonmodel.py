"""The TritonModel an InferenceService becomes: same name, same namespace, owned by it
(`ownerReferences`, controller: true, so deleting the InferenceService deletes it), its files
(`storageUri`, the S3 settings as its `s3-*` annotations, `storageSecret`) and its GPU memory
(the InferenceService's `tritonshare.io/gpu-memory` annotation, else the binder's first
estimate). The InferenceService's spec owns these fields: a change there is patched here; the
TritonModel's `replicas` is set at creation and left to whatever scales it since. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from binder.inferenceservices.predictor import InvalidSpecError
from binder.inferenceservices.storage import Files
from common.quantity import QuantityError, parse_quantity

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
    gpu_memory: str


def gpu_memory_of(obj: Mapping[str, Any], annotation: str, default: str) -> str:
    """The InferenceService's GPU memory: its `annotation`, else `default`; InvalidSpecError when
    the annotation is no quantity of at least 64Mi."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    value = str(annotations.get(annotation) or "").strip()
    if not value:
        return default
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
    return {prefix + option: given.get(option) for option in S3_OPTIONS}


def _spec(wanted: Wanted) -> dict[str, Any]:
    return {
        "storageUri": wanted.files.uri,
        "gpuMemory": wanted.gpu_memory,
        "storageSecret": wanted.storage_secret,
    }


def new_model(obj: Mapping[str, Any], wanted: Wanted, prefix: str) -> dict[str, Any]:
    """The TritonModel to create for the InferenceService."""
    meta = obj["metadata"]
    annotations = {k: v for k, v in _annotations(wanted, prefix).items() if v is not None}
    spec = {k: v for k, v in _spec(wanted).items() if v is not None}
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
        "spec": {**spec, "replicas": 1},
    }


def patch_for(model: Mapping[str, Any], wanted: Wanted, prefix: str) -> dict[str, Any] | None:
    """The merge patch that brings the TritonModel to `wanted` (None: it is there)."""
    patch: dict[str, Any] = {}
    spec = model.get("spec") or {}
    changed = {k: v for k, v in _spec(wanted).items() if spec.get(k) != v}
    if changed:
        patch["spec"] = changed
    annotations = (model.get("metadata") or {}).get("annotations") or {}
    moved = {k: v for k, v in _annotations(wanted, prefix).items() if annotations.get(k) != v}
    if moved:
        patch["metadata"] = {"annotations": moved}
    return patch or None
