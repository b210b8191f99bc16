"""Residency classes in placement (pure): `always` pods are placed against a GPU's memory and
`on-demand` ones against its memory times the node's over-commit factor, and the always-resident
models plus the largest on-demand one never exceed the GPU. A tenant's on-demand pods never cost
another namespace's always pods more than their largest one alone would."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import Any

import pytest

from binder.cluster.clusterstate import ClusterState
from binder.cluster.index import FreeIndex
from binder.cluster.objects import PodInfo, node_from_api, pod_from_api
from binder.cluster.residencyfit import (
    GpuLedger,
    always_free,
    free_of_both,
    on_demand_free,
    wake_room,
)
from binder.framework.noderules import NODE_RULES
from binder.framework.placement import POLICIES, Placement, Policy, Unschedulable, explain, place
from common.contract import RESIDENCY_ON_DEMAND
from common.tritonname import private_triton_name
from tests.binder.framework.test_placement import NOW, cluster
from tests.binder.framework.test_placement_paths import random_node, random_pod
from tests.binder.objects import GI, KEYS, node_obj, pod_obj

ON_DEMAND = {KEYS.residency: RESIDENCY_ON_DEMAND}


def overcommitted(name: str, gpus: list[int], factor: str, **kw: Any) -> dict[str, Any]:
    return node_obj(name, gpus, labels={KEYS.gpu_mem_overcommit: factor}, **kw)


def bind(
    state: ClusterState, name: str, node: str, mem: str, *, namespace: str = "models", **kw: Any
) -> None:
    state.set_pod(
        pod_from_api(
            pod_obj(name, mem=mem, node=node, gpu=f"GPU-{node}-0", namespace=namespace, **kw),
            KEYS,
        )
    )


def decide(state: ClusterState, name: str, mem: str, **kw: Any) -> Placement | Unschedulable:
    return place(state, pod_from_api(pod_obj(name, mem=mem, **kw), KEYS), now=NOW)


def test_an_always_pod_fits_beside_any_number_of_another_namespaces_on_demand_pods() -> None:
    state = cluster(overcommitted("gpu-1", [16 * GI], "4"))
    for n in range(8):  # 48Gi of on-demand models on a 16Gi GPU, the largest 6Gi
        bind(state, f"idle-{n}", "gpu-1", "6Gi", namespace="tenant", annotations=ON_DEMAND)
    # Beside one 6Gi model alone a 10Gi always pod fits: beside eight of them it fits too.
    assert isinstance(decide(state, "victim", "10Gi", namespace="victim"), Placement)
    # One byte more than that would not fit beside the one model either.
    refused = decide(state, "too-big", "11Gi", namespace="victim")
    assert isinstance(refused, Unschedulable)
    assert "Insufficient GPU memory (largest free block 10Gi)" in refused.message


def test_loaded_on_demand_models_hide_no_room_from_always_pods() -> None:
    # The tenant keeps two on-demand models loaded: NVML shows 12Gi used, all of it theirs.
    names = {
        private_triton_name("tenant", f"hot-{n}", f"uid-tenant-hot-{n}"): 6 * GI for n in range(2)
    }
    node = overcommitted("gpu-1", [16 * GI], "3")
    node["metadata"]["annotations"][KEYS.gpu_usage] = json.dumps(
        {"GPU-gpu-1-0": {"used": 12 * GI, "models": names}}
    )
    state = cluster(node)
    for n in range(2):
        bind(state, f"hot-{n}", "gpu-1", "6Gi", namespace="tenant", annotations=ON_DEMAND)
    # Evicting the idle one of them makes room: 16 - 6 (the largest, woken) = 10Gi.
    assert state.memory.free("gpu-1") == [10 * GI]
    assert isinstance(decide(state, "victim", "10Gi", namespace="victim"), Placement)


def test_memory_nothing_charged_explains_is_still_never_handed_out() -> None:
    node = overcommitted("gpu-1", [16 * GI], "3")
    node["metadata"]["annotations"][KEYS.gpu_usage] = json.dumps(
        {"GPU-gpu-1-0": {"used": 12 * GI, "models": {}}}
    )
    state = cluster(node)
    assert state.memory.free("gpu-1") == [4 * GI]
    assert state.memory.free("gpu-1", on_demand=True) == [4 * GI]
    refused = decide(state, "m", "5Gi", annotations=ON_DEMAND)
    assert isinstance(refused, Unschedulable)
    assert "Insufficient GPU memory for always-resident models" in refused.message


def test_on_demand_pods_are_placed_against_the_overcommitted_memory() -> None:
    state = cluster(overcommitted("gpu-1", [16 * GI], "3"))
    for n in range(8):
        bind(state, f"m-{n}", "gpu-1", "6Gi", annotations=ON_DEMAND)
    assert state.memory.free("gpu-1", on_demand=True) == [0]  # 3 x 16 = 48Gi, all promised
    refused = decide(state, "one-more", "1Gi", annotations=ON_DEMAND)
    assert isinstance(refused, Unschedulable)
    assert refused.message == (
        "0/1 nodes are available: 1 Insufficient over-committed GPU memory (largest free block 0)."
    )
    # An always pod is placed against the plain memory: 16 - 6 (the largest on-demand).
    assert isinstance(decide(state, "steady", "10Gi"), Placement)


def test_an_on_demand_pod_must_fit_beside_the_always_resident_models() -> None:
    state = cluster(overcommitted("gpu-1", [16 * GI], "3"))
    bind(state, "steady", "gpu-1", "12Gi")
    assert isinstance(decide(state, "small", "4Gi", annotations=ON_DEMAND), Placement)
    refused = decide(state, "large", "5Gi", annotations=ON_DEMAND)
    assert isinstance(refused, Unschedulable)
    assert refused.message == (
        "0/1 nodes are available: 1 Insufficient GPU memory for always-resident models "
        "(largest room to wake a model 4Gi)."
    )
    [verdict] = explain(
        state, pod_from_api(pod_obj("large", mem="5Gi", annotations=ON_DEMAND), KEYS), now=NOW
    )
    assert verdict.reasons == (
        "Insufficient GPU memory for always-resident models (largest room to wake a model 4Gi)",
    )


def test_without_overcommit_on_demand_pods_are_placed_as_today() -> None:
    state = cluster(node_obj("gpu-1", [16 * GI]))
    for n in range(2):
        bind(state, f"m-{n}", "gpu-1", "6Gi", annotations=ON_DEMAND)
    assert state.memory.free("gpu-1", on_demand=True) == [4 * GI]
    assert isinstance(decide(state, "fits", "4Gi", annotations=ON_DEMAND), Placement)
    assert isinstance(decide(state, "not", "5Gi", annotations=ON_DEMAND), Unschedulable)
    # An always pod needs room only beside one of them.
    assert state.memory.free("gpu-1") == [10 * GI]


def test_binpack_stacks_on_demand_pods_before_opening_an_empty_gpu() -> None:
    state = cluster(overcommitted("gpu-a", [16 * GI], "3"), overcommitted("gpu-b", [16 * GI], "3"))
    bind(state, "first", "gpu-b", "4Gi", annotations=ON_DEMAND)
    chosen = decide(state, "second", "4Gi", annotations=ON_DEMAND)
    assert isinstance(chosen, Placement) and chosen.node == "gpu-b"


def test_an_on_demand_models_measured_memory_counts_only_while_it_is_loaded() -> None:
    name = private_triton_name("models", "grown", "uid-models-grown")
    node = overcommitted("gpu-1", [16 * GI], "2")
    state = cluster(node)
    bind(state, "grown", "gpu-1", "2Gi", annotations=ON_DEMAND)
    assert state.memory.free("gpu-1") == [14 * GI]
    loaded = overcommitted("gpu-1", [16 * GI], "2")
    loaded["metadata"]["annotations"][KEYS.gpu_usage] = json.dumps(
        {"GPU-gpu-1-0": {"used": 9 * GI, "models": {name: 9 * GI}}}
    )
    state.set_node(node_from_api(loaded, KEYS))
    assert state.memory.free("gpu-1") == [7 * GI]  # loaded at 9Gi: waking it needs 9Gi
    state.set_node(node_from_api(node, KEYS))  # unloaded: its request again
    assert state.memory.free("gpu-1") == [14 * GI]


def test_a_bad_residency_is_refused_with_what_to_write() -> None:
    pod = pod_from_api(pod_obj("m", annotations={KEYS.residency: "sometimes"}), KEYS)
    assert pod.problem.startswith(f"annotation {KEYS.residency}='sometimes' is not a residency")
    assert "on-demand" in pod.problem
    refused = place(cluster(node_obj("gpu-1", [16 * GI])), pod, now=NOW)
    assert isinstance(refused, Unschedulable) and "sometimes" in refused.message


def test_a_bad_overcommit_label_places_without_overcommit() -> None:
    node = node_from_api(overcommitted("gpu-1", [16 * GI], "lots"), KEYS)
    assert node.overcommit == 1.0
    assert f"label {KEYS.gpu_mem_overcommit}='lots' is not an over-commit factor" in (
        node.overcommit_problem
    )
    for bad in ("0.5", "nan", "inf", "101"):
        assert node_from_api(overcommitted("n", [GI], bad), KEYS).overcommit == 1.0


def test_the_on_demand_view_follows_nodes_joining_and_leaving() -> None:
    state = cluster(overcommitted("gpu-b", [16 * GI], "2"))
    bind(state, "m", "gpu-b", "8Gi", annotations=ON_DEMAND)
    state.set_node(node_from_api(overcommitted("gpu-a", [16 * GI], "2"), KEYS))
    state.set_node(node_from_api(overcommitted("gpu-c", [16 * GI], "2"), KEYS))
    assert state.memory.free("gpu-b", on_demand=True) == [16 * GI - 1]
    chosen = decide(state, "next", "8Gi", annotations=ON_DEMAND)
    assert isinstance(chosen, Placement) and chosen.node == "gpu-b"
    state.remove_node("gpu-a")
    chosen = decide(state, "next", "8Gi", annotations=ON_DEMAND)
    assert isinstance(chosen, Placement) and chosen.node == "gpu-b"
    state.remove_pod("uid-models-m")
    assert state.memory.free("gpu-b") == [16 * GI]
    assert state.memory.free("gpu-b", on_demand=True) == [16 * GI]


def assert_on_demand_view_fresh(state: ClusterState) -> None:
    """The on-demand arrays and indexes, kept up to date charge by charge and node by node,
    equal the ledger's own figures and indexes built afresh."""
    view = state.view(on_demand=True)
    size_matrix, room_matrix = view.gpu_matrices()
    for i, name in enumerate(state.names):
        free = state.memory.free(name, on_demand=True)
        assert view.free_total[i] == sum(free), name
        assert view.max_free[i] == (max(free) if free else -1), name
        sizes = [state.memory.usable(g) for g in state.nodes[name].gpus]
        assert view.gpu_blocks[i] == tuple(zip(sizes, free, strict=True)), name
        ledgers = [g for g in state.memory.ledgers(name) if g is not None]
        wake = max((wake_room(g) for g in ledgers), default=0) if sizes else -1
        assert view.wake[i] == wake, name
        pad = room_matrix.shape[1] - len(free)
        assert room_matrix[i].tolist() == free + [-1] * pad, name
        assert size_matrix[i].tolist() == sizes + [0] * pad, name
    for constraints in list(state._class_cache.od_indexes):
        kept = state.free_index(constraints, on_demand=True)
        cls = state.constraint_class(constraints)
        built = FreeIndex(cls.nodes, cls.affinity, cls.prefer_no_schedule, 0)
        arrays = (view.capacity, view.free_total)
        assert kept.buckets(*arrays) == built.buckets(*arrays)
        assert kept.blocks(view.gpu_blocks) == built.blocks(view.gpu_blocks)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(8))
def test_the_index_and_the_scan_agree_with_both_classes(seed: int, policy: Policy) -> None:
    """As tests/binder/framework/test_placement_paths.py, with over-committing nodes and on-demand
    pods: the three ways to a decision agree, and on every GPU the always-resident holdings plus the
    largest on-demand one stay within its memory whatever was placed."""
    rng = random.Random(seed)
    state = ClusterState(rules=NODE_RULES, reserve=GI // 2)
    nodes: dict[str, dict[str, Any]] = {}

    def join(name: str) -> None:
        obj = random_node(rng, name)
        if rng.random() < 0.7:
            obj["metadata"]["labels"][KEYS.gpu_mem_overcommit] = rng.choice(["1", "1.5", "3"])
        nodes[name] = obj
        state.set_node(node_from_api(obj, KEYS))
        state.set_lease(name, NOW + 60)

    for n in range(rng.choice([3, 12, 30])):
        join(f"node-{n:03d}")
    placed: list[PodInfo] = []
    for step in range(80):
        pod = random_pod(rng, f"pod-{step}")
        if rng.random() < 0.6:
            pod = replace(pod, on_demand=True)
        result = decide_three_ways(state, pod, policy)
        if isinstance(result, Placement):
            state.assume(pod, result.node, result.gpu.uuid)
            placed.append(pod)
        roll = rng.random()
        if roll < 0.1 and placed:
            state.remove_pod(placed.pop(rng.randrange(len(placed))).uid)
        elif roll < 0.14 and len(nodes) > 2:
            name = rng.choice(list(nodes))
            del nodes[name]
            state.remove_node(name)
        elif roll < 0.2:
            join(f"{rng.choice(list(nodes))}-{step}")
        elif roll < 0.24:  # the agent measures again (models load and unload)
            name = rng.choice(list(nodes))
            usage = random_node(rng, name)["metadata"]["annotations"].get(KEYS.gpu_usage)
            annotations = nodes[name]["metadata"]["annotations"]
            annotations.pop(KEYS.gpu_usage, None)
            if usage is not None:
                annotations[KEYS.gpu_usage] = usage
            state.set_node(node_from_api(nodes[name], KEYS))
        assert_on_demand_view_fresh(state)
    for name in state.names:
        for ledger in state.memory.ledgers(name):
            if ledger is not None and not state.nodes[name].measured:
                always = ledger.held - ledger.on_demand
                assert always + ledger.largest_on_demand <= ledger.usable, name
    assert placed


def decide_three_ways(state: ClusterState, pod: PodInfo, policy: Policy) -> object:
    scanned = place(state, pod, now=NOW, policy=policy, scan_budget=0)
    assert place(state, pod, now=NOW, policy=policy, scan_budget=None) == scanned, pod.key
    assert place(state, pod, now=NOW, policy=policy, scan_budget=3) == scanned, pod.key
    return scanned


def test_the_fused_pass_gives_each_rule_its_own_answer() -> None:
    rng = random.Random(5)
    for _ in range(2000):
        usable = rng.choice([0, 1, 16, 80]) * GI
        held = rng.randrange(0, 3 * usable + 2)
        on_demand = rng.randrange(0, held + 1)
        ledger = GpuLedger(
            usable,
            rng.randrange(-GI, usable + 1),
            held,
            on_demand,
            rng.randrange(0, on_demand + 1),
            rng.randrange(0, on_demand + 1),
            rng.choice([1.0, 1.5, 3.0]),
        )
        assert free_of_both(ledger) == (
            always_free(ledger),
            on_demand_free(ledger),
            wake_room(ledger),
        ), ledger
