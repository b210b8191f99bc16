"""The agent's pod condition write against sim/ through the official client: a new reason under
the same status keeps the condition's lastTransitionTime; a new status moves it."""

from __future__ import annotations

from pathlib import Path

import kubernetes.client

from agent.kube.client import KubeClient
from tests.agent.conftest import make_pod

CONDITION = "tritonshare.io/ModelLoaded"
LONG_AGO = "2026-01-01T00:00:00Z"


def loaded(api: kubernetes.client.ApiClient, name: str) -> dict[str, str]:
    pod = kubernetes.client.CoreV1Api(api).read_namespaced_pod(name, "default")
    for condition in pod.status.conditions or []:
        if condition.type == CONDITION:
            since = condition.last_transition_time
            return {
                "status": condition.status,
                "reason": condition.reason,
                "since": since.strftime("%Y-%m-%dT%H:%M:%SZ") if since else "",
            }
    return {}


async def test_the_transition_time_moves_only_with_the_status(
    kube_api: kubernetes.client.ApiClient, kubeconfig: Path
) -> None:
    make_pod(kube_api, "a", "model_a")
    kubernetes.client.CoreV1Api(kube_api).patch_namespaced_pod_status(
        "a",
        "default",
        {
            "status": {
                "conditions": [
                    {
                        "type": CONDITION,
                        "status": "False",
                        "reason": "ModelMissing",
                        "message": "missing",
                        "lastTransitionTime": LONG_AGO,
                    }
                ]
            }
        },
    )
    kube = KubeClient(str(kubeconfig))
    try:
        await kube.set_pod_condition(
            "default", "a", CONDITION, "False", "ModelFailed", "bad config", was="False"
        )
        assert loaded(kube_api, "a") == {
            "status": "False",
            "reason": "ModelFailed",
            "since": LONG_AGO,
        }
        await kube.set_pod_condition(
            "default", "a", CONDITION, "True", "ModelReady", "ready", was="False"
        )
        now = loaded(kube_api, "a")
        assert (now["status"], now["reason"]) == ("True", "ModelReady")
        assert now["since"] > LONG_AGO
    finally:
        await kube.close()
