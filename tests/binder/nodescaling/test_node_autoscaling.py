"""Node autoscaling end to end, through the official client against the simulated API server: the
binder (`--node-autoscaling`), the simulated kube-scheduler and the simulated Cluster Autoscaler
(sim.controllers.nodeautoscaler, its FAQ's rules). A TritonModel replica that fits no GPU makes
the binder's placeholder pod, for which the autoscaler adds a GPU node; the replica is placed
there and the placeholder goes. A node serving models is guarded from scale-down; an empty GPU
node is removed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from binder.nodescaling.guard import GUARDS
from binder.nodescaling.loop import PERIOD_SECONDS, REFUSED_REASON
from binder.nodescaling.placeholders import (
    HOSTNAME,
    MAX_PER_NAMESPACE,
    PRIORITY_CLASS,
    waiting_model,
)
from sim.apiserver import ApiServerSettings, RunningApiServer, start_in_thread
from sim.controllers.defaultscheduler import DefaultScheduler, list_json
from sim.controllers.nodeautoscaler import (
    GROUP_LABEL,
    SCALE_DOWN_DISABLED,
    ClusterAutoscaler,
    NodeGroup,
)
from tests.binder.objects import GI, gpus_annotation, lease_obj, node_obj
from tests.binder.simcluster import SYSTEM, MakeBinder, add_node, add_pod, eventually, node_of
from tests.binder.tritonmodels.test_tritonmodels import (
    GROUP,
    PLURAL,
    VERSION,
    kubelet_removes_deleted,
    model,
    placed,
)
from tests.deploy.rendering import CHART
from tests.fixtures_sim import coordination_v1, core_v1

GPU_LABELS = {"nvidia.com/gpu.present": "true"}
TAINT = {"key": "tritonshare.io/gpu-node", "value": "true", "effect": "NoExecute"}
# As the agent's --advertise-gpu-mem publishes it: without, a model pod's tritonshare.io/gpu-mem
# fits no other node in Cluster Autoscaler's simulation, which then keeps the node anyway.
ALLOCATABLE = {"cpu": "8", "memory": "32Gi", "pods": "110", "tritonshare.io/gpu-mem": "16Gi"}
PLACEHOLDERS = "tritonshare.io/placeholder"
MODEL = {"tritonshare.io/role": "model"}


@pytest.fixture
def apiserver() -> Iterator[RunningApiServer]:
    """The simulated API server serving the chart's CRDs (overrides tests.fixtures_sim's)."""
    server = start_in_thread(settings=ApiServerSettings(crds=(CHART / "crds",)))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def custom(kube_api: kubernetes.client.ApiClient) -> Any:
    return kubernetes.client.CustomObjectsApi(kube_api)


@pytest.fixture
def scheduler(apiserver: RunningApiServer) -> Iterator[DefaultScheduler]:
    api = apiserver.api_client()
    with DefaultScheduler(api, period=0.1) as running:
        yield running
    api.close()  # type: ignore[no-untyped-call]


def gpu_group(
    kube_api: kubernetes.client.ApiClient,
    *,
    min_size: int = 0,
    allocatable: dict[str, str] = ALLOCATABLE,
    name: str = "gpu",
    gpu_gib: int = 16,
    labels: dict[str, str] | None = None,
) -> NodeGroup:
    """A node group of one GPU of `gpu_gib` per node (16 GiB); a new node's agent starts at once
    (it publishes the GPU and renews its Lease)."""
    core, coordination = core_v1(kube_api), coordination_v1(kube_api)

    def agent_starts(node: str) -> None:
        annotations = {
            "tritonshare.io/gpus": gpus_annotation([gpu_gib * GI], node),
            "tritonshare.io/gpu-mem-total": str(gpu_gib * GI),
        }
        core.patch_node(node, {"metadata": {"annotations": annotations}})
        coordination.create_namespaced_lease(SYSTEM, lease_obj(node, time.time(), 3600))

    template = node_obj(
        "template",
        None,
        labels={**GPU_LABELS, **(labels or {})},
        taints=[TAINT],
        allocatable=allocatable,
    )
    # The node pod starts after the node registers: kube-scheduler binds a placeholder first.
    return NodeGroup(
        name, template, min_size=min_size, max_size=3, on_added=agent_starts, boot_seconds=1.0
    )


def add_gpu_node(
    kube_api: kubernetes.client.ApiClient, name: str, allocatable: dict[str, str] = ALLOCATABLE
) -> None:
    labels = {**GPU_LABELS, GROUP_LABEL: "gpu"}
    add_node(kube_api, name, [16 * GI], labels=labels, taints=[TAINT], allocatable=allocatable)


def placeholder_class(kube_api: kubernetes.client.ApiClient) -> None:
    """The PriorityClass the chart makes with binder.nodeAutoscaling."""
    body: Any = {
        "metadata": {"name": PRIORITY_CLASS},
        "value": -10,
        "preemptionPolicy": "Never",
        "globalDefault": False,
    }
    kubernetes.client.SchedulingV1Api(kube_api).create_priority_class(body)


def node_names(core: Any) -> set[str]:
    return {n.metadata.name for n in core.list_node().items}


def guarded(core: Any, node: str) -> bool:
    annotations = core.read_node(node).metadata.annotations or {}
    return all(annotations.get(key) == "true" for key in GUARDS)


def waiting_events(core: Any, name: str) -> list[Any]:
    events = core.list_namespaced_event("default", field_selector=f"involvedObject.name={name}")
    return [e for e in events.items if e.reason == "WaitingForNode"]


def placeholders(core: Any) -> list[Any]:
    return list(core.list_namespaced_pod(SYSTEM, label_selector=PLACEHOLDERS).items)


async def test_a_replica_no_gpu_fits_gets_a_new_node_which_goes_once_empty(
    kube_api: kubernetes.client.ApiClient,
    apiserver: RunningApiServer,
    make_binder: MakeBinder,
    custom: Any,
    core: Any,
    scheduler: DefaultScheduler,
) -> None:
    placeholder_class(kube_api)
    add_gpu_node(kube_api, "gpu-0")
    group = gpu_group(kube_api)
    api = apiserver.api_client()
    # Scale-down waits 3 s after a scale-up (upstream: 10 min), as a new node's pods start.
    autoscaler = ClusterAutoscaler(
        api, [group], period=0.1, scale_down_unneeded_time=1.0, scale_down_delay_after_add=3.0
    )
    await make_binder(node_autoscaling=True, placeholder_grace_seconds=30, host_drain_seconds=0.5)
    with autoscaler:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, model("resnet", 1, "12Gi")
        )
        await eventually(lambda: placed(custom, "resnet", 1), what="the first replica placed")
        await eventually(lambda: guarded(core, "gpu-0"), what="gpu-0 guarded: it serves")
        assert not placeholders(core), "a model that is placed needs no node"

        # A second 12 GiB replica fits no GPU: a placeholder asks for a node, one is added, the
        # replica is placed on it and the placeholder goes.
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, "resnet", {"spec": {"replicas": 2}}
        )
        [waiting] = await eventually(lambda: placeholders(core), what="a placeholder")
        assert waiting.spec.scheduler_name == "default-scheduler"
        assert waiting.spec.priority_class_name == PRIORITY_CLASS
        assert waiting.metadata.annotations["tritonshare.io/placeholder-for"] == (
            "tritonmodel default/resnet"
        )
        told = await eventually(lambda: waiting_events(core, "resnet"), what="the model told")
        assert told[0].involved_object.kind == "TritonModel"
        assert told[0].message == (
            f"No node fits it: placeholder pod {SYSTEM}/{waiting.metadata.name} asks the node "
            "autoscaler for a node with a GPU of 12288 MiB or more (tritonshare.io/gpu-memory, "
            "or a node without it)."
        )
        obj = await eventually(lambda: placed(custom, "resnet", 2), what="both replicas placed")
        assert group.added == ["gpu-1"]
        assert {e["node"] for e in obj["status"]["placements"]} == {"gpu-0", "gpu-1"}
        await eventually(lambda: not placeholders(core), what="the placeholder deleted")
        await eventually(lambda: guarded(core, "gpu-1"), what="gpu-1 guarded: it serves")
        passes = autoscaler.syncs
        await eventually(lambda: autoscaler.syncs > passes + 5, what="more autoscaler passes")
        assert group.added == ["gpu-1"], "one node was enough"
        assert node_names(core) == {"gpu-0", "gpu-1"}, "nodes that serve are not scaled down"

        # Back to one replica: gpu-1 serves nothing, loses its guard and is removed; gpu-0 stays.
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, "resnet", {"spec": {"replicas": 1}}
        )

        def gpu_1_removed() -> bool:
            kubelet_removes_deleted(core)
            return "gpu-1" not in node_names(core)

        await eventually(gpu_1_removed, what="the empty gpu-1 removed")
        # The autoscaler's thread records a removal just after deleting the Node.
        await eventually(lambda: group.removed == ["gpu-1"], what="gpu-1 recorded as removed")
        assert node_names(core) == {"gpu-0"} and guarded(core, "gpu-0")
        left = placed(custom, "resnet", 1)
        assert left is not None and [e["node"] for e in left["status"]["placements"]] == ["gpu-0"]
    api.close()  # type: ignore[no-untyped-call]


async def test_a_node_serving_a_model_pod_is_kept_and_an_empty_one_removed(
    kube_api: kubernetes.client.ApiClient,
    apiserver: RunningApiServer,
    make_binder: MakeBinder,
    core: Any,
) -> None:
    """A model pod of a ReplicaSet is one Cluster Autoscaler would move (it knows nothing of GPU
    memory): only the guard keeps its node."""
    add_gpu_node(kube_api, "gpu-0")
    await make_binder(node_autoscaling=True)
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "m", "uid": "rs-uid"}
    add_pod(core, "model", mem="2Gi", spec_extra={"tolerations": [TAINT]}, labels=MODEL)
    core.patch_namespaced_pod(
        "model", "default", {"metadata": {"ownerReferences": [{**owner, "controller": True}]}}
    )
    await eventually(lambda: node_of(core, "model") == "gpu-0", what="the model pod bound")
    await eventually(lambda: guarded(core, "gpu-0"), what="gpu-0 guarded")
    add_gpu_node(kube_api, "gpu-1")
    api = apiserver.api_client()
    group = gpu_group(kube_api)
    autoscaler = ClusterAutoscaler(
        api, [group], period=0.1, scale_down_unneeded_time=0.5, scale_down_delay_after_add=0.0
    )
    # Without the guard, Cluster Autoscaler's rules would remove gpu-0 first (by name): its
    # model pod fits gpu-1 as far as they can tell.
    nodes = list_json(autoscaler.core.list_node)
    pods = list_json(autoscaler.core.list_pod_for_all_namespaces)
    [gpu_0] = [n for n in nodes if n["metadata"]["name"] == "gpu-0"]
    assert autoscaler.removable(gpu_0, nodes, pods) == f"node annotated {SCALE_DOWN_DISABLED}=true"
    gpu_0["metadata"]["annotations"].pop(SCALE_DOWN_DISABLED)
    assert autoscaler.removable(gpu_0, nodes, pods) is None
    with autoscaler:
        await eventually(lambda: group.removed == ["gpu-1"], what="the empty gpu-1 removed")
        passes = autoscaler.syncs
        await eventually(lambda: autoscaler.syncs > passes + 10, what="more autoscaler passes")
    api.close()  # type: ignore[no-untyped-call]
    assert node_names(core) == {"gpu-0"}
    assert node_of(core, "model") == "gpu-0"


async def test_a_model_pod_no_gpu_fits_gets_a_new_node(
    kube_api: kubernetes.client.ApiClient,
    apiserver: RunningApiServer,
    make_binder: MakeBinder,
    core: Any,
    scheduler: DefaultScheduler,
) -> None:
    """Nodes that do not advertise tritonshare.io/gpu-mem: the pending model pod itself fits no
    node group's template in Cluster Autoscaler's simulation, so only its placeholder adds one."""
    placeholder_class(kube_api)
    bare = {k: v for k, v in ALLOCATABLE.items() if not k.startswith("tritonshare.io/")}
    add_gpu_node(kube_api, "gpu-0", bare)
    group = gpu_group(kube_api, allocatable=bare)
    api = apiserver.api_client()
    autoscaler = ClusterAutoscaler(api, [group], period=0.1, scale_down_delay_after_add=600.0)
    await make_binder(node_autoscaling=True)
    with autoscaler:
        for name in ("first", "second"):
            add_pod(core, name, mem="12Gi", spec_extra={"tolerations": [TAINT]}, labels=MODEL)
        await eventually(
            lambda: node_of(core, "first") or node_of(core, "second"), what="one bound"
        )
        waiting = "second" if node_of(core, "first") else "first"
        [placeholder] = await eventually(lambda: placeholders(core), what="a placeholder")
        assert placeholder.metadata.annotations["tritonshare.io/placeholder-for"] == (
            f"pod default/{waiting}"
        )
        assert {(t.key, t.value, t.effect) for t in placeholder.spec.tolerations} >= {
            (TAINT["key"], TAINT["value"], TAINT["effect"])
        }, "the pod's tolerations"
        assert await eventually(lambda: waiting_events(core, waiting), what="the pod told")
        await eventually(lambda: node_of(core, waiting) == "gpu-1", what="the pod on the new node")
        await eventually(lambda: not placeholders(core), what="the placeholder deleted")
        assert group.added == ["gpu-1"]
        events = core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={waiting}"
        )
        assert not [e for e in events.items if e.reason == "TriggeredScaleUp"], (
            "the pod alone triggers no scale-up"
        )
    api.close()  # type: ignore[no-untyped-call]


def selected_model(name: str, gpu_memory: str, node_selector: dict[str, str]) -> dict[str, Any]:
    body = model(name, 1, gpu_memory)
    body["spec"]["nodeSelector"] = node_selector
    return body


def placeholders_for(core: Any, namespace: str) -> list[Any]:
    return [
        p
        for p in placeholders(core)
        if p.metadata.annotations["tritonshare.io/placeholder-for"].startswith(
            f"tritonmodel {namespace}/"
        )
    ]


async def test_one_namespaces_unsatisfiable_models_keep_no_other_from_a_node(
    kube_api: kubernetes.client.ApiClient,
    apiserver: RunningApiServer,
    make_binder: MakeBinder,
    custom: Any,
    core: Any,
    scheduler: DefaultScheduler,
) -> None:
    """32 small TritonModels of one namespace, each with a nodeSelector no node group has, hold
    at most that namespace's share of placeholders: another namespace's model that needs a new
    node still gets a placeholder and the node."""
    placeholder_class(kube_api)
    add_gpu_node(kube_api, "gpu-0")
    group = gpu_group(kube_api)
    api = apiserver.api_client()
    autoscaler = ClusterAutoscaler(api, [group], period=0.1, scale_down_delay_after_add=600.0)
    await make_binder(node_autoscaling=True)
    with autoscaler:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, model("filler", 1, "12Gi")
        )
        await eventually(lambda: placed(custom, "filler", 1), what="gpu-0 filled")
        core.create_namespace({"metadata": {"name": "attacker"}})
        for i in range(32):
            custom.create_namespaced_custom_object(
                GROUP,
                VERSION,
                "attacker",
                PLURAL,
                selected_model(f"m{i}", "64Mi", {"pool": f"none-{i}"}),
            )

        def all_waiting() -> bool:
            items = custom.list_namespaced_custom_object(GROUP, VERSION, "attacker", PLURAL)
            return sum(waiting_model(m) is not None for m in items["items"]) == 32

        await eventually(all_waiting, what="the attacker's models reported unschedulable")
        # The binder's pass after the last one (at once on a change, else every 2 s).
        await asyncio.sleep(2 * PERIOD_SECONDS)
        assert len(placeholders_for(core, "attacker")) == MAX_PER_NAMESPACE
        started = time.monotonic()
        custom.create_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, model("victim", 1, "12Gi")
        )
        await eventually(lambda: placeholders_for(core, "default"), what="the victim's placeholder")
        await eventually(lambda: placed(custom, "victim", 1), what="the victim placed")
        elapsed = time.monotonic() - started
        assert group.added == ["gpu-1"]
        assert len(placeholders_for(core, "attacker")) == MAX_PER_NAMESPACE
        assert elapsed < 15.0, f"the victim waited {elapsed:.1f} s"
    api.close()  # type: ignore[no-untyped-call]


async def test_a_model_bigger_than_any_gpu_adds_no_node_and_says_why(
    kube_api: kubernetes.client.ApiClient,
    apiserver: RunningApiServer,
    make_binder: MakeBinder,
    custom: Any,
    core: Any,
    scheduler: DefaultScheduler,
) -> None:
    """A 40Gi TritonModel on a cluster whose nodes and node group have 16 GiB GPUs: no
    placeholder, so no node is added (none kept), and the model is told why."""
    placeholder_class(kube_api)
    add_gpu_node(kube_api, "gpu-0")
    group = gpu_group(kube_api)
    api = apiserver.api_client()
    autoscaler = ClusterAutoscaler(
        api, [group], period=0.1, scale_down_unneeded_time=1.0, scale_down_delay_after_add=3.0
    )
    await make_binder(node_autoscaling=True)
    with autoscaler:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, model("huge", 1, "40Gi")
        )

        def refused() -> list[Any]:
            events = core.list_namespaced_event(
                "default", field_selector="involvedObject.name=huge"
            )
            return [e for e in events.items if e.reason == REFUSED_REASON]

        [told] = await eventually(refused, what="the model told why no node is added")
        assert told.involved_object.kind == "TritonModel"
        assert "more than the largest GPU" in told.message, told.message
        passes = autoscaler.syncs
        await eventually(lambda: autoscaler.syncs > passes + 20, what="more autoscaler passes")
        assert not placeholders(core) and group.added == [], "no node for a model none holds"
        assert not waiting_events(core, "huge")
    api.close()  # type: ignore[no-untyped-call]


async def test_a_models_placeholder_asks_for_a_node_group_of_gpus_large_enough(
    kube_api: kubernetes.client.ApiClient,
    apiserver: RunningApiServer,
    make_binder: MakeBinder,
    custom: Any,
    core: Any,
    scheduler: DefaultScheduler,
) -> None:
    """Two node groups labelled with their GPU's memory in MiB (tritonshare.io/gpu-memory), the
    16 GiB one first for Cluster Autoscaler: a 40Gi model's placeholder fits only the 80 GiB
    group's template, which grows, and the model is placed there; the 16 GiB group adds none."""
    placeholder_class(kube_api)
    label = "tritonshare.io/gpu-memory"
    # The 16 GiB group's node, empty: the placeholder would fit it but for its GPU's size.
    labels = {**GPU_LABELS, GROUP_LABEL: "a-t4", label: "16384"}
    add_node(kube_api, "a-t4-0", [16 * GI], labels=labels, taints=[TAINT], allocatable=ALLOCATABLE)
    small = gpu_group(kube_api, name="a-t4", labels={label: "16384"})
    large = gpu_group(
        kube_api,
        name="b-a100",
        gpu_gib=80,
        labels={label: "81920"},
        allocatable={**ALLOCATABLE, "tritonshare.io/gpu-mem": "80Gi"},
    )
    api = apiserver.api_client()
    autoscaler = ClusterAutoscaler(
        api, [small, large], period=0.1, scale_down_delay_after_add=600.0
    )
    await make_binder(node_autoscaling=True, node_group_gpu_mem=80 * GI)
    with autoscaler:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, model("large", 1, "40Gi")
        )
        [placeholder] = await eventually(lambda: placeholders(core), what="a placeholder")
        affinity = placeholder.spec.affinity.node_affinity
        terms = affinity.required_during_scheduling_ignored_during_execution
        assert [
            (e.key, e.operator, e.values)
            for t in terms.node_selector_terms
            for e in t.match_expressions
            if e.key == label
        ] == [(label, "Gt", ["40959"]), (label, "DoesNotExist", None)]
        obj = await eventually(lambda: placed(custom, "large", 1), what="the model placed")
        assert [e["node"] for e in obj["status"]["placements"]] == ["b-a100-1"]
        assert small.added == [] and large.added == ["b-a100-1"]
    api.close()  # type: ignore[no-untyped-call]


async def test_a_namespaces_placeholders_stay_within_its_gpu_memory_quota(
    kube_api: kubernetes.client.ApiClient,
    apiserver: RunningApiServer,
    make_binder: MakeBinder,
    custom: Any,
    core: Any,
    scheduler: DefaultScheduler,
) -> None:
    """An unplaced replica charges no quota, so each of many waiting models passes it alone:
    their placeholders together stay within what the quota leaves (2Gi: two of 1Gi)."""
    placeholder_class(kube_api)
    add_gpu_node(kube_api, "gpu-0")
    key = "requests.tritonshare.io/gpu-mem"
    quota = {"metadata": {"name": "gpu"}, "spec": {"hard": {key: "14Gi"}}}
    core.create_namespaced_resource_quota("default", quota)
    await make_binder(node_autoscaling=True)
    custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, model("filler", 1, "12Gi")
    )
    await eventually(lambda: placed(custom, "filler", 1), what="12Gi of 14Gi booked")
    for i in range(4):
        custom.create_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, selected_model(f"m{i}", "1Gi", {"pool": f"p{i}"})
        )

    def all_waiting() -> bool:
        items = custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)
        return sum(waiting_model(m) is not None for m in items["items"]) == 4

    await eventually(all_waiting, what="the models reported unschedulable")
    await asyncio.sleep(2 * PERIOD_SECONDS)
    assert len(placeholders(core)) == 2


async def test_a_node_added_that_takes_none_of_its_models_is_let_go(
    kube_api: kubernetes.client.ApiClient,
    apiserver: RunningApiServer,
    make_binder: MakeBinder,
    custom: Any,
    core: Any,
    scheduler: DefaultScheduler,
) -> None:
    """A model whose required pod affinity no pod meets fits a node group's template as its
    placeholder does, but no node: the node added for it serves, runs no model, and once the
    grace has passed its placeholder goes, no other node is asked for, and the node is removed."""
    placeholder_class(kube_api)
    add_gpu_node(kube_api, "gpu-0")
    group = gpu_group(kube_api)
    api = apiserver.api_client()
    autoscaler = ClusterAutoscaler(
        api, [group], period=0.1, scale_down_unneeded_time=0.5, scale_down_delay_after_add=2.0
    )
    await make_binder(node_autoscaling=True, placeholder_grace_seconds=1.0)
    lonely = model("lonely", 1, "12Gi")
    term = {"labelSelector": {"matchLabels": {"app": "none"}}, "topologyKey": HOSTNAME}
    lonely["spec"]["affinity"] = {
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
    }
    with autoscaler:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, model("filler", 1, "2Gi")
        )
        await eventually(lambda: placed(custom, "filler", 1), what="gpu-0 serves")
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, lonely)
        await eventually(lambda: group.added, what="a node added for it")

        def refused() -> list[Any]:
            events = core.list_namespaced_event(
                "default", field_selector="involvedObject.name=lonely"
            )
            return [e for e in events.items if e.reason == REFUSED_REASON]

        [told] = await eventually(refused, what="the model told the node did not take it")
        assert "was added for it and has served for 1 s without taking it" in told.message
        await eventually(lambda: not placeholders(core), what="its placeholder deleted")
        await eventually(lambda: group.removed == group.added, what="the node removed")
        assert len(group.added) == 1, "no other node asked for"
    api.close()  # type: ignore[no-untyped-call]


async def test_a_model_no_node_group_matches_is_told_and_asks_no_more(
    kube_api: kubernetes.client.ApiClient,
    apiserver: RunningApiServer,
    make_binder: MakeBinder,
    custom: Any,
    core: Any,
    scheduler: DefaultScheduler,
) -> None:
    """Its placeholder stays pending (no node group has the label it selects): past
    --placeholder-pending-timeout it goes and the model is told why."""
    placeholder_class(kube_api)
    add_gpu_node(kube_api, "gpu-0")
    group = gpu_group(kube_api)
    api = apiserver.api_client()
    autoscaler = ClusterAutoscaler(api, [group], period=0.1, scale_down_delay_after_add=600.0)
    await make_binder(node_autoscaling=True, placeholder_pending_seconds=1.0)
    with autoscaler:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, selected_model("nowhere", "1Gi", {"pool": "none"})
        )
        await eventually(lambda: placeholders(core), what="a placeholder")

        def refused() -> list[Any]:
            events = core.list_namespaced_event(
                "default", field_selector="involvedObject.name=nowhere"
            )
            return [e for e in events.items if e.reason == REFUSED_REASON]

        [told] = await eventually(refused, what="the model told why no node is added")
        assert "no node group matches its node selection" in told.message, told.message
        await eventually(lambda: not placeholders(core), what="its placeholder deleted")
        await asyncio.sleep(2 * PERIOD_SECONDS)
        assert not placeholders(core) and group.added == [], "none asked for again"
    api.close()  # type: ignore[no-untyped-call]
