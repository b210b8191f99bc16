"""Consolidation carried out by the binder against the simulated API server: with
--consolidate-moves, a pod that waits only because free GPU memory is split gets room by the
eviction of a smaller pod (Events on both say why), never past a PodDisruptionBudget (the
Eviction API's 429), and never with the flag off."""

from __future__ import annotations

from functools import partial
from typing import Any

import kubernetes.client

from sim.apiserver import RunningApiServer
from tests.binder.objects import GI, pod_obj
from tests.binder.simcluster import (
    MakeBinder,
    add_node,
    binder_writes,
    eventually,
    node_of,
    scheduled_condition,
)

OWNED = [
    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": True}
]


def create(core: Any, name: str, mem: str, *, owned: bool = False) -> None:
    obj = pod_obj(name, mem=mem, spec_extra={"terminationGracePeriodSeconds": 0})
    meta = obj["metadata"]
    del meta["uid"], meta["creationTimestamp"]
    meta["namespace"] = "default"
    meta["labels"] = {"app": name}
    if owned:
        meta["ownerReferences"] = OWNED
    core.create_namespaced_pod("default", obj)


def running(core: Any, name: str) -> None:
    """What the kubelet would write: the pod runs and is ready (a budget counts it healthy)."""
    status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    core.patch_namespaced_pod_status(name, "default", {"status": status})


async def split_a100s(kube_api: Any, core: Any) -> None:
    """GPU 0 of a100-0: a 60Gi LLM and a 6Gi BERT beside it (14Gi free); GPU 1: a 70Gi LLM
    (10Gi free); the T4 empty (16Gi). An 18Gi pod then fits no GPU while 40Gi are free."""
    add_node(kube_api, "a100-0", [80 * GI, 80 * GI])
    add_node(kube_api, "t4-0", [16 * GI])
    for name, mem, owned, node in (
        ("llm-a", "60Gi", False, "a100-0"),
        ("fill", "16Gi", False, "t4-0"),  # keeps the T4 full while BERT is placed
        ("bert", "6Gi", True, "a100-0"),
        ("llm-b", "70Gi", False, "a100-0"),
    ):
        create(core, name, mem, owned=owned)
        assert await eventually(partial(node_of, core, name), what=name) == node
        running(core, name)
    core.delete_namespaced_pod("fill", "default", grace_period_seconds=0)


def events(core: Any, name: str, reason: str) -> list[Any]:
    items = core.list_namespaced_event("default", field_selector=f"involvedObject.name={name}")
    return [e for e in items.items if e.reason == reason]


def gone(core: Any, name: str) -> bool:
    return name not in {p.metadata.name for p in core.list_namespaced_pod("default").items}


async def test_a_smaller_pod_is_evicted_to_make_room_and_both_get_an_event(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    await make_binder(consolidate_moves=2)
    await split_a100s(kube_api, core)
    create(core, "whisper", "18Gi")
    assert await eventually(lambda: node_of(core, "whisper"), what="room") == "a100-0"
    assert gone(core, "bert")
    (moved,) = await eventually(lambda: events(core, "bert", "Consolidation"), what="event")
    assert moved.type == "Normal"
    assert "to make room for default/whisper, which needs 18Gi" in moved.message
    (made,) = await eventually(lambda: events(core, "whisper", "Consolidation"), what="event")
    assert "default/bert" in made.message
    # The bare LLMs are never moved.
    assert {node_of(core, "llm-a"), node_of(core, "llm-b")} == {"a100-0"}


async def test_a_disruption_budget_that_forbids_it_stops_the_move(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    core: Any,
    make_binder: MakeBinder,
) -> None:
    policy: Any = kubernetes.client.PolicyV1Api(kube_api)
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "bert", "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "bert"}}},
    }
    policy.create_namespaced_pod_disruption_budget("default", budget)
    await make_binder(consolidate_moves=2)
    await split_a100s(kube_api, core)
    create(core, "whisper", "18Gi")

    def refused() -> list[Any]:
        return [
            w
            for w in binder_writes(apiserver, "bert")
            if w.subresource == "eviction" and w.code == 429
        ]

    await eventually(refused, what="the eviction refused by the budget")
    assert not gone(core, "bert")
    assert not node_of(core, "whisper")
    assert scheduled_condition(core, "whisper").reason == "Unschedulable"
    assert events(core, "bert", "Consolidation") == []
    assert events(core, "whisper", "Consolidation") == []


async def test_with_the_flag_off_nothing_is_evicted(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    core: Any,
    make_binder: MakeBinder,
) -> None:
    await make_binder()
    await split_a100s(kube_api, core)
    create(core, "whisper", "18Gi")
    await eventually(lambda: scheduled_condition(core, "whisper"), what="PodScheduled")
    assert not gone(core, "bert")
    assert [w for w in binder_writes(apiserver) if w.subresource == "eviction"] == []
