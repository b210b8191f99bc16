"""With default values, every GPU node gets a node pod that holds all its GPUs, whatever its cloud
and GPU count: the chart and deploy/overlays/production render one DaemonSet per GPU count (1, 2,
4, 8), and each GPU node, labelled and tainted as its GPU stack leaves it, is selected by exactly
one of them, whose pod requests every GPU of the node and fits the node's allocatable, and whose
Triton loads the agent's --parallel-loads for each GPU at once.

Nodes are judged as kube-scheduler does (the binder's nodeSelector, node affinity and taint
rules, which follow it) and admitted as the kubelet does (the simulated kubelet's admission).
Allocatable is the instance's capacity less a tenth of its memory and 200m CPU for the system.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from binder.cluster.objects import constraints_from_spec, node_from_api
from binder.framework.noderules import first_untolerated_taint, matches_required_affinity
from common.contract import Keys
from sim.node.admission import NodeAdmission
from tests.conftest import require_executable
from tests.deploy.rendering import Obj, render, render_chart

GPU_NODE_TAINT = {"key": "tritonshare.io/gpu-node", "value": "true", "effect": "NoExecute"}


@dataclass(frozen=True)
class Shape:
    """A GPU node as one stack labels and taints it."""

    stack: str
    instance: str
    gpus: int
    cpus: int
    memory_gib: int
    labels: tuple[tuple[str, str], ...]
    taints: tuple[tuple[str, str, str], ...] = ()


def _count(key: str, gpus: int) -> tuple[str, str]:
    return (key, str(gpus))


def _shapes() -> Iterator[Shape]:
    # Any cloud or on-premises: GPU feature discovery labels the count.
    operator = {1: ("a100x1", 12, 144), 2: ("a100x2", 24, 288), 4: ("a100x4", 48, 576)}
    operator[8] = ("p4d.24xlarge", 96, 1152)
    for gpus, (instance, cpus, memory) in operator.items():
        labels = (
            ("nvidia.com/gpu.present", "true"),
            _count("nvidia.com/gpu.count", gpus),
            ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB"),
        )
        yield Shape("gpu-operator", instance, gpus, cpus, memory, labels)
    # Karpenter on EKS labels every node with its GPU count; its NodePools taint GPU nodes.
    karpenter = {1: ("g5.4xlarge", 16, 64), 2: ("g3.8xlarge", 32, 244)}
    karpenter |= {4: ("g5.12xlarge", 48, 192), 8: ("g5.48xlarge", 192, 768)}
    for gpus, (instance, cpus, memory) in karpenter.items():
        labels = (
            _count("karpenter.k8s.aws/instance-gpu-count", gpus),
            ("karpenter.k8s.aws/instance-gpu-name", "a10g"),
            ("node.kubernetes.io/instance-type", instance),
        )
        taints = (("nvidia.com/gpu", "true", "NoSchedule"),)
        yield Shape("eks-karpenter", instance, gpus, cpus, memory, labels, taints)
    # The clouds' own device plugins label the accelerator, not the count: the node pool sets
    # tritonshare.io/gpu-count (docs/deploy.md).
    eks = {1: ("g4dn.4xlarge", 16, 64), 2: ("g3.8xlarge", 32, 244)}
    eks |= {4: ("g4dn.12xlarge", 48, 192), 8: ("g4dn.metal", 96, 384)}
    gke = {1: ("g2-standard-16", 16, 64), 2: ("g2-standard-24", 24, 96)}
    gke |= {4: ("g2-standard-48", 48, 192), 8: ("g2-standard-96", 96, 384)}
    aks = {1: ("Standard_NC24ads_A100_v4", 24, 220), 2: ("Standard_NC48ads_A100_v4", 48, 440)}
    aks |= {4: ("Standard_NC96ads_A100_v4", 96, 880), 8: ("Standard_ND96asr_v4", 96, 900)}
    clouds = (
        (
            "eks",
            eks,
            ("k8s.amazonaws.com/accelerator", "nvidia-tesla-t4"),
            ("nvidia.com/gpu", "true"),
        ),
        (
            "gke",
            gke,
            ("cloud.google.com/gke-accelerator", "nvidia-l4"),
            ("nvidia.com/gpu", "present"),
        ),
        ("aks", aks, ("kubernetes.azure.com/accelerator", "nvidia"), ("sku", "gpu")),
    )
    for stack, table, accelerator, (taint, value) in clouds:
        for gpus, (instance, cpus, memory) in table.items():
            counted = (accelerator, _count("tritonshare.io/gpu-count", gpus))
            tainted = ((taint, value, "NoSchedule"),)
            yield Shape(stack, instance, gpus, cpus, memory, counted, tainted)


SHAPES = tuple(_shapes())


def _node(shape: Shape, *, gpu_node: bool = True) -> Obj:
    taints = [{"key": k, "value": v, "effect": e} for k, v, e in shape.taints]
    if gpu_node:
        taints.append(dict(GPU_NODE_TAINT))
    capacity = {
        "cpu": f"{shape.cpus * 1000 - 200}m",
        "memory": f"{shape.memory_gib * 1024 * 9 // 10}Mi",
        "pods": "110",
    }
    if shape.gpus:
        capacity["nvidia.com/gpu"] = str(shape.gpus)
    return {
        "metadata": {"name": f"{shape.stack}-{shape.instance}", "labels": dict(shape.labels)},
        "spec": {"taints": taints},
        "status": {"allocatable": capacity},
    }


def _selecting(daemonsets: list[Obj], node: Obj) -> list[Obj]:
    """The DaemonSets whose pod kube-scheduler would place on `node`."""
    info = node_from_api(node, Keys())
    chosen = []
    for daemonset in daemonsets:
        constraints = constraints_from_spec(daemonset["spec"]["template"]["spec"])
        if matches_required_affinity(constraints, info) and (
            first_untolerated_taint(info, constraints.tolerations) is None
        ):
            chosen.append(daemonset)
    return chosen


def _triton(daemonset: Obj) -> dict[str, Any]:
    containers: list[dict[str, Any]] = daemonset["spec"]["template"]["spec"]["containers"]
    [triton] = [c for c in containers if c["name"] == "triton"]
    return triton


RENDERINGS = ("chart", "kustomize")


def _daemonsets(rendering: str) -> list[Obj]:
    if rendering == "chart":
        objects = render_chart()
    else:
        objects = render(require_executable("kubectl"), "overlays/production")
    return [o for o in objects if o["kind"] == "DaemonSet"]


@pytest.mark.parametrize("rendering", RENDERINGS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s.stack}-{s.gpus}gpu")
def test_each_gpu_node_gets_one_node_pod_with_all_its_gpus(rendering: str, shape: Shape) -> None:
    node = _node(shape)
    [daemonset] = _selecting(_daemonsets(rendering), node)
    triton = _triton(daemonset)
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == str(shape.gpus)
    # Triton's CPU and memory follow the GPU count: 2 CPUs and 32Gi a GPU.
    assert triton["resources"]["requests"] == {
        "cpu": str(2 * shape.gpus),
        "memory": f"{32 * shape.gpus}Gi",
    }
    # Triton loads as many models at once as the agent lets share each of its GPUs.
    [agent] = [
        c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == "agent"
    ]
    [parallel] = [a.split("=")[1] for a in agent["args"] if a.startswith("--parallel-loads=")]
    threads = [a for a in triton["args"] if a.startswith("--model-load-thread-count=")]
    assert threads == [f"--model-load-thread-count={int(parallel) * shape.gpus}"]
    judge = NodeAdmission()
    judge.set_node(node)
    pod = {"metadata": {"uid": "node-pod"}, "spec": daemonset["spec"]["template"]["spec"]}
    refusal = judge.admit(pod)
    assert refusal is None, f"{shape.instance}: {refusal}"


@pytest.mark.parametrize("rendering", RENDERINGS)
def test_nodes_that_are_not_gpu_nodes_get_none(rendering: str) -> None:
    daemonsets = _daemonsets(rendering)
    assert len(daemonsets) == 4
    cpu_nodes = (
        Shape(
            "eks-karpenter",
            "m7i.4xlarge",
            0,
            16,
            64,
            (("karpenter.k8s.aws/instance-gpu-count", "0"),),
        ),
        Shape(
            "gke", "e2-standard-8", 0, 8, 32, (("cloud.google.com/gke-nodepool", "default-pool"),)
        ),
        Shape("aks", "Standard_D8s_v5", 0, 8, 32, (("kubernetes.azure.com/agentpool", "system"),)),
    )
    for shape in cpu_nodes:
        assert _selecting(daemonsets, _node(shape, gpu_node=False)) == [], shape.instance
    # A cloud's GPU node without a count label: no DaemonSet can know how many GPUs to ask for,
    # so none runs there until the node pool sets tritonshare.io/gpu-count.
    [gke_l4] = [s for s in SHAPES if s.stack == "gke" and s.gpus == 4]
    unlabelled = _node(gke_l4)
    del unlabelled["metadata"]["labels"]["tritonshare.io/gpu-count"]
    assert _selecting(daemonsets, unlabelled) == []
