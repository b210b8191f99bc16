"""values.yaml's example pools select nodes by the labels their clouds set (an instance type,
Karpenter's, a cloud's accelerator with tritonshare.io/gpu-count, GPU feature discovery's where it
runs): each, alone, renders a node pod of its GPU count that runs on a node carrying exactly its
nodeSelector's labels and asks for no GPU feature discovery label beyond them."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.deploy.rendering import CHART, render_chart
from tests.deploy.test_gpu_node_shapes import GPU_NODE_TAINT, _selecting


def example_pools() -> list[dict[str, Any]]:
    """The commented `pools:` example of values.yaml, as YAML."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    start = lines.index("  #   pools:")
    block = []
    for line in lines[start:]:
        if not line.startswith("  #   "):
            break
        block.append(line.removeprefix("  # "))
    pools: list[dict[str, Any]] = yaml.safe_load("\n".join(block))["pools"]
    return pools


SELECTED = [p for p in example_pools() if p.get("nodeSelector")]


def test_the_examples_cover_each_clouds_labels() -> None:
    keys = {key for pool in SELECTED for key in pool["nodeSelector"]}
    assert {
        "node.kubernetes.io/instance-type",
        "karpenter.k8s.aws/instance-gpu-count",
        "cloud.google.com/gke-accelerator",
        "kubernetes.azure.com/accelerator",
        "tritonshare.io/gpu-count",
    } <= keys


@pytest.mark.parametrize("pool", SELECTED, ids=lambda p: p["name"])
def test_an_example_pool_runs_on_nodes_labelled_as_it_selects(pool: dict[str, Any]) -> None:
    daemonsets = [o for o in render_chart({"node": {"pools": [pool]}}) if o["kind"] == "DaemonSet"]
    labels = {"kubernetes.io/hostname": "n", **pool["nodeSelector"]}
    node = {"metadata": {"name": "n", "labels": labels}, "spec": {"taints": [GPU_NODE_TAINT]}}
    [daemonset] = _selecting(daemonsets, node)
    spec = daemonset["spec"]["template"]["spec"]
    [triton] = [c for c in spec["containers"] if c["name"] == "triton"]
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == str(pool["gpus"])
    asked = json.dumps([spec.get("nodeSelector", {}), spec.get("affinity", {})])
    if not any(key.startswith("nvidia.com/") for key in pool["nodeSelector"]):
        assert "nvidia.com/gpu." not in asked, asked
