"""A pod's preemption across a change of binder leader: a new leader holds the room of every
pending pod whose status.nominatedNodeName a preemption wrote, before it places anything, so a
lower-priority pod pending before it does not take the room the victims free; the GPU is the
one the preemption would choose (the field does not say it). A tenant can write the field on its
own pod: a forged nomination holds only the pod's own request, on a node whose filters it passes,
out of free room or room that lower-priority pods are giving up."""

from __future__ import annotations

from typing import Any

import kubernetes.client

from binder.model import pod_from_api
from binder.preemption import nominated_room
from binder.state import ClusterState
from tests.binder.objects import GI, KEYS, node_obj, pod_obj
from tests.binder.simcluster import (
    MakeBinder,
    add_node,
    add_pod,
    eventually,
    failed_events,
    node_of,
)
from tests.binder.test_placement import NOW, cluster
from tests.binder.test_preemption_e2e import events, priority_class


def charged(
    state: ClusterState, name: str, gpu: int, priority: int, *, deleting: bool = False
) -> None:
    """An 8 GiB pod on GPU `gpu` of node "a"; `deleting`: terminating (being evicted)."""
    obj = pod_obj(name, mem="8Gi", node="a", gpu=f"GPU-a-{gpu}", spec_extra={"priority": priority})
    if deleting:
        obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    obj["status"] = {"phase": "Running"}
    state.set_pod(pod_from_api(obj, KEYS))


def nominated(name: str, priority: int, mem: str = "8Gi", node: str = "a", **spec: Any) -> Any:
    obj = pod_obj(name, mem=mem, spec_extra={"priority": priority, **spec})
    obj["status"]["nominatedNodeName"] = node
    return pod_from_api(obj, KEYS)


def test_a_nomination_holds_its_own_request_where_lower_priorities_leave_and_nothing_more() -> None:
    state = cluster(node_obj("a", [16 * GI, 16 * GI], labels={"pool": "a"}))
    # GPU 0: a priority-0 victim leaving and one staying; GPU 1: full at priority 1000, one
    # of them leaving.
    charged(state, "victim", 0, 0, deleting=True)
    charged(state, "stays", 0, 0)
    charged(state, "peer-leaving", 1, 1000, deleting=True)
    charged(state, "peer", 1, 1000)
    room = nominated_room(state, nominated("urgent", 1000), "binpack", NOW)
    assert room is not None and room.uuid == "GPU-a-0", "the GPU its victim leaves"
    # What a forged nomination cannot hold:
    assert nominated_room(state, nominated("same", 0), "binpack", NOW) is None, (
        "room an equal priority gives up"
    )
    assert nominated_room(state, nominated("big", 1000, mem="16Gi"), "binpack", NOW) is None, (
        "more than the leaving pods' room"
    )
    elsewhere = nominated("elsewhere", 1000, nodeSelector={"pool": "b"})
    assert nominated_room(state, elsewhere, "binpack", NOW) is None, "a node it cannot run on"
    assert nominated_room(state, nominated("gone", 1000, node="b"), "binpack", NOW) is None
    assert state.allocated("a") == [16 * GI, 16 * GI], "nothing was held meanwhile"


async def preempted_then_taken_over(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder, urgent: str
) -> str:
    """Node "a" (16 GiB) full with two 8 GiB priority-0 pods that take an hour to terminate;
    "sneaky" (8 GiB, priority 0) pending first, then `urgent` (8 GiB, priority 1000) preempts one
    of them under a first leader, which stops; the victim is then gone before a second binder
    takes the lead (the pending pods queued in creation order: sneaky first). Returns the
    victim's name."""
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


async def test_a_new_leader_keeps_the_room_a_pods_preemption_made(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    await preempted_then_taken_over(kube_api, core, make_binder, "urgent")
    assert await eventually(lambda: node_of(core, "urgent"), what="urgent bound") == "a"
    assert node_of(core, "sneaky") == "", "the lower-priority pod did not take the room"
    assert not [p for p in pods(core) if p.metadata.deletion_timestamp], "no second victim"
    assert len(events(core, "urgent", "Preempting")) == 1
