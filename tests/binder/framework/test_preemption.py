"""Preemption as kube-scheduler's DefaultPreemption decides it (cases after its
defaultpreemption/default_preemption_test.go): which pods are victims, which node is chosen,
preemptionPolicy Never, PodDisruptionBudgets, only tritonshare pods ever victims, and a pod short
of GPU memory preempting on one GPU."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from binder.cluster.budgets import Budget
from binder.cluster.clusterstate import ClusterState
from binder.cluster.modelviews import as_replica
from binder.cluster.objects import pod_from_api
from binder.cluster.podterms import NOTHING, selector_from_api
from binder.framework.placement import resolvable_nodes
from binder.framework.preemption import (
    REASON_NO_VICTIMS,
    REASON_NOT_HELPFUL,
    NoPreemption,
    Preemption,
    preempt,
)
from tests.binder.framework.test_fit import other_pod, with_resources
from tests.binder.framework.test_placement import NOW, cluster, placed, refused
from tests.binder.objects import GI, KEYS, node_obj, pod_obj


def low(
    state: ClusterState,
    name: str,
    node: str,
    gpu: int,
    mem: str,
    priority: int = 0,
    created: str = "2026-01-01T00:00:00Z",
    labels: dict[str, str] | None = None,
    **extra: Any,
) -> None:
    obj = pod_obj(
        name,
        mem=mem,
        node=node,
        gpu=f"GPU-{node}-{gpu}",
        spec_extra={"priority": priority, **extra},
    )
    obj["metadata"]["creationTimestamp"] = created
    obj["metadata"]["labels"] = labels or {}
    obj["status"] = {"phase": "Running"}
    state.set_pod(pod_from_api(obj, KEYS))


def urgent(mem: str = "8Gi", priority: int = 100, **extra: Any) -> dict[str, Any]:
    return pod_obj("urgent", mem=mem, spec_extra={"priority": priority, **extra})


def decide(state: ClusterState, obj: dict[str, Any], budgets: list[Budget] | None = None) -> Any:
    pod = pod_from_api(obj, KEYS)
    refused(state, obj)
    return preempt(state, pod, resolvable_nodes(state, pod, NOW), now=NOW, budgets=budgets or [])


def names(outcome: Any) -> list[str]:
    assert isinstance(outcome, Preemption), outcome
    return [v.name for v in outcome.victims]


def test_the_lowest_priority_pod_is_the_victim_and_the_others_are_reprieved() -> None:
    state = cluster(node_obj("n1", [16 * GI]))
    low(state, "a", "n1", 0, "8Gi", priority=1)
    low(state, "b", "n1", 0, "8Gi", priority=0)
    assert names(decide(state, urgent())) == ["b"]


def test_a_pod_short_of_gpu_memory_takes_its_victims_from_one_gpu() -> None:
    state = cluster(node_obj("n1", [16 * GI, 16 * GI]))
    low(state, "a", "n1", 0, "8Gi", created="2026-01-01T00:00:01Z")
    low(state, "b", "n1", 0, "8Gi", created="2026-01-01T00:00:02Z")
    low(state, "c", "n1", 1, "16Gi", created="2026-01-01T00:00:03Z")
    # Freed on one GPU: c alone (a and b, started earlier, are reprieved first).
    assert names(decide(state, urgent("16Gi"))) == ["c"]


def test_preemption_policy_never_preempts_nothing() -> None:
    state = cluster(node_obj("n1", [16 * GI]))
    low(state, "a", "n1", 0, "16Gi")
    outcome = decide(state, urgent(preemptionPolicy="Never"))
    assert isinstance(outcome, NoPreemption) and not outcome.reasons


def test_pods_of_equal_or_higher_priority_are_never_victims() -> None:
    state = cluster(node_obj("n1", [16 * GI]), node_obj("n2", [16 * GI]))
    low(state, "a", "n1", 0, "16Gi", priority=100)
    low(state, "b", "n2", 0, "16Gi", priority=200)
    outcome = decide(state, urgent())
    assert isinstance(outcome, NoPreemption)
    assert outcome.reasons == {REASON_NOT_HELPFUL: 2}


def test_the_node_with_the_lowest_priority_victims_is_chosen() -> None:
    state = cluster(node_obj("n1", [16 * GI]), node_obj("n2", [16 * GI]))
    low(state, "a", "n1", 0, "16Gi", priority=5)
    low(state, "b", "n2", 0, "16Gi", priority=1)
    outcome = decide(state, urgent())
    assert isinstance(outcome, Preemption) and outcome.node == "n2"


def test_a_node_whose_victims_break_no_budget_wins_over_lower_priority_ones() -> None:
    state = cluster(node_obj("n1", [16 * GI]), node_obj("n2", [16 * GI]))
    low(state, "a", "n1", 0, "16Gi", priority=5)
    low(state, "b", "n2", 0, "16Gi", priority=1, labels={"app": "b"})
    budget = Budget("models", "b", selector_from_api({"matchLabels": {"app": "b"}}), allowed=0)
    outcome = decide(state, urgent(), [budget])
    assert isinstance(outcome, Preemption) and outcome.node == "n1"
    assert outcome.violations == 0
    # With no other choice, the budget is broken (the Eviction API then refuses it).
    state = cluster(node_obj("n2", [16 * GI]))
    low(state, "b", "n2", 0, "16Gi", priority=1, labels={"app": "b"})
    outcome = decide(state, urgent(), [budget])
    assert isinstance(outcome, Preemption) and outcome.violations == 1


def test_fewer_victims_win_at_equal_priority() -> None:
    state = cluster(node_obj("n1", [16 * GI]), node_obj("n2", [16 * GI]))
    low(state, "a1", "n1", 0, "8Gi")
    low(state, "a2", "n1", 0, "8Gi")
    low(state, "b", "n2", 0, "16Gi")
    assert names(decide(state, urgent("16Gi"))) == ["b"]


def test_a_node_the_pods_node_rules_exclude_is_not_a_candidate() -> None:
    taint = {"key": "dedicated", "value": "x", "effect": "NoSchedule"}
    state = cluster(node_obj("n1", [16 * GI], taints=[taint]))
    low(state, "a", "n1", 0, "16Gi", tolerations=[{"operator": "Exists"}])
    outcome = decide(state, urgent())
    assert isinstance(outcome, NoPreemption) and outcome.reasons == {REASON_NOT_HELPFUL: 1}


def test_cpu_held_by_a_lower_priority_model_pod_is_freed_by_preemption() -> None:
    allocatable = {"cpu": "2", "memory": "8Gi", "pods": "110"}
    state = cluster(node_obj("n1", [16 * GI], allocatable=allocatable))
    obj = pod_obj(
        "a", mem="1Gi", node="n1", gpu="GPU-n1-0", spec_extra=with_resources({"cpu": "2"})
    )
    state.set_pod(pod_from_api(obj, KEYS))
    wanting = urgent("1Gi", **with_resources({"cpu": "1"}))
    wanting["spec"]["priority"] = 100
    assert names(decide(state, wanting)) == ["a"]


def test_pods_of_other_schedulers_are_never_victims() -> None:
    allocatable = {"cpu": "2", "memory": "8Gi", "pods": "110"}
    state = cluster(node_obj("n1", [16 * GI], allocatable=allocatable))
    state.track_pod(pod_from_api(other_pod("web", "n1", {"cpu": "2"}), KEYS))
    wanting = urgent("1Gi", **with_resources({"cpu": "1"}))
    wanting["spec"]["priority"] = 100
    outcome = decide(state, wanting)
    assert isinstance(outcome, NoPreemption)


def test_nothing_to_gain_is_said_per_node() -> None:
    state = cluster(node_obj("n1", [16 * GI]), node_obj("n2", [8 * GI]))
    low(state, "a", "n1", 0, "4Gi")
    low(state, "b", "n1", 0, "4Gi", priority=500)
    low(state, "c", "n2", 0, "8Gi")
    # n1 holds a lower-priority pod but freeing it leaves 12Gi; n2 is too small whatever leaves.
    outcome = decide(state, urgent("16Gi"))
    assert isinstance(outcome, NoPreemption)
    assert outcome.reasons == {REASON_NO_VICTIMS: 2}


def test_the_room_held_for_a_nominated_pod_is_its_own_and_no_one_elses() -> None:
    state = cluster(node_obj("n1", [16 * GI]))
    low(state, "a", "n1", 0, "16Gi")
    outcome = decide(state, urgent())
    assert isinstance(outcome, Preemption)
    pod = pod_from_api(urgent(), KEYS)
    state.nominate(pod, "n1", "GPU-n1-0")
    state.remove_pod(pod_from_api(pod_obj("a", node="n1"), KEYS).uid)  # the victim is gone
    # Another pod sees the 8Gi held: only 8Gi of the GPU is free for it.
    assert refused(state, pod_obj("other", mem="9Gi")).reasons
    state.release_nomination(pod.uid)
    chosen = placed(state, urgent())
    assert chosen.node == "n1"


def test_a_replica_is_a_victim_as_a_pod_is_and_no_budget_counts_it() -> None:
    state = cluster(node_obj("n1", [16 * GI]), node_obj("n2", [16 * GI]))
    obj = pod_obj("m", mem="16Gi", node="n1", gpu="GPU-n1-0", spec_extra={"priority": 1})
    obj["metadata"]["labels"] = {"app": "b"}
    obj["status"] = {"phase": "Running"}
    replica = as_replica(pod_from_api(obj, KEYS))
    state.set_pod(replace(replica, uid=f"{replica.uid}/0", name="m/0"))
    low(state, "b", "n2", 0, "16Gi", priority=1, labels={"app": "b"})
    budget = Budget("models", "b", selector_from_api({"matchLabels": {"app": "b"}}), allowed=0)
    outcome = decide(state, urgent(), [budget])
    # Equal priorities: the node whose victim breaks no budget wins, and the replica breaks none.
    assert isinstance(outcome, Preemption) and (outcome.node, outcome.violations) == ("n1", 0)
    assert names(outcome) == ["m/0"]


def test_a_replica_whose_model_would_fall_below_its_min_available_is_spared_first() -> None:
    """A TritonModel's minAvailable is a budget over its replicas: a preemption prefers the
    node whose replica victim leaves its model at its minimum, as it prefers a pod's budget."""
    state = cluster(node_obj("n1", [16 * GI]), node_obj("n2", [16 * GI]))
    for name, node in (("kept", "n1"), ("spare", "n2")):
        obj = pod_obj(name, mem="16Gi", node=node, gpu=f"GPU-{node}-0", spec_extra={"priority": 1})
        obj["status"] = {"phase": "Running"}
        replica = as_replica(pod_from_api(obj, KEYS))
        state.set_pod(replace(replica, uid=f"{replica.uid}/0", name=f"{name}/0"))
    kept = Budget("models", "tritonmodel/kept", NOTHING, allowed=0, model_uid="uid-models-kept")
    spare = Budget("models", "tritonmodel/spare", NOTHING, allowed=1, model_uid="uid-models-spare")
    outcome = decide(state, urgent(), [kept, spare])
    assert isinstance(outcome, Preemption) and (outcome.node, outcome.violations) == ("n2", 0)
    assert names(outcome) == ["spare/0"]
    # With no other choice, the minimum is broken: priority decides, as with a pod's budget.
    outcome = decide(state, urgent(), [kept, replace(spare, allowed=0)])
    assert isinstance(outcome, Preemption) and outcome.violations == 1
