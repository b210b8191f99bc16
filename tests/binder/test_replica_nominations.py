"""A TritonModel replica's preemption across a change of binder leader, against the simulated
API server serving the chart's CRD: the room it holds is written in the model's
status.nominations (signed for the hold), held again by the next leader before it places
anything, so the replica waits for its victims there instead of preempting again and no
lower-priority pod takes the room; a held room whose node is gone, or whose proof the binder did
not sign for that replica, is dropped."""

from __future__ import annotations

import json
from typing import Any

import kubernetes.client

from binder.replicapreemption import held_uid
from tests.binder import test_tritonmodels
from tests.binder.objects import GI
from tests.binder.simcluster import (
    MakeBinder,
    add_node,
    add_pod,
    eventually,
    failed_events,
    node_of,
)
from tests.binder.test_leader import two_replicas
from tests.binder.test_replica_priority import create, model_events, placements, priority_class
from tests.binder.test_tritonmodels import GROUP, PLURAL, VERSION, placed, read

apiserver = test_tritonmodels.apiserver
custom = test_tritonmodels.custom

LOW = ("low-1", "low-2")


def nominations(custom: Any, name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = (read(custom, name).get("status") or {}).get("nominations") or []
    return found


def terminating(core: Any) -> list[str]:
    return [
        p.metadata.name
        for p in core.list_namespaced_pod("default").items
        if p.metadata.deletion_timestamp
    ]


async def preempting_replica(core: Any, custom: Any) -> tuple[str, list[dict[str, Any]]]:
    """Node "a" (16 GiB) full with two 8 GiB model pods of priority 0 that take an hour to
    terminate; then replica 0 of "resnet" (8 GiB, priority 1000) preempts one of them: the
    victim's name and resnet's status.nominations (written before the victim is evicted)."""
    for name in LOW:
        add_pod(core, name, mem="8Gi", spec_extra={"terminationGracePeriodSeconds": 3600})
    await eventually(lambda: all(node_of(core, name) == "a" for name in LOW), what="bound")
    create(custom, "resnet", memory="8Gi", priorityClassName="urgent")
    [victim] = await eventually(lambda: terminating(core), what="the victim leaving")
    return victim, nominations(custom, "resnet")


def node_gpu(core: Any, name: str) -> str:
    node = core.read_node(name)
    return str(json.loads(node.metadata.annotations["tritonshare.io/gpus"])[0]["uuid"])


async def test_a_new_leader_keeps_the_room_a_replicas_preemption_holds(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    priority_class(kube_api, "urgent", 1000)
    add_node(kube_api, "a", [16 * GI])
    leader, follower = await two_replicas(make_binder)
    victim, held = await preempting_replica(core, custom)
    await make_binder.stop(leader)
    await eventually(lambda: follower.elector.is_leader, within=10, what="the takeover")
    # A pending pod of lower priority does not take the room while the victim leaves.
    add_pod(core, "sneaky", mem="8Gi")
    await eventually(lambda: failed_events(core, "sneaky"), what="the pod refused")
    assert terminating(core) == [victim], "the new leader preempts no other victim"
    assert not placements(custom, "resnet"), "it waits for its victim"

    core.delete_namespaced_pod(victim, "default", grace_period_seconds=0)
    obj = await eventually(lambda: placed(custom, "resnet", 1), what="resnet placed")
    gpu = node_gpu(core, "a")
    assert (obj["status"]["placements"][0]["node"], obj["status"]["placements"][0]["gpu"]) == (
        "a",
        gpu,
    )
    assert terminating(core) == [] and node_of(core, "sneaky") == ""
    assert len(model_events(core, "resnet", "Preempting")) == 1
    # The room was written in the status with a proof that holds it, never places it.
    [room] = held
    assert (room["replica"], room["node"], room["gpu"]) == (0, "a", gpu)
    rid = f"{obj['metadata']['uid']}/0"
    assert room["proof"] != obj["status"]["placements"][0]["proof"]
    assert held_uid(rid) not in follower.ledger.state.nominated
    await eventually(lambda: not nominations(custom, "resnet"), what="the room taken")


async def test_a_new_leader_drops_a_room_on_a_gone_node_and_one_the_binder_did_not_sign(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    priority_class(kube_api, "urgent", 1000)
    add_node(kube_api, "a", [16 * GI])
    first = await make_binder()
    _, [held] = await preempting_replica(core, custom)
    create(custom, "bulk", memory="8Gi")
    await eventually(lambda: read(custom, "bulk").get("status"), what="bulk refused")
    await make_binder.stop(first)

    core.delete_node("a")
    add_node(kube_api, "b", [16 * GI])
    gpu = node_gpu(core, "b")
    # The room held for resnet's replica 0, as if bulk's: a proof it never got.
    forged = {"replica": 0, "node": "b", "gpu": gpu, "proof": held["proof"]}
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, "default", PLURAL, "bulk", {"status": {"nominations": [forged]}}
    )
    await eventually(lambda: nominations(custom, "bulk"), what="the forged room written")
    second = await make_binder()
    assert not second.ledger.state.nominated, "neither room is held"
    for name in ("resnet", "bulk"):
        obj = await eventually(lambda name=name: placed(custom, name, 1), what=f"{name} placed")
        assert obj["status"]["placements"][0]["node"] == "b"
        await eventually(lambda name=name: not nominations(custom, name), what="the room dropped")
    assert len(model_events(core, "resnet", "Preempting")) == 1
