"""The controller through the official client against the simulated API server: binding, API
calls per pod, events and conditions as a client reads them, backoff without spam, requeue on a
helpful change, conflicts, bad input, and the HTTP endpoints."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from functools import partial
from typing import Any

import aiohttp
import kubernetes.client
import pytest

from binder.api.kube import USER_AGENT
from binder.cluster.objects import pod_from_api
from binder.framework.placement import Placement, place
from common.proofs import Claim, ProofError
from sim.apiserver import Fault, RunningApiServer
from tests.binder.objects import GI, KEYS, lease_obj, node_obj, pod_obj
from tests.binder.simcluster import (
    SYSTEM,
    MakeBinder,
    add_node,
    add_pod,
    binder_writes,
    eventually,
    failed_events,
    node_of,
    scheduled_condition,
)
from tests.fixtures_sim import PlacementKeys, coordination_v1


async def test_binds_a_pod_with_one_api_call_carrying_the_gpu_annotation(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    core: Any,
    make_binder: MakeBinder,
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI, 16 * GI])
    binder = await make_binder()
    add_pod(core, "resnet", mem="4Gi")
    node = await eventually(lambda: node_of(core, "resnet"), what="the pod to be bound")
    assert node == "gpu-1"
    pod = core.read_namespaced_pod("resnet", "default")
    assert pod.metadata.annotations[KEYS.gpu] in ("GPU-gpu-1-0", "GPU-gpu-1-1")
    # Then its Scheduled Event, after the binding and apart from it.
    await eventually(lambda: scheduled_events(core, "resnet"), what="the Scheduled Event")
    writes = binder_writes(apiserver, "resnet")
    assert [(w.verb, w.resource, w.subresource) for w in writes] == [
        ("create", "pods", "binding"),
    ]
    assert [w.verb for w in binder_writes(apiserver) if w.resource == "events"] == ["create"]
    assert all(w.user_agent == USER_AGENT for w in writes)
    assert USER_AGENT.startswith("tritonshare-binder/")
    # The watch brings the bound pod back: the assumption becomes the real account.
    await eventually(lambda: not binder.cache.state.assumed_uids(), what="the assumption to clear")
    assert binder.cache.state.memory.allocated("gpu-1") in ([4 * GI, 0], [0, 4 * GI])


def scheduled_events(core: Any, name: str) -> list[Any]:
    events = core.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={name}"
    ).items
    return [e for e in events if e.reason == "Scheduled"]


async def test_a_bound_pod_gets_a_scheduled_event_naming_its_node_and_gpu(
    core: Any, kube_api: kubernetes.client.ApiClient, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI, 16 * GI])
    await make_binder()
    add_pod(core, "resnet", mem="4Gi")
    events = await eventually(lambda: scheduled_events(core, "resnet"), what="Scheduled")
    gpu = core.read_namespaced_pod("resnet", "default").metadata.annotations[KEYS.gpu]
    index = gpu.rpartition("-")[2]
    [event] = events
    assert (event.type, event.message, event.action, event.reporting_component) == (
        "Normal",
        f"Successfully assigned default/resnet to gpu-1, GPU {index} ({gpu})",
        "Binding",
        "tritonshare",
    )
    assert (event.involved_object.kind, event.involved_object.uid) == (
        "Pod",
        core.read_namespaced_pod("resnet", "default").metadata.uid,
    )


async def test_scheduled_events_stop_at_their_rate_and_the_rest_are_counted(
    core: Any, kube_api: kubernetes.client.ApiClient, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI] * 2)
    # A burst of one, then one each 1,000 s: the first pod bound gets its Event, no other.
    binder = await make_binder(scheduled_events_per_second=0.001)
    names = [f"m-{i}" for i in range(5)]
    for name in names:
        add_pod(core, name, mem="1Gi")
    await eventually(lambda: all(node_of(core, n) for n in names), what="every bind")
    registry = binder.metrics.registry
    skipped = "tritonshare_binder_scheduled_events_skipped_total"
    await eventually(lambda: registry.get_sample_value(skipped) == 4, what="4 skipped")
    await eventually(
        lambda: sum(len(scheduled_events(core, n)) for n in names) == 1, what="one Event"
    )


async def test_a_scheduled_event_the_server_holds_never_delays_the_next_binding(
    apiserver: RunningApiServer,
    core: Any,
    kube_api: kubernetes.client.ApiClient,
    make_binder: MakeBinder,
) -> None:
    """The Events are written apart from the bindings: an Event write the API server holds (5 s,
    then 429, as a server under load queues and sheds) leaves the next pod's binding as quick,
    even with one bind worker."""
    add_node(kube_api, "gpu-1", [16 * GI] * 2)
    # A write's retries last the renew deadline (the default's 10 s, not the fixture's 1.5 s).
    await make_binder(bind_workers=1, lease_duration_seconds=15.0, renew_deadline_seconds=10.0)
    held = Fault(
        429,
        times=1,
        user_agent=USER_AGENT,
        verb="create",
        resource="events",
        retry_after=1,
        delay_seconds=5.0,
    )
    apiserver.faults.arm(held)
    add_pod(core, "first", mem="1Gi")
    await eventually(lambda: node_of(core, "first"), what="the first pod to be bound")
    await eventually(lambda: held.times == 0, what="its Scheduled Event to be held")
    created = time.monotonic()
    add_pod(core, "second", mem="1Gi")
    await eventually(lambda: node_of(core, "second"), what="the second pod to be bound")
    assert time.monotonic() - created < 2.5
    # The held Event is written all the same, once the server takes it.
    await eventually(lambda: scheduled_events(core, "first"), what="the first pod's Event")


async def test_the_binding_carries_a_proof_of_placement_bound_to_this_pod(
    core: Any,
    kube_api: kubernetes.client.ApiClient,
    make_binder: MakeBinder,
    placement_keys: PlacementKeys,
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    await make_binder()
    add_pod(core, "resnet", mem="4Gi", model="resnet50")
    await eventually(lambda: node_of(core, "resnet"), what="the pod to be bound")
    pod = core.read_namespaced_pod("resnet", "default")
    annotations = pod.metadata.annotations
    claim = Claim(
        pod.metadata.uid,
        "default",
        "resnet",
        "gpu-1",
        annotations[KEYS.gpu],
        "resnet50",
        0,
    )
    proof = placement_keys.ring.verify(claim, annotations[KEYS.placement])
    assert proof.request == 4 * GI
    # The same proof on any other pod, GPU or model proves nothing.
    for forged in (
        replace(claim, pod_uid="another-uid"),
        replace(claim, gpu_uuid="GPU-elsewhere"),
        replace(claim, model_id="victim"),
        replace(claim, node="gpu-2"),
        replace(claim, residency="on-demand"),
    ):
        with pytest.raises(ProofError):
            placement_keys.ring.verify(forged, annotations[KEYS.placement])

    # An on-demand pod's proof binds its class: the agent acts on what the binder decided.
    add_pod(core, "lazy", mem="2Gi", annotations={KEYS.residency: "on-demand"})
    await eventually(lambda: node_of(core, "lazy"), what="the on-demand pod to be bound")
    lazy = core.read_namespaced_pod("lazy", "default")
    signed = lazy.metadata.annotations
    claim = Claim(lazy.metadata.uid, "default", "lazy", "gpu-1", signed[KEYS.gpu], "lazy", 0)
    assert placement_keys.ring.verify(replace(claim, residency="on-demand"), signed[KEYS.placement])
    with pytest.raises(ProofError):
        placement_keys.ring.verify(claim, signed[KEYS.placement])


async def test_unschedulable_pod_gets_one_event_and_condition_then_backs_off_quietly(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    core: Any,
    make_binder: MakeBinder,
) -> None:
    add_node(kube_api, "gpu-1", [8 * GI])
    binder = await make_binder()
    add_pod(core, "big", mem="6Gi")
    await eventually(lambda: node_of(core, "big"))
    add_pod(core, "second", mem="4Gi")
    condition = await eventually(lambda: scheduled_condition(core, "second"), what="PodScheduled")
    expected = "0/1 nodes are available: 1 Insufficient GPU memory (largest free block 2Gi)."
    assert (condition.status, condition.reason, condition.message) == (
        "False",
        "Unschedulable",
        expected,
    )
    events = await eventually(lambda: failed_events(core, "second"), what="the event")
    assert [(e.type, e.message, e.source.component) for e in events] == [
        ("Warning", expected, "tritonshare")
    ]
    # Retries continue with backoff, but the unchanged message is not written again.
    registry = binder.metrics.registry
    sample = "tritonshare_binder_schedule_attempts_total"
    labels = {"result": "unschedulable"}
    await eventually(lambda: (registry.get_sample_value(sample, labels) or 0) >= 4, what="retries")
    assert len(failed_events(core, "second")) == 1
    writes = sorted(
        (w.resource, w.subresource)
        for w in binder_writes(apiserver)
        if w.resource == "events" or w.name == "second"
    )
    # The first pod's Scheduled Event, the second's one FailedScheduling and one condition.
    assert writes == [("events", ""), ("events", ""), ("pods", "status")]
    assert binder.queue.failures(binder_uid(core, "second")) >= 3


def binder_uid(core: Any, name: str) -> str:
    return str(core.read_namespaced_pod(name, "default").metadata.uid)


async def test_a_deleted_pod_frees_memory_and_requeues_at_once(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "gpu-1", [8 * GI])
    # A long backoff: only the requeue on the deletion can bind the second pod in time.
    await make_binder(backoff_initial_seconds=60.0, backoff_max_seconds=120.0)
    add_pod(core, "first", mem="6Gi")
    await eventually(lambda: node_of(core, "first"))
    add_pod(core, "second", mem="6Gi")
    await eventually(lambda: scheduled_condition(core, "second"))
    core.delete_namespaced_pod("first", "default", grace_period_seconds=0)
    assert await eventually(lambda: node_of(core, "second"), within=20) == "gpu-1"


async def test_a_node_added_later_requeues_at_once(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    await make_binder(backoff_initial_seconds=60.0, backoff_max_seconds=120.0)
    add_pod(core, "waiting", mem="2Gi")
    condition = await eventually(lambda: scheduled_condition(core, "waiting"))
    assert condition.message == "0/0 nodes are available:"
    add_node(kube_api, "late", [16 * GI])
    assert await eventually(lambda: node_of(core, "waiting"), within=20) == "late"


async def test_an_agent_coming_alive_requeues_at_once(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    core.create_node(node_obj("gpu-1", [16 * GI]))
    stale = lease_obj("gpu-1", time.time() - 600, 40)
    coordination_v1(kube_api).create_namespaced_lease(SYSTEM, stale)
    await make_binder(backoff_initial_seconds=60.0, backoff_max_seconds=120.0)
    add_pod(core, "m", mem="2Gi")
    condition = await eventually(lambda: scheduled_condition(core, "m"))
    assert condition.message == "0/1 nodes are available: 1 node(s) had no live tritonshare agent."
    lease = coordination_v1(kube_api).read_namespaced_lease("tritonshare-agent-gpu-1", SYSTEM)
    fresh = lease_obj("gpu-1", time.time(), 40)
    fresh["metadata"]["resourceVersion"] = lease.metadata.resource_version
    coordination_v1(kube_api).replace_namespaced_lease("tritonshare-agent-gpu-1", SYSTEM, fresh)
    assert await eventually(lambda: node_of(core, "m"), within=20) == "gpu-1"


async def test_replicas_spread_over_nodes_then_share_them_and_node_rules_apply(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    taint = {"key": "nvidia.com/gpu", "value": "", "effect": "NoSchedule"}
    add_node(kube_api, "a", [16 * GI], labels={"zone": "a"})
    add_node(kube_api, "b", [16 * GI], labels={"zone": "b"}, taints=[taint])
    await make_binder()
    add_pod(core, "r1", model="resnet")
    add_pod(core, "r2", model="resnet", spec_extra={"tolerations": [{"operator": "Exists"}]})
    first = await eventually(lambda: node_of(core, "r1"))
    second = await eventually(lambda: node_of(core, "r2"))
    assert {first, second} == {"a", "b"}
    # Past the nodes, a replica shares a node rather than waiting, where node rules allow.
    add_pod(core, "r3", model="resnet")
    assert await eventually(lambda: node_of(core, "r3")) == "a"


async def test_bad_input_gets_a_clear_event_and_the_binder_keeps_going(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    await make_binder()
    add_pod(core, "no-model", model=None)
    # A malformed quantity never reaches the binder: the API server refuses the pod (the
    # binder's own check of it is tested on pod_from_api in test_placement).
    with pytest.raises(kubernetes.client.ApiException) as refused:
        add_pod(core, "bad-mem", mem="lots")
    assert refused.value.status == 400 and "quantities must match" in str(refused.value.body)
    add_pod(core, "huge", mem="40Gi")
    add_pod(core, "fine", mem="1Gi")
    assert await eventually(lambda: node_of(core, "fine")) == "gpu-1"
    for name, fragment in [
        ("no-model", "has no tritonshare.io/model-id annotation"),
        ("huge", "more than any healthy GPU in the cluster offers (largest 16Gi"),
    ]:
        events = await eventually(partial(failed_events, core, name), what=f"event of {name}")
        assert fragment in events[0].message, events[0].message


async def test_pods_of_other_schedulers_are_left_alone(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    core: Any,
    make_binder: MakeBinder,
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    await make_binder()
    add_pod(core, "theirs", scheduler="default-scheduler")
    add_pod(core, "ours")
    await eventually(lambda: node_of(core, "ours"))
    assert node_of(core, "theirs") == ""
    assert binder_writes(apiserver, "theirs") == []


@pytest.mark.parametrize("elsewhere", [False, True], ids=["same-node", "other-node"])
async def test_a_conflict_or_a_deleted_pod_drops_the_assumption(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder, elsewhere: bool
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    add_node(kube_api, "gpu-2", [16 * GI])
    binder = await make_binder(leader_elect=True, identity="follower")
    # Another replica holds the leader lease, so this one decides nothing by itself.
    coordination_v1(kube_api).create_namespaced_lease(
        SYSTEM,
        {
            "metadata": {"name": "tritonshare-binder", "namespace": SYSTEM},
            "spec": {
                "holderIdentity": "someone-else",
                "leaseDurationSeconds": 3600,
                "renewTime": lease_obj("x", time.time())["spec"]["renewTime"],
            },
        },
    )
    add_pod(core, "raced", mem="4Gi")
    add_pod(core, "gone", mem="4Gi")
    await eventually(lambda: len(binder.cache.pending) == 2, what="two pending pods")
    state = binder.cache.state
    by_name = {p.name: p for p in binder.cache.pending.values()}
    placements = {}
    for name in ("raced", "gone"):
        placement = place(state, by_name[name], now=time.time())
        assert isinstance(placement, Placement)
        placements[name] = placement
    # Someone else binds "raced" between our decision and our binding (on the node we chose, or
    # on the other); "gone" is deleted.
    ours = placements["raced"].node
    theirs = next(n for n in ("gpu-1", "gpu-2") if n != ours) if elsewhere else ours
    binding = {"metadata": {"name": "raced"}, "target": {"kind": "Node", "name": theirs}}
    core.create_namespaced_pod_binding("raced", "default", binding, _preload_content=False)
    core.delete_namespaced_pod("gone", "default", grace_period_seconds=0)
    for name in ("raced", "gone"):
        pod, placement = by_name[name], placements[name]
        state.assume(pod, placement.node, placement.gpu.uuid)
        await binder.controller._slots.acquire()
        binder.controller._bind(pod, placement)
    # Neither assumption stays, and "gone" is charged nowhere. Our Binding of "raced" is refused
    # whole, its annotations with it: the pod someone else bound carries no proof of ours, and
    # is charged nowhere, reported as not placed by the binder, on either node.
    await eventually(lambda: not state.assumed_uids(), what="assumptions dropped")
    raced = by_name["raced"].uid
    await eventually(lambda: raced in binder.cache.unproven, what="raced seen unproven")
    assert state.assigned_pods() == []
    assert binder.cache.unproven[raced].reason == "NotPlacedByBinder"
    assert KEYS.placement not in (
        core.read_namespaced_pod("raced", "default").metadata.annotations or {}
    )


async def test_http_endpoints_report_readiness_role_and_gpu_metrics(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    binder = await make_binder()
    add_pod(core, "m", mem="3Gi")
    await eventually(lambda: node_of(core, "m"))
    base = f"http://127.0.0.1:{binder.http.port}"
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{base}/healthz") as response:
            assert response.status == 200
        async with session.get(f"{base}/readyz") as response:
            assert (response.status, await response.text()) == (200, "ready (leader)\n")
        async with session.get(f"{base}/metrics") as response:
            text = await response.text()
    # A GPU is labelled as dcgm-exporter labels it (`gpu` its index, `UUID`), so queries join.
    gpu = '{UUID="GPU-gpu-1-0",gpu="0",node="gpu-1"}'
    assert f"tritonshare_binder_gpu_allocated_bytes{gpu} 3.221225472e+09" in text
    assert f"tritonshare_binder_gpu_capacity_bytes{gpu} 1.7179869184e+10" in text
    assert 'tritonshare_binder_schedule_attempts_total{result="scheduled"} 1.0' in text
    assert "tritonshare_binder_scheduling_latency_seconds_count 1.0" in text
    assert "tritonshare_binder_is_leader 1.0" in text
    assert "tritonshare_binder_pending_pods 0.0" in text
    assert 'tritonshare_binder_api_writes_total{call="bind"} 1.0' in text
    # One write a pod: the Binding carries the GPU and the proof, which the pod then has.
    assert 'call="annotate"' not in text
    annotations = core.read_namespaced_pod("m", "default").metadata.annotations
    assert annotations[KEYS.gpu] == "GPU-gpu-1-0" and annotations[KEYS.placement]


def test_pod_from_api_reads_what_the_binder_patched() -> None:
    obj = pod_obj("p", node="n", gpu="GPU-n-1")
    assert pod_from_api(obj, KEYS).gpu_uuid == "GPU-n-1"


async def test_a_burst_never_overcommits_a_gpu_as_the_api_shows_it(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    for name in ("a", "b", "c"):
        add_node(kube_api, name, [8 * GI, 8 * GI])
    binder = await make_binder(bind_workers=4)
    sizes = ["1Gi", "2Gi", "3Gi", "5Gi"]
    for i in range(40):
        add_pod(core, f"m{i}", mem=sizes[i % 4], model=f"model-{i % 12}")
    await eventually(
        lambda: (
            len(binder.cache.pending) + len(binder.cache.state.assigned_pods()) == 40
            and all(binder.queue.failures(uid) for uid in binder.cache.pending)
            and not binder.cache.state.assumed_uids()
        ),
        what="every pod decided",
    )
    used: dict[str, int] = {}
    for pod in core.list_namespaced_pod("default").items:
        if not pod.spec.node_name:
            continue
        gpu = pod.metadata.annotations[KEYS.gpu]
        limit = pod.spec.containers[0].resources.limits[KEYS.gpu_mem]
        used[gpu] = used.get(gpu, 0) + int(limit.removesuffix("Gi")) * GI
    assert used and max(used.values()) <= 8 * GI, used
    assert sum(used.values()) >= 40 * GI, "the binder should pack most of the 48Gi"


async def test_a_failure_in_the_scheduling_loop_is_logged_and_stops_the_replica(
    kube_api: kubernetes.client.ApiClient,
    core: Any,
    make_binder: MakeBinder,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    binder = await make_binder()

    def broken(uid: str) -> None:
        raise RuntimeError("a bug in placement")

    monkeypatch.setattr(binder.controller, "schedule_one", broken)
    with caplog.at_level(logging.ERROR, logger="common.lifecycle"):
        add_pod(core, "resnet", mem="4Gi")
        lifecycle = make_binder.lifecycle(binder)
        await eventually(lifecycle.stop_event.is_set, what="the replica to stop")
    assert str(lifecycle.failure) == "a bug in placement"
    assert "The binder's scheduling has failed: stopping this replica." in caplog.messages
