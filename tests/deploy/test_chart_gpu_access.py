"""The chart hands the node's GPUs to the node pod the way the cluster's GPU stack hands them out
(`node.gpuAccess`): the NVIDIA device plugin with one DaemonSet per pool of nodes and its GPU
count, a DRA ResourceClaimTemplate with allocationMode All (resource.k8s.io/v1), or, as an opt-in
for development clusters, NVIDIA_VISIBLE_DEVICES=all. Each variant renders and validates against
the Kubernetes schemas (resource.k8s.io/v1 is in kubernetes-validate's schemas from 1.34)."""

from __future__ import annotations

import json
import re
from typing import Any

import helm_python
import kubernetes_validate
import pytest

from tests.conftest import require_executable
from tests.deploy.rendering import CHART, Obj, name_of, render
from tests.deploy.rendering import render_chart as _render_chart
from tests.deploy.test_chart import _without_helm_labels, render_chart
from tests.deploy.test_manifests import CUSTOM_API_VERSIONS, KUBERNETES_VERSION

DRA_VERSION = "1.34.0"
"""The first Kubernetes release with resource.k8s.io/v1 (DRA generally available)."""
GPU_NODE_TOLERATION = {
    "key": "tritonshare.io/gpu-node",
    "operator": "Exists",
    "effect": "NoExecute",
}
L4_TOLERATION = {"key": "pool", "operator": "Equal", "value": "l4", "effect": "NoSchedule"}
POOLS = [
    {"name": "default", "gpus": 8},
    {
        "name": "l4",
        "gpus": 1,
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"},
        "tolerations": [L4_TOLERATION],
    },
]


def _validate(objects: tuple[Obj, ...], version: str) -> None:
    for obj in objects:
        if obj["apiVersion"] in CUSTOM_API_VERSIONS:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            pytest.fail(
                f"{name_of(obj)} is invalid for Kubernetes {version} at {path}: {e.message}"
            )


def _daemonsets(objects: tuple[Obj, ...]) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "DaemonSet"}


def _containers(daemonset: Obj) -> dict[str, Any]:
    return {c["name"]: c for c in daemonset["spec"]["template"]["spec"]["containers"]}


def _terms(daemonset: Obj) -> list[list[dict[str, Any]]]:
    """The match expressions of each of the node pod's required node affinity terms."""
    affinity = daemonset["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return [t["matchExpressions"] for t in terms]


def _count_values(daemonset: Obj) -> set[str]:
    """The GPU counts the node pod's affinity asks for with `In` (none: any count)."""
    return {
        v
        for term in _terms(daemonset)
        for e in term
        if e["operator"] == "In" and "gpu" in e["key"] and "count" in e["key"]
        for v in e["values"]
    }


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_every_variant_lints_clean() -> None:
    for values in (
        {"node": {"pools": POOLS}},
        {"node": {"gpuAccess": "dra"}},
        {"node": {"gpuAccess": "env"}},
    ):
        report = helm_python.lint(CHART, values, strict=True, kube_version=f"v{DRA_VERSION}")
        problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        assert not problems, f"helm lint with {values}: {problems}"


def test_the_device_plugin_gives_each_pools_node_pod_its_gpu_count() -> None:
    objects = render_chart({"node": {"pools": POOLS}})
    for version in (KUBERNETES_VERSION, kubernetes_validate.latest_version()):
        _validate(objects, version)
    daemonsets = _daemonsets(objects)
    assert set(daemonsets) == {"tritonshare-node", "tritonshare-node-l4"}
    for name, gpus in (("tritonshare-node", "8"), ("tritonshare-node-l4", "1")):
        template = daemonsets[name]["spec"]["template"]
        containers = _containers(daemonsets[name])
        # Triton alone requests the GPUs; nothing sets NVIDIA_VISIBLE_DEVICES for it.
        assert containers["triton"]["resources"]["limits"]["nvidia.com/gpu"] == gpus
        assert "NVIDIA_VISIBLE_DEVICES" not in _env(containers["triton"])
        for other in ("agent", "gateway"):
            assert "nvidia.com/gpu" not in containers[other]["resources"].get("limits", {})
        # The agent reads NVML in Triton's container, through the relay: it needs neither the
        # GPUs nor the variable, so the runtime may refuse the variable from unprivileged pods.
        assert not any(k.startswith("NVIDIA_") for k in _env(containers["agent"]))
        assert _env(containers["agent"])["TRITONSHARE_GPU_SOURCE"] == "triton"
        assert "resourceClaims" not in template["spec"]
        assert GPU_NODE_TOLERATION in template["spec"]["tolerations"]
    default, l4 = daemonsets["tritonshare-node"], daemonsets["tritonshare-node-l4"]
    # Each pool's pod runs only where its request is every GPU of the node.
    assert "nodeSelector" not in default["spec"]["template"]["spec"]
    assert {"key": "nvidia.com/gpu.count", "operator": "In", "values": ["8"]} in _terms(default)[0]
    assert _count_values(default) == {"8"}
    # A pool's own selector alone: no GPU feature discovery label added (nodes without GFD,
    # as EKS managed node groups and Karpenter's come, lack it).
    assert l4["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4"}
    assert L4_TOLERATION in l4["spec"]["template"]["spec"]["tolerations"]
    assert L4_TOLERATION not in default["spec"]["template"]["spec"]["tolerations"]
    # Each DaemonSet's selector matches its own pods only by the pool's label.
    assert l4["spec"]["selector"]["matchLabels"]["tritonshare.io/node-pool"] == "l4"
    assert l4["spec"]["template"]["metadata"]["labels"]["tritonshare.io/node-pool"] == "l4"
    assert "tritonshare.io/node-pool" not in default["spec"]["selector"]["matchLabels"]
    # With tenant code, every pool gets its second DaemonSet.
    with_tenant_code = render_chart(
        {"node": {"pools": POOLS}, "agent": {"tenantCodeNamespaces": ["lab"]}}
    )
    assert set(_daemonsets(with_tenant_code)) == {
        "tritonshare-node",
        "tritonshare-node-tenant-code",
        "tritonshare-node-l4",
        "tritonshare-node-l4-tenant-code",
    }


def test_dra_claims_every_gpu_of_the_node_for_triton_and_the_agent() -> None:
    values = {"node": {"gpuAccess": "dra", "dra": {"deviceClassName": "gpu.example.com"}}}
    objects = render_chart(values)
    _validate(objects, DRA_VERSION)
    _validate(objects, kubernetes_validate.latest_version())
    [template] = [o for o in objects if o["kind"] == "ResourceClaimTemplate"]
    assert template["apiVersion"] == "resource.k8s.io/v1"
    assert template["metadata"]["namespace"] == "tritonshare-system"
    [request] = template["spec"]["spec"]["devices"]["requests"]
    assert request == {
        "name": "gpus",
        "exactly": {"deviceClassName": "gpu.example.com", "allocationMode": "All"},
    }
    # Before 1.34 the API server has no resource.k8s.io/v1: there is no schema for it.
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(template, "1.33.0", strict=True)
    # The strict schema refuses what the API server would: a misspelled field, a missing class.
    misspelled = {"deviceClass": "gpu.example.com", "allocationMode": "All"}
    broken = {"name": "gpus", "exactly": misspelled}
    broken_template = {**template, "spec": {"spec": {"devices": {"requests": [broken]}}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken_template, DRA_VERSION, strict=True)
    daemonset = _daemonsets(objects)["tritonshare-node"]
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["resourceClaims"] == [
        {"name": "gpus", "resourceClaimTemplateName": template["metadata"]["name"]}
    ]
    containers = _containers(daemonset)
    assert _env(containers["agent"])["TRITONSHARE_GPU_SOURCE"] == "nvml", "in its own container"
    for name in ("triton", "agent"):
        assert containers[name]["resources"]["claims"] == [{"name": "gpus"}]
        assert "nvidia.com/gpu" not in containers[name]["resources"].get("limits", {})
        assert "NVIDIA_VISIBLE_DEVICES" not in _env(containers[name])
    assert "claims" not in containers["gateway"]["resources"]
    assert "nodeSelector" not in spec
    assert _count_values(daemonset) == set(), "any GPU count"
    assert set(_daemonsets(objects)) == {"tritonshare-node"}, "one DaemonSet for every count"
    # The default (device plugin) renders no claim template.
    assert not [o for o in render_chart() if o["kind"] == "ResourceClaimTemplate"]


def test_the_dra_overlay_is_the_charts_dra_mode() -> None:
    """deploy/overlays/dra makes the chart's node.gpuAccess=dra objects, field for field."""
    overlay = {name_of(o): o for o in render(require_executable("kubectl"), "overlays/dra")}
    chart = {name_of(o): o for o in render_chart({"node": {"gpuAccess": "dra"}})}
    for name in (
        "DaemonSet/tritonshare-system/tritonshare-node",
        "ResourceClaimTemplate/tritonshare-system/tritonshare-node-gpus",
    ):
        assert _without_helm_labels(chart[name]) == overlay[name], name
    _validate(tuple(overlay.values()), DRA_VERSION)


def test_the_environment_variable_mode_is_an_explicit_opt_in() -> None:
    objects = render_chart({"node": {"gpuAccess": "env"}})
    _validate(objects, KUBERNETES_VERSION)
    daemonset = _daemonsets(objects)["tritonshare-node"]
    containers = _containers(daemonset)
    assert _env(containers["triton"])["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert _env(containers["agent"])["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert _env(containers["agent"])["TRITONSHARE_GPU_SOURCE"] == "nvml"
    for container in containers.values():
        assert not any(
            k.startswith("nvidia.com/") for k in container["resources"].get("limits", {})
        )
    assert "resourceClaims" not in daemonset["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"node": {"gpuAccess": "all"}}, "/node/gpuAccess"),
        ({"node": {"pools": [{"name": "a", "gpus": 0}]}}, "/node/pools/0/gpus"),
        ({"node": {"pools": [{"name": "a"}]}}, "gpus"),
        ({"node": {"pools": [{"name": "A100", "gpus": 8}]}}, "/node/pools/0/name"),
        ({"node": {"pools": []}}, "/node/pools"),
        ({"node": {"pools": [{"name": "a", "gpus": 1, "tritonImage": ""}]}}, "tritonImage"),
    ],
)
def test_the_values_schema_refuses_a_wrong_gpu_setting(
    values: dict[str, Any], problem: str
) -> None:
    with pytest.raises(helm_python.HelmValuesError, match=re.escape(problem)):
        _render_chart(values)


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        (
            {"node": {"pools": [{"name": "a", "gpus": 1}, {"name": "a", "gpus": 2}]}},
            'the pool name "a" is used twice',
        ),
        (
            {
                "node": {"pools": [{"name": "a", "gpus": 1, "affinity": {"nodeAffinity": {}}}]},
                "agent": {"tenantCodeNamespaces": ["lab"]},
            },
            "node.pools[a].affinity cannot be combined with agent.tenantCodeNamespaces",
        ),
    ],
)
def test_pools_that_cannot_work_are_refused_with_the_reason(
    values: dict[str, Any], problem: str
) -> None:
    with pytest.raises(helm_python.HelmError, match=re.escape(problem)):
        _render_chart(values)


def test_the_readmes_example_pool_selects_by_instance_type_alone() -> None:
    """The chart README's pool of g4dn.xlarge nodes runs on nodes as EKS managed node groups
    and Karpenter label them: by instance type, never a GPU feature discovery label they lack."""
    selector = {"node.kubernetes.io/instance-type": "g4dn.xlarge"}
    pool = {"name": "t4", "gpus": 1, "nodeSelector": selector}
    daemonsets = _daemonsets(render_chart({"node": {"pools": [pool]}}))
    spec = daemonsets["tritonshare-node-t4"]["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == selector
    assert "nvidia.com/" not in json.dumps(spec.get("affinity", {})), spec.get("affinity")
    triton = _containers(daemonsets["tritonshare-node-t4"])["triton"]
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_a_pool_pins_its_own_triton_image() -> None:
    """A pool of another Triton release (a TensorRT plan's) beside the default pool: its node pod
    runs the pool's image, every other pool's runs triton.image (its digest where one is set)."""
    image = "nvcr.io/nvidia/tritonserver:24.09-py3"
    pools = [*POOLS, {"name": "plans", "gpus": 1, "tritonImage": image}]
    digest = "sha256:" + "a" * 64
    for triton, default_image in (
        ({}, "nvcr.io/nvidia/tritonserver:24.10-py3"),
        ({"image": {"digest": digest}}, f"nvcr.io/nvidia/tritonserver@{digest}"),
    ):
        objects = render_chart({"node": {"pools": pools}, "triton": triton})
        _validate(objects, KUBERNETES_VERSION)
        images = {
            name: _containers(daemonset)["triton"]["image"]
            for name, daemonset in _daemonsets(objects).items()
        }
        assert images == {
            "tritonshare-node": default_image,
            "tritonshare-node-l4": default_image,
            "tritonshare-node-plans": image,
        }


def test_the_kustomize_pool_of_another_triton_release_keeps_the_base_pools_off_its_nodes() -> None:
    """deploy/overlays/triton-pool: the pool's node pod runs its own Triton on the nodes labelled
    for it, and no node pod of the base's pools (two pods asking for a node's GPUs) runs there."""
    daemonsets = _daemonsets(render(require_executable("kubectl"), "overlays/triton-pool"))
    plans = daemonsets.pop("tritonshare-node-plans")
    spec = plans["spec"]["template"]["spec"]
    assert _containers(plans)["triton"]["image"] == "nvcr.io/nvidia/tritonserver:24.09-py3"
    assert spec["nodeSelector"] == {"tritonshare.io/triton-pool": "plans"}
    assert "affinity" not in spec
    assert plans["spec"]["selector"]["matchLabels"]["tritonshare.io/node-pool"] == "plans"
    assert set(daemonsets) == {f"tritonshare-node{s}" for s in ("", "-2gpu", "-4gpu", "-8gpu")}
    away = {"key": "tritonshare.io/triton-pool", "operator": "DoesNotExist"}
    for daemonset in daemonsets.values():
        image = _containers(daemonset)["triton"]["image"]
        assert image == "nvcr.io/nvidia/tritonserver:24.10-py3"
        assert all(away in term for term in _terms(daemonset)), name_of(daemonset)
