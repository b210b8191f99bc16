"""A TritonModel's status at zero replicas, on the simulated cluster with the real processes (a
real Triton, agent, binder, model hosts): a new model at `minReplicas: 0` is loaded and Ready once
before the autoscaler takes it to zero (Knative's initial scale), and reads Ready at zero; one whose
storageUri answers 404 never reads Ready=True, at one replica or at zero, and says why."""

from __future__ import annotations

import time
from typing import Any, cast

import kubernetes.client
import pytest

from sim.cluster import SimCluster
from sim.demo.scenario import MODELS_DIR
from sim.processes import wait_until
from tests.e2e.test_scale_to_zero import (
    MODEL,
    NAMESPACE,
    _model,
    cluster,
    scale_to_zero_model,
)
from tests.e2e.test_tritonmodel_hosts import GROUP, PLURAL, VERSION

__all__ = ["cluster"]

WATCHED_AT_ZERO_SECONDS = 15.0
"""How long the failed model is watched at zero: past two of the autoscaler's 6 s windows."""


def conditions(custom: Any) -> dict[str, dict[str, Any]]:
    status = _model(custom).get("status") or {}
    return {c["type"]: c for c in status.get("conditions") or []}


def ready(custom: Any) -> tuple[str, str]:
    found = conditions(custom).get("Ready") or {}
    return str(found.get("status")), str(found.get("reason"))


@pytest.mark.slow
@pytest.mark.triton
def test_a_new_model_at_min_zero_is_ready_once_before_it_reaches_zero(
    cluster: SimCluster,
) -> None:
    assert cluster.model_store is not None and cluster.kube is not None
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    uri = cluster.model_store.publish(MODEL, MODELS_DIR / "add_one")
    custom.create_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, scale_to_zero_model(uri)
    )
    seen: list[tuple[int, tuple[str, str]]] = []

    def at_zero() -> bool:
        model = _model(custom)
        seen.append((model["spec"]["replicas"], ready(custom)))
        return bool(model["spec"]["replicas"] == 0 and not model["status"].get("replicas"))

    wait_until("scaled to zero", at_zero, 180)
    status = _model(custom)["status"]
    assert status["loadedStorageUri"] == uri, status
    assert ready(custom) == ("True", "AllReplicasReady"), conditions(custom)
    assert conditions(custom)["Loaded"]["status"] == "True"
    # Ready (with a replica loaded) before the autoscaler first asked for zero: it stays at one
    # replica for longer than a whole window once ready, so a poll sees it.
    first_ready = next(i for i, (_, r) in enumerate(seen) if r == ("True", "AllReplicasReady"))
    first_zero = next(i for i, (n, _) in enumerate(seen) if n == 0)
    assert first_ready < first_zero, seen[: first_zero + 1]
    assert seen[first_ready][0] == 1


@pytest.mark.slow
@pytest.mark.triton
def test_a_model_whose_files_answer_404_never_reads_ready(cluster: SimCluster) -> None:
    assert cluster.model_store is not None and cluster.kube is not None
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    uri = cluster.model_store.publish(MODEL, MODELS_DIR / "add_one")
    missing = uri.replace(f"{MODEL}.tar.gz", "missing.tar.gz")
    assert missing != uri
    custom.create_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, scale_to_zero_model(missing)
    )
    wait_until("FetchFailed", lambda: ready(custom) == ("False", "FetchFailed"), 120)
    loaded = conditions(custom)["Loaded"]
    assert (loaded["status"], loaded["reason"]) == ("False", "FetchFailed"), loaded
    assert "404" in loaded["message"], loaded
    # It may go to zero now that its load has failed, and still says why.
    wait_until("scaled to zero", lambda: _model(custom)["spec"]["replicas"] == 0, 120)
    wait_until("no replica", lambda: not _model(custom)["status"].get("replicas"), 60)
    deadline = time.monotonic() + WATCHED_AT_ZERO_SECONDS
    while time.monotonic() < deadline:
        assert ready(custom) == ("False", "FetchFailed"), conditions(custom)
        time.sleep(0.5)
    assert _model(custom)["status"]["failedStorageUri"] == missing
