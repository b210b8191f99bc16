"""Per-node columns for the filters beside GPU memory, cached until the nodes change.

PodTopologySpread and inter-pod affinity read each node's topology domain per label key;
NodeResourcesFit reads each node's room (allocatable minus the requests of its pods). Facts of
the nodes and their pods only: no rule is judged here (the filters that read the columns are
kube-scheduler's, in binder.framework). Each column is indexed by the cluster state's node order
(binder.cluster.clusterstate, which owns it and the rows it reads) and kept until a node joins,
leaves or changes; the room follows the nodes whose pods changed. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from binder.cluster.objects import NodeInfo
from binder.cluster.podindex import PodIndex

IntArray = npt.NDArray[np.int64]

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


class NodeRows(Protocol):
    """What the columns read of the cluster state: its nodes in index order, and their pods."""

    nodes: dict[str, NodeInfo]
    names: list[str]
    index: dict[str, int]
    nodes_version: int
    """Moves whenever a node joins, leaves, or changes labels, taints or cordon."""
    pods: PodIndex

    def arrays(self) -> None:
        """Bring `names` and `index` up to date with `nodes`."""


class FilterColumns:
    """Topology domains and NodeResourcesFit's room."""

    def __init__(self, rows: NodeRows) -> None:
        self._rows = rows
        self._domains: dict[str, tuple[int, IntArray, list[str]]] = {}
        self._room: ResourceRoom | None = None
        self._room_version = -1
        """The `nodes_version` `_room` was built at (rebuilt when nodes join or leave)."""
        self._room_stale: set[str] = set()

    def allocatable_changed(self, node: str) -> None:
        """A node joined or its allocatable changed: its room is read again."""
        self._room_stale.add(node)

    def resource_room(self) -> ResourceRoom:
        """Each node's room for NodeResourcesFit, brought up to date with the pods and nodes
        that changed since the last read."""
        rows = self._rows
        rows.arrays()
        stale = self._room_stale | rows.pods.changed_nodes
        rows.pods.changed_nodes = set()
        self._room_stale = set()
        room = self._room
        if room is None or self._room_version != rows.nodes_version or self._dirty_room():
            count = len(rows.names)
            room = self._room = ResourceRoom(
                np.zeros((count, len(ROOM_COLUMNS)), np.int64), np.zeros(count, np.int64)
            )
            self._room_version = rows.nodes_version
            stale = set(rows.names)
        for name in stale:
            i = rows.index.get(name)
            if i is None:
                continue
            allocatable = rows.nodes[name].allocatable
            if allocatable is None:
                room.room[i] = UNJUDGED
                room.pods[i] = UNJUDGED
                continue
            requested = rows.pods.requested(name)
            for column, resource in enumerate(ROOM_COLUMNS):
                room.room[i, column] = allocatable.get(resource, 0) - requested.get(resource, 0)
            room.pods[i] = allocatable.get("pods", 0) - rows.pods.pod_count(name)
        return room

    def _dirty_room(self) -> bool:
        return self._room is not None and len(self._room.pods) != len(self._rows.names)

    def topology_domains(self, key: str) -> tuple[IntArray, list[str]]:
        """Per node (in index order) the id of its value of label `key` (-1: the node lacks the
        label), and the values by id; kept until a node joins, leaves or changes labels."""
        rows = self._rows
        rows.arrays()
        cached = self._domains.get(key)
        if cached is not None and cached[0] == rows.nodes_version:
            return cached[1], cached[2]
        ids: dict[str, int] = {}
        column = np.full(len(rows.names), -1, np.int64)
        for i, name in enumerate(rows.names):
            value = rows.nodes[name].labels.get(key)
            if value is not None:
                column[i] = ids.setdefault(value, len(ids))
        values = list(ids)
        if len(self._domains) > 64:
            self._domains.clear()
        self._domains[key] = (rows.nodes_version, column, values)
        return column, values
