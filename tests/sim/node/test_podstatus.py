"""A pod that another writer (an eviction, a node agent) marked Failed stays as the kubelet leaves
it: Failed, whatever the kubelet's own view of it was a moment before (as the kubelet's status
manager writes), its containers stopped, and the pod kept in the API."""

from __future__ import annotations

import sys
import time

import kubernetes.client

from sim.apiserver import RunningApiServer
from sim.node.kubelet import Kubelet
from sim.node.podstatus import write_status
from tests.sim.node.test_kubelet import (
    NODE,
    NS,
    core,
    create,
    kubelet,
    pod_manifest,
    read,
    wait_for,
)

__all__ = ["kubelet"]  # the fixture


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


def test_the_kubelet_stops_a_pod_marked_failed_and_keeps_it(
    kubelet: Kubelet, apiserver: RunningApiServer
) -> None:
    api: kubernetes.client.ApiClient = apiserver.api_client()
    loader = [sys.executable, "-c", "import time; time.sleep(0.2); raise SystemExit(5)"]
    main = [sys.executable, "-c", "import time; time.sleep(60)"]
    spec = {
        "initContainers": [{"name": "loader", "image": "i", "command": loader}],
        "containers": [{"name": "c", "image": "i", "command": main}],
    }
    try:
        create(api, pod_manifest("q", spec))
        wait_for("the loader restarted", lambda: "loader" in str(read(api, "q")) and restarts(api))
        failed = {"status": {"phase": "Failed", "reason": "ModelCrashedTriton", "message": "m"}}
        core(api).patch_namespaced_pod_status("q", NS, failed)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            pod = read(api, "q")
            assert pod is not None, "a Failed pod stays in the API"
            assert pod["status"]["phase"] == "Failed"
            time.sleep(0.1)
    finally:
        api.close()  # type: ignore[no-untyped-call]


def restarts(api: kubernetes.client.ApiClient) -> int:
    pod = read(api, "q") or {}
    return sum(
        int(s.get("restartCount", 0))
        for s in pod.get("status", {}).get("initContainerStatuses", [])
    )
