"""This node's pods as the agent's pod watch last showed them, and which of them it acts for.

The watch (`agent.kube.PodWatch`) hands its lists and events here; the reconciler reads the pods
to decide which models are wanted, and model operations (`agent.models`) read the proven ones to
see what else a GPU holds and whether a model's recorded owner still lives. A pod counts only
with a proven placement (`agent.placement`) and while it is not terminated. It does no I/O of its
own: the fresh read of one pod is the Kubernetes client's, handed in.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from agent.ownership import OwnerRecord
from agent.placement import PlacementVerifier, Proven
from agent.pods import PodInfo, pod_from_dict
from common.contract import Keys

ReadPod = Callable[[str, str], Awaitable[dict[str, Any] | None]]
"""Read one pod (namespace, name) from the API server; None when it does not exist."""


class NodePods:
    """The pods bound to this node, by namespace/name, once the watch has listed them."""

    def __init__(
        self, verifier: PlacementVerifier, read_pod: ReadPod, *, scheduler_name: str, keys: Keys
    ) -> None:
        self._verifier = verifier
        self._read_pod = read_pod
        self._scheduler_name = scheduler_name
        self._keys = keys
        self.by_key: dict[str, PodInfo] = {}
        self.synced = False
        """Whether the pods have been listed: before, an empty map does not mean "no pods"."""

    def replace(self, items: list[dict[str, Any]]) -> None:
        """The watch listed the node's pods."""
        self.by_key = {}
        for obj in items:
            pod = pod_from_dict(obj, self._keys)
            self.by_key[pod.key] = pod
        self.synced = True

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        """The watch saw a pod added, changed or deleted."""
        pod = pod_from_dict(obj, self._keys)
        if kind == "DELETED":
            self.by_key.pop(pod.key, None)
        else:
            self.by_key[pod.key] = pod

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
        obj = await self._read_pod(owner.namespace, owner.name)
        if obj is None:
            return False
        pod = pod_from_dict(obj, self._keys)
        proven = self.proven(pod) if pod.uid == owner.uid else None
        return proven is not None and proven.model_id == owner.model_id
