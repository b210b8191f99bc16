"""The free-memory index and the whole-class scan give the same node, GPU and score.

`place(..., scan_budget=0)` scores every node of the pod's class (the way every decision was made
before the index); `scan_budget=None` answers from the index alone, however far it must read;
the default budget mixes the two. On many random clusters (GPU sizes that repeat, so ties are
common; taints of every effect; preferred and required node affinity; cordoned nodes; dead
agents; unhealthy GPUs; measured GPU memory from the gpu-usage annotation) every pending pod is
placed three ways, for both policies, and the answers must be equal. The pods are then charged
as the controller charges them, and nodes change under the indexes (new measurements, a cordon,
a node joining anywhere in name order, a node leaving), so the indexes are compared after
catching up, not only freshly built. After a node's labels, taints or cordon change, and after a
node joins or leaves (which shifts the later nodes' indices in place), every cached class must
equal one built from scratch, every index one built from its class, and the per-node arrays the
ledger's own figures.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from binder.cluster.classes import NodeRules
from binder.cluster.clusterstate import ClusterState
from binder.cluster.index import FreeIndex, SortedKeys
from binder.cluster.objects import Constraints, NodeInfo, PodInfo, node_from_api, pod_from_api
from binder.framework.noderules import NODE_RULES
from binder.framework.placement import POLICIES, Placement, Policy, place
from tests.binder.objects import GI, KEYS, node_obj, pod_obj

NOW = 1000.0
ZONES = ["a", "b", "c"]
KINDS = {"t4": 16 * GI, "a10": 24 * GI, "a100": 80 * GI}
"""Three sizes, so binpack's every rule is met: the largest kind's small remainders, and blocks of
the middle one kept for the pods that need it."""


def random_node(rng: random.Random, name: str) -> dict[str, Any]:
    kind = rng.choice(list(KINDS))
    count = rng.choice([1, 2, 4])
    healthy = [rng.random() > 0.1 for _ in range(count)]
    taints = []
    roll = rng.random()
    if roll < 0.15:
        taints.append({"key": "dedicated", "value": "ml", "effect": "NoSchedule"})
    elif roll < 0.35:
        taints.append({"key": "spot", "value": "", "effect": "PreferNoSchedule"})
    elif roll < 0.40:
        taints.append({"key": "drain", "value": "", "effect": "NoExecute"})
    if rng.random() < 0.15:
        taints.append({"key": "old", "value": "", "effect": "PreferNoSchedule"})
    obj = node_obj(
        name,
        [KINDS[kind]] * count,
        labels={"zone": rng.choice(ZONES), "gpu": kind, "pool": f"p{rng.randrange(3)}"},
        taints=taints or None,
        unschedulable=rng.random() < 0.08,
        healthy=healthy,
    )
    if rng.random() < 0.3:
        usage = {
            f"GPU-{name}-{g}": {
                "used": rng.choice([0, 1, 3, 6]) * GI,
                "models": {f"m{rng.randrange(6)}": rng.choice([1, 2, 5]) * GI},
            }
            for g in range(count)
            if rng.random() < 0.7
        }
        obj["metadata"]["annotations"][KEYS.gpu_usage] = json.dumps(usage)
    return obj


def relabel(rng: random.Random, node: dict[str, Any]) -> None:
    """Change what Kubernetes' rules read on a node: its cordon, a label or its taints."""
    roll = rng.random()
    if roll < 0.4:
        node["spec"]["unschedulable"] = not node["spec"].get("unschedulable")
    elif roll < 0.7:
        node["metadata"]["labels"]["zone"] = rng.choice(ZONES)
        node["metadata"]["labels"]["pool"] = f"p{rng.randrange(3)}"
    else:
        node["spec"]["taints"] = random_node(rng, "x")["spec"].get("taints", [])


def assert_classes_fresh(state: ClusterState) -> None:
    """Every cached class, kept up to date node by node, equals one evaluated from scratch."""
    fresh = ClusterState(rules=NODE_RULES, reserve=state.memory.reserve)
    for info in state.nodes.values():
        fresh.set_node(info)
    for constraints, kept in list(state._class_cache.classes.items()):
        built = fresh.constraint_class(constraints)
        assert kept.nodes.tolist() == built.nodes.tolist()
        assert kept.affinity.tolist() == built.affinity.tolist()
        assert kept.prefer_no_schedule.tolist() == built.prefer_no_schedule.tolist()
        assert kept.rejected == built.rejected
        assert kept.rejected_counts == built.rejected_counts


def assert_rows_and_indexes_fresh(state: ClusterState) -> None:
    """The per-node arrays hold each node's figures at its place in name order, and every index,
    caught up, equals one built afresh from its class and those arrays."""
    assert state.names == sorted(state.nodes)
    assert state.index == {name: i for i, name in enumerate(state.names)}
    plain = state.view(on_demand=False)
    for i, name in enumerate(state.names):
        free = state.memory.free(name)
        assert plain.free_total[i] == sum(free), name
        assert plain.max_free[i] == (max(free) if free else -1), name
        sizes = [state.memory.usable(g) for g in state.nodes[name].gpus]
        assert plain.capacity[i] == sum(sizes), name
        assert state.lease_expiry[i] == state.leases.get(name, 0.0), name
        size_matrix, room_matrix = plain.gpu_matrices()
        pad = size_matrix.shape[1] - len(sizes)
        assert size_matrix[i].tolist() == sizes + [0] * pad, name
        assert room_matrix[i].tolist() == free + [-1] * pad, name
    for constraints in list(state._class_cache.indexes):
        kept = state.free_index(constraints)
        cls = state.constraint_class(constraints)
        assert plain.gpu_blocks == [
            tuple(
                (state.memory.usable(g), f)
                for g, f in zip(state.nodes[n].gpus, state.memory.free(n), strict=True)
            )
            for n in state.names
        ]
        built = FreeIndex(cls.nodes, cls.affinity, cls.prefer_no_schedule, 0)
        arrays = (plain.capacity, plain.free_total)
        assert kept.buckets(*arrays) == built.buckets(*arrays)
        assert kept.blocks(plain.gpu_blocks) == built.blocks(plain.gpu_blocks)
    # The GPUs counted per size, kept as blocks change, are the ledger's.
    healthy = [block for blocks in plain.gpu_blocks for block in blocks if block[0] > 0]
    counted = state.gpu_sizes()
    assert counted.sizes == tuple(sorted({size for size, _ in healthy}))
    assert counted.gpus == tuple(sum(s == size for s, _ in healthy) for size in counted.sizes)
    assert counted.whole == tuple(sum(b == (size, size) for b in healthy) for size in counted.sizes)
    below = [
        max((s for s in counted.sizes if s * 10 < size * 9), default=0) for size in counted.sizes
    ]
    assert counted.below == tuple(below)
    assert counted.roomy == tuple(
        sum(s == size and free >= under for s, free in healthy)
        for size, under in zip(counted.sizes, below, strict=True)
    )


def random_spec(rng: random.Random) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if rng.random() < 0.3:
        spec["nodeSelector"] = {"zone": rng.choice(ZONES)}
    affinity: dict[str, Any] = {}
    if rng.random() < 0.2:
        affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a10"]}]},
                {"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["p0"]}]},
            ]
        }
    if rng.random() < 0.4:
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {
                "weight": rng.choice([1, 20, 50]),
                "preference": {
                    "matchExpressions": [
                        {
                            "key": rng.choice(["zone", "pool"]),
                            "operator": "In",
                            "values": ["a", "p1"],
                        }
                    ]
                },
            }
            for _ in range(rng.randrange(1, 3))
        ]
    if affinity:
        spec["affinity"] = {"nodeAffinity": affinity}
    tolerations = []
    if rng.random() < 0.4:
        tolerations.append({"key": "dedicated", "operator": "Exists"})
    if rng.random() < 0.3:
        tolerations.append({"key": "spot", "operator": "Exists", "effect": "PreferNoSchedule"})
    if tolerations:
        spec["tolerations"] = tolerations
    return spec


def random_pod(rng: random.Random, name: str) -> PodInfo:
    mem = rng.choice(["512Mi", "1Gi", "2Gi", "4Gi", "8Gi", "15Gi", "20Gi", "40Gi"])
    model = f"m{rng.randrange(12)}"
    return pod_from_api(pod_obj(name, mem=mem, model=model, spec_extra=random_spec(rng)), KEYS)


def decide(state: ClusterState, pod: PodInfo, policy: Policy) -> Placement | object:
    """The pod placed three ways; all three answers must be the same."""
    scanned = place(state, pod, now=NOW, policy=policy, scan_budget=0)
    indexed = place(state, pod, now=NOW, policy=policy, scan_budget=None)
    mixed = place(state, pod, now=NOW, policy=policy, scan_budget=3)
    assert indexed == scanned, f"{pod.key}: index {indexed} != scan {scanned}"
    assert mixed == scanned, f"{pod.key}: budget 3 {mixed} != scan {scanned}"
    return scanned


def build(
    rng: random.Random, count: int, rules: NodeRules = NODE_RULES
) -> tuple[ClusterState, dict[str, dict[str, Any]]]:
    state = ClusterState(rules=rules, reserve=GI // 2)
    nodes = {}
    for n in range(count):
        name = f"node-{n:03d}"
        nodes[name] = random_node(rng, name)
        state.set_node(node_from_api(nodes[name], KEYS))
        state.set_lease(name, NOW - 1 if rng.random() < 0.08 else NOW + 60)
    for p in range(count * 2):  # pods already bound, some without a GPU annotation
        name = rng.choice(list(nodes))
        gpu = f"GPU-{name}-0" if rng.random() < 0.7 else ""
        obj = pod_obj(f"placed-{p}", mem="1Gi", model=f"m{rng.randrange(12)}", node=name, gpu=gpu)
        obj["status"]["phase"] = "Running"
        state.set_pod(pod_from_api(obj, KEYS))
    return state, nodes


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(40))
def test_the_index_and_the_scan_agree_on_random_clusters(
    seed: int, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    if seed % 4 == 3:  # binpack's buckets split into chunks at a few entries, not 512
        monkeypatch.setattr(SortedKeys, "CHUNK", 2)
    rng = random.Random(seed)
    state, nodes = build(rng, rng.choice([3, 12, 40]))
    placed: list[PodInfo] = []
    outcomes = {"placed": 0, "not": 0}
    for step in range(60):
        pod = random_pod(rng, f"pod-{step}")
        result = decide(state, pod, policy)
        if isinstance(result, Placement):
            state.assume(pod, result.node, result.gpu.uuid)
            placed.append(pod)
            outcomes["placed"] += 1
        else:
            outcomes["not"] += 1
        roll = rng.random()
        if roll < 0.1 and placed:  # a pod ends: its memory comes back
            state.remove_pod(placed.pop(rng.randrange(len(placed))).uid)
        elif roll < 0.15:  # the agent publishes new measurements
            name = rng.choice(list(nodes))
            fresh = random_node(rng, name)
            nodes[name]["metadata"]["annotations"] = fresh["metadata"]["annotations"]
            state.set_node(node_from_api(nodes[name], KEYS))
        elif roll < 0.18:  # a cordon, new labels or taints: the classes follow that node
            name = rng.choice(list(nodes))
            relabel(rng, nodes[name])
            state.set_node(node_from_api(nodes[name], KEYS))
            assert_classes_fresh(state)
        elif roll < 0.20 and len(nodes) > 2:  # a node leaves
            name = rng.choice(list(nodes))
            del nodes[name]
            state.remove_node(name)
            assert_classes_fresh(state)
            assert_rows_and_indexes_fresh(state)
        elif roll < 0.23:  # a node joins, anywhere in name order, its agent alive or not yet
            name = f"{rng.choice(list(nodes))}-{step}"
            if rng.random() < 0.7:
                state.set_lease(name, NOW + 60)
            nodes[name] = random_node(rng, name)
            state.set_node(node_from_api(nodes[name], KEYS))
            assert_classes_fresh(state)
            assert_rows_and_indexes_fresh(state)
        elif roll < 0.25:  # an agent dies or comes back
            name = rng.choice(list(nodes))
            state.set_lease(name, NOW - 1 if state.leases.get(name, 0) > NOW else NOW + 60)
        largest = (state.memory.usable(g) for node in state.nodes.values() for g in node.gpus)
        assert state.memory.largest_usable() == max(largest, default=0)
    # Both outcomes must have happened, or the comparison proved little.
    assert outcomes["placed"] > 0
    assert outcomes["not"] > 0 or len(nodes) >= 12


@pytest.mark.parametrize("seed", range(5))
def test_sorted_keys_behave_as_one_sorted_list(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chunked list binpack's buckets use, against a plain sorted list: adds, removes, reads
    from a key on, and node indices shifted past a join or a leave."""
    monkeypatch.setattr(SortedKeys, "CHUNK", 3)
    rng = random.Random(seed)
    plain = sorted({rng.randrange(1 << 28) for _ in range(20)})  # node indices below 4096
    kept = SortedKeys(list(plain))
    for _ in range(400):
        roll = rng.random()
        if roll < 0.45 or not plain:
            key = rng.randrange(1 << 28)
            if key not in plain:
                plain.append(key)
                plain.sort()
                kept.add(key)
        elif roll < 0.85:
            key = plain.pop(rng.randrange(len(plain)))
            kept.remove(key)
        elif roll < 0.95:
            at, delta = rng.randrange(1, 1 << 10), rng.choice([1, -1])
            if delta < 0:  # a node left: its entries went first, as FreeIndex does
                for key in [k for k in plain if (k >> 16) & 0xFFFFFFFF == at - 1]:
                    plain.remove(key)
                    kept.remove(key)
            plain = [k + (delta << 16) if (k >> 16) & 0xFFFFFFFF >= at else k for k in plain]
            kept.map(delta << 16, at)
        start = rng.randrange(1 << 28)
        assert list(kept) == plain
        assert list(kept.from_key(start)) == [k for k in plain if k >= start]
        assert bool(kept) == bool(plain)


def test_ties_are_broken_alike_on_a_cluster_of_identical_nodes() -> None:
    """Many equal nodes: the index must collect the whole tie, in node order, as the scan does."""
    state = ClusterState(rules=NODE_RULES)
    for n in range(50):
        state.set_node(node_from_api(node_obj(f"n{n:02d}", [16 * GI, 16 * GI]), KEYS))
        state.set_lease(f"n{n:02d}", NOW + 60)
    chosen = set()
    for p in range(200):
        pod = pod_from_api(pod_obj(f"p{p}", mem="3Gi", model=f"m{p % 7}"), KEYS)
        for policy in POLICIES:
            decide(state, pod, policy)
        result = place(state, pod, now=NOW, policy="spread", scan_budget=None)
        assert isinstance(result, Placement)
        state.assume(pod, result.node, result.gpu.uuid)
        chosen.add(result.node)
    assert len(chosen) == 50  # spread visited every node, so ties were many and broken apart


class CountingRules:
    """Kubernetes' node rules, noting each node a class asks them of."""

    def __init__(self) -> None:
        self.evaluated: list[str] = []

    def reason(self, constraints: Constraints, node: NodeInfo) -> str:
        self.evaluated.append(node.name)
        return NODE_RULES.reason(constraints, node)

    def scores(self, constraints: Constraints, node: NodeInfo) -> tuple[int, int]:
        return NODE_RULES.scores(constraints, node)

    def preferred_error(self, constraints: Constraints) -> str:
        return NODE_RULES.preferred_error(constraints)


def test_a_node_joining_or_leaving_evaluates_the_rules_of_that_node_only() -> None:
    """Before, a join or a leave threw every class away, and the next decision of each class
    evaluated Kubernetes' rules over every node again (a tenth of a second at 5,000 nodes)."""
    rng = random.Random(7)
    rules = CountingRules()
    state, _ = build(rng, 40, rules)
    pods = [random_pod(rng, f"pod-{p}") for p in range(30)]
    for pod in pods:
        place(state, pod, now=NOW)
    classes = len(state._class_cache.classes)
    assert classes > 3
    evaluated = rules.evaluated
    evaluated.clear()
    name = "node-010-joined"
    state.set_lease(name, NOW + 60)
    state.set_node(node_from_api(random_node(rng, name), KEYS))
    for pod in pods:
        place(state, pod, now=NOW)
    assert evaluated == [name] * classes
    evaluated.clear()
    state.remove_node("node-003")
    for pod in pods:
        place(state, pod, now=NOW)
    assert evaluated == []
    assert len(state._class_cache.classes) == classes
    assert_classes_fresh(state)
    assert_rows_and_indexes_fresh(state)
