"""NodeResourcesFit and NodePorts, as kube-scheduler applies them (cases after its
noderesources/fit_test.go and nodeports/node_ports_test.go): every pod bound to the node counts,
whatever its scheduler; terminated pods do not; a resource the pod asks none of is not checked;
every insufficient resource is named; the binder's own GPU-memory resource is left to the GPU
ledger. End to end: a pod the node cannot hold stays Pending with kube-scheduler's words, and
binds once a pod of another scheduler leaves."""

from __future__ import annotations

from functools import partial
from typing import Any

import kubernetes.client

from binder.cluster.clusterstate import ClusterState
from binder.cluster.objects import pod_from_api
from binder.framework.placement import explain
from tests.binder.framework.test_placement import NOW, cluster, placed, refused
from tests.binder.objects import GI, KEYS, node_obj, pod_obj
from tests.binder.simcluster import (
    MakeBinder,
    add_node,
    add_pod,
    eventually,
    failed_events,
    node_of,
)

SMALL = {"cpu": "2", "memory": "4Gi", "pods": "110", "ephemeral-storage": "10Gi"}


def with_resources(
    requests: dict[str, str] | None = None,
    *,
    init: list[dict[str, str]] | None = None,
    ports: list[dict[str, Any]] | None = None,
    overhead: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A spec_extra: the model container's requests (beside its GPU memory) and ports."""
    container: dict[str, Any] = {
        "name": "proxy",
        "image": "tritonshare/proxy",
        "resources": {"limits": {KEYS.gpu_mem: "1Gi"}, "requests": dict(requests or {})},
    }
    if ports:
        container["ports"] = ports
    spec: dict[str, Any] = {"containers": [container]}
    if init:
        spec["initContainers"] = [
            {"name": f"init-{i}", "image": "tritonshare/loader", "resources": {"requests": r}}
            for i, r in enumerate(init)
        ]
    if overhead:
        spec["overhead"] = overhead
    return spec


def other_pod(name: str, node: str, requests: dict[str, str], **kw: Any) -> dict[str, Any]:
    """A pod of another scheduler, bound, asking no GPU memory."""
    obj = pod_obj(name, mem=None, model=None, node=node, scheduler="default-scheduler", **kw)
    obj["spec"]["containers"][0]["resources"] = {"requests": requests}
    obj["status"] = {"phase": kw.get("phase", "Running")}
    return obj


def track(state: ClusterState, obj: dict[str, Any]) -> None:
    state.track_pod(pod_from_api(obj, KEYS))


def small_node(name: str = "n1", **kw: Any) -> ClusterState:
    return cluster(node_obj(name, [16 * GI], allocatable={**SMALL, **kw}))


def test_a_pod_asking_more_than_the_node_offers_names_every_short_resource() -> None:
    state = small_node()
    result = refused(
        state, pod_obj("big", spec_extra=with_resources({"cpu": "64", "memory": "512Gi"}))
    )
    assert result.message == ("0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient memory.")
    verdict = explain(
        state, pod_from_api(pod_obj("big", spec_extra=with_resources({"cpu": "64"})), KEYS), now=NOW
    )
    assert verdict[0].reasons == ("Insufficient cpu",)


def test_pods_of_every_scheduler_count_and_terminated_ones_do_not() -> None:
    state = small_node()
    track(state, other_pod("web", "n1", {"cpu": "1500m"}))
    asking = pod_obj("m", spec_extra=with_resources({"cpu": "1"}))
    assert refused(state, asking).reasons == {"Insufficient cpu": 1}
    track(state, other_pod("web", "n1", {"cpu": "1500m"}, phase="Succeeded"))
    assert placed(state, asking).node == "n1"


def test_a_pod_asking_exactly_what_is_left_fits() -> None:
    state = small_node()
    track(state, other_pod("web", "n1", {"cpu": "1500m", "memory": "3Gi"}))
    assert placed(state, pod_obj("m", spec_extra=with_resources({"cpu": "500m", "memory": "1Gi"})))
    refused(state, pod_obj("m2", spec_extra=with_resources({"cpu": "501m"})))


def test_the_pod_count_is_checked_even_for_a_pod_asking_nothing() -> None:
    state = small_node(pods="2")
    track(state, other_pod("a", "n1", {}))
    assert placed(state, pod_obj("m")).node == "n1"
    track(state, other_pod("b", "n1", {}))
    assert refused(state, pod_obj("m")).reasons == {"Too many pods": 1}


def test_a_pod_decided_but_not_yet_seen_bound_counts_on_its_node() -> None:
    state = small_node()
    first = pod_from_api(pod_obj("a", spec_extra=with_resources({"cpu": "1500m"})), KEYS)
    chosen = placed(state, pod_obj("a", spec_extra=with_resources({"cpu": "1500m"})))
    state.assume(first, chosen.node, chosen.gpu.uuid)
    refused(state, pod_obj("b", spec_extra=with_resources({"cpu": "1"})))
    state.forget_assumed(first.uid)
    assert placed(state, pod_obj("b", spec_extra=with_resources({"cpu": "1"})))


def test_init_containers_count_at_their_peak_and_overhead_is_added() -> None:
    state = small_node()
    # Containers 500m, an init container 1900m: the pod asks 1900m, then 100m of overhead.
    spec = with_resources({"cpu": "500m"}, init=[{"cpu": "1900m"}], overhead={"cpu": "100m"})
    assert placed(state, pod_obj("m", spec_extra=spec))
    spec = with_resources({"cpu": "500m"}, init=[{"cpu": "1900m"}], overhead={"cpu": "101m"})
    assert refused(state, pod_obj("m", spec_extra=spec)).reasons == {"Insufficient cpu": 1}


def test_extended_resources_the_node_lacks_refuse_and_gpu_memory_is_the_ledgers() -> None:
    state = small_node(**{"example.com/foo": "2"})
    assert placed(state, pod_obj("m", spec_extra=with_resources({"example.com/foo": "2"})))
    wanting = pod_obj("m", spec_extra=with_resources({"example.com/bar": "1"}))
    assert refused(state, wanting).reasons == {"Insufficient example.com/bar": 1}
    # 1Gi of GPU memory on a node whose allocatable does not list the resource: the GPU ledger
    # judges it, not NodeResourcesFit.
    assert placed(state, pod_obj("m", mem="1Gi"))


def test_a_node_without_allocatable_is_not_judged() -> None:
    state = cluster(node_obj("n1", [16 * GI]))
    assert placed(state, pod_obj("m", spec_extra=with_resources({"cpu": "640"})))


def hostport(port: int, ip: str = "", protocol: str = "") -> dict[str, Any]:
    entry: dict[str, Any] = {"containerPort": port, "hostPort": port}
    if ip:
        entry["hostIP"] = ip
    if protocol:
        entry["protocol"] = protocol
    return entry


def test_host_ports_conflict_as_kube_scheduler_judges_them() -> None:
    reason = "node(s) didn't have free ports for the requested pod ports"
    cases = [
        # (in use, wanted, conflicts)
        (hostport(8001), hostport(8001), True),
        (hostport(8001), hostport(8001, protocol="UDP"), False),
        (hostport(8001, ip="127.0.0.1"), hostport(8001, ip="127.0.0.2"), False),
        (hostport(8001, ip="127.0.0.1"), hostport(8001), True),  # 0.0.0.0 takes every address
        (hostport(8001), hostport(8001, ip="127.0.0.1"), True),
        (hostport(8001), hostport(8002), False),
    ]
    for used, wanted, conflicts in cases:
        state = small_node()
        holder = other_pod("holder", "n1", {})
        holder["spec"]["containers"][0]["ports"] = [used]
        track(state, holder)
        pod = pod_obj("m", spec_extra=with_resources(ports=[wanted]))
        if conflicts:
            assert refused(state, pod).reasons == {reason: 1}, (used, wanted)
        else:
            assert placed(state, pod).node == "n1", (used, wanted)


async def test_a_pod_the_node_cannot_hold_waits_with_kube_schedulers_words_then_binds(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "small", [16 * GI], allocatable={"cpu": "2", "memory": "4Gi", "pods": "110"})
    web = other_pod("web", "small", {"cpu": "1500m"})
    del web["metadata"]["uid"], web["metadata"]["creationTimestamp"]
    web["metadata"]["namespace"] = "default"
    core.create_namespaced_pod("default", web)
    await make_binder()
    add_pod(core, "huge", spec_extra=with_resources({"cpu": "64", "memory": "512Gi"}))
    add_pod(core, "one-cpu", spec_extra=with_resources({"cpu": "1"}))
    for name, message in [
        ("huge", "0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient memory."),
        ("one-cpu", "0/1 nodes are available: 1 Insufficient cpu."),
    ]:
        events = await eventually(partial(failed_events, core, name), what=name)
        assert events[0].message == message
    core.delete_namespaced_pod("web", "default", grace_period_seconds=0)
    assert await eventually(lambda: node_of(core, "one-cpu")) == "small"
    assert node_of(core, "huge") == ""
