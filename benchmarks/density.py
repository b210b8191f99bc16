"""Density: how many GPUs the binder's placement saves, packed once and under churn, against
whole-GPU serving, a first-fit-decreasing repack and a lower bound, with the placement the binder
used by earlier rules side by side on the same events.

Everything runs through the binder's own placement core, as `benchmarks/binder_placement.py`
drives it: a `ClusterState`, `place()` for each decision, `assume()` to charge the pod,
`remove_pod()` when its deployment leaves. No API server, no clock: seconds are simulated.

The cluster (seeded; `--scale` multiplies the node counts): T4 nodes (16 GiB GPUs) and L4 nodes
(24 GiB) with 1 to 4 GPUs each, A100 nodes (80 GiB) with 8; a 0.5 GiB reserve per GPU, as the
other binder benchmarks use. Each node has the allocatable CPUs, memory and pods of its node
shape (`benchmarks.shapes`): a one-GPU node 4 CPUs (g4dn.xlarge, g6.xlarge), a T4 one 29 pods
(EKS's VPC CNI on g4dn.xlarge); a node of 2 to 4 T4s or L4s 12 CPUs a GPU (g4dn.12xlarge,
g2-standard-48); the A100 nodes 8xA100-80GB:96:110; 110 pods where not said; less its node
pod's requests and slot. Each replica asks
what the webhook writes (`benchmarks.shapes.model_pod_requests`) beside its GPU memory, and the
models belong to 50 namespaces; `--as tritonmodels` makes each replica a TritonModel replica
on its namespace's model host instead (`binder.cluster.modelviews.as_replica`). Every rule below
filters by the binder's NodeResourcesFit (`binder.framework.fit`). The static packing's
first-fit decreasing (`ffd_rule`) places on the same constraints as the binder (its filters:
pinning, node resources and pod slots, one replica of a model a node); the lower bound
(`lower_bound`) relaxes only how replicas split into GPUs and nodes. Churn's FFD repack of the
live set counts GPU memory, pinning and one replica a node only.

The fleet (seeded; each model gets 1 to 3 replicas, uniformly), sizes drawn log-uniformly in each
band. The bands stand for public models' sizes (parameters times bytes per parameter, plus
activations, workspace and, for LLMs, the KV cache):

- 70 %, 0.5-4 GiB: ResNet-50 (25.6 M parameters), BERT-base (110 M) and BERT-large (340 M),
  Whisper small and medium (244 M, 769 M), T5-base and T5-large (220 M, 770 M), in fp16 or fp32;
- 20 %, 4-12 GiB: Whisper large (1.55 B parameters, about 3 GB in fp16), T5-3B (about 6 GB in
  fp16), 7 B LLMs in 8 bits (about 7 GB);
- 8 %, 12-32 GiB: Llama-2-7B and Llama-3-8B in fp16 (13.5 GB and 16 GB of weights), T5-11B in
  fp16 (about 22 GB), Llama-2-13B in fp16 (26 GB);
- 2 %, 40-70 GiB: Llama-2-13B in fp16 with a long KV cache, Llama-2-70B and Llama-3-70B in 4 bits
  (about 35-40 GB of weights) or 8 bits (about 70 GB); pinned to A100 nodes by required node
  affinity.

Five placements decide, each on its own state, the same pods in the same order:
- "before": an earlier binpack of the binder, re-implemented here: a node scores by how full
  it would be relative to its own capacity, then the fullest GPU that fits; ties by the pod uid's
  hash. (It matched `place()` decision for decision on the tree before the change.)
- "kind first": an earlier rule, re-implemented here: the smallest GPU kind the pod fits,
  then the tightest block on a GPU of that kind, ties in node order. It fixed churn but opened an
  empty T4 while a used L4 had room.
- "used first": a later rule, re-implemented here (the same choice as `place()` before
  the third rule in 11,796 of 11,796 churn decisions): a used GPU (the tightest) before an empty
  one, the smallest empty one first, a GPU of the largest kind only when nothing smaller has
  room. It left the room beside big models empty and opened T4s first.
- "binder": `place(policy="binpack")` of this tree: the second rule, except that while a GPU size
  has GPUs to spare its larger empty GPUs open first and, for the largest kind, the remainder
  beside a big model too small for anything only that kind holds is filled; once a size is
  short, its blocks that a model needing it could use are left to such models.
- "tightest": for comparison, the tightest free block in bytes on any GPU, whatever its size.

Churn runs one more column, "binder + moves": the binder's placement, and when a pod fits no GPU,
`binder.framework.consolidation.plan` with its cooldowns in simulated time, as the binder runs it
with `--consolidate-moves 4`: the pods it names are removed, the pod is placed, then they are placed
again (their controllers' new pods).

Static packing places the whole fleet in a random order (pods arrive in whatever order their owners
create them; the binder's queue keeps kube-scheduler's first-in-first-out order), and, on two more
lines, the binder's placement of the same fleet with each Deployment's replicas queued together (a
ReplicaSet creates them at once), and bound largest first, which is what a queue sorted by size
would give a backlog. One table holds them all, with whole-GPU serving, the lower bound and
first-fit decreasing: GPUs in use by kind, GPUs, GiB of the GPUs opened (what is paid for), how full
those are, and replicas refused. The goals (checked unless `--no-goal`): the binder opens at most
`FFD_GIB_GOAL` times FFD's GiB, and refuses no more replicas. Churn runs deployments (drawn from the
same distribution) arriving as a Poisson process and living an exponential time, at a load where the
requested bytes of the live deployments average `--load` of the cluster's usable memory; the binder
retries pending pods when memory is freed, as the live binder retries on cluster changes. It starts
empty, warms up for one mean lifetime and then measures for `--lifetimes` more.

Run: .venv/bin/python -m benchmarks.density [--scale 1 --models 2000 --load 0.85 --lifetimes 4]
[--no-goal] (`--scale 0.2 --models 400 --lifetimes 2` for a smoke test).
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from benchmarks import command_line, goals, shapes
from benchmarks import results as results_page
from binder.cluster.clusterstate import ClusterState, IntArray
from binder.cluster.modelviews import as_replica
from binder.cluster.objects import Constraints, NodeInfo, PodInfo, constraints_from_spec
from binder.framework.consolidation import Cooldowns, plan
from binder.framework.fit import fit_mask
from binder.framework.noderules import NODE_RULES
from binder.framework.placement import MAX_SCORE, Placement, place

GI = 1024**3
RESERVE = GI // 2
NOW = 1_000_000.0
KINDS = {"t4": 16 * GI, "l4": 24 * GI, "a100": 80 * GI}
NODES = {"t4": 320, "l4": 200, "a100": 20}
"""Nodes of each kind at scale 1 (T4 and L4: 1-4 GPUs each, A100: 8)."""
NAMESPACES = 50


def node_shape(kind: str, gpus: int) -> shapes.NodeShape:
    """The node shape of a node of `gpus` GPUs of `kind` (the module's docstring says why)."""
    if kind == "a100":
        return shapes.parse_shape(f"{gpus}xA100-80GB:{12 * gpus}:110")
    model = {"t4": "T4", "l4": "L4"}[kind]
    if gpus == 1:
        return shapes.parse_shape(f"1x{model}:4:{29 if kind == 't4' else 110}")
    return shapes.parse_shape(f"{gpus}x{model}:{12 * gpus}:110")


BANDS = (
    ("small", 0.70, 0.5, 4.0, False),
    ("medium", 0.20, 4.0, 12.0, False),
    ("large", 0.08, 12.0, 32.0, False),
    ("llm", 0.02, 40.0, 70.0, True),
)
"""(name, share of models, smallest and largest GiB, pinned to A100 nodes)."""
BIG = 40 * GI
"""A free block this large is what a big model needs; smaller A100 blocks are stranded for it."""
PINNED = constraints_from_spec(
    {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}
                    ]
                }
            }
        }
    }
)

Rule = Callable[[ClusterState, PodInfo], "tuple[str, str] | None"]


# ---- the cluster and the fleet -----------------------------------------------------------------


@dataclass(frozen=True)
class Cluster:
    nodes: tuple[NodeInfo, ...]

    def kind(self, node: NodeInfo) -> str:
        return node.labels["gpu"]

    def usable(self) -> int:
        return sum(g.memory - RESERVE for n in self.nodes for g in n.gpus)

    def gpus(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)


def make_cluster(scale: float, seed: int) -> Cluster:
    rng = random.Random(seed)
    nodes = []
    for kind, count in NODES.items():
        for i in range(max(1, round(count * scale))):
            name = f"{kind}-{i:04d}"
            gpus = 8 if kind == "a100" else rng.randint(1, 4)
            nodes.append(node_shape(kind, gpus).node(name, labels={"gpu": kind}))
    return Cluster(tuple(nodes))


@dataclass(frozen=True)
class Deployment:
    model: str
    band: str
    request: int
    replicas: int
    hosted: bool = False
    """TritonModel replicas on their namespace's model hosts (`--as tritonmodels`), not pods."""

    def pods(self) -> list[PodInfo]:
        constraints = PINNED if self.band == "llm" else Constraints()
        namespace = f"team-{zlib.crc32(self.model.encode()) % NAMESPACES:02d}"
        pods = [
            PodInfo(
                uid=f"{self.model}-{r}",
                namespace=namespace,
                name=f"{self.model}-{r}",
                scheduler_name="tritonshare",
                request=self.request,
                model_id=self.model,
                constraints=constraints,
                controlled=True,
                resources=shapes.model_pod_requests(),
            )
            for r in range(self.replicas)
        ]
        return [as_replica(pod) for pod in pods] if self.hosted else pods


def make_deployment(rng: random.Random, model: str, hosted: bool = False) -> Deployment:
    roll, band = rng.random(), BANDS[-1]
    for candidate in BANDS:
        if roll < candidate[1]:
            band = candidate
            break
        roll -= candidate[1]
    name, _, low, high, _ = band
    size = math.exp(rng.uniform(math.log(low), math.log(high)))
    return Deployment(model, name, int(size * 4) * GI // 4, rng.randint(1, 3), hosted)


def mean_bytes(rng: random.Random, samples: int = 20000) -> float:
    """Requested bytes of one deployment (all its replicas), on average."""
    total = 0
    for i in range(samples):
        d = make_deployment(rng, f"probe-{i}")
        total += d.request * d.replicas
    return total / samples


def fresh_state(cluster: Cluster) -> ClusterState:
    state = ClusterState(rules=NODE_RULES, reserve=RESERVE)
    for node in cluster.nodes:
        state.set_node(node)
        state.set_lease(node.name, NOW + 3600)
    return state


# ---- the two placements ------------------------------------------------------------------------


def eligible_nodes(state: ClusterState, pod: PodInfo) -> IntArray:
    """The pod's class's nodes (numpy indices) with a block big enough, a live agent, room for
    the pod's requests and slot (NodeResourcesFit), and no replica of its model revision."""
    nodes = state.constraint_class(pod.constraints).nodes
    max_free = state.view(on_demand=False).max_free
    ok = (max_free[nodes] >= pod.request) & (state.lease_expiry[nodes] > NOW)
    ok &= ~state.model_mask(pod.model_key)[nodes] & fit_mask(state, pod)[nodes]
    return nodes[ok]


def gpu_at_least(state: ClusterState, candidates: IntArray, cost: IntArray) -> tuple[str, str]:
    """The node and GPU of the smallest `cost` (a candidates x GPUs matrix), first in node and
    GPU order on ties."""
    row, position = np.unravel_index(int(np.argmin(cost)), cost.shape)
    node = state.names[int(candidates[row])]
    return node, state.nodes[node].gpus[int(position)].uuid


def binder_rule(state: ClusterState, pod: PodInfo) -> tuple[str, str] | None:
    result = place(state, pod, now=NOW, policy="binpack")
    return (result.node, result.gpu.uuid) if isinstance(result, Placement) else None


def before_rule(state: ClusterState, pod: PodInfo) -> tuple[str, str] | None:
    """The earlier binpack: the node that would be fullest relative to its own capacity (the
    same float operations as the binder's scan then, so ties are the same), then the fullest
    GPU that fits. The fleet has no preferred terms and no PreferNoSchedule taints, so the other
    plugins score every node alike (NodeAffinity 0, TaintToleration 3 x 100)."""
    candidates = eligible_nodes(state, pod)
    if not candidates.size:
        return None
    plain = state.view(on_demand=False)
    capacity = np.maximum(plain.capacity[candidates], 1).astype(np.float64)
    free = plain.free_total[candidates].astype(np.float64)
    memory = MAX_SCORE * (capacity - free + pod.request) / capacity
    score = np.zeros(candidates.size, np.int64) + 3 * MAX_SCORE + memory
    ties = np.flatnonzero(score == score.max())
    chosen = state.names[int(candidates[ties[zlib.crc32(pod.uid.encode()) % ties.size]])]
    gpus = state.nodes[chosen].gpus
    fitting = [(f, g.index, g.uuid) for f, g in zip(state.memory.free(chosen), gpus, strict=True)]
    return chosen, min(item for item in fitting if item[0] >= pod.request)[2]


def kind_first_rule(state: ClusterState, pod: PodInfo) -> tuple[str, str] | None:
    """The "kind first" rule: the smallest GPU size the pod fits, then the tightest block of that
    size, ties in node order (the first such GPU in node and GPU order)."""
    candidates = eligible_nodes(state, pod)
    if not candidates.size:
        return None
    size, room = (matrix[candidates] for matrix in state.view(on_demand=False).gpu_matrices())
    fits = room >= pod.request
    smallest = np.where(fits, size, np.iinfo(np.int64).max).min()
    room = np.where(fits & (size == smallest), room, np.iinfo(np.int64).max)
    return gpu_at_least(state, candidates, room)


def used_first_rule(state: ClusterState, pod: PodInfo) -> tuple[str, str] | None:
    """The "used first" rule, the binder's binpack before the kinds' spare GPUs counted: a used
    GPU (the tightest) before an empty one, the smallest empty one first, a GPU of the largest
    kind (within a tenth of the largest) last, used before empty; ties in node order."""
    candidates = eligible_nodes(state, pod)
    if not candidates.size:
        return None
    size, room = (matrix[candidates] for matrix in state.view(on_demand=False).gpu_matrices())
    top = max(state.memory.largest_usable(), 1)
    used = room < size
    rank = np.where(used, 2 * top + 2, top + 2 - size)
    rank = np.where(size * 10 >= top * 9, used, rank)
    rank = np.where(room >= pod.request, rank, -1)
    room = np.where(rank == rank.max(), room, np.iinfo(np.int64).max)
    return gpu_at_least(state, candidates, room)


def tightest_rule(state: ClusterState, pod: PodInfo) -> tuple[str, str] | None:
    """For comparison, the naive online rule: the tightest free block in bytes on any GPU of
    any kind (what the binder's binpack does within one GPU size), ties in node order."""
    candidates = eligible_nodes(state, pod)
    if not candidates.size:
        return None
    room = state.view(on_demand=False).gpu_matrices()[1][candidates]
    waste = np.where(room >= pod.request, room - pod.request, np.iinfo(np.int64).max)
    return gpu_at_least(state, candidates, waste)


RULES: dict[str, Rule] = {
    "before": before_rule,
    "kind first": kind_first_rule,
    "used first": used_first_rule,
    "binder": binder_rule,
    "tightest": tightest_rule,
}


# ---- first-fit-decreasing repack and the lower bound -------------------------------------------


class FirstFit:
    """The cluster's GPUs, largest kind first, in a max-segment tree of free bytes, so "the first
    GPU at or after i with a block of r bytes" costs O(log GPUs)."""

    def __init__(self, cluster: Cluster) -> None:
        order = sorted(cluster.nodes, key=lambda n: (-KINDS[cluster.kind(n)], n.name))
        self.owner: list[str] = []
        self.kind: list[str] = []
        self.node_end: dict[str, int] = {}
        sizes: list[int] = []
        for node in order:
            for gpu in node.gpus:
                sizes.append(gpu.memory - RESERVE)
                self.owner.append(node.name)
                self.kind.append(cluster.kind(node))
            self.node_end[node.name] = len(sizes)
        self.capacity = sizes
        self.size = 1 << max(1, (len(sizes) - 1).bit_length())
        self.tree = [0] * (2 * self.size)
        for i, s in enumerate(sizes):
            self.tree[self.size + i] = s
        for i in range(self.size - 1, 0, -1):
            self.tree[i] = max(self.tree[2 * i], self.tree[2 * i + 1])
        self.first_a100 = self.kind.index("a100") if "a100" in self.kind else len(sizes)
        self.a100_end = len(sizes) - self.kind[::-1].index("a100") if "a100" in self.kind else 0

    def free(self, i: int) -> int:
        return self.tree[self.size + i]

    def take(self, i: int, amount: int) -> None:
        i += self.size
        self.tree[i] -= amount
        i //= 2
        while i:
            self.tree[i] = max(self.tree[2 * i], self.tree[2 * i + 1])
            i //= 2

    def first(self, start: int, end: int, request: int) -> int:
        """The first GPU in [start, end) with at least `request` free, or -1."""
        return self._first(1, 0, self.size, start, end, request)

    def _first(self, node: int, lo: int, hi: int, start: int, end: int, request: int) -> int:
        if hi <= start or lo >= end or self.tree[node] < request:
            return -1
        if hi - lo == 1:
            return lo
        mid = (lo + hi) // 2
        found = self._first(2 * node, lo, mid, start, end, request)
        return found if found >= 0 else self._first(2 * node + 1, mid, hi, start, end, request)


class Packed(NamedTuple):
    gpus: int
    gib: int
    """GiB of the GPUs that hold a pod."""
    failed: int
    """Pods it could not place."""
    by_kind: Counter[str]
    """GPUs that hold a pod, per kind."""


def ffd(cluster: Cluster, pods: Iterable[PodInfo]) -> Packed:
    """First-fit-decreasing over the cluster's GPUs (largest kind first), with the same rules as
    the binder (pinned pods on A100 nodes only, one replica of a model per node)."""
    fit = FirstFit(cluster)
    nodes_of: dict[str, set[str]] = defaultdict(set)
    failed = 0
    for pod in sorted(pods, key=lambda p: (-p.request, p.uid)):
        pinned = pod.constraints == PINNED
        start, end = (fit.first_a100, fit.a100_end) if pinned else (0, len(fit.capacity))
        while True:
            i = fit.first(start, end, pod.request)
            if i < 0:
                failed += 1
                break
            if fit.owner[i] in nodes_of[pod.model_id]:
                start = fit.node_end[fit.owner[i]]
                continue
            fit.take(i, pod.request)
            nodes_of[pod.model_id].add(fit.owner[i])
            break
    used = [i for i, c in enumerate(fit.capacity) if fit.free(i) < c]
    gib = sum(fit.capacity[i] + RESERVE for i in used) // GI
    return Packed(len(used), gib, failed, Counter(fit.kind[i] for i in used))


def lower_bound(cluster: Cluster, pods: list[PodInfo]) -> int:
    """GPUs no placement on the binder's constraints can do with fewer than: the most of the
    fewest whose usable memory holds every requested byte (largest first), the fewest A100 GPUs
    whose memory holds the pinned replicas' bytes, and the fewest nodes (a GPU each at least)
    whose room for the replicas' requests and pod slots holds every replica. It relaxes how
    replicas split into GPUs and nodes, so it is a bound, not always a packing."""

    def fewest(sizes: list[int], wanted: int) -> int:
        """The fewest of `sizes` adding up to `wanted` (all of them when they cannot)."""
        total = count = 0
        for size in sorted(sizes, reverse=True):
            if total >= wanted:
                break
            total, count = total + size, count + 1
        return count

    usable = [g.memory - RESERVE for n in cluster.nodes for g in n.gpus]
    a100 = [g.memory - RESERVE for n in cluster.nodes if cluster.kind(n) == "a100" for g in n.gpus]
    pinned = sum(p.request for p in pods if p.constraints == PINNED)
    bound = max(fewest(usable, sum(p.request for p in pods)), fewest(a100, pinned))
    if pods:
        asks = dict(pods[0].resources)
        if pods[0].host is None:
            asks["pods"] = 1
        if all(dict(p.resources) == dict(pods[0].resources) for p in pods) and any(asks.values()):
            room = [
                min(
                    (n.allocatable or {}).get(name, 0) // amount
                    for name, amount in asks.items()
                    if amount
                )
                for n in cluster.nodes
            ]
            bound = max(bound, fewest(room, len(pods)))
    return bound


def ffd_rule(cluster: Cluster) -> Rule:
    """First fit over the GPUs, largest kind first, node by node (given the replicas largest
    first: first-fit decreasing), on the binder's constraints: the first node the binder's
    filters leave (`eligible_nodes`: pinning, node resources and pod slots, one replica of a
    model a node, a block big enough), and its first GPU with room."""
    order = sorted(cluster.nodes, key=lambda n: (-KINDS[cluster.kind(n)], n.name))
    rank = {node.name: i for i, node in enumerate(order)}

    def rule(state: ClusterState, pod: PodInfo) -> tuple[str, str] | None:
        candidates = eligible_nodes(state, pod)
        if not candidates.size:
            return None
        node = min((state.names[int(i)] for i in candidates), key=rank.__getitem__)
        frees = state.memory.free(node)
        for gpu, free in zip(state.nodes[node].gpus, frees, strict=True):
            if free >= pod.request:
                return node, gpu.uuid
        return None

    return rule


# ---- what a state looks like -------------------------------------------------------------------


@dataclass
class Picture:
    """A state's GPUs by kind: used, empty, largest free block, memory held by models that would
    fit a smaller kind, free memory stranded on used GPUs."""

    used: Counter[str] = field(default_factory=Counter)
    total: Counter[str] = field(default_factory=Counter)
    used_gib: float = 0.0
    largest: dict[str, int] = field(default_factory=dict)
    held_by_smaller: Counter[str] = field(default_factory=Counter)
    held: Counter[str] = field(default_factory=Counter)
    free_on_used: int = 0
    a100_small_blocks: int = 0
    big_blocks: int = 0


def picture(cluster: Cluster, state: ClusterState) -> Picture:
    out = Picture()
    smaller = {"a100": KINDS["l4"] - RESERVE, "l4": KINDS["t4"] - RESERVE, "t4": 0}
    for node in cluster.nodes:
        kind = cluster.kind(node)
        frees = state.memory.free(node.name)
        by_gpu: dict[int, list[int]] = defaultdict(list)
        for pod, position in state.pods_on(node.name):
            by_gpu[position].append(pod.request)
        for position, (gpu, free) in enumerate(zip(node.gpus, frees, strict=True)):
            out.total[kind] += 1
            out.largest[kind] = max(out.largest.get(kind, 0), free)
            requests = by_gpu.get(position, [])
            out.held[kind] += sum(requests)
            out.held_by_smaller[kind] += sum(r for r in requests if r <= smaller[kind])
            if requests:
                out.used[kind] += 1
                out.used_gib += gpu.memory / GI
                out.free_on_used += free
            if kind == "a100":
                if free >= BIG:
                    out.big_blocks += 1
                else:
                    out.a100_small_blocks += free
    return out


# ---- static packing ----------------------------------------------------------------------------


def whole_gpu(request: int) -> int:
    """The GPU memory a replica holds when it has a GPU to itself: the smallest kind it fits."""
    return min(size for size in KINDS.values() if size - RESERVE >= request)


class Row(NamedTuple):
    """A static packing's line: GPUs holding a replica, per kind; GiB of those GPUs (what is
    paid for); how full they are; replicas refused."""

    name: str
    used: Counter[str]
    gib: float
    held: int
    refused: int


FFD = "FFD, largest GPUs first"
BINDER = "binder"
FFD_GIB_GOAL = 1.05
"""The binder's GiB of GPUs opened over first-fit decreasing's on the same constraints."""


def static_table(rows: list[Row], whole: int, whole_gib: int, bound: int, requested: int) -> None:
    """One table: whole-GPU serving, the lower bound, then each packing, on the same cluster and
    constraints: GPUs by kind, GPUs, GiB of GPUs opened, how full, refused."""
    kinds = "".join(f"{kind:>6}" for kind in KINDS)
    print(f"{'static packing':<34}{kinds}{'GPUs':>7}{'GiB opened':>12}{'full':>7}{'refused':>8}")
    dash = "".join(f"{'-':>6}" for _ in KINDS)
    print(f"{'whole-GPU serving (1 GPU a replica)':<34}{dash}{whole:>7}{whole_gib:>12,}")
    bound_gib = (requested + bound * RESERVE) / GI
    print(f"{'lower bound (same constraints)':<34}{dash}{bound:>7}{bound_gib:>12,.0f}")
    ffd = next(r for r in rows if r.name == FFD)
    for row in rows:
        gpus = sum(row.used.values())
        cells = "".join(f"{row.used[kind]:>6}" for kind in KINDS)
        full = row.held / GI / row.gib if row.gib else 0.0
        line = f"{row.name:<34}{cells}{gpus:>7}{row.gib:>12,.0f}{full:>7.0%}{row.refused:>8}"
        if row is not ffd:
            line += (
                f"   {whole / gpus:.1f}x fewer GPUs than whole-GPU serving; against FFD "
                f"{gpus / sum(ffd.used.values()) - 1:+.1%} GPUs, {row.gib / ffd.gib - 1:+.1%} GiB"
            )
        print(line)


def check_goals(rows: list[Row]) -> list[bool]:
    """The binder's static packing against first-fit decreasing's on the same constraints: GiB
    of GPUs opened within `FFD_GIB_GOAL`, and no more replicas refused."""
    ffd = next(r for r in rows if r.name == FFD)
    binder = next(r for r in rows if r.name == BINDER)
    return [
        goals.check(
            "binder's GiB of GPUs opened / FFD's", binder.gib / ffd.gib, FFD_GIB_GOAL, unit="x"
        ),
        goals.check("binder's replicas refused", binder.refused, ffd.refused),
    ]


def static(cluster: Cluster, models: int, seed: int, hosted: bool) -> list[Row]:
    rng = random.Random(seed)
    fleet = [make_deployment(rng, f"m{i:05d}", hosted) for i in range(models)]
    pods = [p for d in fleet for p in d.pods()]
    rng.shuffle(pods)
    requested = sum(p.request for p in pods)
    by_band = Counter(d.band for d in fleet)
    print(
        f"fleet: {models} models ({', '.join(f'{by_band[b[0]]} {b[0]}' for b in BANDS)}), "
        f"{len(pods)} replicas, {requested / GI:,.0f} GiB requested "
        f"({requested / cluster.usable():.0%} of the cluster's usable GPU memory)"
    )
    whole_gib = sum(whole_gpu(p.request) for p in pods) // GI
    largest_first = sorted(pods, key=lambda p: (-p.request, p.uid))
    runs: list[tuple[str, Rule, list[PodInfo]]] = [(FFD, ffd_rule(cluster), largest_first)]
    runs += [(name, rule, pods) for name, rule in RULES.items()]
    runs.append(("binder, bound largest first", binder_rule, largest_first))
    # A ReplicaSet creates its replicas together, so a real queue holds them next to each other.
    together = [p for d in random.Random(seed + 3).sample(fleet, len(fleet)) for p in d.pods()]
    runs.append(("binder, replicas queued together", binder_rule, together))
    rows = []
    for name, rule, order in runs:
        state = fresh_state(cluster)
        refused = 0
        started = time.perf_counter()
        for pod in order:
            chosen = rule(state, pod)
            if chosen is None:
                refused += 1
            else:
                state.assume(pod, *chosen)
        seconds = time.perf_counter() - started
        seen = picture(cluster, state)
        rows.append(Row(name, seen.used, seen.used_gib, sum(seen.held.values()), refused))
        if rule is binder_rule and order is pods:
            print(f"binder: {1e3 * seconds / len(pods):.2f} ms a decision")
    static_table(rows, len(pods), whole_gib, lower_bound(cluster, pods), requested)
    return rows


def by_kind(used: Counter[str], held: Counter[str] | None = None) -> str:
    """GPUs in use per kind, and how full they are (of their usable memory)."""
    cells = []
    for kind, size in KINDS.items():
        cell = f"{kind} {used[kind]}"
        if held is not None and used[kind]:
            cell += f" ({held[kind] / (used[kind] * (size - RESERVE)):.0%} full)"
        cells.append(cell)
    return f"{'':<4}GPUs in use by kind: {', '.join(cells)}"


# ---- churn -------------------------------------------------------------------------------------


@dataclass
class Events:
    """Arrivals and departures, generated once and replayed for every rule."""

    arrivals: list[tuple[float, float, Deployment]]
    """(arrival, departure, deployment), by arrival."""
    warmup: float
    end: float
    samples: list[float]


def make_events(
    cluster: Cluster, load: float, lifetime: float, lifetimes: float, seed: int, hosted: bool
) -> Events:
    rng = random.Random(seed)
    rate = load * cluster.usable() / (lifetime * mean_bytes(random.Random(seed + 1)))
    end = lifetime * (1 + lifetimes)
    arrivals = []
    t, i = 0.0, 0
    while True:
        t += rng.expovariate(rate)
        if t >= end:
            break
        d = make_deployment(rng, f"c{i:06d}", hosted)
        arrivals.append((t, t + rng.expovariate(1 / lifetime), d))
        i += 1
    samples = [lifetime + lifetime * lifetimes * (k + 1) / 20 for k in range(20)]
    return Events(arrivals, lifetime, end, samples)


@dataclass
class Churned:
    unplaced: list[float] = field(default_factory=list)
    live_gib: list[float] = field(default_factory=list)
    refusals: Counter[str] = field(default_factory=Counter)
    refused_gib: Counter[str] = field(default_factory=Counter)
    big_refused: int = 0
    big_arrivals: int = 0
    big_repackable: int = 0
    repackable_blocks: list[tuple[int, int, int]] = field(default_factory=list)
    """For each of those: (request, largest A100 block, A100 free memory in all), GiB."""
    decisions: int = 0
    seconds: float = 0.0
    gpus_used: list[int] = field(default_factory=list)
    ffd_used: list[int] = field(default_factory=list)
    ffd_failed: list[int] = field(default_factory=list)
    end: Picture = field(default_factory=Picture)
    moves: int = 0
    """Pods moved to make room (consolidation), over the whole run."""
    made_room: int = 0
    """Pending pods placed once pods moved."""
    not_replaced: int = 0
    """Moved pods that found no GPU again at once."""


def cause(state: ClusterState, pod: PodInfo) -> str:
    """Why a pod fits nowhere: a GPU block only on nodes without room for its requests or slot
    (node resources), only on nodes with a replica of its model (one replica per node), no
    block although the eligible nodes have the memory in total (fragmentation), or no room."""
    cls = state.constraint_class(pod.constraints)
    has_model = state.model_mask(pod.model_key)
    fits = fit_mask(state, pod)
    total = 0
    blocked_by_model = blocked_by_resources = False
    for i in cls.nodes.tolist():
        frees = state.memory.free(state.names[i])
        if not fits[i]:
            blocked_by_resources |= max(frees, default=0) >= pod.request
        elif has_model[i]:
            blocked_by_model |= max(frees, default=0) >= pod.request
        else:
            total += sum(frees)
    if blocked_by_resources:
        return "node resources"
    if blocked_by_model:
        return "one replica per node"
    return "fragmentation" if total >= pod.request else "no room"


def a100_blocks(cluster: Cluster, state: ClusterState, request: int) -> tuple[int, int, int]:
    frees = [
        f for n in cluster.nodes if cluster.kind(n) == "a100" for f in state.memory.free(n.name)
    ]
    return request // GI, max(frees) // GI, sum(frees) // GI


def churn(
    cluster: Cluster, events: Events, rule: Rule, check_big: bool, consolidate: bool = False
) -> Churned:
    out = Churned()
    state = fresh_state(cluster)
    placed: dict[str, PodInfo] = {}
    pending: dict[str, PodInfo] = {}
    where: dict[str, str] = {}
    departures: list[tuple[float, int, Deployment]] = []
    samples = list(events.samples)

    def decide(pod: PodInfo) -> bool:
        started = time.perf_counter()
        chosen = rule(state, pod)
        out.seconds += time.perf_counter() - started
        out.decisions += 1
        if chosen is None:
            return False
        state.assume(pod, *chosen)
        # The watch shows it bound (only a pod seen bound may be moved to make room).
        state.set_pod(replace(pod, node_name=chosen[0], gpu_uuid=chosen[1], phase="Running"))
        placed[pod.uid] = pod
        where[pod.uid] = chosen[0]
        return True

    cooldowns = Cooldowns()

    def make_room(pod: PodInfo, at: float) -> bool:
        """Consolidation, as the controller runs it at simulated time `at`: plan, remove the
        pods it names, place the pod, then place them again (their controllers' new pods)."""
        recent = cooldowns.pods(at)
        if pod.uid in recent:
            return False
        found = plan(state, pod, now=NOW, exempt=recent, cold_nodes=cooldowns.nodes(at))
        cooldowns.planned(pod, found, at)
        if found is None:
            return False
        for victim in found.moves:
            state.remove_pod(victim.uid)
            placed.pop(victim.uid)
            where.pop(victim.uid)
        out.moves += len(found.moves)
        ok = decide(pod)
        out.made_room += ok
        for victim in found.moves:
            if not decide(victim):
                pending[victim.uid] = victim
                out.not_replaced += 1
        return ok

    def sample() -> None:
        live = sum(p.request for p in placed.values()) + sum(p.request for p in pending.values())
        out.unplaced.append(sum(p.request for p in pending.values()) / max(live, 1))
        out.live_gib.append(live / GI)
        out.gpus_used.append(sum(picture(cluster, state).used.values()))
        packed = ffd(cluster, [*placed.values(), *pending.values()])
        out.ffd_used.append(packed.gpus)
        out.ffd_failed.append(packed.failed)

    def depart(deployment: Deployment) -> None:
        touched = set()
        for pod in deployment.pods():
            pending.pop(pod.uid, None)
            if placed.pop(pod.uid, None) is not None:
                touched.add(where.pop(pod.uid))
                state.remove_pod(pod.uid)
        # Retry what waits, as the binder does when memory is freed; only a pod that fits the
        # largest block the departure left can be placed now.
        room = max((max(state.memory.free(n), default=0) for n in touched), default=0)
        for uid, pod in list(pending.items()):
            if pod.request <= room and decide(pod):
                del pending[uid]
                room = max((max(state.memory.free(n), default=0) for n in touched), default=0)

    for order, (arrival, leaves, deployment) in enumerate(events.arrivals):
        while departures and departures[0][0] <= arrival:
            depart(heapq.heappop(departures)[2])
        while samples and samples[0] <= arrival:
            samples.pop(0)
            sample()
        heapq.heappush(departures, (leaves, order, deployment))
        measured = arrival >= events.warmup
        for pod in deployment.pods():
            if decide(pod) or (consolidate and make_room(pod, arrival)):
                continue
            pending[pod.uid] = pod
            if not measured:
                continue
            why = cause(state, pod)
            out.refusals[why] += 1
            out.refused_gib[why] += pod.request // GI
            if deployment.band == "llm":
                out.big_refused += 1
                if check_big and ffd(cluster, [*placed.values(), pod]).failed == 0:
                    out.big_repackable += 1
                    out.repackable_blocks.append(a100_blocks(cluster, state, pod.request))
        if measured and deployment.band == "llm":
            out.big_arrivals += deployment.replicas
    out.end = picture(cluster, state)
    return out


def kind_rows(kind: str) -> list[tuple[str, Callable[[Churned], str]]]:
    def empty(r: Churned) -> str:
        return f"{r.end.total[kind] - r.end.used[kind]} / {r.end.total[kind]}"

    def largest(r: Churned) -> str:
        return f"{r.end.largest.get(kind, 0) / GI:.1f} GiB"

    return [(f"  {kind}: empty GPUs / all", empty), (f"  {kind}: largest free block", largest)]


def report_churn(cluster: Cluster, results: dict[str, Churned]) -> None:
    names = list(results)
    rows: list[tuple[str, Callable[[Churned], str]]] = [
        ("live requested GiB (mean)", lambda r: f"{np.mean(r.live_gib):,.0f}"),
        ("unplaced requested bytes (mean)", lambda r: f"{np.mean(r.unplaced):.2%}"),
        ("unplaced requested bytes (worst)", lambda r: f"{max(r.unplaced):.2%}"),
        ("refused replicas on arrival", lambda r: f"{sum(r.refusals.values())}"),
        ("  for no room", lambda r: f"{r.refusals['no room']} ({r.refused_gib['no room']} GiB)"),
        (
            "  for fragmentation alone",
            lambda r: f"{r.refusals['fragmentation']} ({r.refused_gib['fragmentation']} GiB)",
        ),
        ("  for one replica per node", lambda r: f"{r.refusals['one replica per node']}"),
        ("  for node resources (pods, CPU)", lambda r: f"{r.refusals['node resources']}"),
        ("big-model replicas arrived", lambda r: f"{r.big_arrivals}"),
        ("  refused", lambda r: f"{r.big_refused}"),
        ("  refused, FFD repack would place", lambda r: f"{r.big_repackable}"),
        (
            "    first: GiB asked/largest a100 block/a100 free",
            lambda r: "/".join(map(str, r.repackable_blocks[0])) if r.repackable_blocks else "-",
        ),
        ("GPUs in use (mean)", lambda r: f"{np.mean(r.gpus_used):,.0f}"),
        (
            "FFD repack of the live set, GPU memory only (mean)",
            lambda r: f"{np.mean(r.ffd_used):,.0f}",
        ),
        ("  replicas FFD cannot place (mean)", lambda r: f"{np.mean(r.ffd_failed):.1f}"),
        ("ms per decision", lambda r: f"{1e3 * r.seconds / max(r.decisions, 1):.3f}"),
        ("pods moved to make room (whole run)", lambda r: f"{r.moves}"),
        ("  pending pods placed by a move", lambda r: f"{r.made_room}"),
        ("  moved pods not placed again at once", lambda r: f"{r.not_replaced}"),
        ("at the end:", lambda r: ""),
    ]
    for kind in KINDS:
        rows += kind_rows(kind)
    rows += [
        (
            "  a100 memory held by models a smaller GPU fits",
            lambda r: f"{r.end.held_by_smaller['a100'] / max(r.end.held['a100'], 1):.0%}",
        ),
        ("  a100 GPUs with a 40 GiB free block", lambda r: f"{r.end.big_blocks}"),
        (
            "  a100 free memory stranded in smaller blocks",
            lambda r: f"{r.end.a100_small_blocks / GI:,.0f} GiB",
        ),
        ("  free memory on GPUs in use", lambda r: f"{r.end.free_on_used / GI:,.0f} GiB"),
    ]
    print(f"{'churn':<48}" + "".join(f"{n:>20}" for n in names))
    for label, cell in rows:
        print(f"{label:<48}" + "".join(f"{cell(results[n]):>20}" for n in names))


def main() -> int:
    parser = command_line(
        "density",
        (
            "Measures how many GPUs and how much GPU memory the binder's placement uses on a "
            "mixed T4/L4/A100 cluster (--scale multiplies it) for --models models, packed "
            "once and under churn at --load of the usable memory, against whole-GPU serving, "
            "first-fit decreasing and a lower bound."
        ),
    )
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies the node counts")
    parser.add_argument("--models", type=int, default=2000, help="models in the static fleet")
    parser.add_argument("--load", type=float, default=0.85, help="churn: requested / usable")
    parser.add_argument("--lifetime", type=float, default=3600.0, help="mean lifetime, seconds")
    parser.add_argument("--lifetimes", type=float, default=4.0, help="measured, after warm-up")
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument(
        "--as",
        dest="as_",
        choices=("pods", "tritonmodels"),
        default="pods",
        help="each replica a pod, or a TritonModel replica on its namespace's host (pods)",
    )
    parser.add_argument(
        "--no-repack-check",
        action="store_true",
        help="skip the FFD repack run for each refused big-model replica",
    )
    results_page.add_flag(parser)
    goals.add_flag(parser)
    args = parser.parse_args()
    with results_page.captured() as printed:
        verdicts = run(args)
    if args.write_results is not None:
        results_page.record("density", printed.getvalue(), page=args.write_results)
    return goals.exit_code(verdicts, args.no_goal)


def run(args: argparse.Namespace) -> list[bool]:
    started = time.perf_counter()
    cluster = make_cluster(args.scale, args.seed)
    kinds = Counter(cluster.kind(n) for n in cluster.nodes for _ in n.gpus)
    print(
        f"cluster: {len(cluster.nodes)} nodes, {cluster.gpus()} GPUs "
        f"({', '.join(f'{kinds[k]} {k}' for k in KINDS)}), "
        f"{cluster.usable() / GI:,.0f} GiB usable (0.5 GiB reserve per GPU)"
    )
    counted = Counter(str(node_shape(cluster.kind(n), len(n.gpus))) for n in cluster.nodes)
    each = (
        f"a pod of {_requests(shapes.model_pod_requests())} (the webhook's)"
        if args.as_ == "pods"
        else "a TritonModel replica on its namespace's model host"
    )
    print(
        f"node shapes: {', '.join(f'{count} {shape}' for shape, count in sorted(counted.items()))}"
        f"; each replica {each}, in {NAMESPACES} namespaces"
    )
    hosted = args.as_ == "tritonmodels"
    verdicts = check_goals(static(cluster, args.models, args.seed, hosted))
    events = make_events(cluster, args.load, args.lifetime, args.lifetimes, args.seed + 2, hosted)
    print(
        f"\nchurn: {len(events.arrivals)} deployments arriving over {1 + args.lifetimes:g} mean "
        f"lifetimes at {args.load:.0%} load, the first lifetime unmeasured; 20 samples"
    )
    results = {
        name: churn(cluster, events, rule, not args.no_repack_check) for name, rule in RULES.items()
    }
    results["binder + moves"] = churn(
        cluster, events, binder_rule, not args.no_repack_check, consolidate=True
    )
    report_churn(cluster, results)
    print(f"\nran in {time.perf_counter() - started:.0f} s")
    return verdicts


def _requests(resources: Mapping[str, int]) -> str:
    return f"{resources.get('cpu', 0)}m CPU, {resources.get('memory', 0) >> 20}Mi"


if __name__ == "__main__":
    raise SystemExit(main())
