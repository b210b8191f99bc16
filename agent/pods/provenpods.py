"""Which pods the agent acts for: those whose placement on this node it can prove the binder made.

A pod's annotations, labels and `spec.nodeName` are the tenant's to write, so none of them alone
says anything. The binder signs each placement (`common.proofs`); this module rebuilds the claim
from the pod as it is now (uid, namespace, name, node, GPU annotation, model-id and residency
annotations) and checks the signature with the keys in force. A pod created with `spec.nodeName`, a
proof copied from another pod, or a GPU, model id or residency class edited after binding fails
here, and the agent neither serves it nor counts it as wanting a model. A model host's replica is
proved alike, from its entry in the host's annotation and the host's namespace and node
(`agent.pods.modelpods`): the binder signed it as a pod named `<model>/<ordinal>` of uid
`<model uid>/<ordinal>`, which no pod can be. Pure but for reading the key ring it is given.

A verdict is remembered per (claim, proof) while the key ring stays the same (bounded,
`REMEMBERED`): a host's annotation rewritten over and over with the same entries, forged or
not, costs one signature check per entry, not one per write and per pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agent.errors import NotPlacedError
from agent.pods.modelpods import PodInfo
from common.contract import RESIDENCY_ON_DEMAND
from common.proofs import KeyRing, ProofError, pod_claim

REMEMBERED = 16_384
"""Verdicts kept; the oldest is forgotten past it (then checked again when asked)."""


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
        self._ring: KeyRing | None = None
        self._verdicts: dict[tuple[str, ...], int | tuple[str, str]] = {}
        """(claim, proof) -> the request the proof signs, or why it fails (message, kind),
        under `_ring`."""
        self.checked = 0
        """Signatures checked (verdicts not found in memory)."""

    def prove(self, pod: PodInfo) -> Proven:
        """The pod as Proven, or NotPlacedError saying why its placement does not hold."""
        if pod.node_name != self.node_name:
            raise NotPlacedError(
                f"pod {pod.key} is bound to node {pod.node_name or '(none)'}, not to "
                f"{self.node_name}",
                event_reason="NotPlacedByBinder",
            )
        try:
            request = self._verdict(pod)
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
        return Proven(pod, request)

    def _verdict(self, pod: PodInfo) -> int:
        """The GPU memory the pod's proof signs, or ProofError; remembered (see the module)."""
        ring = self._keys()
        if ring is not self._ring:
            self._ring, self._verdicts = ring, {}
        fields = (pod.uid, pod.namespace, pod.name, pod.node_name, pod.gpu_uuid, pod.model_id)
        key = (*fields, pod.residency, pod.placement)
        verdict = self._verdicts.get(key)
        if verdict is None:
            self.checked += 1
            try:
                verdict = ring.verify(pod_claim(*fields, pod.residency), pod.placement).request
            except ProofError as e:
                verdict = (str(e), e.kind)
            if len(self._verdicts) >= REMEMBERED:
                del self._verdicts[next(iter(self._verdicts))]
            self._verdicts[key] = verdict
        if isinstance(verdict, tuple):
            raise ProofError(*verdict)  # a new one each time: a raised one keeps its frames
        return verdict

    def proven(self, pod: PodInfo) -> Proven | None:
        """The pod as Proven, or None when its placement does not hold."""
        try:
            return self.prove(pod)
        except NotPlacedError:
            return None
