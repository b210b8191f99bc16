"""AdmissionReview (admission.k8s.io/v1) in, AdmissionReview out: pure, no I/O.

The API server sends the pod being created; the answer allows it with a JSON patch that completes
it, allows it unchanged (not a model pod, or complete already), or refuses it with a message that
says which annotation is wrong or missing and what to write.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from webhook.mutation import (
    AnnotationError,
    check_residency,
    check_unfinished,
    complete,
    patch,
    wants_completion,
)
from webhook.settings import Settings


class ReviewError(ValueError):
    """The request is not an AdmissionReview for a pod."""


def review(body: Any, settings: Settings) -> dict[str, Any]:
    """The AdmissionReview answering `body` (a decoded AdmissionReview request)."""
    if not isinstance(body, dict) or body.get("kind") != "AdmissionReview":
        raise ReviewError("the body is not an AdmissionReview")
    request = body.get("request")
    if not isinstance(request, dict) or "uid" not in request:
        raise ReviewError("the AdmissionReview has no request with a uid")
    answer: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    pod = request.get("object")
    kind = request.get("kind") or {}
    if isinstance(pod, dict) and kind.get("kind") == "Pod":
        try:
            check_residency(pod, settings)
            if not wants_completion(pod, settings):
                check_unfinished(pod, settings)
                operations = []
            else:
                operations = patch(pod, complete(pod, settings))
        except AnnotationError as e:
            answer = {
                "uid": request["uid"],
                "allowed": False,
                "status": {"code": 400, "reason": "BadRequest", "message": str(e)},
            }
        else:
            if operations:
                answer["patchType"] = "JSONPatch"
                answer["patch"] = base64.b64encode(json.dumps(operations).encode()).decode()
    return {
        "apiVersion": body.get("apiVersion", "admission.k8s.io/v1"),
        "kind": "AdmissionReview",
        "response": answer,
    }
