"""The binder's PodScheduled=False write against sim/ through the official client: a new reason or
message while the pod stays unschedulable keeps the condition's lastTransitionTime, as
kube-scheduler keeps it; a first write stamps it."""

from __future__ import annotations

from pathlib import Path

import kubernetes.client

from binder.api.kube import Kube
from common.kubeapi.session import RetryPolicy
from tests.fixtures_sim import core_v1

LONG_AGO = "2026-01-01T00:00:00Z"


def _scheduled(api: kubernetes.client.ApiClient) -> tuple[str, str, str]:
    pod = core_v1(api).read_namespaced_pod("p", "default")
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled":
            return c.reason, c.message, c.last_transition_time.strftime("%Y-%m-%dT%H:%M:%SZ")
    return "", "", ""


def test_a_new_message_keeps_the_time_the_pod_became_unschedulable(
    kube_api: kubernetes.client.ApiClient, kubeconfig: Path
) -> None:
    core = core_v1(kube_api)
    core.create_namespaced_pod(
        "default",
        {
            "metadata": {"name": "p"},
            "spec": {"schedulerName": "tritonshare", "containers": [{"name": "c", "image": "i"}]},
        },
    )
    kube = Kube(str(kubeconfig), retry=RetryPolicy())
    try:
        kube.set_unschedulable("default", "p", "0/1 nodes fit")
        first = _scheduled(kube_api)
        assert first[:2] == ("Unschedulable", "0/1 nodes fit") and first[2] > LONG_AGO
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/1 nodes fit",
            "lastTransitionTime": LONG_AGO,
        }
        core.patch_namespaced_pod_status("p", "default", {"status": {"conditions": [condition]}})
        kube.set_unschedulable("default", "p", "0/2 nodes fit", "SchedulerError", was="False")
        assert _scheduled(kube_api) == ("SchedulerError", "0/2 nodes fit", LONG_AGO)
    finally:
        kube.close()
