"""An InferenceService's status as ModelMesh writes it, derived from its TritonModel's: the
conditions (`CONDITIONS`: `PredictorReady` and `Ready`), `url` and
`components.predictor` (the `modelmesh-serving` Service's addresses), and `modelStatus`
(`transitionStatus`, `states`, `copies`, `lastFailureInfo`).

How a TritonModel's status reads in ModelMesh's words: Ready=True is `Loaded` (copies: its ready
replicas); its files failed to load (Loaded=False) is `FailedToLoad` and `BlockedByFailedLoad`;
at zero replicas with its files loaded once is `Standby`; anything else (placing, loading, a
replica not yet placed) is `Loading` and `InProgress`. While new files roll out with a replica
of the old ones ready, the active model stays `Loaded` and the target one reads `Loading` (or
`FailedToLoad`). A spec refused before any TritonModel is written is `InvalidSpecError` (or, for a
runtime, `FailedToLoad`) with ModelMesh's reason. Pure: the time comes in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from binder.inferenceservices.predictor import INVALID_PREDICTOR_SPEC
from common.conditions import Condition, ConditionSet, find

PREDICTOR_READY = "PredictorReady"
READY = "Ready"
CONTROLLER = "controller"
CONDITIONS = ConditionSet(
    happy=READY,
    dependents=(PREDICTOR_READY,),
    owners={PREDICTOR_READY: CONTROLLER, READY: CONTROLLER},
)
"""An InferenceService's conditions, all decided by this controller."""

GRPC_PORT = 8033
REST_PORT = 8008
SERVICE = "modelmesh-serving"

UP_TO_DATE, IN_PROGRESS, BLOCKED, INVALID = (
    "UpToDate",
    "InProgress",
    "BlockedByFailedLoad",
    "InvalidSpec",
)
PENDING, STANDBY, LOADING, LOADED, FAILED = (
    "Pending",
    "Standby",
    "Loading",
    "Loaded",
    "FailedToLoad",
)
MODEL_LOAD_FAILED = "ModelLoadFailed"
RUNTIME_UNHEALTHY = "RuntimeUnhealthy"


@dataclass(frozen=True)
class Refusal:
    """Why no TritonModel serves the spec: ModelMesh's reason and what to do."""

    reason: str
    message: str


@dataclass(frozen=True)
class Reading:
    """The ModelMesh state of one InferenceService."""

    transition: str
    active: str
    target: str = ""
    total: int = 0
    failed: int = 0
    failure: tuple[str, str, str] | None = None
    """(reason, message, time) of the last failure; time "" to be stamped now."""


def urls(namespace: str) -> dict[str, str]:
    grpc = f"grpc://{SERVICE}.{namespace}:{GRPC_PORT}"
    return {"url": grpc, "grpcUrl": grpc, "restUrl": f"http://{SERVICE}.{namespace}:{REST_PORT}"}


def reading_of(model: Mapping[str, Any] | None, refusal: Refusal | None) -> Reading:
    """The state a refusal, or the TritonModel's status (None: not created yet), says."""
    if refusal is not None:
        invalid = refusal.reason == INVALID_PREDICTOR_SPEC
        kept = reading_of(model, None) if model is not None else None
        return Reading(
            transition=INVALID if invalid else BLOCKED,
            active=kept.active if kept is not None else FAILED,
            total=kept.total if kept is not None else 0,
            failure=(refusal.reason, refusal.message, ""),
        )
    if model is None:
        return Reading(IN_PROGRESS, PENDING)
    spec = model.get("spec") or {}
    status = model.get("status") or {}
    conditions = status.get("conditions")
    ready = find(conditions, "Ready") or {}
    loaded = find(conditions, "Loaded") or {}
    placed = find(conditions, "Placed") or {}
    ready_count = int(status.get("readyReplicas") or 0)
    placements = status.get("placements") or []
    total = len(placements)
    wanted = int(spec.get("replicas", 1) or 0)
    observed = status.get("observedGeneration") == (model.get("metadata") or {}).get("generation")
    current = status.get("loadedStorageUri") == spec.get("storageUri")
    failed_load = loaded.get("status") == "False"
    # A roll's new files that failed while the old ones serve: `Loaded` stays True (something
    # serves), `failedStorageUri` names them and the replica of them says why.
    failed_roll = bool(spec.get("storageUri")) and status.get("failedStorageUri") == spec.get(
        "storageUri"
    )
    failure = None
    if failed_load:
        failure = (
            MODEL_LOAD_FAILED,
            str(loaded.get("message") or loaded.get("reason") or "the model failed to load"),
            str(loaded.get("lastTransitionTime") or ""),
        )
    elif failed_roll:
        progressing = find(conditions, "Progressing") or {}
        said = next(
            (
                str(p.get("message"))
                for p in placements
                if isinstance(p, dict)
                and p.get("storageUri") == spec.get("storageUri")
                and not p.get("ready")
                and p.get("message")
            ),
            str(progressing.get("message") or "the new files failed to load"),
        )
        failure = (MODEL_LOAD_FAILED, said, str(progressing.get("lastTransitionTime") or ""))
        failed_load = True
    elif placed.get("status") == "False":
        failure = (
            RUNTIME_UNHEALTHY,
            str(placed.get("message") or "waiting for a GPU with room for the model"),
            str(placed.get("lastTransitionTime") or ""),
        )
    not_ready = sum(1 for p in placements if isinstance(p, dict) and not p.get("ready"))
    if observed and ready.get("status") == "True" and current:
        if wanted == 0 and ready_count == 0:
            return Reading(UP_TO_DATE, STANDBY)
        return Reading(UP_TO_DATE, LOADED, total=ready_count)
    if ready_count > 0 and not current:
        # The old files serve while the new ones load (or failed to).
        return Reading(
            BLOCKED if failed_load else IN_PROGRESS,
            LOADED,
            FAILED if failed_load else LOADING,
            total=total,
            failed=not_ready if failed_load else 0,
            failure=failure,
        )
    if failed_load:
        return Reading(BLOCKED, FAILED, total=total, failed=not_ready, failure=failure)
    return Reading(IN_PROGRESS, LOADING, total=total, failure=failure)


def with_storage_key(reading: Reading, key: str | None) -> Reading:
    """`reading` whose failed load names the storage key its files come from (the TritonModel's
    message names the bucket and the path): which `storage-config` entry to check."""
    if key is None or reading.failure is None or reading.failure[0] != MODEL_LOAD_FAILED:
        return reading
    reason, message, since = reading.failure
    return replace(reading, failure=(reason, f"storage key {key}: {message}", since))


def status_of(
    namespace: str,
    generation: int,
    reading: Reading,
    old: Mapping[str, Any] | None,
    now: str,
) -> tuple[dict[str, Any], dict[str, Condition]]:
    """The status fields other than the conditions, and the conditions said, for `reading`
    over the InferenceService's `old` status (its lastFailureInfo's time is kept while the
    failure is the same)."""
    addresses = urls(namespace)
    model_status: dict[str, Any] = {
        "transitionStatus": reading.transition,
        "states": {"activeModelState": reading.active, "targetModelState": reading.target},
        "copies": {"totalCopies": reading.total, "failedCopies": reading.failed},
    }
    if reading.failure is not None:
        reason, message, since = reading.failure
        before = ((old or {}).get("modelStatus") or {}).get("lastFailureInfo") or {}
        if (before.get("reason"), before.get("message")) == (reason, message):
            since = str(before.get("time") or since or now)
        model_status["lastFailureInfo"] = {
            "reason": reason,
            "message": message,
            "time": since or now,
        }
    else:
        model_status["lastFailureInfo"] = None
    fields: dict[str, Any] = {
        "observedGeneration": generation,
        "url": addresses["url"],
        "components": {"predictor": dict(addresses)},
        "modelStatus": model_status,
    }
    if reading.active == LOADED and reading.transition != INVALID:
        own = Condition(READY, "True", LOADED, f"{reading.total} copies loaded", generation)
        predictor = Condition(PREDICTOR_READY, "True", LOADED, own.message, generation)
    elif reading.active == STANDBY:
        message = "no copy is loaded now: the next request loads one"
        own = Condition(READY, "True", STANDBY, message, generation)
        predictor = Condition(PREDICTOR_READY, "True", STANDBY, message, generation)
    else:
        reason, message = (
            (reading.failure[0], reading.failure[1])
            if reading.failure is not None
            else (reading.active, f"the model is {reading.active.lower()}")
        )
        predictor = Condition(PREDICTOR_READY, "False", reason, message, generation)
        own = Condition(READY, "False", reason, message, generation)
    said = {
        PREDICTOR_READY: predictor,
        READY: CONDITIONS.happy_of(own, {PREDICTOR_READY: predictor}),
    }
    return fields, said
