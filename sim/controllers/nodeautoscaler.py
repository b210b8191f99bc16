"""The simulated Cluster Autoscaler: node groups grown for pods that fit no node, and shrunk by
nodes that are unneeded, by the rules its FAQ documents. Acts only through the API (the official
client), as `tritonshare-sim-node-autoscaler`; a node group's "cloud" is a template Node object
and two callbacks (`on_added`, `on_removed`, the first `boot_seconds` after the node registers)
where a test plays what the new machine runs.

Scale-up, each pass:
- the candidates are pods with `PodScheduled=False` reason `Unschedulable`, whatever their
  scheduler, of priority at least `expendable_cutoff` (upstream's
  --expendable-pods-priority-cutoff, -10), not nominated to a node;
- a candidate that fits an existing node by kube-scheduler's rules (`sim.controllers.nodefit`:
  upstream simulates the default scheduler, whatever the pod's `schedulerName`) is left alone
  ("filtered out as schedulable");
- the others are packed, first fit, onto new nodes of the first group (by name) below its
  `max_size` whose template, with the group's DaemonSet pods on it, fits them; the group grows
  by the nodes used (capped at `max_size`) and each pod gets a `TriggeredScaleUp` Event.

Scale-down, each pass once `scale_down_delay_after_add` has passed since the last scale-up:
- a node of a group above its `min_size` is a candidate unless it has the annotation
  `cluster-autoscaler.kubernetes.io/scale-down-disabled: "true"`;
- its utilization is, for a node with GPUs (allocatable `nvidia.com/gpu`), its pods' GPU
  requests over its GPUs, else the larger of CPU and memory; DaemonSet pods count unless
  `ignore_daemonsets_utilization` (upstream's flag, default false); below
  `utilization_threshold` (0.5) it is unneeded if every pod that must move can:
  - DaemonSet pods and pods below the expendable cutoff need not move;
  - a pod with `cluster-autoscaler.kubernetes.io/safe-to-evict: "false"` blocks, as does one
    without a controller or with a controller of a kind upstream does not know (a TritonModel:
    --skip-nodes-with-custom-controller-pods, default true), unless it is marked
    `safe-to-evict: "true"`;
  - each must fit another node (not being removed) beside the pods there;
- a node unneeded for `scale_down_unneeded_time` (upstream 10 min) is drained (its pods deleted)
  and removed (its Node object deleted, then `on_removed`), one a pass.

Not simulated: expanders other than "first group by name", balancing, scale-up from zero
templates of the cloud's tags (the template is given), node readiness and max-node-provision-time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sim.controllers.defaultscheduler import Loop, event_object, list_json
from sim.controllers.nodefit import quantity, requests, running_on, unfit

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]
USER_AGENT = "tritonshare-sim-node-autoscaler"
SCALE_DOWN_DISABLED = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
GROUP_LABEL = "sim.tritonshare.io/node-group"
KNOWN_CONTROLLERS = frozenset(
    {"ReplicaSet", "ReplicationController", "Job", "StatefulSet", "DaemonSet"}
)
GPU = "nvidia.com/gpu"


@dataclass
class NodeGroup:
    """A node group: its bounds, the Node every new node copies, what runs there first."""

    name: str
    template: JsonObject
    """A Node: labels, taints, annotations, status.allocatable; its name is replaced."""
    min_size: int = 0
    max_size: int = 10
    daemonset_pods: Sequence[JsonObject] = ()
    """Pods the group's DaemonSets run on every node (counted in the template, as upstream)."""
    boot_seconds: float = 0.0
    """Seconds from a node's registration to `on_added` (its daemons, the node pod's agent
    among them, starting), during which the default scheduler may already bind to it."""
    on_added: Callable[[str], None] = lambda node: None
    on_removed: Callable[[str], None] = lambda node: None
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def _is_daemonset_pod(pod: Mapping[str, Any]) -> bool:
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("kind") == "DaemonSet" and r.get("controller") for r in refs)


def _priority(pod: Mapping[str, Any]) -> int:
    return int((pod.get("spec") or {}).get("priority") or 0)


def _unschedulable(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    return any(
        c.get("type") == "PodScheduled"
        and c.get("status") == "False"
        and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or []
    )


class ClusterAutoscaler(Loop):
    """Scales `groups` up and down by Cluster Autoscaler's rules (see the module)."""

    name = "sim-cluster-autoscaler"

    def __init__(
        self,
        api: client.ApiClient,
        groups: Sequence[NodeGroup],
        *,
        period: float = 0.2,
        scale_down_unneeded_time: float = 600.0,
        scale_down_delay_after_add: float = 600.0,
        utilization_threshold: float = 0.5,
        expendable_cutoff: int = -10,
        ignore_daemonsets_utilization: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(period)
        api.user_agent = USER_AGENT
        self.core: Any = client.CoreV1Api(api)
        self.groups = {g.name: g for g in groups}
        self.unneeded_time = scale_down_unneeded_time
        self.delay_after_add = scale_down_delay_after_add
        self.threshold = utilization_threshold
        self.cutoff = expendable_cutoff
        self.ignore_daemonsets = ignore_daemonsets_utilization
        self.clock = clock
        self._last_scale_up = -float("inf")
        self._unneeded_since: dict[str, float] = {}
        self._serial = 0
        self._booting: list[tuple[float, NodeGroup, str]] = []

    # ---- one pass ------------------------------------------------------------------------

    def sync_once(self) -> None:
        now = self.clock()
        for entry in [b for b in self._booting if b[0] <= now]:
            self._booting.remove(entry)
            entry[1].on_added(entry[2])
        nodes = list_json(self.core.list_node)
        pods = list_json(self.core.list_pod_for_all_namespaces)
        if self.scale_up(nodes, pods):
            return
        self.scale_down(nodes, pods)

    def _group_of(self, node: Mapping[str, Any]) -> NodeGroup | None:
        name = ((node.get("metadata") or {}).get("labels") or {}).get(GROUP_LABEL)
        return self.groups.get(name) if name else None

    def _template(self, group: NodeGroup, name: str) -> JsonObject:
        node = {**group.template, "apiVersion": "v1", "kind": "Node"}
        metadata = dict(node.get("metadata") or {})
        metadata["name"] = name
        metadata["labels"] = {
            **(metadata.get("labels") or {}),
            "kubernetes.io/hostname": name,
            GROUP_LABEL: group.name,
        }
        node["metadata"] = metadata
        return node

    def scale_up(self, nodes: list[JsonObject], pods: list[JsonObject]) -> bool:
        """Grow groups for the candidates no node takes; True when a group grew."""
        candidates = [
            p
            for p in pods
            if not (p.get("spec") or {}).get("nodeName")
            and not (p.get("metadata") or {}).get("deletionTimestamp")
            and not (p.get("status") or {}).get("nominatedNodeName")
            and _priority(p) >= self.cutoff
            and _unschedulable(p)
        ]
        left = [
            p
            for p in candidates
            if not any(unfit(p, n, running_on(pods, n["metadata"]["name"])) is None for n in nodes)
        ]
        if not left:
            return False
        size = {g: 0 for g in self.groups}
        for node in nodes:
            if (group := self._group_of(node)) is not None:
                size[group.name] += 1
        for group in sorted(self.groups.values(), key=lambda g: g.name):
            room = group.max_size - size[group.name]
            if room <= 0:
                continue
            bins: list[list[JsonObject]] = []
            helped: list[JsonObject] = []
            for pod in left:
                for placed in bins:
                    if unfit(pod, self._template(group, "template"), placed) is None:
                        placed.append(pod)
                        helped.append(pod)
                        break
                else:
                    fresh = list(group.daemonset_pods)
                    if (
                        len(bins) < room
                        and unfit(pod, self._template(group, "template"), fresh) is None
                    ):
                        bins.append([*fresh, pod])
                        helped.append(pod)
            if not bins:
                continue
            before = size[group.name]
            for _ in bins:
                self._add(group)
            message = (
                f"pod triggered scale-up: [{{{group.name} {before}->{before + len(bins)} "
                f"(max: {group.max_size})}}]"
            )
            for pod in helped:
                event_object(
                    self.core, pod, "TriggeredScaleUp", message, "Normal", "cluster-autoscaler"
                )
            self._last_scale_up = self.clock()
            return True
        return False

    def _add(self, group: NodeGroup) -> None:
        self._serial += 1
        name = f"{group.name}-{self._serial}"
        while any(name in g.added for g in self.groups.values()):
            self._serial += 1
            name = f"{group.name}-{self._serial}"
        self.core.create_node(self._template(group, name))
        group.added.append(name)
        log.info("Scale-up: node group %s adds node %s.", group.name, name)
        if group.boot_seconds > 0:
            self._booting.append((self.clock() + group.boot_seconds, group, name))
        else:
            group.on_added(name)

    # ---- scale-down ------------------------------------------------------------------------

    def utilization(self, node: Mapping[str, Any], on_node: Sequence[Mapping[str, Any]]) -> float:
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        counted = [p for p in on_node if not (self.ignore_daemonsets and _is_daemonset_pod(p))]

        def share(resource: str) -> float:
            have = quantity(allocatable.get(resource, 0))
            if have <= 0:
                return 0.0
            used = sum((requests(p).get(resource, Decimal(0)) for p in counted), Decimal(0))
            return float(used / have)

        if quantity(allocatable.get(GPU, 0)) > 0:
            return share(GPU)
        return max(share("cpu"), share("memory"))

    def blocker(self, pod: Mapping[str, Any]) -> str | None:
        """Why `pod` keeps its node (None: it may be moved)."""
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        safe = annotations.get(SAFE_TO_EVICT)
        if safe == "false":
            return f"pod annotated {SAFE_TO_EVICT}=false"
        if safe == "true":
            return None
        refs = [
            r
            for r in (pod.get("metadata") or {}).get("ownerReferences") or []
            if r.get("controller")
        ]
        if not refs:
            return "pod not backed by a controller"
        if refs[0].get("kind") not in KNOWN_CONTROLLERS:
            return f"pod of a custom controller ({refs[0].get('kind')})"
        return None

    def removable(
        self, node: JsonObject, nodes: Sequence[JsonObject], pods: Sequence[JsonObject]
    ) -> str | None:
        """Why `node` is needed (None: it is unneeded)."""
        name = node["metadata"]["name"]
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        if annotations.get(SCALE_DOWN_DISABLED) == "true":
            return f"node annotated {SCALE_DOWN_DISABLED}=true"
        on_node = running_on(pods, name)
        used = self.utilization(node, on_node)
        if used >= self.threshold:
            return f"utilization {used:.2f} is not below {self.threshold}"
        others = [n for n in nodes if n["metadata"]["name"] != name]
        moved: dict[str, list[Mapping[str, Any]]] = {}
        for pod in on_node:
            if _is_daemonset_pod(pod) or _priority(pod) < self.cutoff:
                continue
            if (why := self.blocker(pod)) is not None:
                return why
            # Moved, it is scheduled anew: its node name is the one rule it no longer has.
            pod = {**pod, "spec": {**(pod.get("spec") or {}), "nodeName": ""}}
            for other in others:
                there = [
                    *running_on(pods, other["metadata"]["name"]),
                    *moved.get(other["metadata"]["name"], []),
                ]
                if unfit(pod, other, there) is None:
                    moved.setdefault(other["metadata"]["name"], []).append(pod)
                    break
            else:
                meta = pod["metadata"]
                return f"pod {meta['namespace']}/{meta['name']} fits no other node"
        return None

    def scale_down(self, nodes: list[JsonObject], pods: list[JsonObject]) -> None:
        now = self.clock()
        if now - self._last_scale_up < self.delay_after_add:
            return
        size: dict[str, int] = {}
        for node in nodes:
            if (group := self._group_of(node)) is not None:
                size[group.name] = size.get(group.name, 0) + 1
        seen = set()
        for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
            name = node["metadata"]["name"]
            group = self._group_of(node)
            if group is None or size[group.name] <= group.min_size:
                self._unneeded_since.pop(name, None)
                continue
            seen.add(name)
            why = self.removable(node, nodes, pods)
            if why is not None:
                self._unneeded_since.pop(name, None)
                continue
            since = self._unneeded_since.setdefault(name, now)
            if now - since >= self.unneeded_time:
                self._remove(group, node, pods)
                return
        for name in set(self._unneeded_since) - seen:
            del self._unneeded_since[name]

    def _remove(self, group: NodeGroup, node: JsonObject, pods: Sequence[JsonObject]) -> None:
        name = node["metadata"]["name"]
        log.info("Scale-down: removing unneeded node %s of group %s.", name, group.name)
        event_object(
            self.core,
            {**node, "kind": "Node"},
            "ScaleDown",
            "node removed by cluster autoscaler",
            "Normal",
            "cluster-autoscaler",
        )
        for pod in running_on(pods, name):
            meta = pod["metadata"]
            try:
                self.core.delete_namespaced_pod(
                    meta["name"], meta["namespace"], grace_period_seconds=0
                )
            except ApiException as e:
                if e.status != 404:
                    raise
        self.core.delete_node(name)
        self._unneeded_since.pop(name, None)
        group.removed.append(name)
        group.on_removed(name)
