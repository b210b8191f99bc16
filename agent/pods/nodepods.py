"""This node's pods as the agent's pod watch last showed them, and which of them it acts for.

The watch (`agent.kube.client.PodWatch`) hands its lists and events here; the reconciler reads the
pods to decide which models are wanted, and model operations (`agent.models.nodemodels`) read the
proven ones to see what else a GPU holds and whether a model's recorded owner still lives. A pod
counts only with a proven placement (`agent.pods.provenpods`) and while it is not terminated. A
model host stands for its replicas (`agent.pods.modelpods.pods_from_dict`), each kept here as a pod
of its own, so every reader sees replicas as pods. A host naming more replicas than the node can
hold of one namespace (`max_hosted`: its GPUs' memory over the least a model may ask) stands for
none, so a forged annotation of thousands of entries costs nothing past its reading
(`agent.pods.modelpods`). It does no I/O of its own: the fresh read of one pod is the Kubernetes
client's, handed in.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from agent.errors import NotPlacedError
from agent.pods.modelpods import (
    PodInfo,
    controller_uid,
    is_host,
    pod_from_dict,
    pod_ready,
    pods_from_dict,
    stale_conditions,
)
from agent.pods.ownership import OwnerRecord
from agent.pods.provenpods import PlacementVerifier, Proven
from common.contract import Keys
from common.hosted import host_name, serves_label

REFUSED_PER_HOST = 8
"""Refused replicas of one model host that the agent says why on the host (ListHosted lists
them all)."""

ReadPod = Callable[[str, str], Awaitable[dict[str, Any] | None]]
"""Read one pod (namespace, name) from the API server; None when it does not exist."""


class NodePods:
    """The pods bound to this node, by namespace/name, once the watch has listed them."""

    def __init__(
        self,
        verifier: PlacementVerifier,
        read_pod: ReadPod,
        *,
        scheduler_name: str,
        keys: Keys,
        max_hosted: Callable[[], int] = lambda: 0,
    ) -> None:
        """`max_hosted()`: the most replicas a host of this node may name (0: not known yet)."""
        self._verifier = verifier
        self._max_hosted = max_hosted
        self._read_pod = read_pod
        self._scheduler_name = scheduler_name
        self._keys = keys
        self.by_key: dict[str, PodInfo] = {}
        """Pods and replicas, by namespace/name (a replica's name has a slash, a pod's none)."""
        self._stands_for: dict[str, list[str]] = {}
        """A pod's namespace/name -> the keys it stands for in `by_key`."""
        self._hosts: dict[str, tuple[PodInfo, list[str]]] = {}
        """A model host's namespace/name -> the host, and its loaded conditions of replicas no
        longer in its annotation."""
        self._host_objects: dict[str, dict[str, Any]] = {}
        """A model host's namespace/name -> the host as the watch last showed it."""
        self._pod_objects: dict[str, dict[str, Any]] = {}
        """A model pod's namespace/name -> the pod as the watch last showed it."""
        self.synced = False
        """Whether the pods have been listed: before, an empty map does not mean "no pods"."""

    @property
    def scheduler_name(self) -> str:
        """The scheduler whose pods are tritonshare's."""
        return self._scheduler_name

    @property
    def keys(self) -> Keys:
        return self._keys

    def replace(self, items: list[dict[str, Any]]) -> list[tuple[PodInfo, str]]:
        """The watch listed the node's pods; returns the hosts that stand for no replica and
        why (a malformed annotation)."""
        self.by_key, self._stands_for, self._hosts, self._host_objects = {}, {}, {}, {}
        self._pod_objects = {}
        problems = [self._put(obj) for obj in items]
        self.synced = True
        return [p for p in problems if p is not None]

    def apply(self, kind: str, obj: dict[str, Any]) -> list[tuple[PodInfo, str]]:
        """The watch saw a pod added, changed or deleted; returns as `replace` does."""
        pod = pod_from_dict(obj, self._keys)
        for key in self._stands_for.pop(pod.key, ()):
            self.by_key.pop(key, None)
        self._hosts.pop(pod.key, None)
        self._host_objects.pop(pod.key, None)
        self._pod_objects.pop(pod.key, None)
        if kind == "DELETED":
            return []
        problem = self._put(obj)
        return [problem] if problem is not None else []

    def _put(self, obj: dict[str, Any]) -> tuple[PodInfo, str] | None:
        pods, problem = pods_from_dict(obj, self._keys, self._max_hosted())
        owner = pod_from_dict(obj, self._keys)
        keys = []
        for pod in pods:
            if pod.key in self.by_key:
                continue  # a host cannot name a replica twice, nor a pod take another's name
            self.by_key[pod.key] = pod
            keys.append(pod.key)
        self._stands_for[owner.key] = keys
        if problem:
            return owner, problem
        if is_host(obj, self._keys):
            self._hosts[owner.key] = (owner, stale_conditions(obj, self._keys, pods))
            self._host_objects[owner.key] = obj
        elif self._ours(owner):
            self._pod_objects[owner.key] = obj
        return None

    def is_host(self, key: str) -> bool:
        """Whether the pod `namespace/name` is a model host of this node (only the binder may
        create one: an admission policy)."""
        return key in self._hosts

    def watched_host(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The model host `namespace/name` as the pod watch last showed it; None when the watch
        has not listed yet or shows no such host (the caller reads it fresh then)."""
        if not self.synced:
            return None
        return self._host_objects.get(f"{namespace}/{name}")

    def routed_hosts(self) -> list[str]:
        """This node's live model hosts still in the Service of a model they serve a replica of
        (labelled `<prefix>serves-<model>: "true"`), by namespace/name."""
        routed = []
        for key, obj in self._host_objects.items():
            labels = (obj.get("metadata") or {}).get("labels") or {}
            models = {
                pod.model_id
                for pod_key in self._stands_for.get(key, ())
                if (pod := self.by_key.get(pod_key)) is not None and self._ours(pod)
            }
            if any(labels.get(serves_label(self._keys, model)) == "true" for model in models):
                routed.append(key)
        return sorted(routed)

    def served_model_pods(self) -> list[tuple[PodInfo, str]]:
        """This node's live model pods that are Ready (in their Services) and owned by a
        controller, each with its controller's uid, by namespace/name."""
        served = []
        for key, obj in sorted(self._pod_objects.items()):
            pod = self.by_key.get(key)
            controller = controller_uid(obj)
            if pod is not None and not pod.deleting and controller and pod_ready(obj):
                served.append((pod, controller))
        return served

    def ready(self, keys: Iterable[str]) -> list[str]:
        """Which of the model pods `keys` (namespace/name) the watch last showed Ready."""
        return [k for k in keys if (obj := self._pod_objects.get(k)) is not None and pod_ready(obj)]

    def _ours(self, pod: PodInfo) -> bool:
        return pod.scheduler_name == self._scheduler_name and not pod.terminated

    def unproven(self) -> list[tuple[PodInfo, NotPlacedError]]:
        """The replicas of this node's live model hosts whose proofs do not verify, and why: at
        most REFUSED_PER_HOST a host (each costs the agent a condition and an Event on it, and a
        tenant writes its own host's annotation)."""
        refused = []
        per_host: dict[str, int] = {}
        for pod in list(self.by_key.values()):
            if not pod.host or not self._ours(pod):
                continue
            if per_host.get(pod.object_key, 0) >= REFUSED_PER_HOST:
                continue
            try:
                self._verifier.prove(pod)
            except NotPlacedError as e:
                refused.append((pod, e))
                per_host[pod.object_key] = per_host.get(pod.object_key, 0) + 1
        return refused

    def stale(self) -> list[tuple[PodInfo, list[str]]]:
        """This node's live model hosts that carry loaded conditions of replicas they no longer
        serve, and those conditions."""
        return [(h, types) for h, types in self._hosts.values() if types and self._ours(h)]

    def replica(self, key: str, uid: str) -> PodInfo | None:
        """The replica of a model host of this node with this uid, by its own key or its
        host's, as the watch last saw it. Never another namespace's: a replica's uid is its
        TritonModel's, which a tenant can copy into its own host's annotation."""
        if "/" not in uid:
            return None
        pod = self.by_key.get(key)
        if pod is not None and pod.host and pod.uid == uid:
            return pod
        found = (p for p in self.by_key.values() if p.host and p.object_key == key)
        return next((p for p in found if p.uid == uid), None)

    def proven(self, pod: PodInfo) -> Proven | None:
        """The pod with its proof, when it is a live tritonshare pod placed on this node."""
        if pod.scheduler_name != self._scheduler_name or pod.terminated:
            return None
        return self._verifier.proven(pod)

    def all_proven(self) -> list[Proven]:
        """Every live pod of the node with a proven placement."""
        pods = (self.proven(pod) for pod in list(self.by_key.values()))
        return [p for p in pods if p is not None]

    async def owner_alive(self, owner: OwnerRecord) -> bool:
        """Whether the recorded owner of a model is still a live pod here, proven for its model
        id (read fresh: the watch may lag a pod that was just deleted or replaced)."""
        replica = "/" in owner.name
        name = owner.name
        if replica:
            watched = self.by_key.get(f"{owner.namespace}/{owner.name}")
            name = watched.host if watched is not None else host_name(self._verifier.node_name)
        obj = await self._read_pod(owner.namespace, name)
        if obj is None:
            return False
        pods, _ = pods_from_dict(obj, self._keys, self._max_hosted())
        pod = next((p for p in pods if p.uid == owner.uid), None)
        proven = self.proven(pod) if pod is not None else None
        return proven is not None and proven.model_id == owner.model_id
