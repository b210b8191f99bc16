"""Consolidation: room made for a pod that waits only because the free memory is split.

A pending pod needs its request on one GPU. When no GPU has that block but the nodes the pod may
use (its rules, a live agent, no replica of its model) have the memory in total, moving a few
smaller pods off one GPU gives it the block; their controllers recreate them and the binder
places them elsewhere. This module plans such a move, as KAI Scheduler's consolidation does,
under kube-scheduler's preemption rules where they apply:

- only when fragmentation is the only obstacle (the eligible nodes hold the request in total);
- at most `max_moves` pods, all from one GPU: each smaller than the pending pod, of no higher
  priority, owned by a controller (a bare pod evicted is gone), not being deleted, not a pod the
  binder bound and has not yet seen back, and not one the caller says it moved or protected
  recently (`exempt`: its cooldowns);
- a node the caller moved pods off recently is not a target (`cold_nodes`), so two pending pods
  cannot take turns emptying the same GPU;
- every pod moved must fit elsewhere now (another GPU its rules allow, with a live agent, no
  other replica of its model on the node, and room left after the pods planned before it), so a
  move never turns one pending pod into another;
- the fewest moves, then the fewest bytes moved, then node name and GPU order, among the
  SEARCH_GPUS GPUs with the largest free blocks (those that need the least moved), so a plan
  costs about the same on any cluster.

Whether a PodDisruptionBudget allows each eviction is the API server's answer (429), not this
module's guess: the caller evicts through the Eviction API and stops at the first refusal.

The controller asks for a plan when `--consolidate-moves` is above 0 and carries it out
(binder.framework.moves: evictions and Events). `Cooldowns` keeps what was planned recently, so a
pod moved is not moved again, a node emptied is not a target again, and a pending pod is not planned
for again, for a while; benchmarks/density.py measures what plans do under churn.

Pure: functions of the cluster state and the pod, and bookkeeping of times passed in; no I/O, no
clock.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from binder.cluster.clusterstate import ClusterState
from binder.cluster.objects import Gpu, PodInfo
from common.quantity import format_bytes

MAX_MOVES = 4
"""Pods one plan may move at most (each is a model load elsewhere, seconds to minutes)."""
POD_COOLDOWN_SECONDS = 600.0
"""A pod moved, or planned for, is not moved (or planned for) again for this long."""
SEARCH_GPUS = 256
"""GPUs a plan looks at, those with the largest free blocks (each walks its node's pods)."""
NODE_COOLDOWN_SECONDS = 60.0
"""A node pods were moved off is not a target again for this long."""


@dataclass(frozen=True)
class Plan:
    """Move `moves` off `gpu` of `node`, then the pending pod fits there."""

    node: str
    gpu: Gpu
    moves: tuple[PodInfo, ...]
    freed: int
    """The GPU's free block once the moved pods are gone, in bytes."""

    def reason(self, pod: PodInfo) -> str:
        """What the Event on each moved pod says."""
        return (
            f"moved by tritonshare to make room for {pod.key}, which needs "
            f"{format_bytes(pod.request)} of GPU memory on one GPU: the free memory of its "
            f"nodes is split across GPUs, and GPU {self.gpu.uuid} on {self.node} has that block "
            f"once {len(self.moves)} smaller pod(s) move"
        )


def fragmented(state: ClusterState, pod: PodInfo, *, now: float) -> bool:
    """Whether the pod fits no GPU while its eligible nodes have its request free in total.
    Never for an on-demand pod: it is placed against promised memory, and running models are not
    moved for a model that may sleep."""
    if pod.on_demand:
        return False
    nodes = _eligible(state, pod, now)
    plain = state.view(on_demand=False)
    if not nodes.size or int(plain.max_free[nodes].max()) >= pod.request:
        return False
    return int(plain.free_total[nodes].sum()) >= pod.request


def plan(
    state: ClusterState,
    pod: PodInfo,
    *,
    now: float,
    max_moves: int = MAX_MOVES,
    exempt: Collection[str] = (),
    cold_nodes: Collection[str] = (),
) -> Plan | None:
    """The cheapest move that gives the pending pod a GPU, or None (not fragmentation alone, or
    no GPU can be freed within the rules)."""
    if max_moves <= 0 or not fragmented(state, pod, now=now):
        return None
    nodes = _eligible(state, pod, now)
    if cold_nodes:
        cold = np.array([state.index[n] for n in cold_nodes if n in state.index], np.int64)
        nodes = nodes[~np.isin(nodes, cold)]
    sizes, rooms = state.view(on_demand=False).gpu_matrices()
    size, room = sizes[nodes], rooms[nodes]
    # The GPUs large enough, the largest free blocks first (the least to move): at most
    # SEARCH_GPUS of them are looked at, so a plan's cost does not grow with the cluster.
    flat = np.flatnonzero(size >= pod.request)
    if flat.size > SEARCH_GPUS:
        flat = flat[np.argpartition(-room.ravel()[flat], SEARCH_GPUS - 1)[:SEARCH_GPUS]]
    flat = flat[np.lexsort((flat, -room.ravel()[flat]))]
    width = room.shape[1]
    best: tuple[tuple[int, int, int, int], Plan] | None = None
    on_node: dict[int, dict[int, list[PodInfo]]] = {}
    for cell in flat.tolist():
        i, position = int(nodes[cell // width]), cell % width
        node = state.names[i]
        gpu = state.nodes[node].gpus[position]
        if not gpu.healthy:
            continue
        if i not in on_node:
            on_node[i] = {}
            for other, at in state.pods_on(node):
                on_node[i].setdefault(at, []).append(other)
        free = int(room.ravel()[cell])
        movable = [p for p in on_node[i].get(position, []) if _movable(state, p, pod, exempt)]
        moves = _fewest(state, node, movable, pod.request - free, max_moves)
        if moves is None:
            continue
        moved = sum(state.memory.held(p, node) for p in moves)
        rank = (len(moves), moved, i, position)
        if best is not None and rank >= best[0]:
            continue
        if _rehomed(state, moves, node, position, now):
            best = (rank, Plan(node, gpu, tuple(moves), free + moved))
    return best[1] if best is not None else None


def _eligible(state: ClusterState, pod: PodInfo, now: float) -> npt.NDArray[np.int64]:
    state.arrays()
    nodes = state.constraint_class(pod.constraints).nodes
    ok = state.lease_expiry[nodes] > now
    if pod.model_id:
        ok &= ~state.model_mask(pod.model_key)[nodes]
    return nodes[ok]


def _movable(state: ClusterState, other: PodInfo, pod: PodInfo, exempt: Collection[str]) -> bool:
    return (
        other.controlled
        and not other.deleting
        and other.request < pod.request
        and other.priority <= pod.priority
        and other.uid not in exempt
        and not state.is_assumed(other.uid)
    )


def _fewest(
    state: ClusterState, node: str, movable: list[PodInfo], need: int, max_moves: int
) -> list[PodInfo] | None:
    """The fewest pods whose memory covers `need`: the smallest single one that does, else the
    largest first; None when `max_moves` pods do not."""
    held = sorted(((state.memory.held(p, node), p.uid, p) for p in movable), key=lambda h: h[:2])
    singles = [h for h in held if h[0] >= need]
    if singles:
        return [singles[0][2]]
    taken: list[PodInfo] = []
    for amount, _, other in reversed(held):
        if len(taken) == max_moves:
            return None
        taken.append(other)
        need -= amount
        if need <= 0:
            return taken
    return None


def _rehomed(
    state: ClusterState, moves: list[PodInfo], source: str, position: int, now: float
) -> bool:
    """Whether every moved pod fits elsewhere now (another GPU of its node counts: its model is
    there only because of itself), the largest first, each taking the tightest block its rules
    allow after the ones before it."""
    rooms = state.view(on_demand=False).gpu_matrices()[1]
    taken: dict[tuple[int, int], int] = {(state.index[source], position): 1 << 62}
    for other in sorted(moves, key=lambda p: -p.request):
        nodes = state.constraint_class(other.constraints).nodes
        ok = state.lease_expiry[nodes] > now
        if other.model_id:
            ok &= ~state.model_mask(other.model_key)[nodes] | (nodes == state.index[source])
        nodes = nodes[ok]
        if not nodes.size:
            return False
        room = rooms[nodes].copy()
        for (i, at), amount in taken.items():
            rows = np.flatnonzero(nodes == i)
            if rows.size:
                room[rows[0], at] -= amount
        waste = np.where(room >= other.request, room - other.request, np.iinfo(np.int64).max)
        best = np.unravel_index(int(np.argmin(waste)), waste.shape)
        row, column = int(best[0]), int(best[1])
        if room[row, column] < other.request:
            return False
        key = (int(nodes[row]), column)
        taken[key] = taken.get(key, 0) + other.request
    return True


class Cooldowns:
    """When pods and nodes were last part of a plan. Entries older than their cooldown are
    dropped on each read, so it holds at most the pods and nodes of the plans of the last
    `pod_seconds`: (moves + 1) pods and one node a plan, and at most one plan a pending pod."""

    def __init__(
        self, pod_seconds: float = POD_COOLDOWN_SECONDS, node_seconds: float = NODE_COOLDOWN_SECONDS
    ) -> None:
        self._pod_seconds = pod_seconds
        self._node_seconds = node_seconds
        self._pods: dict[str, float] = {}
        self._nodes: dict[str, float] = {}

    def pods(self, now: float) -> set[str]:
        """Pods not to move now (moved, or planned for, recently)."""
        self._pods = {u: t for u, t in self._pods.items() if now - t < self._pod_seconds}
        return set(self._pods)

    def nodes(self, now: float) -> set[str]:
        """Nodes not to move pods off now."""
        self._nodes = {n: t for n, t in self._nodes.items() if now - t < self._node_seconds}
        return set(self._nodes)

    def planned(self, pod: PodInfo, made: Plan | None, now: float) -> None:
        """A plan was sought for `pod` (`made`: the plan, or None when there was none)."""
        self._pods[pod.uid] = now
        if made is not None:
            self._nodes[made.node] = now
            for moved in made.moves:
                self._pods[moved.uid] = now
