"""The binder places by what GPUs really hold: a placed pod holds the larger of its request and
its model's measured memory (the agent's gpu-usage annotation), and a GPU never offers more than
NVML's free memory minus the reserve. Through the official client against sim/."""

from __future__ import annotations

import json
from typing import Any

import kubernetes.client

from tests.binder.objects import GI, KEYS
from tests.binder.simcluster import (
    MakeBinder,
    add_node,
    add_pod,
    eventually,
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
        lambda: binder.cache.state.gpu_free("gpu-1") == [6 * GI], what="the measured figure"
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
