"""Two pools of two Triton releases end to end: the binder against the simulated API server serving
the chart's CRD, nodes whose agents publish 24.10 and 24.09 (`tritonshare.io/triton-version`). A
TritonModel that needs 24.09 is placed only on that pool; one, and a model pod, that need a
release no node runs stay pending, and their condition and Event name the releases the nodes
run."""

from __future__ import annotations

from typing import Any

import kubernetes.client
import pytest

from tests.binder.objects import GI, KEYS
from tests.binder.simcluster import MakeBinder, add_node, add_pod, eventually, scheduled_condition
from tests.binder.tritonmodels import test_tritonmodels
from tests.binder.tritonmodels.test_tritonmodels import (
    GROUP,
    PLURAL,
    VERSION,
    model,
    not_placed,
    placed,
)

apiserver = test_tritonmodels.apiserver
custom = test_tritonmodels.custom

REFUSED = (
    "0/3 nodes are available: 1 node(s) ran Triton 24.09, not 25.01 as the model requires, "
    "2 node(s) ran Triton 24.10, not 25.01 as the model requires."
)


def two_pools(kube_api: kubernetes.client.ApiClient) -> None:
    """Pool a (two nodes, Triton 24.10) and pool b (one node, Triton 24.09)."""
    for name, release in (("a1", "24.10"), ("a2", "24.10"), ("b1", "24.09")):
        add_node(kube_api, name, [16 * GI, 16 * GI], annotations={KEYS.triton_version: release})


def failed_scheduling(core: Any, name: str) -> list[Any]:
    found = core.list_namespaced_event("default", field_selector=f"involvedObject.name={name}")
    return [e for e in found.items if e.reason == "FailedScheduling"]


async def test_a_tritonmodel_that_needs_a_release_is_placed_only_on_its_pool(
    kube_api: kubernetes.client.ApiClient, custom: Any, make_binder: MakeBinder
) -> None:
    await make_binder()
    two_pools(kube_api)
    body = model("plan", 3)
    body["spec"]["tritonVersion"] = "24.09"
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
    obj = await eventually(lambda: placed(custom, "plan", 3), what="3 replicas placed")
    assert {e["node"] for e in obj["status"]["placements"]} == {"b1"}


async def test_a_tritonmodel_that_needs_a_release_no_node_runs_says_which_they_run(
    kube_api: kubernetes.client.ApiClient, core: Any, custom: Any, make_binder: MakeBinder
) -> None:
    await make_binder()
    two_pools(kube_api)
    body = model("newer", 1)
    body["spec"]["tritonVersion"] = "25.01"
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)

    condition = await eventually(lambda: not_placed(custom, "newer"), what="Placed=False")
    assert condition["reason"] == "Unschedulable"
    assert condition["message"] == f"replica 0: {REFUSED}"
    [event] = await eventually(lambda: failed_scheduling(core, "newer"), what="the Event")
    assert event.message == condition["message"]


async def test_a_model_pod_that_needs_a_release_no_node_runs_stays_pending_saying_why(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    await make_binder()
    two_pools(kube_api)
    add_pod(core, "newer", annotations={KEYS.triton_version: "25.01"})
    add_pod(core, "older", annotations={KEYS.triton_version: "24.09"})

    def bound(name: str) -> str:
        return str(core.read_namespaced_pod(name, "default").spec.node_name or "")

    assert await eventually(lambda: bound("older"), what="the 24.09 pod bound") == "b1"
    condition = await eventually(
        lambda: scheduled_condition(core, "newer"), what="PodScheduled=False"
    )
    assert (condition.status, condition.reason) == ("False", "Unschedulable")
    assert condition.message == REFUSED
    [event] = await eventually(lambda: failed_scheduling(core, "newer"), what="the Event")
    assert event.message == REFUSED
    assert not bound("newer")


async def test_the_crd_refuses_a_release_that_is_not_one(custom: Any) -> None:
    body = model("bad", 1)
    body["spec"]["tritonVersion"] = "24.10-py3"
    with pytest.raises(kubernetes.client.ApiException) as refused:
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
    assert refused.value.status == 422
    assert "tritonVersion" in str(refused.value.body)
