"""An InferenceService's predictor as ModelMesh reads it: the model's format, its runtime, where
its files are, and every spec ModelMesh refuses, refused here with ModelMesh's reason
(`InvalidPredictorSpec`) and a message that says what to write instead.

Both forms are read: `predictor.model` (`modelFormat`, `runtime`, `storageUri` or `storage`,
`protocolVersion`) and the older `predictor.<framework>` (`onnx`, `tensorflow`, ...), with the
annotations `serving.kserve.io/secretKey` (the storage key of a `storageUri`) and
`serving.kserve.io/schemaPath`. The fields ModelMesh ignores (resources, replicas, scaling,
`autoscaling.knative.dev/*`) are accepted and ignored. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MODELMESH = "ModelMesh"
DEPLOYMENT_MODE = "serving.kserve.io/deploymentMode"
SECRET_KEY = "serving.kserve.io/secretKey"  # noqa: S105 (an annotation name)
SCHEMA_PATH = "serving.kserve.io/schemaPath"
INVALID_PREDICTOR_SPEC = "InvalidPredictorSpec"

FRAMEWORKS = (
    "onnx",
    "tensorflow",
    "pytorch",
    "sklearn",
    "xgboost",
    "lightgbm",
    "triton",
    "pmml",
    "paddle",
    "huggingface",
)
"""KServe's framework predictors (`predictor.<framework>`); each names its model format."""

SCHEMES = ("s3", "gs", "https")
"""The storageUri schemes a TritonModel fetches."""
_SCHEME_ADVICE = {
    "http": "http:// is not fetched (the files would travel unauthenticated and in clear): "
    "publish them over https://, or use s3:// or gs://",
    "pvc": "pvc:// is not served by model hosts: copy the files to s3://, gs:// or https://",
}


class InvalidSpecError(ValueError):
    """A spec ModelMesh refuses; `reason` is ModelMesh's, the message says what to fix."""

    def __init__(self, message: str, reason: str = INVALID_PREDICTOR_SPEC) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class ModelFormat:
    name: str
    version: str | None = None

    def __str__(self) -> str:
        return self.name if self.version is None else f"{self.name} (version {self.version})"


@dataclass(frozen=True)
class Storage:
    """Where the files are: a `uri`, or a storage `key` of the namespace's storage-config
    Secret and a `path` in it; `key` also names the credential of a `uri`."""

    uri: str | None = None
    key: str | None = None
    path: str | None = None
    parameters: tuple[tuple[str, str], ...] = ()
    schema_path: str | None = None

    @property
    def scheme(self) -> str:
        return self.uri.partition("://")[0] if self.uri else ""


@dataclass(frozen=True)
class Predictor:
    format: ModelFormat
    runtime: str | None
    storage: Storage
    protocol: str | None = None


def deployment_mode(obj: Mapping[str, Any], default: str) -> str:
    """The InferenceService's deployment mode: its annotation, else the cluster's default."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(DEPLOYMENT_MODE) or default)


def parse(obj: Mapping[str, Any]) -> Predictor:
    """The predictor of an InferenceService, or InvalidSpecError."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    predictor = (obj.get("spec") or {}).get("predictor")
    if not isinstance(predictor, dict):
        raise InvalidSpecError("spec.predictor is required: write spec.predictor.model")
    frameworks = [f for f in FRAMEWORKS if predictor.get(f) is not None]
    model = predictor.get("model")
    if model is not None and frameworks:
        raise InvalidSpecError(
            f"spec.predictor has both model and {frameworks[0]}: write only "
            f"spec.predictor.model (modelFormat.name: {frameworks[0]})"
        )
    if len(frameworks) > 1:
        raise InvalidSpecError(
            f"spec.predictor has {' and '.join(frameworks)}: an InferenceService serves one "
            "model; write one of them, or spec.predictor.model"
        )
    if predictor.get("containers"):
        raise InvalidSpecError(
            "spec.predictor.containers (a custom predictor) is not served in ModelMesh mode: "
            "write spec.predictor.model with a modelFormat"
        )
    if model is not None:
        if not isinstance(model, dict):
            raise InvalidSpecError("spec.predictor.model must be an object")
        form = model.get("modelFormat") or {}
        name = str(form.get("name") or "").strip().lower() if isinstance(form, dict) else ""
        if not name:
            raise InvalidSpecError(
                "spec.predictor.model.modelFormat.name is required (such as onnx)"
            )
        version = form.get("version")
        model_format = ModelFormat(name, str(version) if version not in (None, "") else None)
        runtime = str(model["runtime"]) if model.get("runtime") else None
        body, where = model, "spec.predictor.model"
    elif frameworks:
        body = predictor[frameworks[0]]
        if not isinstance(body, dict):
            raise InvalidSpecError(f"spec.predictor.{frameworks[0]} must be an object")
        model_format, runtime, where = (
            ModelFormat(frameworks[0]),
            None,
            f"spec.predictor.{frameworks[0]}",
        )
    else:
        raise InvalidSpecError(
            "spec.predictor names no model: write spec.predictor.model with modelFormat and "
            "storageUri (or storage.key and storage.path)"
        )
    protocol = body.get("protocolVersion") or predictor.get("protocolVersion")
    if protocol is not None and str(protocol) == "v1":
        raise InvalidSpecError(
            f"{where}.protocolVersion v1 is not served: ModelMesh and Triton serve the v2 "
            "(KServe v2 gRPC and REST) protocol; write grpc-v2 or leave it out"
        )
    return Predictor(
        model_format, runtime, _storage(body, where, annotations), str(protocol or "") or None
    )


def _storage(body: Mapping[str, Any], where: str, annotations: Mapping[str, Any]) -> Storage:
    uri = str(body.get("storageUri") or "").strip() or None
    storage = body.get("storage")
    if storage is not None and not isinstance(storage, dict):
        raise InvalidSpecError(f"{where}.storage must be an object")
    storage = storage or {}
    path = str(storage.get("path") or "").strip() or None
    key = str(storage.get("key") or annotations.get(SECRET_KEY) or "").strip() or None
    raw = storage.get("parameters") or {}
    if not isinstance(raw, dict):
        raise InvalidSpecError(f"{where}.storage.parameters must be an object of strings")
    parameters = tuple(sorted((str(k), str(v)) for k, v in raw.items()))
    schema = str(storage.get("schemaPath") or annotations.get(SCHEMA_PATH) or "") or None
    if uri and path:
        raise InvalidSpecError(
            f"{where} has both storageUri and storage.path: write one of them (storageUri, or "
            "storage.key and storage.path)"
        )
    if not uri and not path:
        raise InvalidSpecError(
            f"{where} names no storage: write storageUri (s3://, gs:// or https://), or "
            "storage.key and storage.path"
        )
    if uri:
        scheme, sep, rest = uri.partition("://")
        if not sep or not rest.split("/", 1)[0]:
            raise InvalidSpecError(
                f"{where}.storageUri {uri!r} is not a URI: write s3://BUCKET/PATH, "
                "gs://BUCKET/PATH or https://HOST/PATH"
            )
        if scheme not in SCHEMES:
            advice = _SCHEME_ADVICE.get(
                scheme, "write s3://BUCKET/PATH, gs://BUCKET/PATH or https://HOST/PATH"
            )
            raise InvalidSpecError(f"{where}.storageUri scheme {scheme}:// is not served: {advice}")
    return Storage(uri=uri, key=key, path=path, parameters=parameters, schema_path=schema)
