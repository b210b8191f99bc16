"""Preemption, as kube-scheduler's DefaultPreemption decides it, for pods with our scheduler name
and for TritonModel replicas.

A pending pod or replica that fits nowhere may have pods and replicas of lower priority taken away
to make room (pods evicted, replicas drained by the model controller), unless its
`preemptionPolicy` is Never. Only what the ledger charges GPU memory (tritonshare pods and
replicas) is ever a victim; no PodDisruptionBudget counts a replica. For each node whose failure
another pod's leaving could cure (not a node rule, a node without GPUs or agent, or a missing
topology label), every lower-priority pod is taken away; if the pod then fits, the pods are given
back one at a time, most important first (higher priority, then the one started earlier), those
whose PodDisruptionBudget would be broken first, and each that still lets the pod fit stays: the
rest are the victims. Because a pod fits on one GPU, the victims of a pod short of GPU memory end
up on one GPU.

Among the nodes that work, kube-scheduler's order picks one: fewest budgets broken, then the
lowest priority of its most important victim, then the smallest sum of priorities, then the
fewest victims, then the latest start of its most important victims, then name order.

The rooms held for pods of lower priority than the preemptor count as free, and those pending
pods are never victims (as kube-scheduler counts nominated pods only against lower-or-equal
priorities). A pod nominated to a node where lower-priority pods are still terminating waits for
them instead of preempting again; a new leader holds its room again if the binder's proof of the
hold verifies (`stale_room`). Pure: reads the state, no I/O, no clock (time is passed in).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace

from binder.cluster.budgets import Budget
from binder.cluster.chargedpods import proven
from binder.cluster.clusterstate import ClusterState
from binder.cluster.objects import PodInfo
from binder.framework.placement import fits_on
from common.proofs import KeyRing

INT32_MAX = 2**31 - 1
REASON_NOT_HELPFUL = "Preemption is not helpful for scheduling"
REASON_NO_VICTIMS = "No preemption victims found for incoming pod"
MAX_CANDIDATES = 100
"""Nodes whose victims are worked out per attempt at most (kube-scheduler's
minCandidateNodesAbsolute): enough to choose well without scanning a large cluster."""


@dataclass(frozen=True)
class Preemption:
    node: str
    victims: tuple[PodInfo, ...]
    violations: int
    """How many victims break their PodDisruptionBudget (the Eviction API then refuses them)."""


@dataclass(frozen=True)
class NoPreemption:
    """Why preemption cannot help, as kube-scheduler's `preemption: ...` message counts it."""

    reasons: Mapping[str, int]
    waiting: bool = False
    """The pod waits for the victims of an earlier preemption to finish leaving."""


def lower_holds(state: ClusterState, pod: PodInfo) -> list[str]:
    """The pods of lower priority than `pod` holding room their preemption made: free to it (a
    replica's held room is not among them: it is a victim, drained)."""
    if not state.nominated:
        return []
    return [
        uid
        for uid in state.nominated
        if (other := state.charged_pod(uid)) is not None
        and other.host is None
        and other.priority < pod.priority
    ]


def may_preempt(state: ClusterState, pod: PodInfo) -> bool:
    """PodEligibleToPreemptOthers: not with preemptionPolicy Never, and not while lower-priority
    pods on its nominated node are still terminating."""
    if pod.preemption_policy == "Never":
        return False
    if pod.nominated_node:
        for other, _ in state.pods_on(pod.nominated_node):
            if other.deleting and other.priority < pod.priority:
                return False
    return True


def stale_room(
    state: ClusterState, held: PodInfo, node: str, gpu: str, proof: str, ring: KeyRing
) -> str:
    """Why a room said to be held (a pod's nomination annotation, a model's status.nominations)
    for `held` (the pod or replica under its held uid) on that node's GPU is not held again by a
    new leader, "" if it is: the node or GPU is gone, or the proof is not the binder's for that
    hold at that request (a tenant writes its own pod's annotations and may copy proofs)."""
    found = state.nodes.get(node)
    if found is None:
        return f"node {node} is gone"
    if not any(g.uuid == gpu and g.healthy for g in found.gpus):
        return f"GPU {gpu} is gone from node {node}"
    verdict = proven(replace(held, node_name=node, gpu_uuid=gpu, placement=proof), ring)
    if not isinstance(verdict, PodInfo):
        return f"its proof does not verify ({verdict.reason})"
    if verdict.request != held.request:
        return "its GPU memory changed"
    return ""


def _breaks_budget(pods: Sequence[PodInfo], budgets: Sequence[Budget]) -> set[str]:
    """The uids of the pods whose eviction, in this order, would take a budget below zero."""
    allowed = {(b.namespace, b.name): b.allowed for b in budgets}
    breaking = set()
    for pod in pods:
        for budget in budgets:
            if not _counts(budget, pod):
                continue
            key = (budget.namespace, budget.name)
            allowed[key] -= 1
            if allowed[key] < 0:
                breaking.add(pod.uid)
    return breaking


def _counts(budget: Budget, pod: PodInfo) -> bool:
    """Whether a disruption of `pod` (a pod, or a TritonModel replica) counts against
    `budget` (a PodDisruptionBudget, or a TritonModel's minAvailable over its replicas)."""
    if budget.namespace != pod.namespace or pod.name in budget.disrupted:
        return False
    if budget.model_uid:
        return pod.host is not None and pod.uid.rpartition("/")[0] == budget.model_uid
    if pod.host is not None:
        return False  # a replica: no PodDisruptionBudget selects it (the binder drains it)
    return not budget.selector.empty and budget.selector.matches(pod.labels)


def _victims_on(
    state: ClusterState, pod: PodInfo, node: str, now: float, budgets: Sequence[Budget]
) -> Preemption | None:
    lower = [
        other
        for other, _ in state.pods_on(node)
        if other.priority < pod.priority and not other.deleting and other.uid != pod.uid
    ]
    if not lower:
        return None
    with state.without([p.uid for p in lower]):
        if not fits_on(state, pod, node, now):
            return None
    # Most important first: higher priority, then started earlier.
    lower.sort(key=lambda p: (-p.priority, p.created))
    breaking = _breaks_budget(lower, budgets)
    ordered = [p for p in lower if p.uid in breaking] + [p for p in lower if p.uid not in breaking]
    victims: list[PodInfo] = []
    kept: list[str] = []
    for candidate in ordered:
        others = [p.uid for p in lower if p.uid not in kept and p.uid != candidate.uid]
        with state.without(others):
            fits = fits_on(state, pod, node, now)
        if fits:
            kept.append(candidate.uid)
        else:
            victims.append(candidate)
    violations = sum(1 for v in victims if v.uid in breaking)
    # Evicted in this order: a refused one (its budget) stops the others being evicted for nothing.
    victims.sort(key=lambda v: v.uid not in breaking)
    return Preemption(node, tuple(victims), violations)


def _rank(choice: Preemption) -> tuple[int, int, int, int, float, str]:
    victims = choice.victims
    top = max(v.priority for v in victims)
    earliest_top = min(v.created for v in victims if v.priority == top)
    return (
        choice.violations,
        top,
        sum(v.priority + INT32_MAX + 1 for v in victims),
        len(victims),
        -earliest_top,
        choice.node,
    )


def preempt(
    state: ClusterState,
    pod: PodInfo,
    resolvable: Sequence[str],
    *,
    now: float,
    budgets: Sequence[Budget] = (),
) -> Preemption | NoPreemption:
    """Where evicting lower-priority tritonshare pods would let the pod in, and which; or why
    nowhere. `resolvable`: the nodes whose failure another pod's leaving could cure."""
    total = len(state.names)
    if not may_preempt(state, pod):
        return NoPreemption({}, waiting=pod.preemption_policy != "Never")
    # Those pending pods are never victims: an eviction would delete them.
    held = lower_holds(state, pod)
    with state.without(held) if held else nullcontext():
        return _choose(state, pod, resolvable, now, budgets, total)


def _choose(
    state: ClusterState,
    pod: PodInfo,
    resolvable: Sequence[str],
    now: float,
    budgets: Sequence[Budget],
    total: int,
) -> Preemption | NoPreemption:
    choices: list[Preemption] = []
    for tried, node in enumerate(resolvable):
        if tried >= MAX_CANDIDATES and choices:
            break
        choice = _victims_on(state, pod, node, now, budgets)
        if choice is not None and choice.victims:
            choices.append(choice)
    if not choices:
        reasons: dict[str, int] = {}
        if resolvable:
            reasons[REASON_NO_VICTIMS] = len(resolvable)
        if total - len(resolvable):
            reasons[REASON_NOT_HELPFUL] = total - len(resolvable)
        return NoPreemption(reasons)
    return min(choices, key=_rank)
