"""A pod's preemption across a change of binder leader: the binder writes the room it holds
(node, GPU, and a proof signed for the hold) in the pod's nomination annotation before its
status.nominatedNodeName, and a new leader holds the room of every pending pod whose proof
verifies before it places anything, so a lower-priority pod pending before it does not take the
room the victims free. A tenant can write both fields on its own pod: a nomination without the
binder's proof for that pod's hold (none, another pod's, a placement's, another GPU's or
request's) holds nothing."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial
from typing import Any

import kubernetes.client

from binder.cluster.chargedpods import sign
from binder.cluster.objects import pod_from_api
from binder.framework.preemption import stale_room
from binder.framework.replicapreemption import held_uid
from common.proofs import KeyRing
from tests.binder.framework.test_placement import cluster
from tests.binder.framework.test_preemption_e2e import events, priority_class
from tests.binder.objects import GI, KEYS, node_obj, pod_obj
from tests.binder.simcluster import (
    MakeBinder,
    add_node,
    add_pod,
    eventually,
    failed_events,
    node_of,
)


def test_a_room_is_held_again_only_with_the_binders_proof_for_that_pods_hold() -> None:
    ring = KeyRing(b"k" * 32)
    state = cluster(node_obj("a", [16 * GI, 16 * GI], healthy=[True, False]))
    gpu, sick = "GPU-a-0", "GPU-a-1"

    def held(name: str, mem: str = "8Gi") -> Any:
        pod = pod_from_api(pod_obj(name, mem=mem), KEYS)
        return replace(pod, uid=held_uid(pod.uid))

    urgent, other = held("urgent"), held("other")
    proof = sign(ring, urgent, "a", gpu)
    assert stale_room(state, urgent, "a", gpu, proof, ring) == ""
    refused = {
        "another pod's": stale_room(state, other, "a", gpu, proof, ring),
        "a placement's": stale_room(
            state,
            urgent,
            "a",
            gpu,
            sign(ring, replace(urgent, uid="uid-models-urgent"), "a", gpu),
            ring,
        ),
        "another GPU's": stale_room(state, urgent, "a", "GPU-a-9", proof, ring),
        "a sick GPU's": stale_room(state, urgent, "a", sick, sign(ring, urgent, "a", sick), ring),
        "another request's": stale_room(state, held("urgent", "4Gi"), "a", gpu, proof, ring),
        "a gone node's": stale_room(state, urgent, "b", gpu, proof, ring),
        "none": stale_room(state, urgent, "a", gpu, "", ring),
    }
    assert all(refused.values()), refused


async def preempted_then_taken_over(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder, urgent: str
) -> str:
    """Node "a" (16 GiB) full with two 8 GiB priority-0 pods that take an hour to terminate;
    "sneaky" (8 GiB, priority 0) pending first, then `urgent` (8 GiB, priority 1000) preempts one
    of them under a first leader, which stops; the victim is then gone before a second binder
    takes the lead (the list, so its queue, gives sneaky first: by name, as the API server
    lists). Returns the victim's name."""
    priority_class(kube_api, "urgent", 1000)
    add_node(kube_api, "a", [16 * GI])
    first = await make_binder(leader_elect=True, identity="replica-a")
    await eventually(lambda: first.elector.is_leader, what="the first leader")
    for name in ("low-1", "low-2"):
        add_pod(core, name, mem="8Gi", spec_extra={"terminationGracePeriodSeconds": 3600})
    await eventually(lambda: node_of(core, "low-1") and node_of(core, "low-2"), what="bound")
    add_pod(core, "sneaky", mem="8Gi")
    await eventually(lambda: failed_events(core, "sneaky"), what="sneaky refused")
    add_pod(core, urgent, mem="8Gi", spec_extra={"priorityClassName": "urgent"})

    def leaving() -> list[str]:
        pods = core.list_namespaced_pod("default").items
        return [p.metadata.name for p in pods if p.metadata.deletion_timestamp]

    [victim] = await eventually(leaving, what="the victim leaving")
    pod = core.read_namespaced_pod(urgent, "default")
    assert pod.status.nominated_node_name == "a"
    await make_binder.stop(first)
    core.delete_namespaced_pod(victim, "default", grace_period_seconds=0)
    await eventually(lambda: victim not in [p.metadata.name for p in pods(core)], what="gone")
    second = await make_binder(leader_elect=True, identity="replica-b")
    await eventually(lambda: second.elector.is_leader, what="the takeover")
    return str(victim)


def pods(core: Any) -> list[Any]:
    return list(core.list_namespaced_pod("default").items)


def nomination(core: Any, name: str) -> dict[str, str]:
    annotations = core.read_namespaced_pod(name, "default").metadata.annotations or {}
    found: dict[str, str] = json.loads(annotations.get(KEYS.nomination, "{}"))
    return found


async def test_a_new_leader_keeps_the_room_a_pods_preemption_made(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    await preempted_then_taken_over(kube_api, core, make_binder, "urgent")
    room = nomination(core, "urgent")
    assert await eventually(lambda: node_of(core, "urgent"), what="urgent bound") == "a"
    assert node_of(core, "sneaky") == "", "the lower-priority pod did not take the room"
    pod = core.read_namespaced_pod("urgent", "default")
    assert (room["node"], room["gpu"]) == ("a", pod.metadata.annotations[KEYS.gpu])
    assert room["proof"] != pod.metadata.annotations[KEYS.placement], "a hold, not a placement"
    assert not [p for p in pods(core) if p.metadata.deletion_timestamp], "no second victim"
    assert len(events(core, "urgent", "Preempting")) == 1


async def test_a_tenant_that_writes_its_pods_nomination_holds_no_room(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    """The attack: a tenant sets status.nominatedNodeName on its own pending pod and copies a
    proof the binder wrote (the placement of a pod on the GPU it wants) into the nomination
    annotation, to hold room ahead of a pod of the same priority (the list, so a new leader's
    queue, gives "early" first: by name, as the API server lists)."""
    add_node(kube_api, "a", [16 * GI])
    first = await make_binder(leader_elect=True, identity="replica-a")
    await eventually(lambda: first.elector.is_leader, what="the first leader")
    for name in ("low-1", "low-2"):
        add_pod(core, name, mem="8Gi")
    await eventually(lambda: node_of(core, "low-1") and node_of(core, "low-2"), what="bound")
    for name in ("early", "forger"):
        add_pod(core, name, mem="8Gi")
        await eventually(partial(failed_events, core, name), what=f"{name} refused")
    await make_binder.stop(first)
    low = core.read_namespaced_pod("low-1", "default").metadata.annotations
    forged = {"node": "a", "gpu": low[KEYS.gpu], "proof": low[KEYS.placement]}
    core.patch_namespaced_pod(
        "forger", "default", {"metadata": {"annotations": {KEYS.nomination: json.dumps(forged)}}}
    )
    core.patch_namespaced_pod_status("forger", "default", {"status": {"nominatedNodeName": "a"}})
    core.delete_namespaced_pod("low-1", "default", grace_period_seconds=0)
    await eventually(lambda: "low-1" not in [p.metadata.name for p in pods(core)], what="gone")
    second = await make_binder(leader_elect=True, identity="replica-b")
    await eventually(lambda: second.elector.is_leader, what="the second leader")
    assert await eventually(lambda: node_of(core, "early"), what="early bound") == "a"
    assert node_of(core, "forger") == ""
    assert not second.ledger.state.nominated


async def test_a_higher_priority_pod_passes_a_lower_pods_held_room_and_evicts_no_pending_pod(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    """As kube-scheduler counts nominated pods only against lower-or-equal priorities: "mid"
    (priority 500) holds the room its victim is leaving; "top" (priority 1000) then preempts the
    other low pod for itself, never mid, which is pending and keeps its place in the queue."""
    priority_class(kube_api, "mid", 500)
    priority_class(kube_api, "top", 1000)
    add_node(kube_api, "a", [16 * GI])
    await make_binder()
    for name in ("low-1", "low-2"):
        add_pod(core, name, mem="8Gi", spec_extra={"terminationGracePeriodSeconds": 3600})
    await eventually(lambda: node_of(core, "low-1") and node_of(core, "low-2"), what="bound")
    add_pod(core, "mid", mem="8Gi", spec_extra={"priorityClassName": "mid"})
    await eventually(lambda: events(core, "mid", "Preempting"), what="mid preempting")
    add_pod(core, "top", mem="8Gi", spec_extra={"priorityClassName": "top"})
    await eventually(lambda: events(core, "top", "Preempting"), what="top preempting")
    leaving = {p.metadata.name for p in pods(core) if p.metadata.deletion_timestamp}
    assert leaving == {"low-1", "low-2"}, "top's victim is the other low pod, not mid"
    for name in ("low-1", "low-2"):
        core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    await eventually(lambda: node_of(core, "mid") and node_of(core, "top"), what="both bound")
