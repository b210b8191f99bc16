"""Consolidation's plans on small clusters: room made for a pod that waits only because the free
memory is split, within the rules (smaller pods, no higher priority, controller-owned, a bounded
number, each fitting elsewhere, cooldowns), and no plan otherwise."""

from __future__ import annotations

from typing import Any

from binder.cluster.clusterstate import ClusterState
from binder.cluster.objects import PodInfo, lease_expiry, node_from_api, pod_from_api
from binder.framework.consolidation import Cooldowns, fragmented, plan
from binder.framework.noderules import NODE_RULES
from binder.framework.placement import Unschedulable, place
from tests.binder.objects import GI, KEYS, lease_obj, node_obj, pod_obj

NOW = 1_000_000.0
OWNED = [
    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": True}
]


def cluster(*nodes: dict[str, Any]) -> ClusterState:
    state = ClusterState(rules=NODE_RULES)
    for obj in nodes:
        info = node_from_api(obj, KEYS)
        state.set_node(info)
        state.set_lease(info.name, lease_expiry(lease_obj(info.name, NOW - 1)))
    return state


def pod(name: str, mem: str, *, owned: bool = True, priority: int = 0, **kw: Any) -> PodInfo:
    obj = pod_obj(name, mem=mem, spec_extra={"priority": priority}, **kw)
    if owned:
        obj["metadata"]["ownerReferences"] = OWNED
    return pod_from_api(obj, KEYS)


def bind(state: ClusterState, name: str, node: str, gpu: int, mem: str, **kw: Any) -> PodInfo:
    bound = pod(name, mem, node=node, gpu=f"GPU-{node}-{gpu}", phase="Running", **kw)
    state.set_pod(bound)
    return bound


def split_a100s() -> ClusterState:
    """Two A100s with 40Gi free each (an LLM, and on one small pods beside it) and a T4 with
    room. The LLMs are bare pods, so only the small ones may move."""
    state = cluster(node_obj("a100-0", [80 * GI, 80 * GI]), node_obj("t4-0", [16 * GI]))
    bind(state, "llm-a", "a100-0", 0, "40Gi", owned=False)
    bind(state, "llm-b", "a100-0", 1, "30Gi", owned=False)
    bind(state, "bert", "a100-0", 1, "6Gi")
    bind(state, "t5", "a100-0", 1, "4Gi")
    return state


def test_the_fewest_smaller_pods_move_off_one_gpu_when_the_memory_is_split() -> None:
    state = split_a100s()
    llm = pod("llm-c", "45Gi")
    assert isinstance(place(state, llm, now=NOW), Unschedulable)
    assert fragmented(state, llm, now=NOW)
    found = plan(state, llm, now=NOW)
    assert found is not None
    # GPU 1 has 40Gi free: moving the 6Gi pod alone makes 46Gi (the 4Gi one would not do).
    assert (found.node, found.gpu.uuid) == ("a100-0", "GPU-a100-0-1")
    assert [p.name for p in found.moves] == ["bert"]
    assert found.freed == 46 * GI
    assert "to make room for models/llm-c" in found.reason(llm)


def test_pods_of_higher_priority_bare_pods_and_pods_not_smaller_never_move() -> None:
    for kw in ({"priority": 10}, {"owned": False}):
        state = cluster(node_obj("a100-0", [80 * GI, 80 * GI]), node_obj("t4-0", [16 * GI]))
        bind(state, "llm-a", "a100-0", 0, "40Gi", owned=False)
        bind(state, "llm-b", "a100-0", 1, "30Gi", owned=False)
        bind(state, "bert", "a100-0", 1, "6Gi", **kw)
        bind(state, "t5", "a100-0", 1, "4Gi", **kw)
        assert plan(state, pod("llm-c", "45Gi"), now=NOW) is None, kw
    # Each A100 GPU has 10Gi free, 20Gi in all, and holds only pods as large as the pending one
    # or larger: none of them moves for it.
    state = cluster(node_obj("a100-0", [80 * GI, 80 * GI]), node_obj("l4-0", [24 * GI]))
    for gpu in (0, 1):
        bind(state, f"w{gpu}", "a100-0", gpu, "20Gi")
        bind(state, f"v{gpu}", "a100-0", gpu, "50Gi")
    bind(state, "fill", "l4-0", 0, "24Gi")
    pending = pod("p", "20Gi")
    assert fragmented(state, pending, now=NOW)
    assert plan(state, pending, now=NOW) is None


def test_no_plan_when_the_memory_is_short_in_total_or_the_moved_pods_fit_nowhere() -> None:
    big = pod("llm-c", "45Gi")
    state = split_a100s()
    bind(state, "fill", "t4-0", 0, "15Gi")
    bind(state, "fill-2", "a100-0", 0, "37Gi")
    assert not fragmented(state, big, now=NOW)  # 3 + 40 + 1 = 44Gi free in all
    assert plan(state, big, now=NOW) is None
    state = split_a100s()
    bind(state, "fill", "t4-0", 0, "15Gi")
    bind(state, "fill-2", "a100-0", 0, "35Gi", owned=False)
    # 46Gi free in all, but the 6Gi pod that would free GPU 1 fits no other GPU (1Gi, 5Gi).
    assert fragmented(state, big, now=NOW)
    assert plan(state, big, now=NOW) is None


def test_a_moved_pod_may_go_to_another_gpu_of_its_own_node() -> None:
    state = split_a100s()
    bind(state, "fill", "t4-0", 0, "15Gi")
    found = plan(state, pod("llm-c", "45Gi"), now=NOW)
    # The T4 is full: GPU 0 (40Gi free) takes the 6Gi pod.
    assert found is not None and [p.name for p in found.moves] == ["bert"]
    assert found.gpu.uuid == "GPU-a100-0-1"


def test_moves_are_bounded_and_cooldowns_are_kept() -> None:
    state = cluster(node_obj("a100-0", [80 * GI, 80 * GI]), node_obj("l4-0", [48 * GI]))
    bind(state, "llm-a", "a100-0", 0, "41Gi", owned=False)
    for i in range(6):
        bind(state, f"s{i}", "a100-0", 1, "6Gi")
    bind(state, "t5", "a100-0", 1, "4Gi")
    big = pod("llm-c", "60Gi")  # GPU 1 has 40Gi free: 20Gi must move, four 6Gi pods
    assert plan(state, big, now=NOW, max_moves=3) is None
    found = plan(state, big, now=NOW, max_moves=4)
    assert found is not None and len(found.moves) == 4
    moved = {p.uid for p in found.moves}
    again = plan(state, big, now=NOW, exempt=moved)
    # With those four exempt, two 6Gi pods and the 4Gi one free 16Gi: not enough.
    assert again is None
    assert plan(state, big, now=NOW, cold_nodes={"a100-0"}) is None


def test_a_pod_the_binder_has_not_seen_bound_yet_is_not_moved() -> None:
    state = split_a100s()
    for name in ("bert", "t5"):
        state.remove_pod(f"uid-models-{name}")
    state.assume(pod("bert", "6Gi"), "a100-0", "GPU-a100-0-1")
    state.assume(pod("t5", "4Gi"), "a100-0", "GPU-a100-0-1")
    assert plan(state, pod("llm-c", "45Gi"), now=NOW) is None


def test_priority_and_controller_are_read_from_the_pod() -> None:
    owned = pod("a", "1Gi", priority=1000)
    assert (owned.priority, owned.controlled) == (1000, True)
    bare = pod_from_api(pod_obj("b", spec_extra={"priority": "high"}), KEYS)
    assert (bare.priority, bare.controlled) == (0, False)
    not_controller = pod_obj("c")
    not_controller["metadata"]["ownerReferences"] = [{**OWNED[0], "controller": False}]
    assert pod_from_api(not_controller, KEYS).controlled is False


def test_a_tenant_recreating_its_pod_cannot_make_the_binder_empty_the_same_gpu_again() -> None:
    """The attack: with --consolidate-moves on, a team deletes and recreates its big pending pod
    (a new uid each time) so that the binder evicts other teams' pods over and over. The
    cooldowns stop it: a pod moved (and the pod it moved for) is not moved or planned for again
    for ten minutes, and a node pods were moved off is not a target for a minute."""
    cooldowns = Cooldowns(pod_seconds=600.0, node_seconds=60.0)
    state = split_a100s()
    first = pod("llm-c", "45Gi")
    made = plan(state, first, now=NOW, exempt=cooldowns.pods(0.0), cold_nodes=cooldowns.nodes(0.0))
    assert made is not None
    cooldowns.planned(first, made, 0.0)
    # The same pod again, or the tenant's new copy of it, a few seconds later: no plan.
    again = pod("llm-c-2", "45Gi")
    for candidate, at in ((first, 5.0), (again, 5.0), (again, 59.0)):
        recent = cooldowns.pods(at)
        assert candidate.uid in recent or (
            plan(state, candidate, now=NOW, exempt=recent, cold_nodes=cooldowns.nodes(at)) is None
        )
    # The moved pod itself stays exempt for ten minutes, even once the node is warm again.
    assert made.moves[0].uid in cooldowns.pods(61.0)
    assert "a100-0" not in cooldowns.nodes(61.0)
    assert made.moves[0].uid not in cooldowns.pods(601.0)


def test_no_running_pod_moves_for_an_on_demand_pod() -> None:
    state = split_a100s()
    llm = pod("llm-c", "45Gi", annotations={KEYS.residency: "on-demand"})
    assert isinstance(place(state, llm, now=NOW), Unschedulable)
    assert not fragmented(state, llm, now=NOW)
    assert plan(state, llm, now=NOW) is None
