"""The binder places by what GPUs really hold: a placed pod holds the larger of its request and
its model's measured memory (the agent's gpu-usage annotation), and a GPU never offers more than
NVML's free memory minus the reserve. Through the official client against sim/."""

from __future__ import annotations

import json
from typing import Any

import kubernetes.client

from binder.cluster.objects import NodeInfo, PodInfo
from common.tritonname import private_triton_name
from tests.binder.objects import GI, KEYS
from tests.binder.simcluster import (
    MakeBinder,
    add_node,
    add_pod,
    bound,
    eventually,
    failure,
    node_of,
    scheduled_condition,
)


def publish_usage(core: Any, node: str, used: int, models: dict[str, int]) -> None:
    usage = {f"GPU-{node}-0": {"used": used, "models": models}}
    core.patch_node(node, {"metadata": {"annotations": {KEYS.gpu_usage: json.dumps(usage)}}})


async def test_a_model_using_more_than_it_asked_for_holds_what_it_uses(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    binder = await make_binder()
    add_pod(core, "greedy", mem="2Gi", model="greedy")
    await eventually(lambda: node_of(core, "greedy"), what="greedy to be bound")
    # Its model turns out to use 10Gi: the GPU has 6Gi left, not 14Gi.
    publish_usage(core, "gpu-1", 10 * GI, {"greedy": 10 * GI})
    await eventually(
        lambda: binder.cache.state.memory.free("gpu-1") == [6 * GI], what="the measured figure"
    )
    add_pod(core, "big", mem="8Gi", model="big")
    condition = await eventually(lambda: scheduled_condition(core, "big"), what="big's reason")
    assert condition.reason == "Unschedulable"
    assert "Insufficient GPU memory (largest free block 6Gi)" in condition.message
    add_pod(core, "fits", mem="5Gi", model="fits")
    assert await eventually(lambda: node_of(core, "fits"), what="a 5Gi pod to fit") == "gpu-1"


async def test_a_gpu_never_offers_more_than_nvml_says_is_free(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    publish_usage(core, "gpu-1", 12 * GI, {})  # something outside tritonshare uses 12Gi
    await make_binder()
    add_pod(core, "big", mem="8Gi", model="big")
    condition = await eventually(lambda: scheduled_condition(core, "big"), what="big's reason")
    assert "largest free block 4Gi" in condition.message
    add_pod(core, "small", mem="3Gi", model="small")
    assert await eventually(lambda: node_of(core, "small"), what="a 3Gi pod to fit") == "gpu-1"


def test_a_pods_measured_figure_is_found_by_its_private_name_and_never_lent_to_another() -> None:
    """The agent publishes each model's figure by its name in Triton: two pods of one model id
    (two namespaces, two revisions) each hold their own figure; a model installed before private
    names is found by its id, and a pod whose own figure is there never takes that one."""
    ours = PodInfo("uid-a", "team-a", "a", model_id="resnet50", request=GI)
    theirs = PodInfo("uid-b", "team-b", "b", model_id="resnet50", request=GI)
    legacy = PodInfo("uid-c", "team-c", "c", model_id="resnet50", request=GI)
    node = NodeInfo(
        "gpu-1", measured={ours.triton_name: 3 * GI, theirs.triton_name: 2 * GI, "resnet50": GI}
    )
    assert ours.triton_name != theirs.triton_name
    assert ours.triton_name == private_triton_name("team-a", "resnet50", "uid-a")
    assert [node.measured_of(p) for p in (ours, theirs, legacy)] == [3 * GI, 2 * GI, GI]
    assert NodeInfo("gpu-1", measured={"resnet50": GI}).measured_of(ours) == GI
    assert node.measured_of(PodInfo("uid-d", "team-d", "d")) is None


async def test_residency_classes_through_the_api(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI], labels={KEYS.gpu_mem_overcommit: "3"})
    await make_binder()
    on_demand = {KEYS.residency: "on-demand"}
    for n in range(6):  # 36Gi of on-demand models on a 16Gi GPU, placed against 48Gi
        add_pod(core, f"idle-{n}", mem="6Gi", model=f"idle-{n}", annotations=on_demand)
    await eventually(lambda: len(bound(core, [f"idle-{n}" for n in range(6)])) == 6, what="six")
    # An always pod fits beside them: 16Gi minus the largest on-demand model, woken.
    add_pod(core, "steady", mem="10Gi", model="steady")
    assert await eventually(lambda: node_of(core, "steady"), what="steady") == "gpu-1"
    # Now the always-resident models leave 6Gi to wake a model in: a 7Gi one fits nowhere.
    add_pod(core, "large", mem="7Gi", model="large", annotations=on_demand)
    condition = await eventually(lambda: scheduled_condition(core, "large"), what="large")
    assert condition.reason == "Unschedulable"
    assert "Insufficient GPU memory for always-resident models" in condition.message
    # A residency that names no class is explained, as the binder's other refusals are.
    add_pod(core, "typo", mem="1Gi", model="typo", annotations={KEYS.residency: "sometimes"})
    condition = await eventually(lambda: scheduled_condition(core, "typo"), what="typo")
    assert condition.status == "False" and "is not a residency class" in condition.message
    assert "is not a residency class" in await eventually(lambda: failure(core, "typo"))


async def test_a_deleted_pods_memory_counts_against_its_quota_until_its_node_unloads_it(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    """Attack: a namespace's 10Gi pod is deleted while Triton still holds its model (a slow
    unload); its quota's use drops at once, yet the memory is not free. Its next 10Gi pod waits,
    refused by the quota, until the node no longer reports the model loaded."""
    add_node(kube_api, "gpu-1", [16 * GI, 16 * GI])
    core.create_namespaced_resource_quota(
        "default",
        {
            "metadata": {"name": "gpu"},
            "spec": {"hard": {"requests.tritonshare.io/gpu-mem": "10Gi"}},
        },
    )
    binder = await make_binder()
    add_pod(core, "first", mem="10Gi", model="m")
    await eventually(lambda: node_of(core, "first"), what="first to be bound")
    uid = core.read_namespaced_pod("first", "default").metadata.uid
    name = private_triton_name("default", "m", uid)
    publish_usage(core, "gpu-1", 10 * GI, {name: 10 * GI})
    await eventually(
        lambda: binder.cache.state.nodes["gpu-1"].measured.get(name), what="the measured model"
    )
    core.delete_namespaced_pod("first", "default", grace_period_seconds=0)
    await eventually(
        lambda: not binder.cache.state.charged_pod(uid), what="the pod gone from the binder"
    )
    add_pod(core, "second", mem="10Gi", model="m2")
    condition = await eventually(lambda: scheduled_condition(core, "second"), what="its reason")
    assert condition.status == "False" and "exceeded quota: gpu" in condition.message, condition
    assert not node_of(core, "second")
    # Triton has unloaded it: the node no longer reports it, and the quota has room again.
    publish_usage(core, "gpu-1", 0, {})
    assert await eventually(lambda: node_of(core, "second"), what="second bound") == "gpu-1"
