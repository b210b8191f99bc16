"""kube-scheduler's NodeResourcesFit and NodePorts filters, over every node at once.

NodeResourcesFit: a node fits a pod when, for each resource the pod asks for, the pod's request
is at most the node's `status.allocatable` minus the requests of every pod bound to the node
that is not terminated, whatever scheduler placed it (`binder.cluster.podindex`), and one more pod
stays within its allocatable `pods`. As upstream, a resource the pod asks none of is not checked (a
pod asking nothing is checked for the pod count only), an extended resource the node does not offer
counts as 0 offered, and every insufficient resource is named (`Insufficient cpu`,
`Insufficient memory`, ...; `Too many pods`). The GPU-memory resource is the binder's own
(`binder.cluster.clusterstate` accounts it per GPU) and is left out of the pod's requests where pods
enter. A node that publishes no allocatable at all (a Node object written by hand) is not judged.

A TritonModel replica (`PodInfo.host`) is judged as the pod its namespace's model host would
grow by: on a node where the namespace has a host, only the replica's own share; elsewhere
that share plus the host's requests and one pod slot (`needs`).

NodePorts: a host port conflicts with one in use on the node for the same protocol and port
when the addresses are equal or either is 0.0.0.0.

Pure: reads the state, no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from binder.cluster.clusterstate import ClusterState
from binder.cluster.objects import PodInfo
from common.podresources import CPU, EPHEMERAL, MEMORY, ports_conflict

BoolArray = npt.NDArray[np.bool_]

REASON_PORTS = "node(s) didn't have free ports for the requested pod ports"
REASON_TOO_MANY_PODS = "Too many pods"
COLUMNS = (CPU, MEMORY, EPHEMERAL)
"""The resources kept as per-node arrays (what nearly every pod asks for); others are checked
node by node, only for the pods that ask for them."""
COLUMNS_ONLY = frozenset(COLUMNS)


def insufficient(resource: str) -> str:
    return f"Insufficient {resource}"


def needs(state: ClusterState, pod: PodInfo, node: str) -> tuple[int, Mapping[str, int]]:
    """The pod slots and requests the pod takes on the node: a pod one slot and its requests; a
    replica its own share, plus a slot and its host's requests where its host group has no host
    on the node yet."""
    host = pod.host
    if host is None:
        return 1, pod.resources
    if state.pods.has_host(pod.host_group or pod.namespace, node):
        return 0, pod.resources
    total = dict(host)
    for resource, amount in pod.resources.items():
        total[resource] = total.get(resource, 0) + amount
    return 1, total


def node_fit_reasons(state: ClusterState, pod: PodInfo, node: str) -> list[str]:
    """NodePorts' reason, else every NodeResourcesFit reason for one node (kube-scheduler stops
    at the first failing plugin, so ports come alone)."""
    if pod.host_ports:
        used = list(state.pods.ports(node))
        if any(ports_conflict(p, u) for p in pod.host_ports for u in used):
            return [REASON_PORTS]
    allocatable = state.nodes[node].allocatable
    if allocatable is None:
        return []
    reasons = []
    slots, resources = needs(state, pod, node)
    if slots and state.pods.pod_count(node) + slots > allocatable.get("pods", 0):
        reasons.append(REASON_TOO_MANY_PODS)
    requested = state.pods.requested(node)
    for resource, amount in _ordered(resources):
        if amount > allocatable.get(resource, 0) - requested.get(resource, 0):
            reasons.append(insufficient(resource))
    return reasons


def _ordered(resources: Mapping[str, int]) -> list[tuple[str, int]]:
    """Upstream's order: cpu, memory, ephemeral-storage, then the others by name."""
    first = [(r, resources[r]) for r in COLUMNS if resources.get(r, 0) > 0]
    rest = sorted((r, a) for r, a in resources.items() if r not in COLUMNS and a > 0)
    return first + rest


def fits_node(state: ClusterState, pod: PodInfo, i: int) -> bool:
    """Whether NodePorts and NodeResourcesFit pass on node `i`, read from scalars: the common
    decision checks a few nodes, and a vector operation over every node would let the watch
    threads take the GIL from the event loop (numpy releases it above 500 elements)."""
    slots, resources = needs(state, pod, state.names[i])
    if pod.host_ports or not COLUMNS_ONLY.issuperset(resources):
        return not node_fit_reasons(state, pod, state.names[i])
    free = state.filters.resource_room()
    if free.pods[i] < slots:
        return False
    room = free.room[i]
    for column, resource in enumerate(COLUMNS):
        amount = resources.get(resource, 0)
        if amount > 0 and room[column] < amount:
            return False
    return True


def fit_mask(state: ClusterState, pod: PodInfo) -> BoolArray:
    """Per node (index order), whether NodePorts and NodeResourcesFit pass."""
    free = state.filters.resource_room()
    host = pod.host
    hosted = _hosted(state, pod) if host is not None else None
    ok = free.pods >= 1 if hosted is None else hosted | (free.pods >= 1)
    for column, resource in enumerate(COLUMNS):
        amount = pod.resources.get(resource, 0)
        extra = host.get(resource, 0) if host is not None else 0
        if hosted is not None and extra > 0:
            need = np.where(hosted, amount, amount + extra)
            ok &= (free.room[:, column] >= need) | (need <= 0)
        elif amount > 0:
            ok &= free.room[:, column] >= amount
    asked = {**(host or {}), **pod.resources}
    others = [r for r in asked if r not in COLUMNS and asked[r] > 0]
    if others:
        for i in np.flatnonzero(ok):
            name = state.names[i]
            allocatable = state.nodes[name].allocatable
            if allocatable is None:
                continue
            requested = state.pods.requested(name)
            resources = needs(state, pod, name)[1]
            if any(
                0 < resources.get(r, 0) > allocatable.get(r, 0) - requested.get(r, 0)
                for r in others
            ):
                ok[i] = False
    if pod.host_ports:
        for name in state.pods.nodes_with_ports():
            i = state.index.get(name)
            if i is not None and ok[i] and node_fit_reasons(state, pod, name) == [REASON_PORTS]:
                ok[i] = False
    return ok


def _hosted(state: ClusterState, pod: PodInfo) -> BoolArray:
    """Per node (index order), whether the replica's host group has a model host there."""
    mask = np.zeros(len(state.names), np.bool_)
    for name in state.pods.host_nodes(pod.host_group or pod.namespace):
        i = state.index.get(name)
        if i is not None:
            mask[i] = True
    return mask
