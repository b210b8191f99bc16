"""Placement: which node and which GPU a pod goes to, or why it cannot go anywhere.

Filters, in kube-scheduler's order and then ours: Kubernetes' rules (binder.framework.noderules),
the node publishes GPUs, its agent is alive, the model is not already on the node, and the request
fits in one healthy GPU's free memory. Scores add as kube-scheduler's plugins do: NodeAffinity
(weight 2) and TaintToleration (weight 3), each normalised to 0..100 over the feasible nodes, plus
our GPU memory score (weight 1, 0..100). Among the nodes Kubernetes' scores rate best, one a pod
of the same revision (namespace, model id, revision) left comes first: its agent may have kept the
files.

`binpack` (the default) puts a pod where it wastes the least of what only bigger pods could use,
on the fewest GPUs (`pack_score` gives the order): a used GPU, the tightest, before an empty one.
A GPU size has GPUs to spare while more than two fifths of its GPUs in the cluster could take a
pod that needs that size (`SPARE_SHARE`); then its empty GPUs open larger first (fewer GPUs in
use). Once a size is short, its empty GPUs open smaller first, and a block that could hold a pod
that needs that size is left to such pods. The cluster's largest kind (within a tenth of the
largest GPU's size) is kept whole for the pods only it holds: it is taken last, except the
remainder beside a big pod when that remainder is smaller than the next kind's GPUs (nothing
only the largest kind holds fits there) while more than two fifths of the largest kind are
whole. The largest kind is kept because a small model left beside a big one stays when the big
one goes, and the next big model finds no block: measured in benchmarks/density.py, under churn
every rule that filled that room whatever the A100s' state refused 210 to 485 of 490 big-model
replicas on arrival (this rule: 30). Scoring a node's fullness relative to its own size instead
makes 8-GPU A100 nodes look fullest and feeds them small models until
no big model fits.

Replicas of one model revision (`ModelKey`: a TritonModel's, a Deployment's model pods of one
model id) spread by `replica_spread`: `GPU` (the default) and `Node` take a node without one
first; `GPU` then a node with a GPU that fits and holds none, and on the chosen node such a GPU
(`replica_gpus`), so a replica adds GPU compute; `None` packs them as any pods. Preferences only:
with no such node or GPU, a replica goes where the scores put it.

`spread` favours the node with the most free memory relative to its size and its emptiest GPU;
its ties go to a node chosen by a stable hash of the pod's uid.

Two ways to the same answer. The common case reads the pod's class's free-memory index
(binder.cluster.index): for binpack a bisection to the tightest block that fits in each bucket, for
spread the heads of the buckets and the run of equal scores; so its cost does not grow with the
cluster. When that would mean walking far (many infeasible entries, or a large spread tie), when
nothing fits (the reasons need every node) or when PreScore fails, every node of the class is scored
at once. The two agree on the node, the GPU and the score;
tests/binder/framework/test_placement_paths.py compares them on random clusters.

An `on-demand` pod reads the state's on-demand view (`ClusterState.view`): the same filters, scores
and index over its own free memory (`binder.cluster.residencyfit`), and its own memory reasons.

Pure: a function of the cluster state, the pod and the time passed in; no I/O, no clock.
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from binder.cluster.classes import ConstraintClass
from binder.cluster.clusterstate import (
    GPUS_NONE,
    GPUS_OK,
    GPUS_UNREADABLE,
    ClusterState,
    IntArray,
)
from binder.cluster.gpusizes import GpuSizes
from binder.cluster.index import BLOCK_SHIFT, NODE_MASK, SHIFT, FreeIndex, block_node
from binder.cluster.memoryviews import MemoryView
from binder.cluster.objects import Gpu, PodInfo, constraints_from_spec, node_from_api
from binder.framework.filters import PodFilters, pod_filters
from binder.framework.interpod import REASON_AFFINITY as REASON_AFFINITY_RULES
from binder.framework.noderules import kubernetes_reasons
from binder.framework.spread import REASON_MISSING_LABEL
from common.contract import SPREAD_GPU, SPREAD_NONE, Keys
from common.quantity import format_bytes

Policy = Literal["binpack", "spread"]
POLICIES: tuple[Policy, ...] = ("binpack", "spread")

AFFINITY_WEIGHT = 2
TAINT_WEIGHT = 3
MEMORY_WEIGHT = 1
MAX_SCORE = 100

SCAN_BUDGET = 256
"""Index entries a decision may read before it scores the whole class instead; both give the
same answer, this only bounds the index's worst case (a long infeasible head, a large tie)."""

REASON_NO_GPUS = "node(s) had no GPUs published by the tritonshare agent"
REASON_BAD_GPUS = "node(s) had an unreadable tritonshare GPU annotation"
REASON_AGENT_DOWN = "node(s) had no live tritonshare agent"


def reason_memory(largest_free: int) -> str:
    return f"Insufficient GPU memory (largest free block {format_bytes(largest_free)})"


def reason_always_resident(largest: int) -> str:
    """An on-demand pod's reason where the always-resident models leave too little to wake it."""
    return (
        f"Insufficient GPU memory for always-resident models (largest room to wake a model "
        f"{format_bytes(largest)})"
    )


def reason_overcommit(largest_free: int) -> str:
    """An on-demand pod's reason where the GPUs' over-commit budget is spent."""
    return (
        f"Insufficient over-committed GPU memory (largest free block {format_bytes(largest_free)})"
    )


def _on_demand_memory_reasons(state: ClusterState, pod: PodInfo, nodes: IntArray) -> Counter[str]:
    """Why an on-demand pod fits none of these nodes by GPU memory: the always-resident models
    leave too little to wake it, or the over-commit budget is spent."""
    view = state.view(on_demand=True)
    wake = view.wake[nodes]
    short = wake < pod.request
    reasons: Counter[str] = Counter()
    if short.any():
        reasons[reason_always_resident(max(0, int(wake[short].max())))] = int(short.sum())
    if not short.all():
        spent = view.max_free[nodes[~short]]
        reasons[reason_overcommit(max(0, int(spent.max())))] = int((~short).sum())
    return reasons


@dataclass(frozen=True)
class Placement:
    node: str
    gpu: Gpu
    score: float


@dataclass(frozen=True)
class Unschedulable:
    """Why a pod was not placed: `message` is kube-scheduler's FitError format, or the error of a
    plugin that failed the attempt (then `condition_reason` is SchedulerError, as upstream)."""

    message: str
    reasons: Mapping[str, int]
    """How many nodes failed for each reason (empty for a problem with the pod itself)."""
    condition_reason: str = "Unschedulable"
    """The PodScheduled=False reason: Unschedulable (fits nowhere) or SchedulerError."""

    @property
    def attempt_result(self) -> str:
        """The schedule_attempts_total result label, as kube-scheduler counts it."""
        return "unschedulable" if self.condition_reason == "Unschedulable" else "error"


def node_fits(
    pod: Mapping[str, Any], node: Mapping[str, Any], *, tenant_code: bool = False
) -> list[str]:
    """Kubernetes' node rules and the TenantCode filter for an API-shaped pod and node (whose
    namespace may run tenant code when `tenant_code`): empty when the node fits, else every rule
    it breaks, phrased as kube-scheduler phrases them, in its filter order (the first is the
    one kube-scheduler reports). GPU memory, agents and model ids need the whole cluster: see
    `explain`."""
    spec = pod.get("spec")
    constraints = constraints_from_spec(spec if isinstance(spec, Mapping) else {}, tenant_code)
    return kubernetes_reasons(constraints, node_from_api(node, Keys()))


def fit_message(total_nodes: int, reasons: Mapping[str, int], detail: str = "") -> str:
    """kube-scheduler's FitError text: "0/N nodes are available: <detail>. <sorted counts>." """
    message = f"0/{total_nodes} nodes are available:"
    if detail:
        message += f" {detail}."
    histogram = sorted(f"{count} {reason}" for reason, count in reasons.items())
    if histogram:
        message += " " + ", ".join(histogram) + "."
    return message


def pod_problem(state: ClusterState, pod: PodInfo) -> str:
    """A reason the pod fits no node whatever the others do, or ""."""
    if pod.problem:
        return pod.problem
    largest = state.memory.largest_usable()
    if largest > 0 and pod.request > largest:
        return (
            f"pod requests {format_bytes(pod.request)} of GPU memory, more than any healthy GPU in "
            f"the cluster offers (largest {format_bytes(largest)} after the reserve); lower its "
            f"GPU memory limit or add larger GPUs"
        )
    return ""


def _tie_break(uid: str, count: int) -> int:
    return zlib.crc32(uid.encode()) % count


def choose_gpu(
    state: ClusterState,
    node: str,
    request: int,
    policy: Policy,
    kinds: Kinds | None = None,
    *,
    on_demand: bool = False,
    avoid: frozenset[int] = frozenset(),
) -> Gpu | None:
    """binpack: the GPU with the best memory score (`pack_score`), then the tightest block;
    spread: the emptiest. Ties go to the lower GPU index. `on_demand`: the pod's residency
    class is `on-demand` (its blocks are `binder.cluster.residencyfit.on_demand_free`).
    `avoid`: positions of GPUs that hold a replica of the pod's model (`replica_gpus`), taken
    only when no other GPU of the node fits."""
    view = state.view(on_demand)
    state.arrays()
    info = state.nodes[node]
    # The ledger's (usable size, free block) of each GPU, as the index reads them.
    blocks = view.gpu_blocks[state.index[node]]
    fitting = [
        (size, free, g.index, g)
        for at, ((size, free), g) in enumerate(zip(blocks, info.gpus, strict=True))
        if g.healthy and free >= request and at not in avoid
    ]
    if not fitting and avoid:
        return choose_gpu(state, node, request, policy, kinds, on_demand=on_demand)
    if not fitting:
        return None
    if policy == "binpack":
        by_size = _scores_by_size(kinds or gpu_kinds(state), request)
        return min(fitting, key=lambda item: (-_score_of(by_size, item[0], item[1]), *item[1:3]))[3]
    return min(fitting, key=lambda item: (-item[1], item[2]))[3]


def spreads_nodes(pod: PodInfo) -> bool:
    """Whether the pod's replicas prefer nodes without one (`replica_spread` GPU or Node)."""
    return bool(pod.model_id) and pod.replica_spread != SPREAD_NONE


def replica_gpus(state: ClusterState, pod: PodInfo, node: str) -> frozenset[int]:
    """Positions of the node's GPUs that hold a charged replica of the pod's model revision
    (other than the pod itself), when the pod spreads over GPUs (`replica_spread` GPU); read
    only on the few nodes that have one."""
    if not pod.model_id or pod.replica_spread != SPREAD_GPU:
        return frozenset()
    if node not in state.tallies.nodes_with_model(pod.model_key):
        return frozenset()
    return _held_on(state, pod, node)


def _held_on(state: ClusterState, pod: PodInfo, node: str) -> frozenset[int]:
    return state.replica_gpus(pod.model_key, pod.uid).get(node, frozenset())


def _free_of_replicas(
    state: ClusterState, view: MemoryView, pod: PodInfo, candidates: IntArray
) -> tuple[npt.NDArray[np.bool_], dict[int, frozenset[int]]]:
    """Which candidate nodes (each holding a replica of the pod's model) have a GPU that fits
    the pod and holds none, and per candidate row the GPU positions that hold one. The
    revision's GPUs are read once, whatever the nodes."""
    _, rooms = view.gpu_matrices()
    free = np.zeros(candidates.size, np.bool_)
    held: dict[int, frozenset[int]] = {}
    by_node = state.replica_gpus(pod.model_key, pod.uid)
    for row, i in enumerate(candidates.tolist()):
        name = state.names[i]
        taken = by_node.get(name, frozenset())
        held[row] = taken
        free[row] = any(
            at not in taken and g.healthy and int(rooms[i, at]) >= pod.request
            for at, g in enumerate(state.nodes[name].gpus)
        )
    return free, held


def place(
    state: ClusterState,
    pod: PodInfo,
    *,
    now: float,
    policy: Policy = "binpack",
    scan_budget: int | None = SCAN_BUDGET,
) -> Placement | Unschedulable:
    """Choose a node and a GPU for a pending pod, or say why none fits.

    `scan_budget`: index entries to read before scoring the whole class instead (None: no
    limit; 0: never use the index). Every value gives the same answer; tests vary it."""
    problem = pod_problem(state, pod)
    if problem:
        return Unschedulable(fit_message(len(state.nodes), {}, problem), {})
    cls = state.constraint_class(pod.constraints)
    view = state.view(pod.on_demand)
    # Nodes its revision's pods left may hold its files: a tie-break the index cannot see, so
    # such a pod is scored over its whole class.
    kept = state.left_nodes(pod.model_key) if pod.model_id else set()
    filters = pod_filters(state, pod)
    nodes = cls.nodes
    if pod.nominated_node:
        nominated = state.index.get(pod.nominated_node)
        if nominated is not None and _feasible(state, pod, cls, filters, nominated, now):
            # The node its preemption made room on, while it still fits (as kube-scheduler).
            return _on_node(state, pod, pod.nominated_node, policy, 0.0)
    # Whether the plugins that look at other pods tell any two nodes apart (if not over every
    # node that passes the node rules, then not over the feasible ones either).
    scored = nodes.size > 1 and filters.scores(nodes) is not None
    if not scored and not kept and scan_budget != 0 and not cls.preferred_error:
        # The common case: nothing but node rules and memory tells the nodes apart, so the
        # free-memory index finds the best, reading a few nodes one at a time.
        budget = math.inf if scan_budget is None else scan_budget
        index = state.free_index(pod.constraints, pod.on_demand)
        taken = state.model_nodes(pod.model_key) if spreads_nodes(pod) else set()
        indexed = _pack_indexed if policy == "binpack" else _spread_indexed
        found = indexed(state, view, pod, index, now, budget, taken, filters.passes)
        if found is not None:
            return found
    if nodes.size:
        ok = (view.max_free[nodes] >= pod.request) & (state.lease_expiry[nodes] > now)
        ok &= filters.ok[nodes]
        held: dict[int, frozenset[int]] | None = None
        if spreads_nodes(pod):
            # Replicas of a model revision spread over nodes: a node without one first; then,
            # for `GPU`, a node with a GPU that fits and holds none.
            fresh = ok & ~state.model_mask(pod.model_key)[nodes]
            if fresh.any():
                ok = fresh
            elif pod.replica_spread == SPREAD_GPU and ok.any():
                roomy, by_row = _free_of_replicas(state, view, pod, nodes[ok])
                if roomy.any():
                    held = {r: by_row[int(at)] for r, at in enumerate(np.flatnonzero(roomy))}
                    ok[np.flatnonzero(ok)[~roomy]] = False
        candidates = nodes[ok]
        if candidates.size > 1 and cls.preferred_error:
            # kube-scheduler scores only when two or more nodes are feasible; PreScore fails.
            return Unschedulable(cls.preferred_error, {}, "SchedulerError")
        if candidates.size:
            # Normalised over the feasible nodes, as kube-scheduler normalises them.
            extra = filters.scores(candidates) if scored and candidates.size > 1 else None
            affinity, prefer = cls.affinity[ok], cls.prefer_no_schedule[ok]
            return _best(state, view, pod, policy, candidates, affinity, prefer, extra, kept, held)
    return _unschedulable(state, pod, now, cls, filters)


def _spread_indexed(
    state: ClusterState,
    view: MemoryView,
    pod: PodInfo,
    index: FreeIndex,
    now: float,
    budget: float,
    taken: set[int],
    fits: Callable[[int], bool],
) -> Placement | None:
    """spread from the index: the emptiest feasible node of each bucket, scored exactly as
    `_best` scores (same integer and float operations, in the same order), then the uid's pick
    among the equal best; None when the budget runs out or nothing is feasible (the caller then
    scores the whole class)."""
    request = pod.request
    max_free = view.max_free
    lease = state.lease_expiry
    read = 0
    heads: list[tuple[int, int, int, list[int], int]] = []
    for (affinity, prefer, capacity), keys in index.buckets(view.capacity, view.free_total).items():
        for position in range(len(keys) - 1, -1, -1):
            read += 1
            if read > budget:
                return None
            i = keys[position] & NODE_MASK
            if max_free[i] >= request and lease[i] > now and i not in taken and fits(i):
                heads.append((affinity, prefer, capacity, keys, position))
                break
    if not heads:
        return None
    top_affinity = max(h[0] for h in heads)
    top_prefer = max(h[1] for h in heads)
    best = -math.inf
    scored: list[tuple[float, int, float, list[int], int]] = []
    for affinity, prefer, capacity, keys, position in heads:
        affinity_score = (affinity * MAX_SCORE) // top_affinity if top_affinity > 0 else 0
        taint_score = (
            MAX_SCORE - (prefer * MAX_SCORE) // top_prefer if top_prefer > 0 else MAX_SCORE
        )
        base = AFFINITY_WEIGHT * affinity_score + TAINT_WEIGHT * taint_score
        size = float(max(capacity, 1))
        score = base + MEMORY_WEIGHT * _memory_score(size, keys[position] >> SHIFT, request)
        scored.append((score, base, size, keys, position))
        best = max(best, score)
    ties: list[int] = []
    for score, base, size, keys, position in scored:
        if score != best:
            continue
        # The bucket's run of equal scores: the same free memory, in node order.
        while position >= 0:
            free, i = keys[position] >> SHIFT, keys[position] & NODE_MASK
            if base + MEMORY_WEIGHT * _memory_score(size, free, request) != best:
                break
            read += 1
            if read > budget:
                return None
            if max_free[i] >= request and lease[i] > now and i not in taken and fits(i):
                ties.append(i)
            position -= 1
    ties.sort()
    return _on_node(state, pod, state.names[ties[_tie_break(pod.uid, len(ties))]], "spread", best)


def _pack_indexed(
    state: ClusterState,
    view: MemoryView,
    pod: PodInfo,
    index: FreeIndex,
    now: float,
    budget: float,
    taken: set[int],
    fits: Callable[[int], bool],
) -> Placement | None:
    """binpack from the index: in each bucket (one GPU size), the tightest block that fits on a
    feasible node (a bisection, then a walk past dead agents and nodes that have the model),
    scored and tie-broken exactly as `_best` does; None when the budget runs out or nothing is
    feasible."""
    request = pod.request
    lease = state.lease_expiry
    read = 0
    heads: list[tuple[int, int, int, int, int]] = []
    for (affinity, prefer, size), keys in index.blocks(view.gpu_blocks).items():
        for key in keys.from_key(request << BLOCK_SHIFT):
            read += 1
            if read > budget:
                return None
            i = block_node(key)
            if lease[i] > now and i not in taken and fits(i):
                heads.append((affinity, prefer, size, key >> BLOCK_SHIFT, i))
                break
    if not heads:
        return None
    top_affinity = max(h[0] for h in heads)
    top_prefer = max(h[1] for h in heads)
    kinds = gpu_kinds(state)
    by_size = _scores_by_size(kinds, request)
    best, best_block, chosen = -math.inf, 0, 0
    for affinity, prefer, size, block, i in heads:
        affinity_score = (affinity * MAX_SCORE) // top_affinity if top_affinity > 0 else 0
        taint_score = (
            MAX_SCORE - (prefer * MAX_SCORE) // top_prefer if top_prefer > 0 else MAX_SCORE
        )
        base = AFFINITY_WEIGHT * affinity_score + TAINT_WEIGHT * taint_score
        score = base + MEMORY_WEIGHT * _score_of(by_size, size, block)
        # Equal scores: the tightest block, then node name order.
        if score > best or (score == best and (block, i) < (best_block, chosen)):
            best, best_block, chosen = score, block, i
    return _on_node(state, pod, state.names[chosen], "binpack", best, kinds)


SPARE_SHARE = 0.4
"""binpack: a GPU size has GPUs to spare while more than this share of its GPUs in the cluster
could take a pod that needs that size: for the largest kind, whole GPUs (a big model needs a
whole one); for the others, GPUs with a block at least the next kind's size. Measured in
benchmarks/density.py (seeds 29 and 7): at 1/4 the static fleet packs onto 799 GPUs but churn
refuses up to 77 big-model replicas; at 2/5, 834 GPUs and 30 to 36 refused, as many as requiring
a quarter of the largest kind whole (23 to 36)."""


BySize = dict[int, tuple[int, float, float, float]]
"""Per usable size: (the next kind's size, and `_size_scores`) for one pod."""
BY_REQUEST_KEPT = 64
"""Requests whose per-size scores `Kinds` keeps (then it starts again): bounds that cache."""


@dataclass(frozen=True)
class Kinds:
    """What binpack needs to know of the cluster's GPU sizes, per usable size (ascending)."""

    largest: int
    """The largest healthy GPU's usable bytes (at least 1)."""
    sizes: tuple[int, ...]
    below: tuple[int, ...]
    """For each size, the next kind's (`GpuSizes.below`)."""
    spare: tuple[bool, ...]
    """For each size, whether it has GPUs to spare (`SPARE_SHARE`)."""
    by_request: dict[int, BySize] = field(default_factory=dict, compare=False, repr=False)
    """`_scores_by_size` of the requests decided while these kinds held (a few dozen at most)."""


def gpu_kinds(state: ClusterState) -> Kinds:
    return _kinds(state.gpu_sizes(), max(state.memory.largest_usable(), 1))


@lru_cache(maxsize=16)
def _kinds(listed: GpuSizes, largest: int) -> Kinds:
    """Kept while no GPU changes size, or turns whole, used or roomy (most charges do neither)."""
    spare = tuple(
        (whole if size * 10 >= largest * 9 else roomy) > gpus * SPARE_SHARE
        for size, gpus, whole, roomy in zip(
            listed.sizes, listed.gpus, listed.whole, listed.roomy, strict=True
        )
    )
    return Kinds(largest, listed.sizes, listed.below, spare)


def pack_score(kinds: Kinds, size: int, free: int, request: int) -> float:
    """binpack's memory score of a GPU of `size` usable bytes with a `free` block that fits the
    pod. A pod goes where it wastes the least of what only bigger pods could use, and opens
    larger GPUs while their kind has GPUs to spare:

    - 100: a used GPU (the tightest wins ties), unless the next rule keeps its block;
    - 51 to 99: an empty GPU of a size with GPUs to spare (`Kinds.spare`), the larger the higher
      (fewest GPUs in use);
    - 26 to 50: a used GPU whose block is kept for the pods that need its kind: a pod that fits
      a smaller kind, a block at least the next kind's size, a size with none to spare; the
      smaller the GPU the higher;
    - 2 to 25: an empty GPU of a size with none to spare, the smaller the higher;
    - the largest kind (within a tenth of the largest GPU) is kept whole for the pods only it
      holds: 1 used, 0 empty; except that a used one whose block is smaller than the next
      kind's GPUs (so nothing only the largest kind holds fits there) scores 100 while its size
      has GPUs to spare.

    `_best` reads the same per-size scores (`_size_scores`) for every GPU at once."""
    return _score_of(_scores_by_size(kinds, request), size, free)


def _scores_by_size(kinds: Kinds, request: int) -> BySize:
    """Each size's scores for a pod of this request (a cluster has a few sizes), kept with the
    kinds: the pods of one Deployment ask alike, and the kinds change only when a GPU turns
    whole, used or roomy."""
    scores = kinds.by_request.get(request)
    if scores is None:
        if len(kinds.by_request) >= BY_REQUEST_KEPT:
            kinds.by_request.clear()
        scores = kinds.by_request[request] = {
            size: (kinds.below[at], *_size_scores(kinds, at, request))
            for at, size in enumerate(kinds.sizes)
        }
    return scores


def _score_of(by_size: BySize, size: int, free: int) -> float:
    scores = by_size.get(size)
    if scores is None:
        return -1.0  # not a healthy GPU of the cluster: it fits nothing
    below, empty, used_small, used_large = scores
    if free == size:
        return empty
    return used_small if free < below else used_large


def _size_scores(kinds: Kinds, at: int, request: int) -> tuple[float, float, float]:
    """`pack_score` of the `at`-th size's GPUs: (empty, used with a block smaller than the next
    kind's GPUs, used with a larger block)."""
    largest, size, below, spare = kinds.largest, kinds.sizes[at], kinds.below[at], kinds.spare[at]
    if size * 10 >= largest * 9:
        return 0.0, (100.0 if spare else 1.0), 1.0
    empty = 51 + 48 * size / largest if spare else 2 + 23 * (largest - size) / largest
    # A block that could hold a pod that needs this kind is left to such pods while the kind is
    # short, unless this pod needs the kind itself.
    kept = not spare and request <= below
    return empty, 100.0, (26 + 24 * (largest - size) / largest if kept else 100.0)


def _pack_scores(
    kinds: Kinds, size: IntArray, room: IntArray, request: int
) -> npt.NDArray[np.float64]:
    """`pack_score` of every GPU of the matrices (-1 where the pod does not fit)."""
    if not kinds.sizes:
        return np.full(size.shape, -1.0)
    table = np.array([_size_scores(kinds, at, request) for at in range(len(kinds.sizes))])
    at = np.minimum(np.searchsorted(kinds.sizes, size), len(kinds.sizes) - 1)
    below = np.asarray(kinds.below, np.int64)[at]
    column = np.where(room >= size, 0, np.where(room < below, 1, 2))
    scores = table[at, column]
    return np.where(room >= request, scores, -1.0)


def _on_node(
    state: ClusterState,
    pod: PodInfo,
    node: str,
    policy: Policy,
    score: float,
    kinds: Kinds | None = None,
) -> Placement:
    gpu = choose_gpu(
        state,
        node,
        pod.request,
        policy,
        kinds,
        on_demand=pod.on_demand,
        avoid=replica_gpus(state, pod, node),
    )
    # max_free said a GPU fits, so there is one; keep the invariant loud if that ever breaks.
    assert gpu is not None, f"node {node} was feasible but no GPU fits"
    return Placement(node, gpu, float(score))


def _memory_score(capacity: float, free: int, request: int) -> float:
    """`_best`'s spread memory score of one node, with its float operations in its order."""
    return MAX_SCORE * (float(free) - request) / capacity


def _best(
    state: ClusterState,
    view: MemoryView,
    pod: PodInfo,
    policy: Policy,
    candidates: np.ndarray[Any, np.dtype[np.int64]],
    affinity: np.ndarray[Any, np.dtype[np.int64]],
    prefer: np.ndarray[Any, np.dtype[np.int64]],
    extra: npt.NDArray[np.float64] | None = None,
    kept: set[int] | None = None,
    held: Mapping[int, frozenset[int]] | None = None,
) -> Placement:
    """Score every candidate; `extra` is the weighted scores of the plugins that look at other
    pods (`binder.framework.filters`), None when they score every candidate alike. Among the
    candidates Kubernetes' scores rate best, those in `kept` (nodes the pod's revision left, which
    may hold its files) come first, before the GPU memory score. `held`: per candidate row, the
    GPUs that hold a replica of the pod's model, left out of its node's binpack score (each
    such node has another GPU that fits)."""
    top_affinity = int(affinity.max())
    affinity_score = (affinity * MAX_SCORE) // top_affinity if top_affinity > 0 else affinity * 0
    top_prefer = int(prefer.max())
    if top_prefer > 0:
        taint_score = MAX_SCORE - (prefer * MAX_SCORE) // top_prefer
    else:
        taint_score = np.full(prefer.shape, MAX_SCORE, np.int64)
    request = pod.request
    base = AFFINITY_WEIGHT * affinity_score + TAINT_WEIGHT * taint_score
    only: npt.NDArray[np.bool_] | None = None
    if kept:
        kubernetes = base if extra is None else base + extra
        only = np.isin(candidates, list(kept)) & (kubernetes == kubernetes.max())
        if not only.any():
            only = None
    if policy == "binpack":
        # Each GPU scored as `pack_score` scores it; a node scores as its best GPU, and its
        # tightest block of that score breaks ties.
        all_sizes, all_rooms = view.gpu_matrices()
        room = all_rooms[candidates]
        kinds = gpu_kinds(state)
        gpu_scores = _pack_scores(kinds, all_sizes[candidates], room, request)
        for row, positions in (held or {}).items():
            for at in positions:
                gpu_scores[row, at] = -1.0
        memory = gpu_scores.max(axis=1)
        unfit = np.iinfo(np.int64).max
        tightest = np.where(gpu_scores == memory[:, None], room, unfit).min(axis=1)
        score = base + MEMORY_WEIGHT * memory
        if extra is not None:
            score = score + extra
        if only is not None:
            score = np.where(only, score, -np.inf)
        top_score = score.max()
        # Equal scores: the tightest block, then node name order.
        tied = np.flatnonzero(score == top_score)
        chosen = int(tied[np.argmin(tightest[tied])])
        node = state.names[int(candidates[chosen])]
        return _on_node(state, pod, node, policy, top_score, kinds)
    capacity = np.maximum(view.capacity[candidates], 1).astype(np.float64)
    free = view.free_total[candidates].astype(np.float64)
    memory = MAX_SCORE * (free - request) / capacity
    score = base + MEMORY_WEIGHT * memory
    if extra is not None:
        score = score + extra
    if only is not None:
        score = np.where(only, score, -np.inf)
    best = score.max()
    ties = np.flatnonzero(score == best)
    chosen = int(candidates[ties[_tie_break(pod.uid, ties.size)]])
    return _on_node(state, pod, state.names[chosen], policy, best)


def _feasible(
    state: ClusterState, pod: PodInfo, cls: ConstraintClass, filters: PodFilters, i: int, now: float
) -> bool:
    """Whether node `i` passes every filter for the pod."""
    node = state.names[i]
    if i in cls.rejected or _node_reason(state, node, now):
        return False
    free = state.memory.free(node, pod.on_demand)
    return max(free, default=0) >= pod.request and filters.passes(i)


def fits_on(state: ClusterState, pod: PodInfo, node: str, now: float) -> bool:
    """Whether the pod passes every filter on this one node (for preemption's what-ifs)."""
    i = state.index.get(node)
    if i is None:
        return False
    cls = state.constraint_class(pod.constraints)
    return _feasible(state, pod, cls, pod_filters(state, pod), i, now)


UNRESOLVABLE = frozenset({REASON_MISSING_LABEL, REASON_AFFINITY_RULES})
"""Pod filter reasons no other pod's leaving can cure (kube-scheduler's
UnschedulableAndUnresolvable): preemption skips those nodes."""


def resolvable_nodes(state: ClusterState, pod: PodInfo, now: float) -> list[str]:
    """The nodes where evicting other pods could let the pod in: they pass Kubernetes' node
    rules, publish GPUs, have a live agent, run the Triton release it needs, hold some charged
    pod of lower priority, and fail no filter that other pods' leaving cannot cure."""
    cls = state.constraint_class(pod.constraints)
    filters = pod_filters(state, pod)
    passing = set(cls.nodes.tolist())
    out = []
    for node in state.nodes_with_lower_priority(pod.priority):
        i = state.index.get(node)
        if i is None or i not in passing or i in filters.version or _node_reason(state, node, now):
            continue
        if not UNRESOLVABLE.intersection(filters.reasons(i)):
            out.append(node)
    return sorted(out)


def _node_reason(state: ClusterState, node: str, now: float) -> str:
    """Our node filters that come before the pod filters: the node publishes readable GPUs and
    its agent is alive; "" when it passes."""
    info = state.nodes[node]
    if info.gpu_problem:
        return REASON_BAD_GPUS
    if not info.gpus:
        return REASON_NO_GPUS
    if state.leases.get(node, 0.0) <= now:
        return REASON_AGENT_DOWN
    return ""


def _unschedulable(
    state: ClusterState, pod: PodInfo, now: float, cls: ConstraintClass, filters: PodFilters
) -> Unschedulable:
    """Count, per reason, the nodes that failed, in filter order: Kubernetes' node rules, the
    node's GPUs and agent, the filters that look at other pods (each of a node's reasons counts,
    as kube-scheduler counts them), then GPU memory. Vectorised where it can be, because a
    helpful cluster change retries every waiting pod at once."""
    reasons: Counter[str] = Counter(cls.rejected_counts)
    nodes = cls.nodes
    status = state.gpu_status[nodes]
    rest = status == GPUS_OK
    for code, reason in ((GPUS_UNREADABLE, REASON_BAD_GPUS), (GPUS_NONE, REASON_NO_GPUS)):
        count = int(np.count_nonzero(status == code))
        if count:
            reasons[reason] += count
    down = rest & (state.lease_expiry[nodes] <= now)
    if down.any():
        reasons[REASON_AGENT_DOWN] += int(np.count_nonzero(down))
    rest &= ~down
    failing = rest & ~filters.ok[nodes]
    for i in nodes[failing]:
        reasons.update(filters.reasons(int(i)))
    rest &= ~failing
    if rest.any() and pod.on_demand:
        reasons.update(_on_demand_memory_reasons(state, pod, nodes[rest]))
    elif rest.any():
        largest = max(0, int(state.view(on_demand=False).max_free[nodes[rest]].max()))
        reasons[reason_memory(largest)] += int(np.count_nonzero(rest))
    return Unschedulable(fit_message(len(state.names), reasons), dict(reasons))


@dataclass(frozen=True)
class NodeVerdict:
    """One node's answer for `explain`: every reason it does not fit, or none."""

    node: str
    reasons: tuple[str, ...]
    free: tuple[int, ...]


def explain(state: ClusterState, pod: PodInfo, *, now: float) -> list[NodeVerdict]:
    """For every node, why the pod does or does not fit there: every Kubernetes node rule it
    breaks, then the first of our node filters, the filters that look at other pods, and GPU
    memory (each when the ones before it pass, as a decision reads them)."""
    state.arrays()
    filters = pod_filters(state, pod)
    verdicts = []
    for i, node in enumerate(state.names):
        free = state.memory.free(node, pod.on_demand)
        reasons = kubernetes_reasons(pod.constraints, state.nodes[node])
        reason = _node_reason(state, node, now)
        if reason:
            reasons.append(reason)
        else:
            reasons += filters.reasons(i)
            largest = max(free, default=0)
            if largest < pod.request and pod.on_demand:
                reasons += _on_demand_memory_reasons(state, pod, np.array([i], np.int64))
            elif largest < pod.request:
                reasons.append(
                    f"Insufficient GPU memory: needs {format_bytes(pod.request)}, the largest "
                    f"free block is {format_bytes(largest)}"
                )
        verdicts.append(NodeVerdict(node, tuple(reasons), tuple(free)))
    return verdicts
