"""What the pods charged to the cluster state add up to, kept as they are charged and freed.

How many charged pods have each spec.priority (whether any could be preempted for another), the
GPU memory and per-process allowance each namespace's pods ask (`binder.framework.quota`), the
GPU memory of its pods gone from the API whose models their node still reports loaded (`leave`:
memory is free only once Triton has freed it), and per model revision the nodes its pods are on
and the nodes they left. The cluster state
(binder.cluster.clusterstate) alone changes it; readers ask. Pure bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Collection

from binder.cluster.objects import ModelKey, PodInfo

LEFT_KEYS = 10_000
"""Model revisions whose pods' last nodes are remembered (the least recently left go)."""
LEFT_NODES = 8
"""Nodes remembered per model revision, the most recently left."""


class PodTallies:
    """Counts over the charged pods, by priority, namespace and model revision."""

    def __init__(self) -> None:
        self._priorities: Counter[int] = Counter()
        """spec.priority of the charged pods: whether any pod could be preempted for another."""
        self.pods_memory: Counter[str] = Counter()
        """Per namespace, the GPU memory its pods ask (not replicas: `binder.framework.quota`)."""
        self.pods_allowance: dict[str, Counter[str]] = {}
        """Per namespace and priority class, the per-process allowance booked for its pods,
        which no quota's status counts (`binder.framework.quota`)."""
        self.leaving_memory: Counter[str] = Counter()
        """Per namespace, the GPU memory its pods gone from the API still hold (`leave`)."""
        self._leaving: dict[str, tuple[PodInfo, str]] = {}
        """Pod uid -> (the pod, its node): a pod no longer charged whose model its node still
        reports loaded."""
        self._model_nodes: dict[ModelKey, Counter[str]] = {}
        """Per (namespace, model id, revision), the nodes of its pods."""
        self._left: OrderedDict[ModelKey, dict[str, None]] = OrderedDict()
        """Per model revision, the nodes its pods left, most recent last: their agents keep the
        files a while (docs/agent.md), so a new replica there starts without the transfer."""

    def add(self, pod: PodInfo, node: str) -> None:
        """Count a pod charged to `node`."""
        self._priorities[pod.priority] += 1
        if pod.host is None:
            self.pods_memory[pod.namespace] += pod.asked
            if pod.allowance:
                by_class = self.pods_allowance.setdefault(pod.namespace, Counter())
                by_class[pod.priority_class] += pod.allowance
        if pod.model_id:
            self._model_nodes.setdefault(pod.model_key, Counter())[node] += 1

    def remove(self, pod: PodInfo, node: str) -> None:
        """Stop counting a pod `add` counted on `node`; its model revision is noted to have
        left the node."""
        self._priorities[pod.priority] -= 1
        if self._priorities[pod.priority] <= 0:
            del self._priorities[pod.priority]
        if pod.host is None:
            self.pods_memory[pod.namespace] -= pod.asked
            if self.pods_memory[pod.namespace] <= 0:
                del self.pods_memory[pod.namespace]
            if pod.allowance:
                by_class = self.pods_allowance[pod.namespace]
                by_class[pod.priority_class] -= pod.allowance
                if by_class[pod.priority_class] <= 0:
                    del by_class[pod.priority_class]
                if not by_class:
                    del self.pods_allowance[pod.namespace]
        if pod.model_id:
            model = pod.model_key
            self._model_nodes[model][node] -= 1
            if self._model_nodes[model][node] <= 0:
                del self._model_nodes[model][node]
                if not self._model_nodes[model]:
                    del self._model_nodes[model]
            self._note_left(model, node)

    def leave(self, pod: PodInfo, node: str) -> None:
        """A model pod no longer charged whose model `node` still reports loaded: its namespace
        keeps its GPU memory until the node no longer does (`left`)."""
        if pod.host is not None or pod.uid in self._leaving:
            return
        self._leaving[pod.uid] = (pod, node)
        self.leaving_memory[pod.namespace] += pod.asked

    def left(self, uid: str) -> None:
        """The pod's model is no longer loaded on its node (or the pod is charged again)."""
        found = self._leaving.pop(uid, None)
        if found is None:
            return
        namespace = found[0].namespace
        self.leaving_memory[namespace] -= found[0].asked
        if self.leaving_memory[namespace] <= 0:
            del self.leaving_memory[namespace]

    def leaving_on(self, node: str) -> list[PodInfo]:
        """The pods gone from `node` whose models it still reported loaded."""
        return [pod for pod, where in self._leaving.values() if where == node]

    def has_lower_priority(self, priority: int) -> bool:
        """Whether some charged pod has a lower spec.priority (a possible preemption victim)."""
        return any(p < priority for p in self._priorities)

    def nodes_with_model(self, key: ModelKey) -> list[str]:
        """The nodes that have a pod of that model revision."""
        return list(self._model_nodes.get(key, ()))

    def left_nodes(self, key: ModelKey) -> Collection[str]:
        """The nodes a pod of that model revision left, the most recent last."""
        return self._left.get(key) or ()

    def _note_left(self, key: ModelKey, node: str) -> None:
        nodes = self._left.pop(key, {})
        nodes.pop(node, None)
        nodes[node] = None
        while len(nodes) > LEFT_NODES:
            del nodes[next(iter(nodes))]
        self._left[key] = nodes
        while len(self._left) > LEFT_KEYS:
            self._left.popitem(last=False)
