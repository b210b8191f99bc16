"""On SIGTERM the agent drains its node's model hosts only when its own pod is being deleted (a
DaemonSet update, `kubectl delete pod`): the kubelet restarting the agent's container alone (an
image set on it, a failed liveness probe) sends SIGTERM too, and then the hosts stay served. The
drain itself, through a node pod replacement, is tests/e2e/test_node_pod_drain.py."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, cast

import kubernetes.client

from agent.app import Agent
from sim.gpu.nvml import MockNvml
from sim.gpu.spec import parse_spec
from sim.triton import TritonServer
from tests.agent.conftest import NODE, agent_settings

NAMESPACE = "tritonshare-system"
POD = "tritonshare-node-x7k2p"


def _drains(agent: Agent, sig: signal.Signals) -> bool:
    agent.stopping.signalled(sig)
    return agent.stopping.drains


async def test_a_sigterm_drains_only_when_the_node_pod_is_deleted(
    kubeconfig: Path,
    triton: TritonServer,
    model_repository: Path,
    node: str,
    kube_api: kubernetes.client.ApiClient,
) -> None:
    core = cast(Any, kubernetes.client.CoreV1Api(kube_api))
    settings = agent_settings(kubeconfig, triton, model_repository, pod_name=POD)
    agent = Agent(settings, nvml=MockNvml(parse_spec("1xT4", seed=NODE)).as_module())
    assert not _drains(agent, signal.SIGINT), "SIGINT stops at once"
    assert _drains(agent, signal.SIGTERM)
    try:
        assert await agent.stopping.pod_deleted(), "a node pod already gone"
        core.create_namespaced_pod(
            NAMESPACE,
            {
                "metadata": {"name": POD, "finalizers": ["test.tritonshare.io/hold"]},
                "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "x"}]},
            },
        )
        assert not await agent.stopping.pod_deleted(), "its container alone restarts"
        core.delete_namespaced_pod(POD, NAMESPACE)
        assert await agent.stopping.pod_deleted(), "the pod is deleted: drain"
        # Without its name the agent cannot tell: every SIGTERM drains.
        unnamed = Agent(
            agent_settings(kubeconfig, triton, model_repository),
            nvml=MockNvml(parse_spec("1xT4", seed=NODE)).as_module(),
        )
        assert await unnamed.stopping.pod_deleted()
        await unnamed.kube.close()
    finally:
        await agent.kube.close()
