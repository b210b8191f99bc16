"""deploy/example/karpenter-nodepool.yaml: a Karpenter v1 NodePool whose fields are those
Karpenter requires, whose nodes (labelled as Karpenter labels an instance of each GPU count it
allows) each get exactly one of the chart's node pods, and on which a waiting model's placeholder
lands only where one GPU holds the model."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from binder.nodescaling.placeholders import Group, Selection, manifest
from common.contract import Keys
from sim.controllers.nodefit import unfit
from tests.deploy.rendering import REPO, render_chart
from tests.deploy.test_gpu_node_shapes import _selecting

NODEPOOL = REPO / "deploy" / "example" / "karpenter-nodepool.yaml"
OPERATORS = {"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"}
GPU_MEMORY = "karpenter.k8s.aws/instance-gpu-memory"
GPU_COUNT = "karpenter.k8s.aws/instance-gpu-count"
# Instances of the families the NodePool allows: (family, GPU count, one GPU's MiB).
INSTANCES = {
    "g4dn.xlarge": ("g4dn", 1, 16384),
    "g5.12xlarge": ("g5", 4, 24576),
    "g6e.2xlarge": ("g6e", 1, 49152),
    "p4d.24xlarge": ("p4d", 8, 40960),
    "p5.48xlarge": ("p5", 8, 81920),
}


def nodepool() -> dict[str, Any]:
    [doc] = list(yaml.safe_load_all(NODEPOOL.read_text()))
    assert isinstance(doc, dict)
    return doc


def test_it_has_the_fields_karpenter_requires() -> None:
    doc = nodepool()
    assert (doc["apiVersion"], doc["kind"]) == ("karpenter.sh/v1", "NodePool")
    assert doc["metadata"]["name"]
    spec = doc["spec"]["template"]["spec"]
    assert set(spec["nodeClassRef"]) == {"group", "kind", "name"}
    for requirement in spec["requirements"]:
        assert requirement["operator"] in OPERATORS, requirement
        assert all(isinstance(v, str) for v in requirement.get("values", [])), requirement
    for taint in spec["taints"]:
        assert taint["effect"] in {"NoSchedule", "PreferNoSchedule", "NoExecute"}, taint
    disruption = doc["spec"]["disruption"]
    assert disruption["consolidationPolicy"] in {"WhenEmpty", "WhenEmptyOrUnderutilized"}
    assert set(doc["spec"]) <= {"template", "disruption", "limits", "weight"}


def karpenter_node(instance: str) -> dict[str, Any]:
    """A node Karpenter makes of the NodePool for `instance`: its well-known labels, the
    NodePool's taints and the GPU node's allocatable."""
    family, gpus, mebibytes = INSTANCES[instance]
    spec = nodepool()["spec"]["template"]["spec"]
    allowed = {r["key"]: r["values"] for r in spec["requirements"] if r["operator"] == "In"}
    assert family in allowed["karpenter.k8s.aws/instance-family"]
    assert str(gpus) in allowed[GPU_COUNT]
    labels = {
        "kubernetes.io/hostname": instance,
        "node.kubernetes.io/instance-type": instance,
        "karpenter.k8s.aws/instance-family": family,
        "karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia",
        GPU_COUNT: str(gpus),
        GPU_MEMORY: str(mebibytes),
        "karpenter.sh/capacity-type": "on-demand",
    }
    return {
        "metadata": {"name": instance, "labels": labels},
        "spec": {"taints": spec["taints"]},
        "status": {"allocatable": {"cpu": "8", "memory": "64Gi", "pods": "110"}},
    }


@pytest.mark.parametrize("instance", sorted(INSTANCES))
def test_each_of_its_nodes_gets_one_node_pod_of_its_gpus(instance: str) -> None:
    daemonsets = [o for o in render_chart() if o["kind"] == "DaemonSet"]
    [daemonset] = _selecting(daemonsets, karpenter_node(instance))
    containers = daemonset["spec"]["template"]["spec"]["containers"]
    [triton] = [c for c in containers if c["name"] == "triton"]
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == str(INSTANCES[instance][1])


def test_a_40gi_models_placeholder_lands_only_where_one_gpu_holds_it() -> None:
    placeholder = manifest(
        Group("models", Selection()),
        name="tritonshare-placeholder-x-0",
        namespace="tritonshare-system",
        keys=Keys(),
        image="pause",
        node_selector=((GPU_COUNT, None),),
        waiting_for=["tritonmodel models/large"],
        gpu_memory=(GPU_MEMORY, 40 * 1024 + 1536),  # 40Gi and the chart's reserve
    )
    fits = {i for i in INSTANCES if unfit(placeholder, karpenter_node(i), []) is None}
    assert fits == {"g6e.2xlarge", "p5.48xlarge"}
