"""Preemption end to end through the simulated API server and the official client: a pod of a
higher PriorityClass that fits nowhere has a lower-priority model pod evicted (the Eviction API,
a `Preempted` Event on the victim), gets status.nominatedNodeName, and is bound to the room once
the victim is gone; a PodDisruptionBudget that forbids the eviction is respected."""

from __future__ import annotations

from functools import partial
from typing import Any

import kubernetes.client

from sim.apiserver import RunningApiServer
from tests.binder.objects import GI
from tests.binder.simcluster import (
    MakeBinder,
    add_node,
    add_pod,
    binder_writes,
    eventually,
    node_of,
)


def priority_class(kube_api: kubernetes.client.ApiClient, name: str, value: int) -> None:
    scheduling: Any = kubernetes.client.SchedulingV1Api(kube_api)
    scheduling.create_priority_class(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
    )


def running(core: Any, name: str) -> None:
    """What the node's kubelet would write: the pod runs and is ready (a PodDisruptionBudget
    guards only such pods)."""
    status = {
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
        }
    }
    core.patch_namespaced_pod_status(name, "default", status)


def events(core: Any, name: str, reason: str) -> list[Any]:
    found = core.list_namespaced_event("default", field_selector=f"involvedObject.name={name}")
    return [e for e in found.items if e.reason == reason]


def exists(core: Any, name: str) -> bool:
    return any(p.metadata.name == name for p in core.list_namespaced_pod("default").items)


async def fill_node(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    priority_class(kube_api, "urgent", 1000)
    add_node(kube_api, "a", [16 * GI])
    await make_binder()
    for name in ("low-1", "low-2"):
        # A short grace period: node "a" runs no kubelet, so the API server finishes a
        # deletion once it is over, as the node's kubelet would.
        add_pod(
            core,
            name,
            mem="8Gi",
            labels={"app": "low"},
            spec_extra={"terminationGracePeriodSeconds": 1},
        )
    for name in ("low-1", "low-2"):
        assert await eventually(partial(node_of, core, name)) == "a"
        running(core, name)


async def test_a_higher_priority_pod_preempts_one_victim_and_takes_its_room(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    await fill_node(kube_api, core, make_binder)
    add_pod(core, "urgent", mem="8Gi", spec_extra={"priorityClassName": "urgent"})
    assert await eventually(lambda: node_of(core, "urgent"), what="urgent bound") == "a"
    gone = [name for name in ("low-1", "low-2") if not exists(core, name)]
    assert len(gone) == 1, "exactly one victim makes the room"
    [event] = events(core, gone[0], "Preempted")
    pod = core.read_namespaced_pod("urgent", "default")
    assert event.message == f"Preempted by pod {pod.metadata.uid} on node a"
    assert pod.status.nominated_node_name == "a"
    assert events(core, "urgent", "Preempting")


async def test_a_budget_that_forbids_the_eviction_keeps_the_victims(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    core: Any,
    make_binder: MakeBinder,
) -> None:
    policy: Any = kubernetes.client.PolicyV1Api(kube_api)
    policy.create_namespaced_pod_disruption_budget(
        "default",
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "low"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "low"}}},
        },
    )
    await fill_node(kube_api, core, make_binder)
    add_pod(core, "urgent", mem="8Gi", spec_extra={"priorityClassName": "urgent"})
    # The binder asks for an eviction; the API server refuses it for the budget.
    refused = await eventually(
        lambda: [
            r
            for r in binder_writes(apiserver)
            if r.subresource == "eviction" and r.name.startswith("low-")
        ],
        what="an eviction attempt",
    )
    assert {r.code for r in refused} == {429}
    assert node_of(core, "urgent") == ""
    assert exists(core, "low-1") and exists(core, "low-2")
    assert not events(core, "low-1", "Preempted") and not events(core, "low-2", "Preempted")
