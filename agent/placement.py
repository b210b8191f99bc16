"""Which pods the agent acts for: those whose placement on this node it can prove the binder made.

A pod's annotations, labels and `spec.nodeName` are the tenant's to write, so none of them alone
says anything. The binder signs each placement (`common.placement`); this module rebuilds the claim
from the pod as it is now (uid, namespace, name, node, GPU annotation, model-id and residency
annotations) and checks the signature with the keys in force. A pod created with `spec.nodeName`, a
proof copied from another pod, or a GPU, model id or residency class edited after binding fails
here, and the agent neither serves it nor counts it as wanting a model. A model host's replica is
proved alike, from its entry in the host's annotation and the host's namespace and node
(`agent.pods`): the binder signed it as a pod named `<model>/<ordinal>` of uid
`<model uid>/<ordinal>`, which no pod can be. Pure but for reading the key ring it is given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agent.errors import NotPlacedError
from agent.pods import PodInfo
from common.contract import RESIDENCY_ON_DEMAND
from common.placement import KeyRing, ProofError, pod_claim


@dataclass(frozen=True)
class Proven:
    """A pod with a placement the binder made, and what that placement decided."""

    pod: PodInfo
    request: int
    """The GPU memory the binder booked for the pod, in bytes."""

    @property
    def uid(self) -> str:
        return self.pod.uid

    @property
    def key(self) -> str:
        return self.pod.key

    @property
    def model_id(self) -> str:
        return self.pod.model_id

    @property
    def gpu_uuid(self) -> str:
        return self.pod.gpu_uuid

    @property
    def namespace(self) -> str:
        return self.pod.namespace

    @property
    def residency(self) -> str:
        """The residency class the binder decided (the proof binds the annotation)."""
        return self.pod.residency

    @property
    def on_demand(self) -> bool:
        return self.pod.residency == RESIDENCY_ON_DEMAND


class PlacementVerifier:
    """Proves pods against the binder's keys, for one node."""

    def __init__(self, keys: Callable[[], KeyRing], node_name: str) -> None:
        self._keys = keys
        self.node_name = node_name

    def prove(self, pod: PodInfo) -> Proven:
        """The pod as Proven, or NotPlacedError saying why its placement does not hold."""
        if pod.node_name != self.node_name:
            raise NotPlacedError(
                f"pod {pod.key} is bound to node {pod.node_name or '(none)'}, not to "
                f"{self.node_name}",
                event_reason="NotPlacedByBinder",
            )
        claim = pod_claim(
            pod.uid,
            pod.namespace,
            pod.name,
            pod.node_name,
            pod.gpu_uuid,
            pod.model_id,
            pod.residency,
        )
        try:
            proof = self._keys().verify(claim, pod.placement)
        except ProofError as e:
            reason = "PlacementChanged" if pod.placement else "NotPlacedByBinder"
            if pod.host:
                raise NotPlacedError(
                    f"replica {pod.name} of model host {pod.object_key} was not placed on this "
                    f"node by the tritonshare binder: {e}; only the binder writes a host's "
                    f"hosted-models annotation (an entry copied from another host or edited "
                    f"does not verify)",
                    event_reason=reason,
                ) from e
            raise NotPlacedError(
                f"pod {pod.key} was not placed on this node by the tritonshare binder: {e}; "
                f"create it without spec.nodeName and let the binder place it, and do not edit "
                f"its tritonshare annotations afterwards",
                event_reason=reason,
            ) from e
        return Proven(pod, proof.request)

    def proven(self, pod: PodInfo) -> Proven | None:
        """The pod as Proven, or None when its placement does not hold."""
        try:
            return self.prove(pod)
        except NotPlacedError:
            return None
