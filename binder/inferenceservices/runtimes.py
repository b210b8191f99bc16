"""Which ServingRuntime serves an InferenceService, chosen as ModelMesh chooses, and whether the
node's Triton can serve its model.

ModelMesh's choice: a named `runtime` must exist (the namespace's ServingRuntime of that name,
else the ClusterServingRuntime), be `multiModel: true`, not be disabled, and list the model's
format (and its version, if the InferenceService gives one) in `supportedModelFormats`; without
a name, the runtimes listing the format with `autoSelect: true` are candidates, highest
`priority` first, the namespace's before the cluster's, then by name. A runtime whose
`builtInAdapter.serverType` is `triton` is served by the node's Triton: its containers and their
resources are never a model's. tritonshare takes the first candidate it can serve.

What the node's Triton serves (`serving`): ONNX and TensorRT everywhere; PyTorch (TorchScript)
and the Python backend only for the namespaces allowed tenant code; a `triton` model repository
(files with their config.pbtxt) everywhere, the agent checking its backend. TensorFlow and Keras
(no TensorFlow backend in the Triton tritonshare runs), scikit-learn, XGBoost and LightGBM (no
FIL backend served) and every other runtime (MLServer, OVMS, TorchServe) are refused with
`NoSupportingRuntime` and how to convert the model. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from binder.inferenceservices.predictor import InvalidSpecError, ModelFormat, Predictor

NO_SUPPORTING_RUNTIME = "NoSupportingRuntime"
RUNTIME_NOT_RECOGNIZED = "RuntimeNotRecognized"
TRITON = "triton"

SERVED = frozenset({"onnx", "tensorrt", "triton"})
"""Formats the node's Triton serves for every namespace (their backends run no tenant code)."""
TENANT_CODE = frozenset({"pytorch", "python"})
"""Formats served only for the namespaces the operator allows tenant code."""
_ADVICE = {
    "tensorflow": "the Triton tritonshare runs has no TensorFlow backend: convert the model "
    "with tf2onnx (python -m tf2onnx.convert --saved-model DIR --output model.onnx) and "
    "write modelFormat onnx",
    "keras": "the Triton tritonshare runs has no TensorFlow backend: convert the model with "
    "tf2onnx (python -m tf2onnx.convert --keras MODEL.h5 --output model.onnx) and write "
    "modelFormat onnx",
    "sklearn": "tritonshare serves no FIL or MLServer backend: convert the model with skl2onnx "
    "and write modelFormat onnx",
    "xgboost": "tritonshare serves no FIL or MLServer backend: convert the model with "
    "onnxmltools (convert_xgboost) and write modelFormat onnx",
    "lightgbm": "tritonshare serves no FIL or MLServer backend: convert the model with "
    "onnxmltools (convert_lightgbm) and write modelFormat onnx",
    "pytorch": "PyTorch models run tenant code inside the shared Triton: export the model "
    "with torch.onnx.export and write modelFormat onnx, or ask the operator to add the "
    "namespace to the binder's --tenant-code-namespaces",
    "python": "Python models run tenant code inside the shared Triton: ask the operator to "
    "add the namespace to the binder's --tenant-code-namespaces",
}


@dataclass(frozen=True)
class Supported:
    """One entry of a runtime's supportedModelFormats."""

    name: str
    version: str | None
    auto_select: bool
    priority: int | None


@dataclass(frozen=True)
class Runtime:
    name: str
    cluster: bool
    """A ClusterServingRuntime (False: the namespace's ServingRuntime)."""
    multi_model: bool
    disabled: bool
    server_type: str
    """builtInAdapter.serverType ("" when none)."""
    formats: tuple[Supported, ...]

    @property
    def kind(self) -> str:
        return "ClusterServingRuntime" if self.cluster else "ServingRuntime"

    def supports(self, model_format: ModelFormat, *, auto: bool) -> Supported | None:
        """The entry that lists the format (and its version, if given); with `auto`, only one
        that may be auto-selected."""
        for entry in self.formats:
            if entry.name != model_format.name or (auto and not entry.auto_select):
                continue
            if model_format.version is not None and entry.version != model_format.version:
                continue
            return entry
        return None


def runtime_of(obj: Mapping[str, Any], *, cluster: bool) -> Runtime:
    """A ServingRuntime or ClusterServingRuntime as the choice reads it."""
    spec = obj.get("spec") or {}
    adapter = spec.get("builtInAdapter") or {}
    formats = []
    for entry in spec.get("supportedModelFormats") or []:
        if not isinstance(entry, dict) or not entry.get("name"):
            continue
        version = entry.get("version")
        priority = entry.get("priority")
        formats.append(
            Supported(
                str(entry["name"]).lower(),
                str(version) if version not in (None, "") else None,
                bool(entry.get("autoSelect")),
                int(priority) if isinstance(priority, int) else None,
            )
        )
    return Runtime(
        name=str((obj.get("metadata") or {}).get("name", "")),
        cluster=cluster,
        multi_model=bool(spec.get("multiModel")),
        disabled=bool(spec.get("disabled")),
        server_type=str(adapter.get("serverType") or "") if isinstance(adapter, dict) else "",
        formats=tuple(formats),
    )


def choose(
    predictor: Predictor,
    namespaced: Iterable[Runtime],
    cluster: Iterable[Runtime],
    *,
    tenant_code: bool,
) -> Runtime:
    """The runtime that serves the predictor, or InvalidSpecError with ModelMesh's reason
    (RuntimeNotRecognized, NoSupportingRuntime) and what to do."""
    namespaced, cluster = list(namespaced), list(cluster)
    model_format = predictor.format
    if predictor.runtime is not None:
        named = next((r for r in namespaced if r.name == predictor.runtime), None) or next(
            (r for r in cluster if r.name == predictor.runtime), None
        )
        if named is None:
            raise InvalidSpecError(
                f"runtime {predictor.runtime} is neither a ServingRuntime of the namespace nor a "
                "ClusterServingRuntime: create it, or leave spec.predictor.model.runtime out "
                "to have one chosen",
                RUNTIME_NOT_RECOGNIZED,
            )
        if not named.multi_model or named.disabled:
            why = "disabled" if named.disabled else "not multiModel: true"
            raise InvalidSpecError(
                f"{named.kind} {named.name} is {why}: ModelMesh serves only enabled "
                "multi-model runtimes",
                RUNTIME_NOT_RECOGNIZED,
            )
        if named.supports(model_format, auto=False) is None and not _repository(
            model_format, named
        ):
            raise InvalidSpecError(
                f"{named.kind} {named.name} does not list model format {model_format} in "
                "supportedModelFormats",
                NO_SUPPORTING_RUNTIME,
            )
        serving(model_format, named, tenant_code=tenant_code)
        return named
    candidates = _candidates(model_format, namespaced, cluster)
    if not candidates:
        raise InvalidSpecError(
            f"no ServingRuntime or ClusterServingRuntime auto-selects model format "
            f"{model_format}: {_advice(model_format) or 'name a runtime that lists it'}",
            NO_SUPPORTING_RUNTIME,
        )
    refused: InvalidSpecError | None = None
    for runtime in candidates:
        try:
            serving(model_format, runtime, tenant_code=tenant_code)
        except InvalidSpecError as e:
            refused = refused or e
            continue
        return runtime
    assert refused is not None
    raise refused


def _candidates(
    model_format: ModelFormat, namespaced: list[Runtime], cluster: list[Runtime]
) -> list[Runtime]:
    """The auto-selectable runtimes for the format, in ModelMesh's order; for a `triton` model
    repository, which no runtime lists, the Triton runtimes."""
    ranked: list[tuple[int, int, str, Runtime]] = []
    for scope, runtimes in enumerate((namespaced, cluster)):
        for runtime in runtimes:
            if not runtime.multi_model or runtime.disabled:
                continue
            entry = runtime.supports(model_format, auto=True)
            if entry is None and not _repository(model_format, runtime):
                continue
            priority = entry.priority if entry is not None and entry.priority is not None else 0
            ranked.append((-priority, scope, runtime.name, runtime))
    return [r for *_, r in sorted(ranked, key=lambda x: x[:3])]


def _repository(model_format: ModelFormat, runtime: Runtime) -> bool:
    """A `triton` model repository is served by a Triton runtime whatever formats it lists."""
    return model_format.name == TRITON and runtime.server_type == TRITON


def _advice(model_format: ModelFormat) -> str:
    return _ADVICE.get(model_format.name, "")


def serving(model_format: ModelFormat, runtime: Runtime, *, tenant_code: bool) -> None:
    """Nothing when the node's Triton serves the format under `runtime`; else InvalidSpecError
    (NoSupportingRuntime) saying what to do."""
    if runtime.server_type != TRITON:
        served_by = runtime.server_type or "its own containers"
        raise InvalidSpecError(
            f"{runtime.kind} {runtime.name} serves with {served_by}: tritonshare serves only "
            f"Triton runtimes (builtInAdapter.serverType triton); "
            f"{_advice(model_format) or 'export the model to ONNX and write modelFormat onnx'}",
            NO_SUPPORTING_RUNTIME,
        )
    name = model_format.name
    if name in SERVED or (name in TENANT_CODE and tenant_code):
        return
    advice = _advice(model_format) or (
        "the Triton tritonshare runs serves onnx, tensorrt and triton model repositories "
        "(pytorch and python only for namespaces allowed tenant code): export the model to ONNX"
    )
    raise InvalidSpecError(
        f"model format {model_format} is not served by the node's Triton: {advice}",
        NO_SUPPORTING_RUNTIME,
    )
