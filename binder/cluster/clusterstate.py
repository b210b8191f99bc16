"""The binder's in-memory picture of the cluster: nodes, agent leases and the GPU memory ledger.

It owns the accounting DESIGN.md defines: a GPU's free memory is its size minus the reserve minus
what the non-terminated pods assigned to it hold, including pods the binder has bound but not yet
seen back from its watch ("assumed" pods); which bound pods are charged at all (those whose proof
of placement verifies) is decided before they reach it (`binder.cluster.cache`). It keeps the
accounts and the per-node rows in node name order, and composes what follows them: the sums per
GPU (binder.cluster.gpumemory), the tallies by priority, namespace and model
(binder.cluster.tallies), the memory views of both residency classes (binder.cluster.memoryviews),
the constraint classes with their free-memory indexes (binder.cluster.classcache: the verdicts of
the node rules it is built with, kube-scheduler's in binder.framework.noderules) and the other
filters' columns (binder.cluster.filtercolumns). So a decision reads a few bucket heads, or at
worst a few vector operations, instead of a scan of every pod of every node. Fed by the cache,
read by placement. No I/O, no clock: lease liveness is judged against a time passed in.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import numpy as np
import numpy.typing as npt

from binder.cluster.classcache import ClassCache
from binder.cluster.classes import ConstraintClass, NodeRules
from binder.cluster.filtercolumns import FilterColumns
from binder.cluster.gpumemory import Account, GpuMemory
from binder.cluster.gpusizes import GpuSizes
from binder.cluster.index import FreeIndex
from binder.cluster.memoryviews import MemoryView, ResidencyViews
from binder.cluster.objects import Constraints, ModelKey, NodeInfo, PodInfo
from binder.cluster.podindex import PodIndex
from binder.cluster.podterms import Labels
from binder.cluster.tallies import PodTallies

IntArray = npt.NDArray[np.int64]
GPUS_OK, GPUS_NONE, GPUS_UNREADABLE = 0, 1, 2
FloatArray = npt.NDArray[np.float64]


class ClusterState:
    """Nodes, leases and the GPU memory ledger, with vectorised per-node views for placement."""

    def __init__(self, *, rules: NodeRules, reserve: int = 0) -> None:
        self.nodes: dict[str, NodeInfo] = {}
        self.leases: dict[str, float] = {}
        self._accounts: dict[str, Account] = {}
        self._by_model: dict[ModelKey, dict[str, Account]] = {}
        """The accounts of each model revision's pods, by uid (`replica_gpus`)."""
        self._by_node: dict[str, dict[str, Account]] = {}
        self.memory = GpuMemory(self.nodes, self._by_node, reserve=reserve)
        """Per GPU, what the charged pods hold and what is free."""
        self.tallies = PodTallies()
        """The charged pods counted by priority, namespace and model revision."""
        self.pods = PodIndex()
        """Every bound, non-terminated pod, whatever its scheduler (and the assumed ones)."""
        self._assumed_only: set[str] = set()
        """Pods in `pods` only by assumption: the watch has not shown them bound yet."""
        self.nominated: dict[str, str] = {}
        """Pods holding room freed by their preemption, and the node (see `nominate`)."""
        self.namespace_labels: dict[str, Labels] = {}
        """Each namespace's labels, for namespaceSelectors of pod affinity terms."""
        self.nodes_version = 0
        """Moves whenever a node joins, leaves, or changes labels, taints or cordon."""
        self.filters = FilterColumns(self)
        """Per node, the columns of the filters beside GPU memory."""
        self._class_cache = ClassCache(rules)
        self._dirty = True
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.gpu_status: IntArray = np.zeros(0, np.int64)
        """Per node: GPUS_OK, GPUS_NONE (nothing published) or GPUS_UNREADABLE."""
        self.lease_expiry: FloatArray = np.zeros(0, np.float64)
        self._views = ResidencyViews()
        """GPU memory as a pod of each residency class sees it (`view`)."""

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
            self.filters.allocatable_changed(node.name)
        self.memory.follow_largest(old, node)
        for gone in self.tallies.leaving_on(node.name):
            if node.measured_of(gone) is None:
                self.tallies.left(gone.uid)  # unloaded: its namespace's memory is free
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
        self.memory.follow_largest(old, None)
        for gone in self.tallies.leaving_on(name):
            self.tallies.left(gone.uid)
        self.nodes_version += 1
        self.memory.forget_node(name)
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
        self._charge(Account(pod, pod.node_name, -1, assumed=False))

    def assume(self, pod: PodInfo, node: str, gpu_uuid: str, placement: str = "") -> None:
        """Charge a pod the binder is binding, before the watch shows it bound; `placement` is
        the proof it signed (so the watch's copy of the pod needs no second check)."""
        self.remove_pod(pod.uid)
        bound = pod.bound(node, gpu_uuid, placement)
        self._charge(Account(bound, node, -1, assumed=True))
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
        self.tallies.remove(account.pod, account.node)
        if account.pod.model_id:
            revision = self._by_model.get(account.pod.model_key)
            if revision is not None:
                revision.pop(uid, None)
                if not revision:
                    del self._by_model[account.pod.model_key]
        node = self.nodes.get(account.node)
        if not account.assumed and node is not None and node.measured_of(account.pod) is not None:
            # Its model is still loaded there: its namespace holds the memory until unloaded.
            self.tallies.leave(account.pod, account.node)
        self._by_node[account.node].pop(uid, None)
        if not self._by_node[account.node]:
            del self._by_node[account.node]
        if self.memory.discharge(account):
            self._refresh(account.node)
        if account.pod.on_demand:
            self.memory.settle_on_demand(account.node)

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

    def nodes_with_lower_priority(self, priority: int) -> list[str]:
        """The nodes with a charged pod of lower spec.priority that is not being deleted."""
        return [
            node
            for node, accounts in self._by_node.items()
            if any(a.pod.priority < priority and not a.pod.deleting for a in accounts.values())
        ]

    def replica_gpus(self, key: ModelKey, exclude: str = "") -> dict[str, frozenset[int]]:
        """Per node, the positions of the GPUs charged a pod of model revision `key` (but the
        pod `exclude`): the cost is the revision's pods, not the nodes'."""
        found: dict[str, set[int]] = {}
        for uid, account in self._by_model.get(key, {}).items():
            if uid != exclude and account.gpu >= 0:
                found.setdefault(account.node, set()).add(account.gpu)
        return {node: frozenset(gpus) for node, gpus in found.items()}

    def _charge(self, account: Account) -> None:
        self._accounts[account.pod.uid] = account
        if account.pod.model_id:
            self._by_model.setdefault(account.pod.model_key, {})[account.pod.uid] = account
        self.tallies.left(account.pod.uid)
        self.tallies.add(account.pod, account.node)
        self._by_node.setdefault(account.node, {})[account.pod.uid] = account
        if account.pod.on_demand:
            self.memory.on_demand_pods[account.node] += 1
            self._activate_on_demand()
        if self.memory.charge(account):
            self._refresh(account.node)

    # ---- per-node rows ------------------------------------------------------------------------

    def _recharge_node(self, name: str) -> None:
        accounts = self._by_node.get(name, {}).values()
        self.memory.recharge(name, sorted(accounts, key=lambda a: a.pod.uid))
        self._refresh(name)

    def _refresh(self, name: str) -> None:
        if self._dirty or name not in self.index:
            return
        i = self.index[name]
        info = self.nodes[name]
        if info.gpus:
            self.gpu_status[i] = GPUS_OK
        else:
            self.gpu_status[i] = GPUS_UNREADABLE if info.gpu_problem else GPUS_NONE
        if self._views.write(i, self.memory.offer(name, self._views.split)):
            self._class_cache.changes.append(i)

    def _activate_on_demand(self) -> None:
        """The first node that over-commits or the first on-demand pod: from now on the
        on-demand view keeps its own numbers (a copy of the plain ones, then each node's own)."""
        if self._views.split:
            return
        self._views.split_off()
        self._class_cache.forget_on_demand()
        if self._dirty:
            return  # `arrays` builds both views
        overcommitted = [n for n, i in self.nodes.items() if i.overcommit != 1]
        for name in list(self.memory.on_demand_pods) + overcommitted:
            self._refresh(name)

    def gpu_sizes(self) -> GpuSizes:
        """The cluster's healthy GPUs by usable size: how many, how many hold nothing, and how
        many have a block for a pod that needs their size."""
        self.arrays()
        return self._views.sizes()

    def view(self, on_demand: bool) -> MemoryView:
        """The GPU memory a pod of that residency class sees (`binder.cluster.residencyfit`)."""
        if on_demand and self._views.split:
            self.arrays()
        return self._views.of(on_demand)

    def arrays(self) -> None:
        """Build the per-node arrays at the first decision; after that, nodes joining and leaving
        update them in place (`_insert_row`, `_delete_row`)."""
        if not self._dirty:
            return
        self.names = sorted(self.nodes)
        self.index = {name: i for i, name in enumerate(self.names)}
        count = len(self.names)
        self.gpu_status = np.zeros(count, np.int64)
        self.lease_expiry = np.array([self.leases.get(n, 0.0) for n in self.names], np.float64)
        self._views.reset(count)
        self._dirty = False
        for name in self.names:
            self._refresh(name)
        self._class_cache.forget()

    def _insert_row(self, name: str) -> None:
        """A node joined: give it a row at its place in name order and move the later nodes'
        indices up by one in the arrays, every cached class and every index. Its own numbers and
        rules are filled in by the caller (`_recharge_node`, `_reclassify`)."""
        if self._dirty:
            return  # the arrays are built at the next decision
        position = bisect_left(self.names, name)
        self._class_cache.settle(self._views.of)
        self.names.insert(position, name)
        self.index = {n: i for i, n in enumerate(self.names)}
        self.gpu_status = np.insert(self.gpu_status, position, GPUS_NONE)
        self.lease_expiry = np.insert(self.lease_expiry, position, self.leases.get(name, 0.0))
        self._views.insert(position)
        self._class_cache.insert(position)

    def _delete_row(self, name: str) -> None:
        """A node left: drop its row and move the later nodes' indices down by one, as above."""
        if self._dirty or name not in self.index:
            return
        position = self.index[name]
        self._class_cache.settle(self._views.of)
        del self.names[position]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.gpu_status = np.delete(self.gpu_status, position)
        self.lease_expiry = np.delete(self.lease_expiry, position)
        self._views.delete(position)
        self._class_cache.delete(position)

    def _reclassify(self, name: str) -> None:
        """A node's labels, taints or cordon changed: evaluate Kubernetes' rules again for that
        node only, in every cached class and its index (not every node of every class)."""
        if self._dirty or name not in self.index:
            self._class_cache.forget()
            return
        i = self.index[name]
        self._class_cache.reclassify(i, self.nodes[name], self._views.of)

    def constraint_class(self, constraints: Constraints) -> ConstraintClass:
        """Kubernetes' rules for these constraints over every node, cached until nodes change."""
        self.arrays()
        return self._class_cache.constraint_class(
            constraints, lambda: [self.nodes[name] for name in self.names]
        )

    def free_index(self, constraints: Constraints, on_demand: bool = False) -> FreeIndex:
        """The class's feasible-by-rules nodes by free memory, up to date with the ledger, as a
        pod of that residency class sees the memory."""
        cls = self.constraint_class(constraints)
        on_demand = on_demand and self._views.split
        return self._class_cache.free_index(constraints, cls, on_demand, self._views.of(on_demand))

    def model_nodes(self, key: ModelKey) -> set[int]:
        """Indices of the nodes that already have a pod of that model revision."""
        index = self.index
        return {index[n] for n in self.tallies.nodes_with_model(key) if n in index}

    def left_nodes(self, key: ModelKey) -> set[int]:
        """Indices of the nodes a pod of that model revision left (their agents may keep its
        files); only the binder reads it, and only for pods of the same namespace's revision."""
        index = self.index
        return {index[n] for n in self.tallies.left_nodes(key) if n in index}

    def model_mask(self, key: ModelKey) -> npt.NDArray[np.bool_]:
        """True at the index of every node that already has a pod of that model revision."""
        mask = np.zeros(len(self.names), np.bool_)
        for name in self.tallies.nodes_with_model(key):
            i = self.index.get(name)
            if i is not None:
                mask[i] = True
        return mask
