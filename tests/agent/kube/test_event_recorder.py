"""The agent records every Event, on pods and on its node, through the one rule
(common/events.py): a repeated Event is one object whose count grows, through the official
client against sim/."""

from __future__ import annotations

from pathlib import Path

import kubernetes.client

from agent.kube.client import KubeClient


async def test_a_repeated_agent_event_is_one_event_with_a_growing_count(
    kube_api: kubernetes.client.ApiClient, kubeconfig: Path
) -> None:
    kube = KubeClient(str(kubeconfig))
    try:
        for _ in range(3):
            await kube.record_pod_event(
                "default",
                "p",
                "uid-p",
                reason="ModelNotVouched",
                message="unloaded",
                component="tritonshare-agent/n",
            )
        for _ in range(2):
            await kube.record_node_event(
                "n",
                reason="ForeignGPUProcess",
                message="process 7 holds 1Gi",
                component="tritonshare-agent",
            )
    finally:
        await kube.close()
    core = kubernetes.client.CoreV1Api(kube_api)
    found = sorted(
        (e.involved_object.kind, e.reason, e.count)
        for e in core.list_namespaced_event("default").items
    )
    assert found == [("Node", "ForeignGPUProcess", 2), ("Pod", "ModelNotVouched", 3)]
