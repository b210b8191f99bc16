"""A TritonModel replica's preemption across a change of binder leader, against the simulated
API server serving the chart's CRD: the room it holds is written in the model's
status.nominations (signed for the hold), held again by the next leader before it places
anything, so the replica waits for its victims there (pods terminating, or replicas draining
from their host) instead of preempting again and no lower-priority pod takes the room; a held
room whose node or GPU is gone, whose replica is placed, whose model's GPU memory changed, or
whose proof the binder did not sign for that replica's hold, is dropped. A replica that preempts
never takes a pending pod's held room as a victim."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial
from typing import Any

import kubernetes.client

from binder.app import Binder
from binder.cluster.chargedpods import sign
from binder.cluster.clusterstate import ClusterState
from binder.cluster.ledger import Ledger
from binder.cluster.modelviews import ModelInfo, model_from_api
from binder.cluster.objects import node_from_api
from binder.framework.noderules import NODE_RULES
from binder.framework.placement import Unschedulable, place
from binder.framework.replicapreemption import ReplicaPreemption, held_uid
from common.proofs import KeyRing
from tests.binder.api.test_leader import two_replicas
from tests.binder.framework.test_placement import NOW, cluster
from tests.binder.framework.test_preemption import low
from tests.binder.objects import GI, KEYS, node_obj
from tests.binder.simcluster import (
    MakeBinder,
    add_node,
    add_pod,
    eventually,
    failed_events,
    node_of,
)
from tests.binder.tritonmodels import test_tritonmodels
from tests.binder.tritonmodels.test_replica_priority import (
    BULK,
    create,
    model_events,
    placements,
    priority_class,
    set_loaded,
)
from tests.binder.tritonmodels.test_tritonmodels import (
    GROUP,
    HOSTED,
    PLURAL,
    VERSION,
    hosts,
    model,
    placed,
    read,
)

apiserver = test_tritonmodels.apiserver
custom = test_tritonmodels.custom

LOW = ("low-1", "low-2")


def tritonmodel(name: str, memory: str = "2Gi") -> ModelInfo:
    obj = model(name, 1, memory)
    obj["metadata"].update(uid=f"uid-{name}", namespace="default")
    return model_from_api(obj, KEYS, "tritonshare")


def test_a_new_leader_holds_only_rooms_the_binder_signed_for_that_replica_node_and_gpu() -> None:
    ring = KeyRing(b"k" * 32)
    state = ClusterState(rules=NODE_RULES)
    state.set_node(node_from_api(node_obj("a", [16 * GI, 16 * GI], healthy=[True, False]), KEYS))
    ledger = Ledger(state)
    gpu, sick = (g.uuid for g in state.nodes["a"].gpus)

    def hold(m: ModelInfo, node: str = "a", on: str = gpu) -> tuple[str, str, str]:
        """The proof the binder writes for replica 0's room (`held_uid`)."""
        room = replace(m.replica(0), uid=held_uid(f"{m.uid}/0"))
        return node, on, sign(ring, room, node, on)

    good, placed_, gone, sick_gpu, grown, copied, as_placement = (
        tritonmodel(name)
        for name in ("good", "placed", "gone", "sick", "grown", "copied", "as-placement")
    )
    rooms = [
        (good, hold(good)),
        (placed_, hold(placed_)),
        (gone, hold(gone, node="b")),
        (sick_gpu, hold(sick_gpu, on=sick)),
        (grown, hold(tritonmodel("grown", "1Gi"))),  # signed before its gpuMemory grew
        (copied, hold(good)),  # another replica's room
        (as_placement, ("a", gpu, sign(ring, as_placement.replica(0), "a", gpu))),
    ]
    for m, room in rooms:
        ledger.models[m.uid] = replace(m, nominated={0: room})
    state.assume(placed_.replica(0), "a", gpu)
    preemption = ReplicaPreemption(
        ledger, "binpack", enabled=True, drain=lambda *_: None, ring=lambda: ring
    )
    preemption.restore()
    assert set(state.nominated) == {held_uid("uid-good/0")}
    assert preemption.holds("uid-good/0")
    assert preemption.nominations("uid-good") == [
        {"replica": 0, "node": "a", "gpu": gpu, "proof": rooms[0][1][2]}
    ]
    # Held in the ledger as the replica's request on its GPU, until it takes it.
    assert state.memory.allocated("a") == [4 * GI, 0]
    assert preemption.take_room("uid-good/0") == "a"
    assert state.memory.allocated("a") == [2 * GI, 0]


def test_a_replica_waits_for_its_victims_before_the_cache_shows_them_leaving() -> None:
    ring = KeyRing(b"k" * 32)
    state = cluster(node_obj("a", [16 * GI]))
    for name in LOW:
        low(state, name, "a", 0, "8Gi")
    m = tritonmodel("resnet", "8Gi")
    m = replace(m, template=replace(m.template, priority=1000))
    preemption = ReplicaPreemption(
        Ledger(state), "binpack", enabled=True, drain=lambda *_: None, ring=lambda: ring
    )
    for _ in range(2):  # the second before the watch shows the victim terminating
        node = preemption.take_room("uid-resnet/0")
        replica = replace(m.replica(0), nominated_node=node)
        result = place(state, replica, now=NOW)
        assert isinstance(result, Unschedulable)
        preemption.decide(m, 0, replica, result, NOW)
    [eviction] = preemption.evictions
    assert len(eviction.pods) == 1, "one victim, taken once"
    assert set(state.nominated) == {held_uid("uid-resnet/0")}


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


def seen_held(binder: Binder) -> bool:
    return any(m.nominated for m in binder.ledger.models.values())


def seen_draining(binder: Binder) -> bool:
    host = binder.ledger.hosts.get("default", {}).get("a") or {}
    annotation = (host.get("metadata") or {}).get("annotations", {}).get(HOSTED, "[]")
    return any(entry.get("draining") for entry in json.loads(annotation))


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
    victim_uid = core.read_namespaced_pod(victim, "default").metadata.uid

    def seen(binder: Binder) -> bool:
        charged = binder.ledger.state.charged_pod(victim_uid)
        return seen_held(binder) and charged is not None and charged.deleting

    await eventually(lambda: seen(follower), what="the follower seeing the room and the victim")
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
        obj = await eventually(partial(placed, custom, name, 1), what=f"{name} placed")
        assert obj["status"]["placements"][0]["node"] == "b"
        assert not nominations(custom, name), "the room dropped"
    assert len(model_events(core, "resnet", "Preempting")) == 1


async def test_a_new_leader_waits_for_a_victim_replica_draining_from_its_host(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    priority_class(kube_api, "urgent", 1000)
    add_node(kube_api, "a", [16 * GI])
    leader, follower = await two_replicas(make_binder)
    create(custom, "bulk", memory="12Gi")
    await eventually(lambda: placed(custom, "bulk", 1), what="bulk placed")
    await eventually(lambda: hosts(core).get("a"), what="the host")
    set_loaded(core, "bulk", "a", "True")
    await eventually(lambda: BULK in hosts(core)["a"].metadata.labels, what="bulk served")
    create(custom, "resnet", memory="8Gi", priorityClassName="urgent")
    await eventually(lambda: model_events(core, "resnet", "Preempting"), what="preempting")
    assert nominations(custom, "resnet")
    # The follower's cache sees the room held and bulk marked draining on its host.
    await eventually(lambda: seen_held(follower) and seen_draining(follower), what="the follower")

    await make_binder.stop(leader)
    await eventually(lambda: follower.elector.is_leader, within=10, what="the takeover")
    uid = read(custom, "resnet")["metadata"]["uid"]
    # Its refusal is the new leader's own once it has reconciled it.
    await eventually(lambda: uid in follower.models._reporter._refused, what="resnet reconciled")
    assert not placements(custom, "resnet"), "it waits for the drain"
    set_loaded(core, "bulk", "a", "False")  # the host's loader unloaded it
    resnet = await eventually(lambda: placed(custom, "resnet", 1), what="resnet placed")
    assert resnet["status"]["placements"][0]["node"] == "a"
    assert len(model_events(core, "resnet", "Preempting")) == 1


async def test_a_higher_priority_replica_never_takes_a_pending_pods_held_room_as_a_victim(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    """Pod "mid" (priority 500) holds the room its victim is leaving; replica 0 of "resnet"
    (priority 1000) then preempts the other low pod, never the pending "mid" (an eviction would
    delete it)."""
    priority_class(kube_api, "mid", 500)
    priority_class(kube_api, "urgent", 1000)
    add_node(kube_api, "a", [16 * GI])
    await make_binder()
    for name in LOW:
        add_pod(core, name, mem="8Gi", spec_extra={"terminationGracePeriodSeconds": 3600})
    await eventually(lambda: all(node_of(core, name) == "a" for name in LOW), what="bound")
    add_pod(core, "mid", mem="8Gi", spec_extra={"priorityClassName": "mid"})
    await eventually(lambda: len(terminating(core)) == 1, what="mid's victim leaving")
    create(custom, "resnet", memory="8Gi", priorityClassName="urgent")
    await eventually(lambda: model_events(core, "resnet", "Preempting"), what="resnet preempting")
    assert set(terminating(core)) == set(LOW), "resnet's victim is the other low pod"
    assert "mid" in [p.metadata.name for p in core.list_namespaced_pod("default").items]
