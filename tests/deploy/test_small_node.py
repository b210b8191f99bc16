"""The node pod fits the small node docs/deploy.md sizes, a g4dn.xlarge (one T4, 4 CPUs, 16 GiB,
29 pods): the shipped node pod for small nodes (deploy/overlays/small-nodes, and the chart's
pool from its README) is admitted there by the simulated kubelet and runs, the model pods
docs/deploy.md promises fit beside it and one more does not; what Triton may hold under its
smaller limit is still admitted, load by load, by the agent. The benchmarks count the same node
pod (`benchmarks.shapes`)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml

from agent.errors import HostMemoryExhaustedError
from agent.gpus.processes import TritonProcesses
from agent.models.quietwindow import QuietWindow
from agent.models.tritonram import HostMemory, HostMemoryRules
from benchmarks import shapes
from common.podresources import CPU, MEMORY, PODS, pod_requests
from common.quantity import parse_quantity
from sim.apiserver import RunningApiServer
from sim.node.admission import NodeAdmission
from sim.node.kubelet import HollowKubelet
from tests.conftest import require_executable
from tests.deploy.rendering import CHART, DEPLOY, render, render_chart
from tests.sim.node.test_kubelet import wait_for
from webhook.mutation import complete
from webhook.settings import Settings as WebhookSettings

G4DN_XLARGE = shapes.parse_shape("1xT4:4:29")
NODE = "g4dn-xlarge"
SYSTEM = "tritonshare-system"


def _node_objects(objects: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    """The 1-GPU node DaemonSet (the first) and what its pod names (its ServiceAccount, its
    PriorityClass)."""
    daemonset = next(o for o in objects if o["kind"] == "DaemonSet")
    assert daemonset["metadata"]["name"] in ("tritonshare-node", "tritonshare-node-small")
    spec = daemonset["spec"]["template"]["spec"]
    needed = {
        ("ServiceAccount", spec["serviceAccountName"]),
        ("PriorityClass", spec.get("priorityClassName")),
    }
    return [daemonset, *(o for o in objects if (o["kind"], o["metadata"]["name"]) in needed)]


def overlay() -> list[dict[str, Any]]:
    return _node_objects(render(require_executable("kubectl"), "overlays/small-nodes"))


def chart_pool() -> list[dict[str, Any]]:
    """The chart with the small pool its README gives."""
    readme = (CHART / "README.md").read_text()
    [values] = [b for b in re.findall(r"```yaml\n(.*?)```", readme, re.S) if "pools" in b]
    return _node_objects(render_chart(yaml.safe_load(values)))


SOURCES = {"overlays/small-nodes": overlay, "chart pool small": chart_pool}


def documented_model_pods() -> int:
    """How many model pods docs/deploy.md says fit beside the node pod on a g4dn.xlarge."""
    text = (DEPLOY.parent / "docs" / "deploy.md").read_text()
    found = re.search(r"(\d+) beside the node pod on a g4dn\.xlarge", text)
    assert found, "docs/deploy.md, Sizing, says how many model pods a g4dn.xlarge holds"
    return int(found[1])


def model_pod(index: int) -> dict[str, Any]:
    """A model pod as the webhook completes it, put on the node directly (the binder's choice
    is not under test: the kubelet's admission is)."""
    annotations = {"tritonshare.io/model-uri": "gs://models/m", "tritonshare.io/gpu-mem": "512Mi"}
    pod = {
        "metadata": {"name": f"model-{index}", "namespace": "default", "annotations": annotations},
        "spec": {"containers": []},
    }
    completed = complete(pod, WebhookSettings())
    completed["spec"]["nodeName"] = NODE
    return completed


def phase(api: kubernetes.client.ApiClient, namespace: str, name: str) -> tuple[str, str]:
    core: Any = kubernetes.client.CoreV1Api(api)
    status = core.read_namespaced_pod(name, namespace).status
    return status.phase or "", status.reason or ""


def running(api: kubernetes.client.ApiClient, namespace: str, name: str) -> bool:
    return phase(api, namespace, name)[0] == "Running"


@pytest.mark.parametrize("source", SOURCES)
def test_the_small_node_pod_runs_on_a_g4dn_xlarge_with_the_documented_model_pods_beside_it(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient, source: str
) -> None:
    daemonset, *needed = SOURCES[source]()
    template = daemonset["spec"]["template"]
    requests = pod_requests(template["spec"])
    assert {CPU: requests[CPU], MEMORY: requests[MEMORY], PODS: 1} == G4DN_XLARGE.node_pod, (
        "benchmarks.shapes counts another node pod than the one shipped for small nodes"
    )
    core: Any = kubernetes.client.CoreV1Api(kube_api)
    allocatable = {k: str(v) for k, v in G4DN_XLARGE.allocatable.items()}
    allocatable[CPU] = f"{G4DN_XLARGE.allocatable[CPU]}m"
    core.create_node({"metadata": {"name": NODE}})
    core.patch_node_status(NODE, {"status": {"allocatable": allocatable, "capacity": allocatable}})
    for obj in needed:
        if obj["kind"] == "ServiceAccount":
            core.create_namespaced_service_account(SYSTEM, obj)
        else:
            scheduling: Any = kubernetes.client.SchedulingV1Api(kube_api)
            scheduling.create_priority_class(obj)
    hollow = HollowKubelet(apiserver.api_client(), [NODE])
    hollow.start()
    try:
        # The DaemonSet controller's pod: the template, on the node.
        node_pod = {
            "metadata": {"name": "tritonshare-node-g4dn", "labels": template["metadata"]["labels"]},
            "spec": {**template["spec"], "nodeName": NODE},
        }
        core.create_namespaced_pod(SYSTEM, node_pod)
        wait_for("the node pod to run", partial(running, kube_api, SYSTEM, "tritonshare-node-g4dn"))
        fitting = documented_model_pods()
        for index in range(fitting + 1):
            core.create_namespaced_pod("default", model_pod(index))
        for index in range(fitting):
            wait_for(
                f"model pod {index} to run", partial(running, kube_api, "default", f"model-{index}")
            )
        refused = wait_for(
            "the model pod past the documented count to be refused",
            lambda: (p := phase(kube_api, "default", f"model-{fitting}"))[0] == "Failed" and p,
        )
        assert refused[1] == "OutOfcpu"
        assert phase(kube_api, SYSTEM, "tritonshare-node-g4dn")[0] == "Running"
    finally:
        hollow.stop()


def _triton(daemonset: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = daemonset["spec"]["template"]["spec"]["containers"]
    [triton] = [c for c in containers if c["name"] == "triton"]
    return dict(triton)


@pytest.mark.parametrize("source", SOURCES)
def test_the_agent_admits_loads_against_the_small_pools_triton_limit(
    source: str, tmp_path: Path
) -> None:
    """The agent reads Triton's limit from the downward API: the smaller limit still takes
    loads beside Triton's own memory (here this process stands in for Triton's tree), and
    refuses the one that would pass it, before any OOM."""
    daemonset, *_ = SOURCES[source]()
    triton = _triton(daemonset)
    limit = parse_quantity(triton["resources"]["limits"]["memory"])
    assert limit == parse_quantity(triton["resources"]["requests"]["memory"]) < 16 << 30
    containers = daemonset["spec"]["template"]["spec"]["containers"]
    [agent] = [c for c in containers if c["name"] == "agent"]
    [variable] = [v for v in agent["env"] if v["name"] == "TRITONSHARE_TRITON_MEMORY_LIMIT"]
    assert variable["valueFrom"]["resourceFieldRef"] == {
        "containerName": "triton",
        "resource": "limits.memory",
    }
    pid_file = tmp_path / "pid"
    pid_file.write_text(str(os.getpid()))
    memory = HostMemory(
        TritonProcesses(pid_file),
        HostMemoryRules(limit=limit),
        quiet=QuietWindow(None, max_age=10.0),  # a node without a gateway
    )
    admitted = 0
    with pytest.raises(HostMemoryExhaustedError, match="does not fit in Triton's host memory"):
        for index in range(64):
            # Three namespaces, so Triton's limit binds before any namespace's share does.
            owner = f"team-{index % 3}/m{index}"
            memory.admit(f"m{index}", f"digest-{index}", 0, f"m{index}", owner)
            admitted += 1
    # 8Gi less 1Gi kept, less this stand-in's own memory: 512Mi loads, about a dozen.
    assert admitted >= 10


def test_the_base_node_pod_is_refused_by_a_g4dn_xlarge_and_the_small_one_admitted() -> None:
    """Why small nodes need their own sizes: Triton's 32Gi is more than the node has."""
    allocatable = {k: str(v) for k, v in G4DN_XLARGE.allocatable.items()}
    allocatable[CPU] = f"{G4DN_XLARGE.allocatable[CPU]}m"
    [base] = [
        o
        for o in render(require_executable("kubectl"), "base")
        if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "tritonshare-node"
    ]
    for daemonset, refused in ((base, "OutOfmemory"), (overlay()[0], None)):
        judge = NodeAdmission()
        judge.set_node({"status": {"allocatable": allocatable}})
        pod = {"metadata": {"uid": "node-pod"}, "spec": daemonset["spec"]["template"]["spec"]}
        refusal = judge.admit(pod)
        assert (refusal and refusal.reason) == refused, refusal
