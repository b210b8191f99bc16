"""Every pod bound to a node and not terminated, whatever its scheduler, as the filters that look
at other pods read them.

- Per node: the sum of its pods' requests, its pod count and its host ports (NodeResourcesFit,
  NodePorts): a node's room is its allocatable minus what every pod on it asks for, pods of
  other schedulers included.
- TritonModel replicas (`PodInfo.host` set) count like pods everywhere below, each on its own,
  but take no pod slot: per host group (the namespace's hosts of one storage Secret,
  `PodInfo.host_group`) and node their model host does, one slot and the host's requests,
  charged with the group's first replica on the node and freed with its last; each replica adds
  only its own share of requests.
- Per namespace: its pods grouped by label set, each group with how many of its pods run on each
  node (InterPodAffinity, PodTopologySpread). Pods of one template share a label set, so a
  selector is matched against a namespace's few groups, not its many pods.
- The pods that carry pod affinity or anti-affinity, grouped by their terms, with their nodes
  (an existing pod's required anti-affinity can keep the incoming pod off its topology domain;
  its preferred terms score).

Pods the binder has bound but not yet seen back from its watch are in it too (`ClusterState`
feeds it with every assumption). Pure bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from binder.cluster.objects import PodInfo
from binder.cluster.podterms import Labels, PodAffinity
from common.podresources import HostPort

LabelsKey = frozenset[tuple[str, str]]


@dataclass
class LabelGroup:
    """Pods of one namespace with one label set, and how many run on each node."""

    labels: Labels
    nodes: Counter[str]
    deleting: Counter[str]
    """Of those, how many are being deleted (PodTopologySpread does not count them)."""


@dataclass
class AffinityGroup:
    """Pods that carry the same pod (anti-)affinity, and how many run on each node."""

    namespace: str
    affinity: PodAffinity
    nodes: Counter[str]


@dataclass(frozen=True)
class _Entry:
    node: str
    namespace: str
    labels_key: LabelsKey
    requests: Mapping[str, int]
    ports: tuple[HostPort, ...]
    affinity: PodAffinity
    deleting: bool
    host: Mapping[str, int] | None
    group: str
    """A replica's host group (`PodInfo.host_group`, else its namespace)."""


class PodIndex:
    def __init__(self) -> None:
        self._pods: dict[str, _Entry] = {}
        self._requested: dict[str, Counter[str]] = {}
        self._counts: Counter[str] = Counter()
        self._ports: dict[str, Counter[HostPort]] = {}
        self._groups: dict[str, dict[LabelsKey, LabelGroup]] = {}
        self._affinity: dict[tuple[str, PodAffinity], AffinityGroup] = {}
        self._hosts: dict[str, Counter[str]] = {}
        """Per host group, its replicas on each node: a node listed has the group's host."""
        self._host_charged: dict[tuple[str, str], Mapping[str, int]] = {}
        """Per (host group, node) with a host, the host requests charged to the node (freed
        as charged, whatever a later replica says)."""
        self.changed_nodes: set[str] = set()
        """Nodes whose requests or pod count changed since the owner last read this (it
        refreshes its per-node arrays from them and clears it)."""

    def __len__(self) -> int:
        return len(self._pods)

    def __contains__(self, uid: str) -> bool:
        return uid in self._pods

    def set_pod(self, pod: PodInfo, node: str) -> None:
        """Count a pod on `node` (replacing what was counted of it)."""
        entry = _Entry(
            node,
            pod.namespace,
            frozenset(pod.labels.items()),
            pod.resources,
            pod.host_ports,
            pod.affinity,
            pod.deleting,
            pod.host,
            pod.host_group or pod.namespace,
        )
        if self._pods.get(pod.uid) == entry:
            return
        self.remove_pod(pod.uid)
        self._pods[pod.uid] = entry
        self._count(entry, pod.labels)

    def _count(self, entry: _Entry, labels: Labels) -> None:
        node = entry.node
        if entry.host is None:
            self._counts[node] += 1
        else:
            replicas = self._hosts.setdefault(entry.group, Counter())
            if not replicas[node]:
                self._counts[node] += 1
                self._host_charged[(entry.group, node)] = entry.host
                if entry.host:
                    self._requested.setdefault(node, Counter()).update(entry.host)
            replicas[node] += 1
        if entry.requests:
            self._requested.setdefault(node, Counter()).update(entry.requests)
        if entry.ports:
            self._ports.setdefault(node, Counter()).update(entry.ports)
        groups = self._groups.setdefault(entry.namespace, {})
        group = groups.get(entry.labels_key)
        if group is None:
            group = groups[entry.labels_key] = LabelGroup(dict(labels), Counter(), Counter())
        group.nodes[node] += 1
        if entry.deleting:
            group.deleting[node] += 1
        if entry.affinity:
            key = (entry.namespace, entry.affinity)
            held = self._affinity.get(key)
            if held is None:
                held = self._affinity[key] = AffinityGroup(
                    entry.namespace, entry.affinity, Counter()
                )
            held.nodes[node] += 1
        self.changed_nodes.add(node)

    def remove_pod(self, uid: str) -> None:
        entry = self._pods.pop(uid, None)
        if entry is None:
            return
        node = entry.node
        if entry.host is None:
            _decrement(self._counts, node)
        else:
            replicas = self._hosts[entry.group]
            _decrement(replicas, node)
            if not replicas[node]:
                _decrement(self._counts, node)
                self._release(node, self._host_charged.pop((entry.group, node)))
                if not replicas:
                    del self._hosts[entry.group]
        self._release(node, entry.requests)
        if entry.ports:
            ports = self._ports[node]
            ports.subtract(entry.ports)
            for port in [p for p, v in ports.items() if v <= 0]:
                del ports[port]
            if not ports:
                del self._ports[node]
        groups = self._groups[entry.namespace]
        group = groups[entry.labels_key]
        _decrement(group.nodes, node)
        if entry.deleting:
            _decrement(group.deleting, node)
        if not group.nodes:
            del groups[entry.labels_key]
            if not groups:
                del self._groups[entry.namespace]
        if entry.affinity:
            key = (entry.namespace, entry.affinity)
            held = self._affinity[key]
            _decrement(held.nodes, node)
            if not held.nodes:
                del self._affinity[key]
        self.changed_nodes.add(node)

    def _release(self, node: str, requests: Mapping[str, int]) -> None:
        if not requests:
            return
        requested = self._requested[node]
        requested.subtract(requests)
        for resource in [r for r, v in requested.items() if v <= 0]:
            del requested[resource]
        if not requested:
            del self._requested[node]

    def take(self, uid: str) -> object | None:
        """Remove a pod and return what was counted of it, for `put` to count again."""
        entry = self._pods.get(uid)
        self.remove_pod(uid)
        return entry

    def put(self, uid: str, taken: object | None) -> None:
        """Count again what `take` returned."""
        if not isinstance(taken, _Entry):
            return
        self.remove_pod(uid)
        self._pods[uid] = taken
        self._count(taken, dict(taken.labels_key))

    def uids(self) -> set[str]:
        return set(self._pods)

    def node_of(self, uid: str) -> str | None:
        entry = self._pods.get(uid)
        return entry.node if entry is not None else None

    # ---- per node ------------------------------------------------------------------------------

    def requested(self, node: str) -> Mapping[str, int]:
        """The sum of the requests of the pods on the node (resources none asks for absent)."""
        return self._requested.get(node, {})

    def pod_count(self, node: str) -> int:
        """The pods on the node, a model host counted once however many replicas it serves."""
        return self._counts.get(node, 0)

    # ---- model hosts ---------------------------------------------------------------------------

    def has_host(self, group: str, node: str) -> bool:
        """Whether the host group (a namespace's hosts of one storage Secret; the namespace for
        those of none) has a model host on the node (a replica placed there)."""
        replicas = self._hosts.get(group)
        return replicas is not None and node in replicas

    def host_nodes(self, group: str) -> Iterator[str]:
        """The nodes where the host group has a model host."""
        return iter(self._hosts.get(group, ()))

    def host_count(self) -> int:
        """Model hosts in the cluster: (host group, node) pairs with a replica."""
        return len(self._host_charged)

    def nodes_with_ports(self) -> list[str]:
        """The nodes where some pod holds a host port."""
        return list(self._ports)

    def ports(self, node: str) -> Iterator[HostPort]:
        """The host ports in use on the node."""
        return iter(self._ports.get(node, ()))

    # ---- per namespace, by labels --------------------------------------------------------------

    def namespaces(self) -> Iterator[str]:
        return iter(self._groups)

    def groups(self, namespace: str) -> Iterator[LabelGroup]:
        """The namespace's pods by label set (none when it has no bound pods)."""
        return iter(self._groups.get(namespace, {}).values())

    def affinity_groups(self) -> Iterator[AffinityGroup]:
        """The bound pods that carry pod affinity or anti-affinity, grouped by their terms."""
        return iter(self._affinity.values())


def _decrement(counter: Counter[str], key: str) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]
