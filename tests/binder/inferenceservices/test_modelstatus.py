"""An InferenceService's status as ModelMesh writes it, from its TritonModel's status."""

from __future__ import annotations

from typing import Any

from binder.inferenceservices.modelstatus import (
    BLOCKED,
    CONDITIONS,
    FAILED,
    IN_PROGRESS,
    INVALID,
    LOADED,
    LOADING,
    PENDING,
    STANDBY,
    UP_TO_DATE,
    Reading,
    Refusal,
    reading_of,
    status_of,
    with_storage_key,
)

URI = "s3://b/m"


def model(
    *conditions: tuple[str, str, str],
    ready: int = 0,
    placements: list[dict[str, Any]] | None = None,
    replicas: int = 1,
    loaded: str | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"generation": 1},
        "spec": {"storageUri": URI, "replicas": replicas},
        "status": {
            "observedGeneration": 1,
            "readyReplicas": ready,
            "placements": placements or [],
            "loadedStorageUri": loaded,
            "conditions": [
                {"type": t, "status": s, "reason": r, "message": f"{r}!",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}
                for t, s, r in conditions
            ],
        },
    }  # fmt: skip


def test_readings() -> None:
    assert reading_of(None, None) == Reading(IN_PROGRESS, PENDING)
    placed = [{"node": "n1", "ready": False}]
    loading = model(
        ("Placed", "True", "AllPlaced"), ("Ready", "False", "NotReady"), placements=placed
    )
    assert reading_of(loading, None) == Reading(IN_PROGRESS, LOADING, total=1)
    ready = model(
        ("Ready", "True", "AllReplicasReady"), ready=1, loaded=URI,
        placements=[{"node": "n1", "ready": True}],
    )  # fmt: skip
    assert reading_of(ready, None) == Reading(UP_TO_DATE, LOADED, total=1)
    standby = model(("Ready", "True", "Loaded"), replicas=0, loaded=URI)
    assert reading_of(standby, None) == Reading(UP_TO_DATE, STANDBY)
    failed = model(("Loaded", "False", "FetchFailed"), placements=placed)
    assert reading_of(failed, None) == Reading(
        BLOCKED, FAILED, total=1, failed=1,
        failure=("ModelLoadFailed", "FetchFailed!", "2026-01-01T00:00:00Z"),
    )  # fmt: skip
    unplaced = model(("Placed", "False", "NoRoom"))
    assert reading_of(unplaced, None).failure == (
        "RuntimeUnhealthy",
        "NoRoom!",
        "2026-01-01T00:00:00Z",
    )
    # New files roll out while the old ones serve.
    rolling = model(("Ready", "False", "Rolling"), ready=1, loaded="s3://b/old", placements=placed)
    assert (reading_of(rolling, None).active, reading_of(rolling, None).target) == (LOADED, LOADING)


def test_new_files_that_fail_to_load_while_the_old_ones_serve_read_blocked() -> None:
    """A roll whose new files fail to load (the TritonModel's `failedStorageUri` is its
    `storageUri`; `Loaded` stays True, the old files serving): the active model stays Loaded, the
    target reads FailedToLoad and the transition BlockedByFailedLoad, with the failing replica's
    word, as ModelMesh says of a new version that fails."""
    said = "ModelInvalid: the model host's loader cannot load replica m/0: not an ONNX model"
    placements = [
        {"replica": 0, "ready": False, "storageUri": URI, "message": said},
        {"replica": 1, "ready": True, "storageUri": "s3://b/old"},
    ]
    blocked = model(
        ("Loaded", "True", "ReplicasServing"), ("Ready", "True", "AllReplicasReady"),
        ("Progressing", "False", "NewFilesNotServed"),
        ready=1, loaded="s3://b/old", placements=placements,
    )  # fmt: skip
    blocked["status"]["failedStorageUri"] = URI
    assert reading_of(blocked, None) == Reading(
        BLOCKED, LOADED, FAILED, total=2, failed=1,
        failure=("ModelLoadFailed", said, "2026-01-01T00:00:00Z"),
    )  # fmt: skip


def test_a_refusal_keeps_what_still_serves() -> None:
    refusal = Refusal("InvalidPredictorSpec", "bad")
    assert reading_of(None, refusal) == Reading(
        INVALID, FAILED, failure=("InvalidPredictorSpec", "bad", "")
    )
    serving = model(("Ready", "True", "AllReplicasReady"), ready=1, loaded=URI)
    assert reading_of(serving, refusal).active == LOADED
    runtime = reading_of(None, Refusal("NoSupportingRuntime", "tf"))
    assert (runtime.transition, runtime.active) == (BLOCKED, FAILED)


def test_the_status_as_modelmesh_writes_it() -> None:
    fields, said = status_of("ns", 3, Reading(UP_TO_DATE, LOADED, total=2), None, "now")
    assert fields == {
        "observedGeneration": 3,
        "url": "grpc://modelmesh-serving.ns:8033",
        "components": {"predictor": {
            "url": "grpc://modelmesh-serving.ns:8033",
            "grpcUrl": "grpc://modelmesh-serving.ns:8033",
            "restUrl": "http://modelmesh-serving.ns:8008",
        }},
        "modelStatus": {
            "transitionStatus": "UpToDate",
            "states": {"activeModelState": "Loaded", "targetModelState": ""},
            "copies": {"totalCopies": 2, "failedCopies": 0},
            "lastFailureInfo": None,
        },
    }  # fmt: skip
    assert [(c.type, c.status) for c in said.values()] == [
        ("PredictorReady", "True"),
        ("Ready", "True"),
    ]
    written = CONDITIONS.compose(None, said)
    assert [c["type"] for c in written] == ["PredictorReady", "Ready"]


def test_a_failures_time_stays_while_it_is_the_same() -> None:
    reading = Reading(INVALID, FAILED, failure=("InvalidPredictorSpec", "bad", ""))
    first, said = status_of("ns", 1, reading, None, "t1")
    assert first["modelStatus"]["lastFailureInfo"] == {
        "reason": "InvalidPredictorSpec", "message": "bad", "time": "t1"
    }  # fmt: skip
    assert said["Ready"].reason == "InvalidPredictorSpec" and said["Ready"].status == "False"
    again, _ = status_of("ns", 1, reading, first, "t2")
    assert again["modelStatus"]["lastFailureInfo"]["time"] == "t1"
    other = Reading(INVALID, FAILED, failure=("InvalidPredictorSpec", "worse", ""))
    moved, _ = status_of("ns", 1, other, first, "t3")
    assert moved["modelStatus"]["lastFailureInfo"]["time"] == "t3"


def test_a_failed_load_names_the_storage_key_its_files_come_from() -> None:
    """The TritonModel's message names the bucket and path; the key says which storage-config
    entry holds them. Other failures, and files without a key, are left as they are."""
    failed = Reading(BLOCKED, FAILED, failure=("ModelLoadFailed", f"{URI}: S3 refused", "t"))
    named = with_storage_key(failed, "localMinIO")
    assert named.failure == ("ModelLoadFailed", f"storage key localMinIO: {URI}: S3 refused", "t")
    assert with_storage_key(failed, None) == failed
    waiting = Reading(IN_PROGRESS, LOADING, failure=("RuntimeUnhealthy", "no room", "t"))
    assert with_storage_key(waiting, "localMinIO") == waiting
