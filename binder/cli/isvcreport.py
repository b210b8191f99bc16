"""What `tritonshare explain isvc/NAME` says of an InferenceService: how its status reads (Ready,
ModelMesh's model states, its last failure, the address its clients call) and the TritonModel
that serves it, explained as `explain tm/NAME` explains one (`binder.cli.modelreport`: each
replica's node, GPU and model host pod, and its GPU memory as declared, estimated or measured).
The TritonModel is the InferenceService's only when its controller ownerReference names the
InferenceService's uid: one of the same name it does not own serves it not. Pure: API objects and
the model's document in, a document and sentences out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TextIO

from binder.cli.modelreport import write_model
from binder.inferenceservices.tritonmodel import KIND
from common.kubeapi.session import JsonObject


def owns(isvc: JsonObject, model: JsonObject) -> bool:
    """Whether `model` is the TritonModel the InferenceService's controller made for it."""
    uid = (isvc.get("metadata") or {}).get("uid")
    refs = (model.get("metadata") or {}).get("ownerReferences") or []
    return any(
        isinstance(ref, Mapping)
        and ref.get("kind") == KIND
        and ref.get("uid") == uid
        and ref.get("controller") is True
        for ref in refs
    )


def isvc_document(
    isvc: JsonObject, model: JsonObject | None, explained: dict[str, Any] | None
) -> dict[str, Any]:
    """What `explain isvc/NAME` prints: its status's readings and, when it owns `model` (the
    TritonModel of its name, None when there is none), `explained`, that model's document."""
    metadata = isvc.get("metadata") or {}
    status = isvc.get("status") or {}
    ready: Mapping[str, Any] = next(
        (
            c
            for c in status.get("conditions") or []
            if isinstance(c, Mapping) and c.get("type") == "Ready"
        ),
        {},
    )
    model_status = status.get("modelStatus") or {}
    states = model_status.get("states") or {}
    owned = model is not None and owns(isvc, model)
    return {
        "inferenceService": f"{metadata.get('namespace', '')}/{metadata.get('name', '')}",
        "ready": {
            "status": str(ready.get("status") or "Unknown"),
            "reason": str(ready.get("reason") or "") or None,
            "message": str(ready.get("message") or "") or None,
        },
        "activeModelState": str(states.get("activeModelState") or "") or None,
        "targetModelState": str(states.get("targetModelState") or "") or None,
        "transitionStatus": str(model_status.get("transitionStatus") or "") or None,
        "lastFailureInfo": model_status.get("lastFailureInfo") or None,
        "url": str(status.get("url") or "") or None,
        "tritonModel": explained if owned else None,
        "foreignTritonModel": model is not None and not owned,
    }


def write_isvc(document: dict[str, Any], out: TextIO) -> None:
    """`isvc_document` as sentences."""
    key = document["inferenceService"]
    ready = document["ready"]
    why = ": ".join(w for w in (ready["reason"], ready["message"]) if w)
    said = f"Ready {ready['status']}" + (f" ({why})" if why else "")
    state = document["activeModelState"] or "no model state yet"
    if document["targetModelState"]:
        state += f", loading to {document['targetModelState']}"
    if document["transitionStatus"]:
        state += f", {document['transitionStatus']}"
    out.write(f"InferenceService {key} reads {said}; its model: {state}.\n")
    if document["url"]:
        name = key.partition("/")[2]
        out.write(f"Its clients call {document['url']} with model name {name}.\n")
    failure = document["lastFailureInfo"]
    if isinstance(failure, Mapping):
        where = f" (on {failure['location']})" if failure.get("location") else ""
        out.write(
            f"Its last failure{where}: {failure.get('reason', '')}: {failure.get('message', '')}\n"
        )
    explained = document["tritonModel"]
    if explained is not None:
        out.write(f"It is served as TritonModel {explained['tritonModel']}:\n")
        write_model(explained, out)
    elif document["foreignTritonModel"]:
        out.write(
            f"TritonModel {key} is not this InferenceService's (no controller ownerReference to "
            f"it): it is left alone, and serves this InferenceService not.\n"
        )
    else:
        out.write(
            "No TritonModel serves it: tritonshare serves the ModelMesh-mode InferenceServices "
            "of the namespaces handed to it, and writes why it refuses one in its status.\n"
        )
