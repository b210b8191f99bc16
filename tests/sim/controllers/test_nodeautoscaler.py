"""The simulated Cluster Autoscaler's rules, on objects (its API passes are tested end to end in
tests/binder/nodescaling): GPU nodes' utilization (DaemonSet pods counted unless ignored), the
pods that keep a node, and why a pod asking nvidia.com/gpu fits no template whose node pod holds
every GPU."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from sim.controllers.nodeautoscaler import SAFE_TO_EVICT, ClusterAutoscaler, NodeGroup
from sim.controllers.nodefit import unfit

GPU_NODE: dict[str, Any] = {
    "metadata": {"name": "g", "labels": {}},
    "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "4"}},
}


def pod(
    name: str,
    owner: str | None = "ReplicaSet",
    gpus: int = 0,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    refs = [{"kind": owner, "name": "o", "uid": "u", "controller": True}] if owner else []
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {
        "metadata": {
            "namespace": "n",
            "name": name,
            "ownerReferences": refs,
            "annotations": annotations or {},
        },
        "spec": {"nodeName": "g", "containers": [{"name": "c", "resources": resources}]},
    }


@pytest.fixture
def autoscaler() -> Iterator[ClusterAutoscaler]:
    api = kubernetes.client.ApiClient()
    yield ClusterAutoscaler(api, [NodeGroup("g", GPU_NODE)])
    api.close()  # type: ignore[no-untyped-call]


def test_a_gpu_node_is_as_used_as_its_gpus_node_pod_included_unless_ignored(
    autoscaler: ClusterAutoscaler,
) -> None:
    node_pod = pod("tritonshare-node", owner="DaemonSet", gpus=4)
    assert autoscaler.utilization(GPU_NODE, [node_pod, pod("model")]) == 1.0
    autoscaler.ignore_daemonsets = True
    assert autoscaler.utilization(GPU_NODE, [node_pod, pod("model")]) == 0.0


def test_the_pods_that_keep_a_node(autoscaler: ClusterAutoscaler) -> None:
    assert autoscaler.blocker(pod("m")) is None
    assert autoscaler.blocker(pod("m", annotations={SAFE_TO_EVICT: "false"})) is not None
    assert autoscaler.blocker(pod("bare", owner=None)) == "pod not backed by a controller"
    assert autoscaler.blocker(pod("bare", owner=None, annotations={SAFE_TO_EVICT: "true"})) is None
    assert autoscaler.blocker(pod("host", owner="TritonModel")) == (
        "pod of a custom controller (TritonModel)"
    )


def test_a_gpu_request_fits_no_template_whose_node_pod_holds_every_gpu() -> None:
    node_pod = pod("tritonshare-node", owner="DaemonSet", gpus=4)
    asks_gpu = {**pod("x", gpus=1), "spec": {"containers": pod("x", gpus=1)["spec"]["containers"]}}
    assert unfit(asks_gpu, GPU_NODE, [node_pod]) == "Insufficient nvidia.com/gpu"
    assert unfit(asks_gpu, GPU_NODE, []) is None
