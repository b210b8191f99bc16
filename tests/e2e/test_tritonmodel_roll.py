"""A TritonModel's roll to new files on the simulated cluster with the real processes, where no node
has room for a surge replica (one GPU node, which holds the model's replica already): the binder
says so (a `RollingWithoutSurge` Event), drains the replica (the host's loader unloads it
through the agent), places it again on the new files, which the loader loads, and once it is
served the roll is complete (`NewFilesServed`, `updatedReplicas` 1). A client sends through the
model's Service all along; its answers move from the old files' to the new files'. (The surge
replica, for a roll with no failed request, needs a second node that runs pods: see
tests/binder/test_model_roll.py.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import pytest

from common.contract import Keys
from common.hosted import serves_label
from sim.cluster import SimCluster
from sim.demo.rollout import NEW_ANSWER, OLD_ANSWER, SteadyClient, new_release
from sim.demo.scenario import MODELS_DIR, NODES
from sim.processes import wait_until
from sim.service import Endpoints
from sim.triton import TritonInstall

NAMESPACE = "team-a"
MODEL = "add-one"
GROUP, VERSION, PLURAL = "tritonshare.io", "v1alpha1", "tritonmodels"
KEYS = Keys()


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    # The test's model is Python (tenant code): the namespace is let run it.
    with SimCluster(
        tmp_path / "cluster", [NODES[0]], binders=1, webhook=True,
        tenant_code_namespaces=(NAMESPACE,),
    ) as running:  # fmt: skip
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


def _status(custom: Any) -> dict[str, Any]:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, MODEL)
    found: dict[str, Any] = obj.get("status") or {}
    return found


def _progressing(custom: Any) -> dict[str, Any]:
    conditions = {c["type"]: c for c in _status(custom).get("conditions") or []}
    found: dict[str, Any] = conditions.get("Progressing") or {}
    return found


@pytest.mark.slow
@pytest.mark.triton
def test_a_tritonmodel_with_no_room_for_a_surge_is_replaced_on_the_new_files(
    cluster: SimCluster, tmp_path: Path
) -> None:
    assert cluster.model_store is not None and cluster.kube is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    old_uri = cluster.model_store.publish(MODEL, MODELS_DIR / "add_one", release="old")
    new_files = new_release(MODELS_DIR / "add_one", tmp_path / "new-files")
    new_uri = cluster.model_store.publish(MODEL, new_files, release="new")
    spec = {"storageUri": old_uri, "gpuMemory": "1Gi", "replicas": 1}
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TritonModel"}
    custom.create_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, {**body, "metadata": {"name": MODEL}, "spec": spec}
    )
    wait_until("the replica ready", lambda: _status(custom).get("readyReplicas") == 1, 150)

    with Endpoints(cluster.kube, NAMESPACE, f"{serves_label(KEYS, MODEL)}=true") as service:
        wait_until("the Service's endpoint", service.pick, 30)
        client = SteadyClient(service, model=MODEL)
        client.start()
        try:
            wait_until("an old answer", partial(client.since, 0.0), 30)
            custom.patch_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, PLURAL, MODEL, {"spec": {"storageUri": new_uri}}
            )
            wait_until(
                "the replica given the new files",
                lambda: (
                    _status(custom).get("observedGeneration") == 2
                    and [e["storageUri"] for e in _status(custom)["placements"]] == [new_uri]
                ),
                60,
            )
            wait_until(
                "the roll complete",
                lambda: (
                    _progressing(custom).get("reason") == "NewFilesServed"
                    and _status(custom).get("readyReplicas") == 1
                ),
                60,
            )
            done = time.monotonic()
            wait_until("a new answer", lambda: NEW_ANSWER in client.since(done), 30)
        finally:
            client.stop()
    events = core.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={MODEL}")
    [event] = [e for e in events.items if e.reason == "RollingWithoutSurge"]
    assert not [e.message for e in events.items if e.reason == "NewFilesNotServed"]
    assert "no room for a surge replica" in event.message, event.message
    status = _status(custom)
    assert status["updatedReplicas"] == 1
    assert [e["storageUri"] for e in status["placements"]] == [new_uri]
    answers = [answer for _, _, answer in client.answers]
    assert answers[0] == OLD_ANSWER and answers[-1] == NEW_ANSWER
    assert OLD_ANSWER not in client.since(done), "the old files are gone once the roll is done"
