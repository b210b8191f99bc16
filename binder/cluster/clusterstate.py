"""The binder's in-memory picture of the cluster: nodes, agent leases and the GPU memory ledger.

It owns the accounting DESIGN.md defines: a GPU's free memory is its size minus the reserve minus
what the non-terminated pods assigned to it hold, including pods the binder has bound but not yet
seen back from its watch ("assumed" pods). Which bound pods are charged at all (those whose proof
of placement verifies) is decided before they reach it (`binder.cluster.cache`,
`binder.cluster.proofs`). A pod holds the larger of its request and what its model is measured to
use on the node (the agent's gpu-usage annotation), and a GPU never offers more than NVML says is
free minus the reserve, so memory nothing charged explains (a pod that proves nothing, something
outside tritonshare) is never handed out either. It keeps per-node numbers in arrays indexed by
node name order, and caches per pod-constraint evaluations of Kubernetes' rules over all nodes
(kept up to date node by node when a node joins, leaves, or its labels, taints or cordon
change), each with its free-memory index (binder.cluster.index), fed by a log of the nodes whose
free memory changed. So a decision reads a few bucket heads, or at worst a few vector operations,
instead of a scan of every pod of every node.

Residency classes (`binder.cluster.residency`) give an on-demand pod its own view of the same
ledger: per node its own free memory, GPU blocks and indexes (`view(on_demand=True)`), kept only
once a node over-commits or a pod is on-demand; until then both classes read the plain arrays.

It is fed by the cache (watch events) and read by placement. No I/O, no clock: lease liveness is
judged against a time passed in by the caller.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from binder.cluster.classes import ConstraintClass, evaluate, reevaluate, shifted, without
from binder.cluster.index import Blocks, FreeIndex
from binder.cluster.objects import Constraints, Gpu, ModelKey, NodeInfo, PodInfo
from binder.cluster.podindex import PodIndex
from binder.cluster.podterms import Labels
from binder.cluster.residency import GpuLedger, always_free, free_of_both, on_demand_free
from binder.cluster.rules import first_untolerated_taint, matches_required_affinity

IntArray = npt.NDArray[np.int64]
GPUS_OK, GPUS_NONE, GPUS_UNREADABLE = 0, 1, 2
FloatArray = npt.NDArray[np.float64]

LEFT_KEYS = 10_000
"""Model revisions whose pods' last nodes the state remembers (the least recently left go)."""
LEFT_NODES = 8
"""Nodes remembered per model revision, the most recently left."""
CHANGE_LOG_LIMIT = 1 << 16
"""Logged node changes kept for the free-memory indexes; past it they are rebuilt on next use."""


@dataclass(frozen=True)
class GpuSizes:
    """The cluster's healthy GPUs grouped by usable size (ascending): for binpack's scoring."""

    sizes: tuple[int, ...]
    below: tuple[int, ...]
    """For each size, the next kind's: the largest size under nine tenths of it (sizes within a
    tenth of each other are one kind), 0 for the smallest kind. A pod larger than that needs a
    GPU of this size or more."""
    gpus: tuple[int, ...]
    """GPUs of each size."""
    whole: tuple[int, ...]
    """Of those, the GPUs nothing is charged to (their free block is their whole size)."""
    roomy: tuple[int, ...]
    """Of those, the GPUs with a free block a pod that needs this size could use (at least the
    next kind's size, `below`)."""


def next_kind_below(sizes: list[int], size: int) -> int:
    """The largest of the ascending `sizes` under nine tenths of `size` (s * 10 < size * 9);
    0 when none is."""
    under = bisect_left(sizes, -(-size * 9 // 10))
    return sizes[under - 1] if under else 0


UNJUDGED = np.iinfo(np.int64).max // 4
"""The room of a node that publishes no allocatable: NodeResourcesFit does not judge it."""
ROOM_COLUMNS = ("cpu", "memory", "ephemeral-storage")


@dataclass(frozen=True)
class ResourceRoom:
    """Per node (index order): allocatable minus the requests of its pods."""

    room: IntArray
    """A row per node, a column per `ROOM_COLUMNS` resource."""
    pods: IntArray
    """Pods the node may still take."""


@dataclass
class _Account:
    """Where one pod's request is charged."""

    pod: PodInfo
    node: str
    gpu: int
    """Position of the charged GPU in the node's list; -1 while the node is unknown."""
    assumed: bool
    held: int = 0
    """Bytes charged: the larger of the request and the model's measured memory."""
    loaded: int = 0
    """For an on-demand pod: its model's measured memory while loaded (0 while unloaded)."""


class ClusterState:
    """Nodes, leases and the GPU memory ledger, with vectorised per-node views for placement."""

    def __init__(self, *, reserve: int = 0) -> None:
        self.reserve = reserve
        self.nodes: dict[str, NodeInfo] = {}
        self.leases: dict[str, float] = {}
        self._accounts: dict[str, _Account] = {}
        self._by_node: dict[str, dict[str, _Account]] = {}
        self._alloc: dict[str, list[int]] = {}
        self._od_alloc: dict[str, list[int]] = {}
        self._od_loaded: dict[str, list[int]] = {}
        """Per node with on-demand pods, per GPU: bytes they hold, and their loaded models'
        measured bytes (`binder.cluster.residency`); `_od_count` says how many such pods a node
        has."""
        self._od_count: Counter[str] = Counter()
        self._od_active = False
        """Whether any node over-commits or any pod is on-demand: until then the on-demand view
        equals the plain one, and costs nothing."""
        self.od_max_free: IntArray = np.zeros(0, np.int64)
        self.od_wake: IntArray = np.zeros(0, np.int64)
        """Per node, the most room any of its GPUs leaves to wake one on-demand model
        (`binder.cluster.residency.wake_room`; -1 without GPUs): for the unschedulable reasons."""
        self.od_free_total: IntArray = np.zeros(0, np.int64)
        self.od_gpu_blocks: list[Blocks] = []
        """As `max_free`, `free_total` and `gpu_blocks`, for an on-demand pod."""
        self._od_gpu_size: IntArray = np.zeros((0, 1), np.int64)
        self._od_gpu_room: IntArray = np.full((0, 1), -1, np.int64)
        self._od_stale_rows: set[int] = set()
        self._od_indexes: dict[Constraints, FreeIndex] = {}
        self._models: dict[str, Counter[ModelKey]] = {}
        self._model_nodes: dict[ModelKey, Counter[str]] = {}
        """Per node its pods' (namespace, model id, revision), and per such key its nodes."""
        self._left: OrderedDict[ModelKey, dict[str, None]] = OrderedDict()
        """Per model revision, the nodes its pods left, most recent last: their agents keep the
        files a while (docs/agent.md), so a new replica there starts without the transfer."""
        self._classes: dict[Constraints, ConstraintClass] = {}
        self._indexes: dict[Constraints, FreeIndex] = {}
        self._changes: list[int] = []
        """Indices of nodes whose free memory or capacity changed, in order (for the indexes)."""
        self._dirty = True
        self._largest: int | None = None
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.max_free: IntArray = np.zeros(0, np.int64)
        self.gpu_status: IntArray = np.zeros(0, np.int64)
        """Per node: GPUS_OK, GPUS_NONE (nothing published) or GPUS_UNREADABLE."""
        self.free_total: IntArray = np.zeros(0, np.int64)
        self.capacity: IntArray = np.zeros(0, np.int64)
        self.lease_expiry: FloatArray = np.zeros(0, np.float64)
        self.gpu_blocks: list[Blocks] = []
        """Per node, per GPU: (usable size, free block), for binpack's index of free blocks."""
        self._gpu_size: IntArray = np.zeros((0, 1), np.int64)
        self._gpu_room: IntArray = np.full((0, 1), -1, np.int64)
        self._stale_rows: set[int] = set()
        """Rows of those matrices behind `gpu_blocks`: written only when `gpu_matrices` is read."""
        self._gpus_of_size: Counter[int] = Counter()
        self._whole_of_size: Counter[int] = Counter()
        self._roomy_of_size: Counter[int] = Counter()
        self._below: dict[int, int] | None = None
        """Each size's next kind (`GpuSizes.below`); None when a size came or went, and the
        roomy counts with it are recounted at the next read."""
        """Over `gpu_blocks`: healthy GPUs per usable size, and those of them with nothing taken
        (free block = size), kept as blocks change so `gpu_sizes` costs no pass over the GPUs."""
        self._sizes: GpuSizes | None = None
        self.pods = PodIndex()
        """Every bound, non-terminated pod, whatever its scheduler (and the assumed ones)."""
        self._assumed_only: set[str] = set()
        """Pods in `pods` only by assumption: the watch has not shown them bound yet."""
        self._priorities: Counter[int] = Counter()
        """spec.priority of the charged pods: whether any pod could be preempted for another."""
        self.pods_memory: Counter[str] = Counter()
        """Per namespace, the GPU memory its pods ask (not replicas: `binder.framework.quota`)."""
        self.pods_allowance: dict[str, Counter[str]] = {}
        """Per namespace and priority class, the per-process allowance booked for its pods,
        which no quota's status counts (`binder.framework.quota`)."""
        self.nominated: dict[str, str] = {}
        """Pods holding room freed by their preemption, and the node (see `nominate`)."""
        self.namespace_labels: dict[str, Labels] = {}
        """Each namespace's labels, for namespaceSelectors of pod affinity terms."""
        self.nodes_version = 0
        """Moves whenever a node joins, leaves, or changes labels, taints or cordon."""
        self._domains: dict[str, tuple[int, IntArray, list[str]]] = {}
        self._eligible: dict[tuple[Constraints, bool, bool], tuple[int, npt.NDArray[np.bool_]]] = {}
        self._room: ResourceRoom | None = None
        self._room_version = -1
        """The `nodes_version` `_room` was built at (rebuilt when nodes join or leave)."""
        self._room_stale: set[str] = set()

    # ---- nodes and leases -------------------------------------------------------------------

    def set_node(self, node: NodeInfo) -> bool:
        """Add or update a node; True when anything placement depends on changed."""
        old = self.nodes.get(node.name)
        if old == node:
            return False
        self.nodes[node.name] = node
        if node.overcommit != 1.0:
            self._activate_on_demand()
        if old is None or old.allocatable != node.allocatable:
            self._room_stale.add(node.name)
        self._follow_largest(old, node)
        rules = (node.labels, node.taints, node.unschedulable)
        if old is None:
            self._insert_row(node.name)
        self._recharge_node(node.name)
        if old is None or (old.labels, old.taints, old.unschedulable) != rules:
            self.nodes_version += 1
            self._reclassify(node.name)
        return True

    def remove_node(self, name: str) -> bool:
        old = self.nodes.pop(name, None)
        if old is None:
            return False
        self._follow_largest(old, None)
        self.nodes_version += 1
        self._alloc.pop(name, None)
        self._od_alloc.pop(name, None)
        self._od_loaded.pop(name, None)
        for account in self._by_node.get(name, {}).values():
            account.gpu = -1
        self._delete_row(name)
        return True

    def set_lease(self, node: str, expiry: float) -> None:
        """Record when the agent's lease of `node` expires (seconds since the epoch)."""
        if self.leases.get(node) == expiry:
            return
        self.leases[node] = expiry
        if not self._dirty and node in self.index:
            self.lease_expiry[self.index[node]] = expiry

    def remove_lease(self, node: str) -> None:
        self.set_lease(node, 0.0)

    # ---- pods ---------------------------------------------------------------------------------

    @staticmethod
    def counts(pod: PodInfo) -> bool:
        """Whether a pod holds GPU memory: assigned to a node and not terminated."""
        return bool(pod.node_name) and not pod.terminated and pod.request > 0

    def set_pod(self, pod: PodInfo) -> None:
        """Account an assigned pod as the API shows it (replacing any assumption about it)."""
        if not self.counts(pod):
            self.remove_pod(pod.uid)
            return
        self.track_pod(pod)
        existing = self._accounts.get(pod.uid)
        if (
            existing is not None
            and existing.node == pod.node_name
            and existing.pod.request == pod.request
            and existing.pod.model_key == pod.model_key
            and existing.pod.on_demand == pod.on_demand
            and (existing.pod.gpu_uuid == pod.gpu_uuid or not pod.gpu_uuid)
        ):
            existing.pod = pod if pod.gpu_uuid else existing.pod
            existing.assumed = False
            return
        self.remove_pod(pod.uid)
        self._charge(_Account(pod, pod.node_name, -1, assumed=False))

    def assume(self, pod: PodInfo, node: str, gpu_uuid: str, placement: str = "") -> None:
        """Charge a pod the binder is binding, before the watch shows it bound; `placement` is
        the proof it signed (so the watch's copy of the pod needs no second check)."""
        self.remove_pod(pod.uid)
        bound = pod.bound(node, gpu_uuid, placement)
        self._charge(_Account(bound, node, -1, assumed=True))
        if pod.uid not in self.pods:
            self._assumed_only.add(pod.uid)
        self.pods.set_pod(bound, node)

    def track_pod(self, pod: PodInfo) -> None:
        """Follow any pod as the watch shows it, whatever its scheduler: a bound, non-terminated
        pod counts on its node for the filters that look at other pods; others do not."""
        self._assumed_only.discard(pod.uid)
        if pod.node_name and not pod.terminated:
            self.pods.set_pod(pod, pod.node_name)
        else:
            self.pods.remove_pod(pod.uid)

    def untrack_pod(self, uid: str) -> None:
        self._assumed_only.discard(uid)
        self.pods.remove_pod(uid)

    @contextmanager
    def without(self, uids: Iterable[str]) -> Iterator[None]:
        """The state as if these pods were gone (their GPU memory, requests, ports and place in
        the pod index), put back as they were on leaving: for preemption's what-ifs."""
        saved = []
        for uid in uids:
            account = self._accounts.get(uid)
            if account is not None:
                self.remove_pod(uid)
            saved.append((uid, account, self.pods.take(uid)))
        try:
            yield
        finally:
            for uid, account, entry in reversed(saved):
                if account is not None:
                    self._charge(account)
                self.pods.put(uid, entry)

    def nominate(self, pod: PodInfo, node: str, gpu_uuid: str) -> None:
        """Hold room on a node for a pod whose preemption freed it: charged as an assumption
        until the pod is placed (`release_nomination` first) or gone."""
        self.assume(pod, node, gpu_uuid)
        self.nominated[pod.uid] = node

    def release_nomination(self, uid: str) -> None:
        if self.nominated.pop(uid, None) is not None:
            self.forget_assumed(uid)

    def is_accounted(self, uid: str) -> bool:
        """Whether the pod's request is charged to a node (seen bound, or assumed)."""
        return uid in self._accounts

    def account_uids(self) -> set[str]:
        return set(self._accounts)

    def is_assumed(self, uid: str) -> bool:
        account = self._accounts.get(uid)
        return account is not None and account.assumed

    def forget_assumed(self, uid: str) -> None:
        """Drop the pod's assumption, but never an account the watch has confirmed meanwhile."""
        if self.is_assumed(uid):
            self.remove_pod(uid)
        if uid in self._assumed_only:
            self._assumed_only.discard(uid)
            self.pods.remove_pod(uid)

    def remove_pod(self, uid: str) -> None:
        account = self._accounts.pop(uid, None)
        if account is None:
            return
        self._priorities[account.pod.priority] -= 1
        if self._priorities[account.pod.priority] <= 0:
            del self._priorities[account.pod.priority]
        if account.pod.host is None:
            self.pods_memory[account.pod.namespace] -= account.pod.asked
            if self.pods_memory[account.pod.namespace] <= 0:
                del self.pods_memory[account.pod.namespace]
            if account.pod.allowance:
                by_class = self.pods_allowance[account.pod.namespace]
                by_class[account.pod.priority_class] -= account.pod.allowance
                if by_class[account.pod.priority_class] <= 0:
                    del by_class[account.pod.priority_class]
                if not by_class:
                    del self.pods_allowance[account.pod.namespace]
        self._by_node[account.node].pop(uid, None)
        if not self._by_node[account.node]:
            del self._by_node[account.node]
        if account.pod.model_id:
            model = account.pod.model_key
            self._models[account.node][model] -= 1
            if self._models[account.node][model] <= 0:
                del self._models[account.node][model]
            self._model_nodes[model][account.node] -= 1
            if self._model_nodes[model][account.node] <= 0:
                del self._model_nodes[model][account.node]
                if not self._model_nodes[model]:
                    del self._model_nodes[model]
            self._note_left(model, account.node)
        if account.pod.on_demand:
            self._od_count[account.node] -= 1
        if account.gpu >= 0 and account.node in self._alloc:
            self._alloc[account.node][account.gpu] -= account.held
            if account.pod.on_demand and account.node in self._od_alloc:
                self._od_alloc[account.node][account.gpu] -= account.held
                self._od_loaded[account.node][account.gpu] -= account.loaded
            self._refresh(account.node)
        if account.pod.on_demand and self._od_count[account.node] <= 0:
            del self._od_count[account.node]
            self._od_alloc.pop(account.node, None)
            self._od_loaded.pop(account.node, None)

    def assigned_pods(self) -> list[PodInfo]:
        return [a.pod for a in self._accounts.values()]

    def charged_pod(self, uid: str) -> PodInfo | None:
        """The pod as charged (seen bound, or assumed with the proof the binder signed)."""
        account = self._accounts.get(uid)
        return account.pod if account is not None else None

    def bound_pods(self) -> list[PodInfo]:
        """The charged pods the watch has shown bound (assumptions left out)."""
        return [a.pod for a in self._accounts.values() if not a.assumed]

    def pods_on(self, node: str) -> list[tuple[PodInfo, int]]:
        """The pods charged to a node, each with its GPU position (-1: not attributed)."""
        return [(a.pod, a.gpu) for a in self._by_node.get(node, {}).values()]

    def assumed_uids(self) -> list[str]:
        return [uid for uid, a in self._accounts.items() if a.assumed]

    def has_model(self, node: str, key: ModelKey) -> bool:
        """Whether a pod of that namespace's model id at that revision is on the node."""
        return self._models.get(node, Counter())[key] > 0

    def nodes_with_model(self, key: ModelKey) -> list[str]:
        return list(self._model_nodes.get(key, ()))

    # ---- GPU numbers --------------------------------------------------------------------------

    def allocated(self, node: str) -> list[int]:
        """Requested bytes charged to each GPU of the node, in the node's GPU order."""
        return list(self._alloc.get(node, ()))

    def usable(self, gpu: Gpu) -> int:
        """What a GPU offers to pods at most: its memory minus the reserve (0 when unhealthy)."""
        return max(0, gpu.memory - self.reserve) if gpu.healthy else 0

    def largest_usable(self) -> int:
        """The most any single healthy GPU in the cluster can offer a pod."""
        if self._largest is None:
            self._largest = max(
                (self.usable(g) for n in self.nodes.values() for g in n.gpus), default=0
            )
        return self._largest

    def _largest_on(self, node: NodeInfo | None) -> int:
        return max((self.usable(g) for g in node.gpus), default=0) if node is not None else 0

    def _follow_largest(self, old: NodeInfo | None, new: NodeInfo | None) -> None:
        """Keep `largest_usable` without a pass over every GPU of the cluster each time an agent
        republishes its node: only a node that held the largest GPU and offers less now (or
        left) sends the next call back to the pass."""
        if self._largest is None:
            return
        before, after = self._largest_on(old), self._largest_on(new)
        if before >= self._largest > after:
            self._largest = None
        else:
            self._largest = max(self._largest, after)

    def gpu_free(self, node: str) -> list[int]:
        """Free bytes per GPU for placement (0 for unhealthy GPUs; never negative)."""
        info = self.nodes.get(node)
        if info is None or not info.gpus:
            return []
        if node in self._od_count:
            return [always_free(g) if g is not None else 0 for g in self.ledgers(node)]
        alloc = self._alloc.get(node, [0] * len(info.gpus))
        # `usable` and `_nvml_free` written out: this runs on every charge, for every GPU.
        reserve = self.reserve
        free = []
        for g, a in zip(info.gpus, alloc, strict=True):
            if not g.healthy:
                free.append(0)
                continue
            usable = max(0, g.memory - reserve)
            cap = usable if g.used is None else g.memory - g.used - reserve
            free.append(max(0, min(usable - a, cap)))
        return free

    def gpu_free_on_demand(self, node: str) -> list[int]:
        """Free bytes per GPU for an on-demand pod (`binder.cluster.residency.on_demand_free`)."""
        info = self.nodes.get(node)
        if info is None or not info.gpus:
            return []
        if node not in self._od_count and info.overcommit == 1.0:
            return self.gpu_free(node)  # the same numbers: nothing on-demand, no over-commit
        return [on_demand_free(g) if g is not None else 0 for g in self.ledgers(node)]

    def ledgers(self, node: str) -> list[GpuLedger | None]:
        """Each GPU's ledger for the residency rules (None for an unhealthy GPU)."""
        info = self.nodes[node]
        count = len(info.gpus)
        alloc = self._alloc.get(node) or [0] * count
        od = self._od_alloc.get(node) or [0] * count
        loaded = self._od_loaded.get(node) or [0] * count
        largest = [0] * count
        if node in self._od_count:
            for account in self._by_node.get(node, {}).values():
                if account.pod.on_demand and 0 <= account.gpu < count:
                    largest[account.gpu] = max(largest[account.gpu], account.held)
        out: list[GpuLedger | None] = []
        reserve, factor = self.reserve, info.overcommit
        # `usable` and `_nvml_free` written out: this runs on every charge to such a node.
        for position, gpu in enumerate(info.gpus):
            if not gpu.healthy:
                out.append(None)
                continue
            usable = max(0, gpu.memory - reserve)
            nvml = usable if gpu.used is None else gpu.memory - gpu.used - reserve
            out.append(
                GpuLedger(
                    usable,
                    nvml,
                    alloc[position],
                    od[position],
                    largest[position],
                    loaded[position],
                    factor,
                )
            )
        return out

    def _nvml_free(self, gpu: Gpu) -> int:
        """NVML's free memory minus the reserve, as the agent published it (no figure: no cap)."""
        if gpu.used is None or not gpu.healthy:
            return self.usable(gpu)
        return gpu.memory - gpu.used - self.reserve

    def held(self, pod: PodInfo, node: str) -> int:
        """What a pod holds on its GPU: its request, or more when its model is measured above."""
        info = self.nodes.get(node)
        measured = (info.measured_of(pod) if info is not None else None) or 0
        return max(pod.request, measured)

    def nodes_with_lower_priority(self, priority: int) -> list[str]:
        """The nodes with a charged pod of lower spec.priority that is not being deleted."""
        return [
            node
            for node, accounts in self._by_node.items()
            if any(a.pod.priority < priority and not a.pod.deleting for a in accounts.values())
        ]

    def has_lower_priority(self, priority: int) -> bool:
        """Whether some charged pod has a lower spec.priority (a possible preemption victim)."""
        return any(p < priority for p in self._priorities)

    def _charge(self, account: _Account) -> None:
        self._accounts[account.pod.uid] = account
        self._priorities[account.pod.priority] += 1
        if account.pod.host is None:
            self.pods_memory[account.pod.namespace] += account.pod.asked
            if account.pod.allowance:
                by_class = self.pods_allowance.setdefault(account.pod.namespace, Counter())
                by_class[account.pod.priority_class] += account.pod.allowance
        self._by_node.setdefault(account.node, {})[account.pod.uid] = account
        if account.pod.model_id:
            model = account.pod.model_key
            self._models.setdefault(account.node, Counter())[model] += 1
            self._model_nodes.setdefault(model, Counter())[account.node] += 1
        if account.pod.on_demand:
            self._od_count[account.node] += 1
            self._activate_on_demand()
        if account.node in self.nodes:
            account.gpu = self._attribute(account)
            account.held = self.held(account.pod, account.node)
            self._alloc[account.node][account.gpu] += account.held
            if account.pod.on_demand:
                self._add_on_demand(account)
            self._refresh(account.node)

    def _attribute(self, account: _Account) -> int:
        """The GPU a pod is charged to: the one its annotation names; a pod without one (bound by
        someone else, or naming a GPU the node lost) is charged to the GPU with the most free
        memory, so the largest free block is never overstated."""
        info = self.nodes[account.node]
        alloc = self._alloc.setdefault(account.node, [0] * len(info.gpus))
        for position, gpu in enumerate(info.gpus):
            if gpu.uuid == account.pod.gpu_uuid:
                return position
        if not info.gpus:
            self._alloc[account.node] = alloc = [0]
            return 0
        frees = [self.usable(g) - a for g, a in zip(info.gpus, alloc, strict=True)]
        return max(range(len(frees)), key=lambda i: (frees[i], -i))

    def _add_on_demand(self, account: _Account) -> None:
        """Charge an on-demand pod's holding and, while its model is loaded (the agent lists it
        as measured), that measured memory to its GPU's on-demand columns."""
        node = account.node
        width = len(self._alloc[node])
        od = self._od_alloc.setdefault(node, [0] * width)
        loaded = self._od_loaded.setdefault(node, [0] * width)
        account.loaded = self.nodes[node].measured_of(account.pod) or 0
        od[account.gpu] += account.held
        loaded[account.gpu] += account.loaded

    def _recharge_node(self, name: str) -> None:
        info = self.nodes[name]
        self._alloc[name] = [0] * max(1, len(info.gpus))
        self._od_alloc.pop(name, None)
        self._od_loaded.pop(name, None)
        for account in sorted(self._by_node.get(name, {}).values(), key=lambda a: a.pod.uid):
            account.gpu = self._attribute(account)
            account.held = self.held(account.pod, name)
            self._alloc[name][account.gpu] += account.held
            if account.pod.on_demand:
                self._add_on_demand(account)
        self._refresh(name)

    def _refresh(self, name: str) -> None:
        if self._dirty or name not in self.index:
            return
        i = self.index[name]
        info = self.nodes[name]
        own_view = self._od_active and (name in self._od_count or info.overcommit != 1.0)
        # A node with on-demand pods or over-commit: both views from one pass over its ledgers.
        ledgers = self.ledgers(name) if own_view and info.gpus else []
        both = [free_of_both(g) if g is not None else (0, 0, 0) for g in ledgers]
        free = [b[0] for b in both] if both else self.gpu_free(name)
        self.max_free[i] = max(free) if free else -1
        if info.gpus:
            self.gpu_status[i] = GPUS_OK
        else:
            self.gpu_status[i] = GPUS_UNREADABLE if info.gpu_problem else GPUS_NONE
        free_total = sum(free)
        sizes = [self.usable(g) for g in info.gpus]
        capacity = sum(sizes)
        blocks = tuple(zip(sizes, free, strict=True))
        changed = False
        if (
            free_total != self.free_total[i]
            or capacity != self.capacity[i]
            or blocks != self.gpu_blocks[i]
        ):
            self.free_total[i] = free_total
            self.capacity[i] = capacity
            self._recount(self.gpu_blocks[i], blocks)
            self.gpu_blocks[i] = blocks
            self._stale_rows.add(i)
            changed = True
        if self._od_active:
            if both:
                wake = max(b[2] for b in both)
                free = [b[1] for b in both]
                blocks = tuple(zip(sizes, free, strict=True))
            else:
                wake = int(self.max_free[i])  # nothing on-demand, no over-commit: the same room
            self.od_wake[i] = wake
            if blocks != self.od_gpu_blocks[i]:
                self.od_max_free[i] = max(free) if free else -1
                self.od_free_total[i] = sum(free)
                self.od_gpu_blocks[i] = blocks
                self._od_stale_rows.add(i)
                changed = True
        if changed:
            self._changes.append(i)

    def _activate_on_demand(self) -> None:
        """The first node that over-commits or the first on-demand pod: from now on the
        on-demand view keeps its own numbers (a copy of the plain ones, then each node's own)."""
        if self._od_active:
            return
        self._od_active = True
        if self._dirty:
            return  # `arrays` builds both views
        self._copy_plain_view()
        for name in list(self._od_count) + [n for n, i in self.nodes.items() if i.overcommit != 1]:
            self._refresh(name)

    def _copy_plain_view(self) -> None:
        self.od_max_free = self.max_free.copy()
        self.od_wake = self.max_free.copy()
        self.od_free_total = self.free_total.copy()
        self.od_gpu_blocks = list(self.gpu_blocks)
        self._od_gpu_size = np.zeros((len(self.names), 1), np.int64)
        self._od_gpu_room = np.full((len(self.names), 1), -1, np.int64)
        self._od_stale_rows = set(range(len(self.names)))
        self._od_indexes.clear()

    def _recount(self, old: Blocks, new: Blocks) -> None:
        """Follow the per-size counts from a node's old blocks to its new ones. A charge changes
        one GPU's block and seldom turns it whole, used, or roomy: then the counts and the
        `gpu_sizes` answer are kept as they are."""
        below = self._below
        if below is not None and len(old) == len(new):
            changed = [(was, now) for was, now in zip(old, new, strict=True) if was != now]
            if all(
                was[0] == now[0]
                and was[0] in below
                and (was[1] == was[0]) == (now[1] == now[0])
                and (was[1] >= below[was[0]]) == (now[1] >= below[now[0]])
                for was, now in changed
            ):
                return  # no GPU changed size, wholeness or room (unhealthy ones are size 0)
        for sign, blocks in ((-1, old), (1, new)):
            for size, free in blocks:
                if size <= 0:
                    continue  # an unhealthy GPU offers nothing and is not counted
                self._gpus_of_size[size] += sign
                self._whole_of_size[size] += sign * (free == size)
                if below is not None and size in below:
                    self._roomy_of_size[size] += sign * (free >= below[size])
                else:
                    below = self._below = None  # a size new to the cluster: recount on read
        for size in [size for size, count in self._gpus_of_size.items() if not count]:
            del self._gpus_of_size[size], self._whole_of_size[size]
            self._below = None
        self._sizes = None

    def gpu_sizes(self) -> GpuSizes:
        """The cluster's healthy GPUs by usable size: how many, how many hold nothing, and how
        many have a block for a pod that needs their size."""
        self.arrays()
        if self._below is None:
            # A size came or went (rare: a node of a new GPU model): each size's next kind may
            # have changed, so its roomy GPUs are counted again, once.
            sizes = sorted(self._gpus_of_size)
            below = {size: next_kind_below(sizes, size) for size in sizes}
            self._roomy_of_size = Counter()
            for blocks in self.gpu_blocks:
                for size, free in blocks:
                    if size > 0:
                        self._roomy_of_size[size] += free >= below[size]
            self._below = below
            self._sizes = None
        if self._sizes is None:
            sizes = sorted(self._gpus_of_size)
            self._sizes = GpuSizes(
                tuple(sizes),
                tuple(self._below[size] for size in sizes),
                tuple(self._gpus_of_size[size] for size in sizes),
                tuple(self._whole_of_size[size] for size in sizes),
                tuple(self._roomy_of_size[size] for size in sizes),
            )
        return self._sizes

    def gpu_matrices(self) -> tuple[IntArray, IntArray]:
        """`gpu_blocks` as two matrices, a row per node: each GPU's usable size (0 past the
        node's GPUs) and free block (-1 there), for binpack's vectorised scan. Kept up to date
        only when read: the common decision reads the index instead."""
        if self._stale_rows:
            self._gpu_size, self._gpu_room = _fill_rows(
                self._gpu_size, self._gpu_room, self.gpu_blocks, self._stale_rows
            )
        return self._gpu_size, self._gpu_room

    def od_gpu_matrices(self) -> tuple[IntArray, IntArray]:
        """`gpu_matrices` for an on-demand pod."""
        if not self._od_active:
            return self.gpu_matrices()
        if self._od_stale_rows:
            self._od_gpu_size, self._od_gpu_room = _fill_rows(
                self._od_gpu_size, self._od_gpu_room, self.od_gpu_blocks, self._od_stale_rows
            )
        return self._od_gpu_size, self._od_gpu_room

    def view(self, on_demand: bool) -> MemoryView:
        """The GPU memory a pod of that residency class sees (`binder.cluster.residency`)."""
        if on_demand and self._od_active:
            self.arrays()
            return OnDemandView(self)
        return self

    # ---- vectorised views ---------------------------------------------------------------------

    def arrays(self) -> None:
        """Build the per-node arrays at the first decision; after that, nodes joining and leaving
        update them in place (`_insert_row`, `_delete_row`)."""
        if not self._dirty:
            return
        self.names = sorted(self.nodes)
        self.index = {name: i for i, name in enumerate(self.names)}
        count = len(self.names)
        self.max_free = np.full(count, -1, np.int64)
        self.gpu_status = np.zeros(count, np.int64)
        self.free_total = np.zeros(count, np.int64)
        self.capacity = np.zeros(count, np.int64)
        self.lease_expiry = np.array([self.leases.get(n, 0.0) for n in self.names], np.float64)
        self.gpu_blocks = [()] * count
        self._gpus_of_size.clear()
        self._whole_of_size.clear()
        self._below = None
        self._sizes = None
        self._gpu_size = np.zeros((count, 1), np.int64)
        self._gpu_room = np.full((count, 1), -1, np.int64)
        self._stale_rows.clear()
        self._dirty = False
        if self._od_active:
            self._copy_plain_view()
        for name in self.names:
            self._refresh(name)
        self._forget_classes()

    def _insert_row(self, name: str) -> None:
        """A node joined: give it a row at its place in name order and move the later nodes'
        indices up by one in the arrays, every cached class and every index. Its own numbers and
        rules are filled in by the caller (`_recharge_node`, `_reclassify`)."""
        if self._dirty:
            return  # the arrays are built at the next decision
        position = bisect_left(self.names, name)
        self._settle_indexes()
        self.gpu_matrices()  # stale rows are counted by index: settle them before the shift
        self.names.insert(position, name)
        self.index = {n: i for i, n in enumerate(self.names)}
        self.max_free = np.insert(self.max_free, position, -1)
        self.gpu_status = np.insert(self.gpu_status, position, GPUS_NONE)
        self.free_total = np.insert(self.free_total, position, 0)
        self.capacity = np.insert(self.capacity, position, 0)
        self.lease_expiry = np.insert(self.lease_expiry, position, self.leases.get(name, 0.0))
        self.gpu_blocks.insert(position, ())
        self._gpu_size = np.insert(self._gpu_size, position, 0, axis=0)
        self._gpu_room = np.insert(self._gpu_room, position, -1, axis=0)
        if self._od_active:
            self.od_gpu_matrices()
            self.od_max_free = np.insert(self.od_max_free, position, -1)
            self.od_wake = np.insert(self.od_wake, position, -1)
            self.od_free_total = np.insert(self.od_free_total, position, 0)
            self.od_gpu_blocks.insert(position, ())
            self._od_gpu_size = np.insert(self._od_gpu_size, position, 0, axis=0)
            self._od_gpu_room = np.insert(self._od_gpu_room, position, -1, axis=0)
        for constraints, cls in self._classes.items():
            self._classes[constraints] = shifted(cls, position, 1)
        for index in self._all_indexes():
            index.shift(position, 1)

    def _delete_row(self, name: str) -> None:
        """A node left: drop its row and move the later nodes' indices down by one, as above."""
        if self._dirty or name not in self.index:
            return
        position = self.index[name]
        self._settle_indexes()
        self.gpu_matrices()
        del self.names[position]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.max_free = np.delete(self.max_free, position)
        self.gpu_status = np.delete(self.gpu_status, position)
        self.free_total = np.delete(self.free_total, position)
        self.capacity = np.delete(self.capacity, position)
        self.lease_expiry = np.delete(self.lease_expiry, position)
        self._recount(self.gpu_blocks[position], ())
        del self.gpu_blocks[position]
        self._gpu_size = np.delete(self._gpu_size, position, axis=0)
        self._gpu_room = np.delete(self._gpu_room, position, axis=0)
        if self._od_active:
            self.od_gpu_matrices()
            self.od_max_free = np.delete(self.od_max_free, position)
            self.od_wake = np.delete(self.od_wake, position)
            self.od_free_total = np.delete(self.od_free_total, position)
            del self.od_gpu_blocks[position]
            self._od_gpu_size = np.delete(self._od_gpu_size, position, axis=0)
            self._od_gpu_room = np.delete(self._od_gpu_room, position, axis=0)
        for constraints, cls in self._classes.items():
            self._classes[constraints] = shifted(without(cls, position), position + 1, -1)
        for index in self._all_indexes():
            index.refile(position, None, 0, 0, ())
            index.shift(position + 1, -1)

    def _settle_indexes(self) -> None:
        """Bring every index up to the change log and empty it: its node indices are about to
        shift."""
        upto = len(self._changes)
        for on_demand in (False, True):
            free, blocks = self._view_columns(on_demand)
            for index in self._indexes_of(on_demand).values():
                index.catch_up(self._changes, self.capacity, free, blocks, upto)
                index.cursor = 0
        self._changes.clear()

    def _indexes_of(self, on_demand: bool) -> dict[Constraints, FreeIndex]:
        return self._od_indexes if on_demand else self._indexes

    def _all_indexes(self) -> list[FreeIndex]:
        return [*self._indexes.values(), *self._od_indexes.values()]

    def _view_columns(self, on_demand: bool) -> tuple[IntArray, list[Blocks]]:
        """Per node its free memory and its GPUs' blocks, as a pod of that class sees them."""
        if on_demand and self._od_active:
            return self.od_free_total, self.od_gpu_blocks
        return self.free_total, self.gpu_blocks

    def _forget_classes(self) -> None:
        self._classes.clear()
        self._indexes.clear()
        self._od_indexes.clear()
        self._changes.clear()

    def _reclassify(self, name: str) -> None:
        """A node's labels, taints or cordon changed: evaluate Kubernetes' rules again for that
        node only, in every cached class and its index (not every node of every class)."""
        if self._dirty or name not in self.index:
            self._forget_classes()
            return
        i = self.index[name]
        node = self.nodes[name]
        for constraints, cls in list(self._classes.items()):
            self._classes[constraints], scoring = reevaluate(cls, constraints, i, node)
            for on_demand in (False, True):
                index = self._indexes_of(on_demand).get(constraints)
                if index is not None:
                    free, blocks = self._view_columns(on_demand)
                    index.refile(i, scoring, int(self.capacity[i]), int(free[i]), blocks[i])

    def constraint_class(self, constraints: Constraints) -> ConstraintClass:
        """Kubernetes' rules for these constraints over every node, cached until nodes change."""
        self.arrays()
        cached = self._classes.get(constraints)
        if cached is not None:
            return cached
        result = evaluate(constraints, [self.nodes[name] for name in self.names])
        if len(self._classes) > 1024:
            self._forget_classes()
        self._classes[constraints] = result
        return result

    def free_index(self, constraints: Constraints, on_demand: bool = False) -> FreeIndex:
        """The class's feasible-by-rules nodes by free memory, up to date with the ledger, as a
        pod of that residency class sees the memory."""
        cls = self.constraint_class(constraints)
        if len(self._changes) > CHANGE_LOG_LIMIT:
            self._indexes.clear()
            self._od_indexes.clear()
            self._changes.clear()
        on_demand = on_demand and self._od_active
        indexes = self._indexes_of(on_demand)
        index = indexes.get(constraints)
        if index is None:
            index = FreeIndex(cls.nodes, cls.affinity, cls.prefer_no_schedule, len(self._changes))
            indexes[constraints] = index
        else:
            free, blocks = self._view_columns(on_demand)
            index.catch_up(self._changes, self.capacity, free, blocks, len(self._changes))
        return index

    def resource_room(self) -> ResourceRoom:
        """Each node's room for NodeResourcesFit, brought up to date with the pods and nodes
        that changed since the last read."""
        self.arrays()
        stale = self._room_stale | self.pods.changed_nodes
        self.pods.changed_nodes = set()
        self._room_stale = set()
        room = self._room
        if room is None or self._room_version != self.nodes_version or self._dirty_room():
            count = len(self.names)
            room = self._room = ResourceRoom(
                np.zeros((count, len(ROOM_COLUMNS)), np.int64), np.zeros(count, np.int64)
            )
            self._room_version = self.nodes_version
            stale = set(self.names)
        for name in stale:
            i = self.index.get(name)
            if i is None:
                continue
            allocatable = self.nodes[name].allocatable
            if allocatable is None:
                room.room[i] = UNJUDGED
                room.pods[i] = UNJUDGED
                continue
            requested = self.pods.requested(name)
            for column, resource in enumerate(ROOM_COLUMNS):
                room.room[i, column] = allocatable.get(resource, 0) - requested.get(resource, 0)
            room.pods[i] = allocatable.get("pods", 0) - self.pods.pod_count(name)
        return room

    def _dirty_room(self) -> bool:
        return self._room is not None and len(self._room.pods) != len(self.names)

    def topology_domains(self, key: str) -> tuple[IntArray, list[str]]:
        """Per node (in index order) the id of its value of label `key` (-1: the node lacks the
        label), and the values by id; kept until a node joins, leaves or changes labels."""
        self.arrays()
        cached = self._domains.get(key)
        if cached is not None and cached[0] == self.nodes_version:
            return cached[1], cached[2]
        ids: dict[str, int] = {}
        column = np.full(len(self.names), -1, np.int64)
        for i, name in enumerate(self.names):
            value = self.nodes[name].labels.get(key)
            if value is not None:
                column[i] = ids.setdefault(value, len(ids))
        values = list(ids)
        if len(self._domains) > 64:
            self._domains.clear()
        self._domains[key] = (self.nodes_version, column, values)
        return column, values

    def eligible(
        self, constraints: Constraints, honor_affinity: bool, honor_taints: bool
    ) -> npt.NDArray[np.bool_]:
        """Per node, whether PodTopologySpread counts it for a pod of these constraints: its
        nodeSelector and required node affinity match (when `honor_affinity`) and its
        NoSchedule/NoExecute taints are tolerated (when `honor_taints`)."""
        self.arrays()
        key = (constraints, honor_affinity, honor_taints)
        cached = self._eligible.get(key)
        if cached is not None and cached[0] == self.nodes_version:
            return cached[1]
        mask = np.ones(len(self.names), np.bool_)
        if honor_affinity or honor_taints:
            tolerations = constraints.tolerations
            for i, name in enumerate(self.names):
                node = self.nodes[name]
                affinity_ok = not honor_affinity or matches_required_affinity(constraints, node)
                taints_ok = not honor_taints or first_untolerated_taint(node, tolerations) is None
                mask[i] = affinity_ok and taints_ok
        if len(self._eligible) > 1024:
            self._eligible.clear()
        self._eligible[key] = (self.nodes_version, mask)
        return mask

    def model_nodes(self, key: ModelKey) -> set[int]:
        """Indices of the nodes that already have a pod of that model revision."""
        index = self.index
        return {index[n] for n in self._model_nodes.get(key, ()) if n in index}

    def _note_left(self, key: ModelKey, node: str) -> None:
        nodes = self._left.pop(key, {})
        nodes.pop(node, None)
        nodes[node] = None
        while len(nodes) > LEFT_NODES:
            del nodes[next(iter(nodes))]
        self._left[key] = nodes
        while len(self._left) > LEFT_KEYS:
            self._left.popitem(last=False)

    def left_nodes(self, key: ModelKey) -> set[int]:
        """Indices of the nodes a pod of that model revision left (their agents may keep its
        files); only the binder reads it, and only for pods of the same namespace's revision."""
        nodes = self._left.get(key)
        if not nodes:
            return set()
        index = self.index
        return {index[n] for n in nodes if n in index}

    def model_mask(self, key: ModelKey) -> npt.NDArray[np.bool_]:
        """True at the index of every node that already has a pod of that model revision."""
        mask = np.zeros(len(self.names), np.bool_)
        for name in self._model_nodes.get(key, ()):
            i = self.index.get(name)
            if i is not None:
                mask[i] = True
        return mask


def _fill_rows(
    size: IntArray, room: IntArray, blocks: list[Blocks], rows: set[int]
) -> tuple[IntArray, IntArray]:
    """Write the `rows` of the (size, free block) matrices from `blocks` and empty `rows`;
    widened first when a node has more GPUs than any before."""
    widest = max(len(blocks[i]) for i in rows)
    width = size.shape[1]
    if widest > width:
        extra = ((0, 0), (0, widest - width))
        size = np.pad(size, extra, constant_values=0)
        room = np.pad(room, extra, constant_values=-1)
    for i in rows:
        row = blocks[i]
        size[i] = 0
        room[i] = -1
        size[i, : len(row)] = [s for s, _ in row]
        room[i, : len(row)] = [f for _, f in row]
    rows.clear()
    return size, room


class MemoryView(Protocol):
    """The GPU memory placement reads for one pod: the plain view (the state itself, for an
    `always` pod) or the on-demand one. The same names as on the state, so placement reads
    either alike."""

    @property
    def max_free(self) -> IntArray: ...

    @property
    def free_total(self) -> IntArray: ...

    @property
    def gpu_blocks(self) -> list[Blocks]: ...

    def gpu_matrices(self) -> tuple[IntArray, IntArray]: ...

    def gpu_free(self, node: str) -> list[int]: ...

    def free_index(self, constraints: Constraints) -> FreeIndex: ...


class OnDemandView:
    """The state's GPU memory as an on-demand pod sees it
    (`binder.cluster.residency.on_demand_free`)."""

    __slots__ = ("_state",)

    def __init__(self, state: ClusterState) -> None:
        self._state = state

    @property
    def max_free(self) -> IntArray:
        return self._state.od_max_free

    @property
    def free_total(self) -> IntArray:
        return self._state.od_free_total

    @property
    def gpu_blocks(self) -> list[Blocks]:
        return self._state.od_gpu_blocks

    def gpu_matrices(self) -> tuple[IntArray, IntArray]:
        return self._state.od_gpu_matrices()

    def gpu_free(self, node: str) -> list[int]:
        return self._state.gpu_free_on_demand(node)

    def free_index(self, constraints: Constraints) -> FreeIndex:
        return self._state.free_index(constraints, on_demand=True)
