"""The agent's pod condition write against sim/ through the official client: a new reason under
the same status keeps the condition's lastTransitionTime; a new status moves it."""

from __future__ import annotations

from pathlib import Path

import kubernetes.client

from agent.kube.client import KubeClient
from common.conditions import Condition
from tests.agent.conftest import make_pod

CONDITION = "tritonshare.io/ModelLoaded"
LONG_AGO = "2026-01-01T00:00:00Z"
FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def loaded(api: kubernetes.client.ApiClient, name: str) -> tuple[str, str, str]:
    """The condition's status, reason and lastTransitionTime as the API server stores them."""
    pod = kubernetes.client.CoreV1Api(api).read_namespaced_pod(name, "default")
    for c in (pod.status.conditions if pod.status else None) or []:
        if c.type == CONDITION:
            since = c.last_transition_time
            return c.status, c.reason or "", since.strftime(FORMAT) if since else ""
    return "", "", ""


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
        failed = Condition(CONDITION, "False", "ModelFailed", "bad config")
        await kube.set_pod_condition("default", "a", failed, was="False")
        assert loaded(kube_api, "a") == ("False", "ModelFailed", LONG_AGO)
        ready = Condition(CONDITION, "True", "ModelReady", "ready")
        await kube.set_pod_condition("default", "a", ready, was="False")
        status, reason, since = loaded(kube_api, "a")
        assert (status, reason) == ("True", "ModelReady")
        assert since > LONG_AGO
    finally:
        await kube.close()
