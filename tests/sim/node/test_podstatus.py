"""The simulated kubelet writes a pod's status as the kubelet's status manager does: a pod that
another writer (an eviction, a node agent) marked Failed keeps that phase, whatever the kubelet's
own view of it was a moment before."""

from __future__ import annotations

import kubernetes.client

from sim.apiserver import RunningApiServer
from sim.node.podstatus import write_status
from tests.sim.node.test_kubelet import NODE, NS, core, create, pod_manifest, read


def kubelet_status(phase: str) -> dict[str, object]:
    return {"phase": phase, "conditions": [{"type": "Initialized", "status": "False"}]}


def test_a_pod_marked_failed_by_another_writer_stays_failed(apiserver: RunningApiServer) -> None:
    api: kubernetes.client.ApiClient = apiserver.api_client()
    try:
        create(api, pod_manifest("p", {"containers": [{"name": "c", "image": "i"}]}))
        pod = read(api, "p")
        assert pod is not None and pod["spec"]["nodeName"] == NODE
        uid = pod["metadata"]["uid"]
        assert write_status(core(api), NS, "p", uid, kubelet_status("Pending")) is not None
        failed = {"status": {"phase": "Failed", "reason": "ModelCrashedTriton", "message": "m"}}
        core(api).patch_namespaced_pod_status("p", NS, failed)
        assert write_status(core(api), NS, "p", uid, kubelet_status("Pending")) is not None
        pod = read(api, "p")
        assert pod is not None
        assert (pod["status"]["phase"], pod["status"]["reason"]) == ("Failed", "ModelCrashedTriton")
    finally:
        api.close()  # type: ignore[no-untyped-call]
