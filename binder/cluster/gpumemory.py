"""GPU memory per GPU: what each charged pod holds on which GPU, and what each GPU has free.

A pod is charged to the GPU its annotation names (or, naming none, the one with the most free
memory) and holds the larger of its request and what its model is measured to use on the node.
A GPU offers its size minus the reserve, and never more than NVML says is free minus the reserve;
on a node with on-demand pods or over-commit each GPU's ledger goes through the residency rules
(binder.cluster.residencyfit). `GpuMemory` keeps the sums per GPU; the cluster state
(binder.cluster.clusterstate) owns the nodes and the accounts it reads, and alone charges and
frees. Pure arithmetic: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from binder.cluster.objects import Gpu, NodeInfo, PodInfo
from binder.cluster.residencyfit import GpuLedger, always_free, free_of_both, on_demand_free


@dataclass
class Account:
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


class Offer(NamedTuple):
    """What one node's GPUs offer, per GPU: usable size and free bytes for an `always` pod."""

    sizes: list[int]
    free: list[int]
    on_demand: tuple[list[int], int] | None
    """For an `on-demand` pod: free bytes per GPU and the most room any GPU leaves to wake one
    on-demand model; None where that is what an `always` pod has (nothing on-demand, no
    over-commit)."""


class GpuMemory:
    """Per node, per GPU: the bytes charged pods hold, and what is free for placement."""

    def __init__(
        self,
        nodes: dict[str, NodeInfo],
        accounts: dict[str, dict[str, Account]],
        *,
        reserve: int = 0,
    ) -> None:
        """`nodes` and `accounts` (per node, its charged pods' accounts by uid) are the cluster
        state's own, read here and never changed."""
        self.reserve = reserve
        self._nodes = nodes
        self._accounts = accounts
        self._alloc: dict[str, list[int]] = {}
        self._od_alloc: dict[str, list[int]] = {}
        self._od_loaded: dict[str, list[int]] = {}
        """Per node with on-demand pods, per GPU: bytes they hold, and their loaded models'
        measured bytes (`binder.cluster.residencyfit`)."""
        self.on_demand_pods: Counter[str] = Counter()
        """Per node, how many on-demand pods are charged to it."""
        self._largest: int | None = None

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
                (self.usable(g) for n in self._nodes.values() for g in n.gpus), default=0
            )
        return self._largest

    def _largest_on(self, node: NodeInfo | None) -> int:
        return max((self.usable(g) for g in node.gpus), default=0) if node is not None else 0

    def follow_largest(self, old: NodeInfo | None, new: NodeInfo | None) -> None:
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

    def free(self, node: str, on_demand: bool = False) -> list[int]:
        """Free bytes per GPU for placement, as a pod of that residency class sees them (0 for
        unhealthy GPUs; never negative; on-demand: `binder.cluster.residencyfit.on_demand_free`)."""
        info = self._nodes.get(node)
        if info is None or not info.gpus:
            return []
        if on_demand and (node in self.on_demand_pods or info.overcommit != 1.0):
            return [on_demand_free(g) if g is not None else 0 for g in self.ledgers(node)]
        if node in self.on_demand_pods:
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

    def offer(self, node: str, split: bool) -> Offer:
        """What the node's GPUs offer; with `split` (the on-demand view kept apart), what they
        offer an on-demand pod too, from one pass over its ledgers where it differs."""
        info = self._nodes[node]
        sizes = [self.usable(g) for g in info.gpus]
        if split and info.gpus and (node in self.on_demand_pods or info.overcommit != 1.0):
            both = [free_of_both(g) if g is not None else (0, 0, 0) for g in self.ledgers(node)]
            on_demand = ([b[1] for b in both], max(b[2] for b in both))
            return Offer(sizes, [b[0] for b in both], on_demand)
        return Offer(sizes, self.free(node), None)

    def ledgers(self, node: str) -> list[GpuLedger | None]:
        """Each GPU's ledger for the residency rules (None for an unhealthy GPU)."""
        info = self._nodes[node]
        count = len(info.gpus)
        alloc = self._alloc.get(node) or [0] * count
        od = self._od_alloc.get(node) or [0] * count
        loaded = self._od_loaded.get(node) or [0] * count
        largest = [0] * count
        if node in self.on_demand_pods:
            for account in self._accounts.get(node, {}).values():
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
        info = self._nodes.get(node)
        measured = (info.measured_of(pod) if info is not None else None) or 0
        return max(pod.request, measured)

    def charge(self, account: Account) -> bool:
        """Charge an account to a GPU of its node; False (nothing charged yet) while the node is
        unknown."""
        if account.node not in self._nodes:
            return False
        account.gpu = self._attribute(account)
        account.held = self.held(account.pod, account.node)
        self._alloc[account.node][account.gpu] += account.held
        if account.pod.on_demand:
            self._add_on_demand(account)
        return True

    def discharge(self, account: Account) -> bool:
        """Take a freed pod off its GPU; True when it was charged to one (the node's numbers
        changed). An on-demand pod leaves its node's count; once the node's figures are read
        again, `settle_on_demand` drops the node's on-demand columns if it was the last."""
        if account.pod.on_demand:
            self.on_demand_pods[account.node] -= 1
        if account.gpu < 0 or account.node not in self._alloc:
            return False
        self._alloc[account.node][account.gpu] -= account.held
        if account.pod.on_demand and account.node in self._od_alloc:
            self._od_alloc[account.node][account.gpu] -= account.held
            self._od_loaded[account.node][account.gpu] -= account.loaded
        return True

    def settle_on_demand(self, node: str) -> None:
        """Forget a node's on-demand columns once no on-demand pod is charged to it."""
        if self.on_demand_pods[node] <= 0:
            del self.on_demand_pods[node]
            self._od_alloc.pop(node, None)
            self._od_loaded.pop(node, None)

    def recharge(self, name: str, accounts: Iterable[Account]) -> None:
        """Charge a node's accounts again from nothing (its GPUs or measurements changed)."""
        info = self._nodes[name]
        self._alloc[name] = [0] * max(1, len(info.gpus))
        self._od_alloc.pop(name, None)
        self._od_loaded.pop(name, None)
        for account in accounts:
            account.gpu = self._attribute(account)
            account.held = self.held(account.pod, name)
            self._alloc[name][account.gpu] += account.held
            if account.pod.on_demand:
                self._add_on_demand(account)

    def forget_node(self, name: str) -> None:
        """A node left: drop its sums (its accounts wait, unattributed, for it to come back)."""
        self._alloc.pop(name, None)
        self._od_alloc.pop(name, None)
        self._od_loaded.pop(name, None)

    def _attribute(self, account: Account) -> int:
        """The GPU a pod is charged to: the one its annotation names; a pod without one (bound by
        someone else, or naming a GPU the node lost) is charged to the GPU with the most free
        memory, so the largest free block is never overstated."""
        info = self._nodes[account.node]
        alloc = self._alloc.setdefault(account.node, [0] * len(info.gpus))
        for position, gpu in enumerate(info.gpus):
            if gpu.uuid == account.pod.gpu_uuid:
                return position
        if not info.gpus:
            self._alloc[account.node] = alloc = [0]
            return 0
        frees = [self.usable(g) - a for g, a in zip(info.gpus, alloc, strict=True)]
        return max(range(len(frees)), key=lambda i: (frees[i], -i))

    def _add_on_demand(self, account: Account) -> None:
        """Charge an on-demand pod's holding and, while its model is loaded (the agent lists it
        as measured), that measured memory to its GPU's on-demand columns."""
        node = account.node
        width = len(self._alloc[node])
        od = self._od_alloc.setdefault(node, [0] * width)
        loaded = self._od_loaded.setdefault(node, [0] * width)
        account.loaded = self._nodes[node].measured_of(account.pod) or 0
        od[account.gpu] += account.held
        loaded[account.gpu] += account.loaded
