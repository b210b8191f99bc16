"""A TritonModel's disruption budget (`spec.minAvailable`), against the simulated API server's
Eviction API and PodDisruptionBudgets through the official client: the binder keeps one budget on
the namespace's model hosts, so a kubectl-drain-style eviction of a host is allowed while the
model keeps its minimum ready elsewhere and refused with 429 while it would not; the schema
refuses a negative minimum. The budget's arithmetic is checked on its own."""

from __future__ import annotations

import json
from typing import Any

import kubernetes.client
import pytest

from binder.tritonmodels.hostbudget import BUDGET_NAME, evictable, min_available
from common.hosted import host_name
from tests.binder.objects import GI
from tests.binder.simcluster import MakeBinder, add_node, eventually
from tests.binder.tritonmodels import test_tritonmodels
from tests.binder.tritonmodels.test_host_gaps import loaded
from tests.binder.tritonmodels.test_model_hosts import hosted
from tests.binder.tritonmodels.test_tritonmodels import (
    GROUP,
    PLURAL,
    VERSION,
    hosts,
    kubelet_removes_deleted,
    model,
    placed,
    read,
)

apiserver = test_tritonmodels.apiserver
custom = test_tritonmodels.custom


def budgeted(name: str, replicas: int, minimum: int) -> dict[str, Any]:
    obj = model(name, replicas)
    obj["spec"]["minAvailable"] = minimum
    return obj


def running(core: Any, node: str) -> None:
    """What the kubelet writes on the host on `node` once its containers run and its replicas
    are loaded (no kubelet here): a Pending pod is evicted without a look at any budget."""
    loaded(core, node, "resnet")
    core.patch_namespaced_pod_status(host_name(node), "default", {"status": {"phase": "Running"}})


def evict(core: Any, node: str) -> None:
    """What kubectl drain asks of the host on `node`: its eviction (policy/v1)."""
    name = host_name(node)
    body = kubernetes.client.V1Eviction(
        metadata=kubernetes.client.V1ObjectMeta(name=name, namespace="default")
    )
    core.create_namespaced_pod_eviction(name, "default", body)


def allowed(policy: Any) -> int | None:
    """The budget's disruptionsAllowed once the API server has processed its spec."""
    try:
        found = policy.read_namespaced_pod_disruption_budget(BUDGET_NAME, "default")
    except kubernetes.client.ApiException:
        return None
    if found.status is None or found.status.observed_generation != found.metadata.generation:
        return None
    return int(found.status.disruptions_allowed)


def test_the_hosts_that_may_go_keep_each_models_minimum_whichever_they_are() -> None:
    assert evictable({"h1": 1, "h2": 1}, 1) == 1
    assert evictable({"h1": 2, "h2": 1, "h3": 1}, 2) == 1, "its fullest host first"
    assert evictable({"h1": 1, "h2": 1}, 2) == 0
    assert evictable({"h1": 1}, 3) == 0, "a minimum not met blocks every eviction"
    assert evictable({"h1": 1, "h2": 1}, 0) is None, "no minimum: all may go"
    assert min_available(3, []) is None, "no model with a minimum: no budget"
    assert min_available(4, [({"h1": 1, "h2": 1}, 1), ({"h3": 1, "h4": 1}, 1)]) == 3
    assert min_available(3, [({"h1": 1, "h2": 1}, 1), ({"h3": 2}, 1)]) == 3, "h3 holds both"
    assert min_available(3, [({"h1": 1, "h2": 1}, 0)]) == 0
    assert min_available(1, [({"h1": 1}, 1)]) == 1


async def test_a_host_eviction_keeps_the_models_min_available(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    """Two replicas on two nodes, minAvailable 1: evicting one host is allowed, the other then
    refused with 429 until the first host is back and serves its replica again."""
    for node in ("n1", "n2"):
        add_node(kube_api, node, [16 * GI])
    policy: Any = kubernetes.client.PolicyV1Api(kube_api)
    await make_binder()
    custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, budgeted("resnet", 2, 1)
    )
    await eventually(lambda: placed(custom, "resnet", 2), what="resnet placed")
    await eventually(lambda: len(hosts(core)) == 2, what="2 hosts")
    for node in ("n1", "n2"):
        running(core, node)
    await eventually(lambda: read(custom, "resnet")["status"].get("readyReplicas") == 2)
    await eventually(lambda: allowed(policy) == 1, what="a budget that allows one eviction")
    found = policy.read_namespaced_pod_disruption_budget(BUDGET_NAME, "default")
    assert found.spec.selector.match_labels == {"tritonshare.io/model-host": "true"}
    assert found.spec.unhealthy_pod_eviction_policy == "AlwaysAllow"

    evict(core, "n1")
    assert [p.spec.node_name for p in _terminating(core)] == ["n1"]
    with pytest.raises(kubernetes.client.ApiException) as refused:
        evict(core, "n2")
    assert refused.value.status == 429
    assert "disruption budget" in json.loads(str(refused.value.body))["message"]
    assert "n2" in hosts(core), "kept"

    # The first host gone and made again by the binder: the second is refused until the
    # replica there is served again.
    kubelet_removes_deleted(core)
    await eventually(lambda: "n1" in hosts(core), what="the host made again")
    core.patch_namespaced_pod_status(host_name("n1"), "default", {"status": {"phase": "Running"}})
    await eventually(lambda: allowed(policy) == 0, what="a budget for the new host")
    with pytest.raises(kubernetes.client.ApiException) as still:
        evict(core, "n2")
    assert still.value.status == 429
    running(core, "n1")
    await eventually(lambda: allowed(policy) == 1, what="the budget once it serves")
    evict(core, "n2")


async def test_no_budget_without_a_minimum_and_none_left_behind(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "n1", [16 * GI])
    policy: Any = kubernetes.client.PolicyV1Api(kube_api)
    await make_binder()
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("bert", 1))
    custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, budgeted("resnet", 1, 1)
    )
    await eventually(lambda: allowed(policy) is not None, what="the budget")
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "resnet", {"spec": {"minAvailable": None}}
    )

    def budgets() -> list[str]:
        items = policy.list_namespaced_pod_disruption_budget("default").items
        return [b.metadata.name for b in items]

    await eventually(lambda: budgets() == [], what="the budget removed")


def test_a_negative_minimum_is_refused(custom: Any) -> None:
    with pytest.raises(kubernetes.client.ApiException) as refused:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, budgeted("resnet", 2, -1)
        )
    assert refused.value.status == 422
    assert "spec.minAvailable" in json.loads(str(refused.value.body))["message"]


def _terminating(core: Any) -> list[Any]:
    return [p for p in core.list_namespaced_pod("default").items if p.metadata.deletion_timestamp]


async def test_a_scale_down_drains_a_replica_not_served_before_a_served_one(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    """As a ReplicaSet deletes its unready pods first: scaled from 2 to 1 while only the highest
    replica is served, the other one drains, and the model keeps its minAvailable of 1."""
    for node in ("n1", "n2"):
        add_node(kube_api, node, [16 * GI])
    await make_binder()
    custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, budgeted("resnet", 2, 1)
    )
    obj = await eventually(lambda: placed(custom, "resnet", 2), what="resnet placed")
    nodes = {p["replica"]: p["node"] for p in obj["status"]["placements"]}
    await eventually(lambda: len(hosts(core)) == 2, what="2 hosts")
    running(core, nodes[1])
    await eventually(lambda: read(custom, "resnet")["status"].get("readyReplicas") == 1)
    custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, "default", PLURAL, "resnet", {"spec": {"replicas": 1}}
    )

    def kept() -> list[int]:
        """The replicas still named on the hosts once replica 0 is gone or draining."""
        entries = [e for h in hosts(core).values() for e in hosted(h)]
        leaving = [e["replica"] for e in entries if e.get("draining")]
        if leaving or len(entries) == 1:
            return [e["replica"] for e in entries if not e.get("draining")]
        return []

    assert await eventually(kept, what="one replica leaving") == [1]
    assert [p["replica"] for p in read(custom, "resnet")["status"]["placements"]] == [1]
    assert read(custom, "resnet")["status"].get("readyReplicas") == 1
