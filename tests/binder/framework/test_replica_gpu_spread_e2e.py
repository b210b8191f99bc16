"""Replicas over GPUs end to end: the binder against the simulated API server serving the
chart's CRD, a TritonModel scaled through `/scale` (as `kubectl scale tm`) and a Deployment's
model pods, on a node of two GPUs one of which another model uses."""

from __future__ import annotations

from typing import Any

import kubernetes.client

from tests.binder.objects import GI, KEYS
from tests.binder.simcluster import MakeBinder, add_node, add_pod, eventually
from tests.binder.tritonmodels import test_tritonmodels
from tests.binder.tritonmodels.test_tritonmodels import GROUP, PLURAL, VERSION, model, placed

apiserver = test_tritonmodels.apiserver
custom = test_tritonmodels.custom
GPUS = {"GPU-n1-0", "GPU-n1-1"}


async def _used_node(kube_api: kubernetes.client.ApiClient, core: Any) -> None:
    """Node n1 of two 16Gi GPUs; a model pod of another model on one of them."""
    add_node(kube_api, "n1", [16 * GI, 16 * GI])
    add_pod(core, "other", mem="4Gi", model="other")

    def bound_gpu() -> str:
        pod = core.read_namespaced_pod("other", "default")
        return str((pod.metadata.annotations or {}).get(KEYS.gpu) or "")

    assert await eventually(bound_gpu, what="the other model placed") in GPUS


async def _scaled_gpus(custom: Any, spread: str | None) -> set[str]:
    body = model("anchor", 1)
    if spread is not None:
        body["spec"]["replicaSpread"] = spread
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
    await eventually(lambda: placed(custom, "anchor", 1), what="1 replica placed")
    custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, "default", PLURAL, "anchor", {"spec": {"replicas": 3}}
    )
    obj = await eventually(lambda: placed(custom, "anchor", 3), what="scaled to 3")
    entries = obj["status"]["placements"]
    assert {e["node"] for e in entries} == {"n1"}
    return {e["gpu"] for e in entries}


async def test_kubectl_scale_to_three_replicas_places_them_on_both_gpus(
    kube_api: kubernetes.client.ApiClient, core: Any, custom: Any, make_binder: MakeBinder
) -> None:
    await make_binder()
    await _used_node(kube_api, core)
    assert await _scaled_gpus(custom, None) == GPUS


async def test_a_model_that_asks_to_pack_stacks_its_replicas_on_one_gpu(
    kube_api: kubernetes.client.ApiClient, core: Any, custom: Any, make_binder: MakeBinder
) -> None:
    await make_binder()
    await _used_node(kube_api, core)
    assert len(await _scaled_gpus(custom, "None")) == 1
