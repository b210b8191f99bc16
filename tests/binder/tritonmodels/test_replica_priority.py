"""A TritonModel's priority against the simulated API server serving the chart's CRD, through the
official client: resolved from its PriorityClass as a pod's is (the class's value and
preemptionPolicy, else the globalDefault, else 0), a class that does not exist refused in the API
server's words (a Placed condition and a FailedScheduling Event) until it does."""

from __future__ import annotations

import asyncio
import json
from functools import partial
from typing import Any

import kubernetes.client
import pytest

from binder.app import Binder
from binder.cluster.modelviews import ModelInfo
from binder.cluster.objects import PodInfo
from binder.cluster.priorities import PriorityClassInfo, resolve
from common.contract import Keys
from common.hosted import host_name
from sim.apiserver import RunningApiServer
from tests.binder.framework.test_preemption_e2e import running
from tests.binder.simcluster import (
    MakeBinder,
    add_node,
    add_pod,
    binder_writes,
    eventually,
    node_of,
)
from tests.binder.tritonmodels import test_tritonmodels
from tests.binder.tritonmodels.test_model_hosts import HOST_READY
from tests.binder.tritonmodels.test_tritonmodels import (
    GROUP,
    HOSTED,
    PLURAL,
    VERSION,
    hosts,
    loaded_types,
    model,
    placed,
    read,
)

GI = 1 << 30
KEYS = Keys()
BULK = "tritonshare.io/serves-bulk"

apiserver = test_tritonmodels.apiserver
custom = test_tritonmodels.custom


def priority_class(
    kube_api: kubernetes.client.ApiClient, name: str, value: int, **extra: Any
) -> None:
    scheduling: Any = kubernetes.client.SchedulingV1Api(kube_api)
    scheduling.create_priority_class(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
            **extra,
        }
    )


def create(custom: Any, name: str, replicas: int = 1, memory: str = "2Gi", **spec: Any) -> None:
    body = model(name, replicas, memory)
    body["spec"].update(spec)
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)


def condition(custom: Any, name: str, kind: str = "Placed") -> dict[str, Any]:
    conditions = (read(custom, name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def refused(custom: Any, name: str) -> bool:
    return condition(custom, name).get("status") == "False"


def model_events(core: Any, name: str, reason: str) -> list[Any]:
    found = core.list_namespaced_event("default", field_selector=f"involvedObject.name={name}")
    return [e for e in found.items if e.reason == reason]


def test_the_class_gives_the_priority_as_the_admission_plugin_does() -> None:
    template = PodInfo(uid="m", namespace="default", name="m")
    classes = {
        "high": PriorityClassInfo("high", 1000, preemption_policy="Never"),
        "a": PriorityClassInfo("a", 50, global_default=True),
        "b": PriorityClassInfo("b", 20, global_default=True),
    }

    def resolved(name: str, known: dict[str, PriorityClassInfo]) -> tuple[int, str, str]:
        info = resolve(ModelInfo("m", "default", "m", 1, 1, template, priority_class=name), known)
        t = info.template
        return t.priority, t.preemption_policy, info.priority_problem

    assert resolved("high", classes) == (1000, "Never", "")
    assert resolved("", classes) == (20, "PreemptLowerPriority", ""), "the lowest default"
    assert resolved("", {}) == (0, "PreemptLowerPriority", "")
    assert resolved("gone", classes) == (
        0,
        "PreemptLowerPriority",
        "no PriorityClass with name gone was found",
    )


async def test_a_model_whose_class_does_not_exist_waits_for_it_and_says_why(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "n1", [16 * GI])
    binder: Binder = await make_binder()
    create(custom, "resnet", priorityClassName="urgent")
    placed_ = await eventually(lambda: condition(custom, "resnet"), what="the Placed condition")
    message = 'tritonmodel "resnet" replica 0: no PriorityClass with name urgent was found'
    assert (placed_["status"], placed_["reason"], placed_["message"]) == (
        "False",
        "PriorityClassNotFound",
        message,
    )
    [event] = await eventually(lambda: model_events(core, "resnet", "FailedScheduling"))
    assert (event.type, event.message) == ("Warning", message)

    priority_class(kube_api, "urgent", 5000, preemptionPolicy="Never")
    obj = await eventually(lambda: placed(custom, "resnet", 1), what="placed once it exists")
    uid = obj["metadata"]["uid"]
    replica = binder.ledger.state.charged_pod(f"{uid}/0")
    assert replica is not None
    assert (replica.priority, replica.preemption_policy) == (5000, "Never")
    assert condition(custom, "resnet")["status"] == "True"

    # A class deleted later leaves placed replicas their priority, as it leaves pods theirs.
    scheduling: Any = kubernetes.client.SchedulingV1Api(kube_api)
    scheduling.delete_priority_class("urgent")
    await eventually(lambda: "urgent" not in binder.ledger.priority_classes, what="deleted")
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "resnet", {"metadata": {"labels": {"edited": "yes"}}}
    )
    await eventually(lambda: binder.ledger.models[uid].template.labels.get("edited"))
    replica = binder.ledger.state.charged_pod(f"{uid}/0")
    assert replica is not None and replica.priority == 5000
    assert binder.ledger.state.tallies.has_lower_priority(5000 + 1)
    assert condition(custom, "resnet")["status"] == "True"


# ---- preemption ----------------------------------------------------------------------------------


def pod_events(core: Any, name: str, reason: str) -> list[Any]:
    return model_events(core, name, reason)


def exists(core: Any, name: str) -> bool:
    return any(p.metadata.name == name for p in core.list_namespaced_pod("default").items)


def placements(custom: Any, name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = (read(custom, name).get("status") or {}).get("placements") or []
    return found


async def low_pods(kube_api: kubernetes.client.ApiClient, core: Any, mem: str = "8Gi") -> None:
    """Node "a" (16 GiB) full with two model pods of priority 0 (a short grace period: no
    kubelet runs there, so the API server ends a deletion once it is over)."""
    for name in ("low-1", "low-2"):
        add_pod(core, name, mem=mem, spec_extra={"terminationGracePeriodSeconds": 1})
    for name in ("low-1", "low-2"):
        assert await eventually(partial(node_of, core, name)) == "a"


async def test_a_replica_preempts_a_lower_priority_pod_and_takes_its_room(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    priority_class(kube_api, "urgent", 1000)
    add_node(kube_api, "a", [16 * GI])
    await make_binder()
    await low_pods(kube_api, core)
    create(custom, "resnet", memory="8Gi", priorityClassName="urgent")
    obj = await eventually(lambda: placed(custom, "resnet", 1), what="the replica placed")
    assert obj["status"]["placements"][0]["node"] == "a"
    gone = [name for name in ("low-1", "low-2") if not exists(core, name)]
    assert len(gone) == 1, "exactly one victim makes the room"
    rid = f"{obj['metadata']['uid']}/0"
    [event] = pod_events(core, gone[0], "Preempted")
    assert event.message == f"Preempted by TritonModel replica {rid} on node a"
    [preempting] = await eventually(lambda: model_events(core, "resnet", "Preempting"))
    assert preempting.message == (
        f"replica 0: preempting 1 lower-priority pod(s) and replica(s) on node a: default/{gone[0]}"
    )


async def test_a_model_without_a_class_takes_the_global_default_as_a_pod_does(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "a", [16 * GI])
    binder = await make_binder()
    await low_pods(kube_api, core)  # priority 0: created before the default exists
    priority_class(kube_api, "everyone", 100, globalDefault=True)
    create(custom, "resnet", memory="8Gi")
    obj = await eventually(lambda: placed(custom, "resnet", 1), what="the replica placed")
    replica = binder.ledger.state.charged_pod(f"{obj['metadata']['uid']}/0")
    assert replica is not None and replica.priority == 100
    assert [name for name in ("low-1", "low-2") if not exists(core, name)], "one preempted"


async def test_a_replica_preempts_a_lower_priority_replica_which_is_placed_again_elsewhere(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    priority_class(kube_api, "urgent", 1000)
    add_node(kube_api, "a", [16 * GI])
    await make_binder()
    create(custom, "bulk", memory="12Gi")
    bulk = await eventually(lambda: placed(custom, "bulk", 1), what="bulk placed")
    create(custom, "resnet", memory="8Gi", priorityClassName="urgent")
    resnet = await eventually(lambda: placed(custom, "resnet", 1), what="resnet placed")
    assert resnet["status"]["placements"][0]["node"] == "a"
    rid = f"{resnet['metadata']['uid']}/0"
    why = f"replica 0 was preempted by TritonModel replica {rid} on node a"
    [event] = await eventually(lambda: model_events(core, "bulk", "Preempted"))
    assert (event.type, event.message) == ("Normal", why)
    # It fits nowhere now: Placed False, saying it was preempted and why it is not back.
    placed_ = await eventually(
        lambda: (c := condition(custom, "bulk")).get("reason") == "Preempted" and c
    )
    assert placed_["status"] == "False"
    assert placed_["message"].startswith(f"{why}; placed again when it fits: replica 0: 0/1")
    assert placements(custom, "bulk") == []
    bulk_uid = bulk["metadata"]["uid"]
    # Placed again as soon as it fits somewhere.
    add_node(kube_api, "b", [16 * GI])
    again = await eventually(lambda: placed(custom, "bulk", 1), what="bulk placed again")
    assert again["status"]["placements"][0]["node"] == "b"
    assert condition(custom, "bulk")["status"] == "True"
    assert placements(custom, "resnet")[0]["node"] == "a", "the preemptor stays"
    assert again["metadata"]["uid"] == bulk_uid


async def test_a_pod_preempts_a_lower_priority_replica(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    priority_class(kube_api, "urgent", 1000)
    add_node(kube_api, "a", [16 * GI])
    binder = await make_binder()
    create(custom, "bulk", memory="12Gi")
    bulk = await eventually(lambda: placed(custom, "bulk", 1), what="bulk placed")
    add_pod(core, "urgent", mem="8Gi", spec_extra={"priorityClassName": "urgent"})
    assert await eventually(lambda: node_of(core, "urgent"), what="urgent bound") == "a"
    pod = core.read_namespaced_pod("urgent", "default")
    why = f"replica 0 was preempted by pod {pod.metadata.uid} on node a"
    [event] = await eventually(lambda: model_events(core, "bulk", "Preempted"))
    assert event.message == why
    [preempting] = await eventually(lambda: pod_events(core, "urgent", "Preempting"))
    assert preempting.message == "Preempting 1 lower-priority pod(s) on node a: default/bulk/0"
    placed_ = await eventually(lambda: condition(custom, "bulk").get("reason") == "Preempted")
    assert placed_
    assert placements(custom, "bulk") == []
    uid = bulk["metadata"]["uid"]
    assert uid not in {p.uid.partition("/")[0] for p in binder.ledger.state.bound_pods()}


async def test_a_replica_never_preempts_equal_or_higher_priority_nor_with_policy_never(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    priority_class(kube_api, "urgent", 1000)
    priority_class(kube_api, "top", 2000)
    priority_class(kube_api, "polite", 5000, preemptionPolicy="Never")
    add_node(kube_api, "a", [20 * GI])
    await make_binder()
    add_pod(core, "top", mem="8Gi", spec_extra={"priorityClassName": "top"})
    add_pod(core, "low", mem="2Gi")  # lower, but too small to make the room
    create(custom, "peer", memory="8Gi", priorityClassName="urgent")
    assert await eventually(lambda: node_of(core, "top"), what="top bound") == "a"
    assert await eventually(lambda: node_of(core, "low"), what="low bound") == "a"
    peer = await eventually(lambda: placed(custom, "peer", 1), what="peer placed")
    for name, cls in (("resnet", "urgent"), ("polite", "polite")):
        create(custom, name, memory="8Gi", priorityClassName=cls)
    for name in ("resnet", "polite"):
        await eventually(partial(refused, custom, name), what=f"{name} refused")
    resnet = condition(custom, "resnet")
    assert resnet["reason"] == "Unschedulable"
    assert resnet["message"].endswith(
        "preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
    )
    polite = condition(custom, "polite")
    assert "preemption" not in polite["message"], "Never: no preemption is tried"
    assert exists(core, "top") and exists(core, "low")
    # Not preempted: the same placements (their messages follow the host's creation).
    kept = [{**p, "message": ""} for p in placements(custom, "peer")]
    assert kept == [{**p, "message": ""} for p in peer["status"]["placements"]]
    assert not model_events(core, "peer", "Preempted")
    assert not pod_events(core, "top", "Preempted")


def set_loaded(core: Any, model_name: str, node: str, status: str) -> None:
    """What the agent writes on the host for its replica of `model_name`."""
    types = loaded_types(core, node, model_name)
    conditions = [{"type": t, "status": status, "reason": "X"} for t in types]
    core.patch_namespaced_pod_status(
        host_name(node),
        "default",
        {"status": {"conditions": [*conditions, HOST_READY]}},
        _content_type="application/strategic-merge-patch+json",
    )


async def test_a_preempted_replica_loaded_on_its_host_drains_before_its_room_is_taken(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    priority_class(kube_api, "urgent", 1000)
    add_node(kube_api, "a", [16 * GI])
    binder = await make_binder()
    create(custom, "bulk", memory="12Gi")
    bulk = await eventually(lambda: placed(custom, "bulk", 1), what="bulk placed")
    await eventually(lambda: hosts(core).get("a"), what="the host")
    set_loaded(core, "bulk", "a", "True")
    await eventually(lambda: BULK in hosts(core)["a"].metadata.labels, what="bulk served")

    create(custom, "resnet", memory="8Gi", priorityClassName="urgent")

    def draining() -> Any:
        host = hosts(core)["a"]
        entries = json.loads(host.metadata.annotations[HOSTED])
        return host if entries[0].get("draining") else None

    host = await eventually(draining, what="bulk marked draining on its host")
    assert BULK not in host.metadata.labels, "out of its Service as it drains"
    placed_ = await eventually(lambda: condition(custom, "bulk").get("reason") == "Preempted")
    assert placed_
    assert condition(custom, "bulk")["message"].endswith(
        "placed again once its previous placement on node a has drained"
    )
    # Its room is held for the preemptor, which waits for the drain.
    assert binder.ledger.state.is_accounted(f"{bulk['metadata']['uid']}/0")
    assert not placements(custom, "resnet")
    set_loaded(core, "bulk", "a", "False")  # the host's loader unloaded it
    resnet = await eventually(lambda: placed(custom, "resnet", 1), what="resnet placed")
    assert resnet["status"]["placements"][0]["node"] == "a"


async def test_a_namespace_cannot_preempt_with_a_class_its_quota_forbids(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    """The attack: team-a names a high class to push another namespace's replica off its GPU.
    Kubernetes lets any namespace name any class; the admin's bound is a ResourceQuota scoped by
    PriorityClass, which refuses team-a's pods of that class, and its replicas alike."""
    priority_class(kube_api, "urgent", 1000)
    core.create_namespace({"metadata": {"name": "team-a"}})
    selector = {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In",
                                      "values": ["urgent"]}]}  # fmt: skip
    core.create_namespaced_resource_quota(
        "team-a",
        {
            "metadata": {"name": "no-urgent"},
            "spec": {"hard": {"requests.tritonshare.io/gpu-mem": "0"}, "scopeSelector": selector},
        },
    )
    add_node(kube_api, "a", [16 * GI])
    await make_binder()
    create(custom, "bulk", memory="12Gi")  # another namespace's, priority 0
    await eventually(lambda: placed(custom, "bulk", 1), what="bulk placed")

    for name, spec in (("sneaky", {"priorityClassName": "urgent"}), ("plain", {})):
        body = model(name, 1, "8Gi" if spec else "2Gi")
        body["spec"].update(spec)
        custom.create_namespaced_custom_object(GROUP, VERSION, "team-a", PLURAL, body)

    def team_a(name: str) -> dict[str, Any]:
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, "team-a", PLURAL, name)
        conditions = (obj.get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "Placed"), {})

    refused_ = await eventually(lambda: team_a("sneaky").get("reason") == "ExceededQuota" and 1)
    assert refused_
    assert team_a("sneaky")["message"] == (
        'tritonmodel "sneaky" replica 0: exceeded quota: no-urgent, requested:'
        " requests.tritonshare.io/gpu-mem=8Gi, used: requests.tritonshare.io/gpu-mem=0,"
        " limited: requests.tritonshare.io/gpu-mem=0"
    )
    # The quota selects only that class: the namespace's other models are placed.
    await eventually(lambda: team_a("plain").get("status") == "True", what="plain placed")
    # As its pods of that class are refused by the API server.
    pod = {
        "metadata": {"name": "sneaky"},
        "spec": {
            "priorityClassName": "urgent",
            "schedulerName": "tritonshare",
            "containers": [
                {
                    "name": "m",
                    "image": "tritonshare/proxy",
                    "resources": {"limits": {"tritonshare.io/gpu-mem": "8Gi"}},
                }
            ],
        },
    }
    with pytest.raises(kubernetes.client.ApiException) as caught:
        core.create_namespaced_pod("team-a", pod)
    assert caught.value.status == 403
    assert "exceeded quota: no-urgent" in str(caught.value.body)
    assert placements(custom, "bulk")[0]["node"] == "a"
    assert not model_events(core, "bulk", "Preempted")


async def test_a_replica_respects_the_budget_of_the_pods_it_would_preempt(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    custom: Any,
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
    priority_class(kube_api, "urgent", 1000)
    add_node(kube_api, "a", [16 * GI])
    await make_binder()
    for name in ("low-1", "low-2"):
        add_pod(core, name, mem="8Gi", labels={"app": "low"})
    for name in ("low-1", "low-2"):
        assert await eventually(partial(node_of, core, name)) == "a"
        running(core, name)
    create(custom, "resnet", memory="8Gi", priorityClassName="urgent")
    refused_ = await eventually(
        lambda: [
            r
            for r in binder_writes(apiserver)
            if r.subresource == "eviction" and r.name.startswith("low-")
        ],
        what="an eviction attempt",
    )
    assert {r.code for r in refused_} == {429}
    # Refused, it waits before it preempts again (the model is retried every second meanwhile).
    await asyncio.sleep(2.5)
    attempts = [r for r in binder_writes(apiserver) if r.subresource == "eviction"]
    assert len(attempts) == 1, attempts
    assert exists(core, "low-1") and exists(core, "low-2")
    assert not placements(custom, "resnet")
    assert condition(custom, "resnet")["status"] == "False"
    assert not pod_events(core, "low-1", "Preempted") and not pod_events(core, "low-2", "Preempted")


# ---- a roll to new files ---------------------------------------------------------------------

NEW_URI = "https://models.example.com/y.tar.gz"


def roll(custom: Any, name: str, uri: str) -> None:
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, name, {"spec": {"storageUri": uri}}
    )


def on_files(custom: Any, name: str, uri: str) -> list[tuple[int, str]]:
    return [(p["replica"], p["node"]) for p in placements(custom, name) if p["storageUri"] == uri]


async def test_a_rolls_surge_replica_preempts_by_the_models_priority_onto_the_new_files(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    priority_class(kube_api, "urgent", 1000)
    add_node(kube_api, "b", [8 * GI])
    await make_binder()
    create(custom, "resnet", memory="8Gi", priorityClassName="urgent")
    obj = await eventually(lambda: placed(custom, "resnet", 1), what="resnet placed")
    old_uri = obj["spec"]["storageUri"]
    assert on_files(custom, "resnet", old_uri) == [(0, "b")]
    add_node(kube_api, "a", [16 * GI])
    await low_pods(kube_api, core)  # "b" is full: no room for a surge without preemption

    roll(custom, "resnet", NEW_URI)
    surge = await eventually(lambda: on_files(custom, "resnet", NEW_URI), what="the surge")
    assert surge == [(1, "a")], "the lowest free ordinal, on the room its preemption made"
    assert len([n for n in ("low-1", "low-2") if not exists(core, n)]) == 1
    [preempting] = await eventually(lambda: model_events(core, "resnet", "Preempting"))
    assert preempting.message.startswith("replica 1: preempting 1 lower-priority pod(s)")
    assert on_files(custom, "resnet", old_uri) == [(0, "b")], "the old replica stays meanwhile"
    assert condition(custom, "resnet", "Progressing")["reason"] == "ReplicaUpdating"


async def test_a_roll_whose_class_is_gone_leaves_every_replica_on_its_files_and_says_why(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    priority_class(kube_api, "urgent", 1000)
    add_node(kube_api, "a", [16 * GI])
    add_node(kube_api, "b", [16 * GI])
    binder = await make_binder()
    create(custom, "resnet", priorityClassName="urgent")
    obj = await eventually(lambda: placed(custom, "resnet", 1), what="resnet placed")
    old = on_files(custom, "resnet", obj["spec"]["storageUri"])
    scheduling: Any = kubernetes.client.SchedulingV1Api(kube_api)
    scheduling.delete_priority_class("urgent")
    await eventually(lambda: "urgent" not in binder.ledger.priority_classes, what="deleted")

    roll(custom, "resnet", NEW_URI)
    stalled = await eventually(
        lambda: (c := condition(custom, "resnet", "Progressing")).get("status") == "False" and c,
        what="the roll refused",
    )
    assert stalled["reason"] == "PriorityClassNotFound"
    assert stalled["message"] == (
        "no PriorityClass with name urgent was found; the replicas stay on their files"
    )
    assert on_files(custom, "resnet", obj["spec"]["storageUri"]) == old
    assert not on_files(custom, "resnet", NEW_URI)
    assert condition(custom, "resnet")["status"] == "True", "its replica stays placed"
    entries = json.loads(hosts(core)[old[0][1]].metadata.annotations[HOSTED])
    assert not any(e.get("draining") for e in entries), "nothing leaves"
