"""Which bound pods the binder charges: those whose proof of placement verifies.

A tenant can create a pod with `spec.nodeName` (skipping the binder), copy a proof from another pod,
or edit its own pod's annotations after binding. Charging such a pod's GPU memory, or counting its
model id as present on its node, would let any tenant starve placement or keep a victim's model off
every node. So a bound pod counts only if the binder's key ring (`current` or `previous`) verifies
its proof against the pod as it is now (uid, namespace, name, node, GPU, model id and residency
class), and it is then charged at the request the proof names: what the binder booked. Pods the
binder assumed (bound itself, not yet seen back) are charged by `ClusterState.assume`.

Everything else is `Unproven`: never charged, reported (an Event, and `tritonshare status` and
`explain`) when it sits on a tritonshare node. The verdict is a function of the pod and the ring
only, so every replica, and a restarted binder, reaches the same ledger from the API.

Pure: the caller passes the ring; no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from binder.cluster.objects import PodInfo
from common.contract import RESIDENCY_ALWAYS, RESIDENCY_ON_DEMAND
from common.proofs import Claim, KeyRing, ProofError, parse_proof, pod_claim

NOT_PLACED = "NotPlacedByBinder"
"""Event reason: no proof, or one the binder never wrote (malformed)."""
CHANGED = "PlacementChanged"
"""Event reason: a proof that does not match the pod (copied from another pod, or the pod's GPU,
model id or proof edited after binding)."""
KEY_UNKNOWN = "PlacementKeyUnknown"
"""Event reason: signed with a key the binder no longer holds (rotated out) or never held."""

_REASONS = {
    "absent": NOT_PLACED,
    "malformed": NOT_PLACED,
    "unknown-key": KEY_UNKNOWN,
    "mismatch": CHANGED,
}
_WHY = {
    NOT_PLACED: "it was not placed by the tritonshare binder (no proof of placement)",
    CHANGED: (
        "its proof of placement does not match it (copied from another pod, or its GPU, model "
        "id or proof edited after binding)"
    ),
    KEY_UNKNOWN: (
        "its proof of placement was signed with a key the binder no longer holds (rotated out "
        "of the placement-key Secret's current and previous)"
    ),
}
_FIX = {
    NOT_PLACED: (
        "create it without spec.nodeName and with schedulerName tritonshare, and let the "
        "binder place it"
    ),
    CHANGED: "do not edit its tritonshare annotations; recreate it to have it placed again",
    KEY_UNKNOWN: "recreate it (kubectl rollout restart) so the binder signs it with the new key",
}


@dataclass(frozen=True, slots=True)
class Unproven:
    """A bound pod the binder does not charge, and why."""

    pod: PodInfo
    reason: str
    """The Event reason: NOT_PLACED, CHANGED or KEY_UNKNOWN."""

    @property
    def why(self) -> str:
        return _WHY[self.reason]

    @property
    def message(self) -> str:
        """The Event's message: what is wrong, its consequence, and what to do."""
        return (
            f"Pod {self.pod.key} on node {self.pod.node_name} carries tritonshare resources or "
            f"annotations, but {self.why}: the binder does not count its GPU memory or its "
            f"model id, and the node's agent does not serve it. To run it on tritonshare, "
            f"{_FIX[self.reason]}."
        )


def sign(ring: KeyRing, pod: PodInfo, node: str, gpu_uuid: str) -> str:
    """The proof of placing `pod` (a pod, or a TritonModel replica: `ModelInfo.replica`) on
    that node's GPU, signed with the current key."""
    residency = RESIDENCY_ON_DEMAND if pod.on_demand else RESIDENCY_ALWAYS
    claim = Claim(
        pod.uid, pod.namespace, pod.name, node, gpu_uuid, pod.model_id, pod.request, residency
    )
    return ring.sign(claim)


def proven(pod: PodInfo, ring: KeyRing | None) -> PodInfo | Unproven:
    """The bound pod as the binder charges it (at the request its proof booked), or Unproven.

    With no ring (`tritonshare status` run by someone who cannot read the key) only the proof's
    form is checked, and a well-formed proof is taken at its word; the binder always has a ring.
    """
    try:
        if ring is None:
            proof = parse_proof(pod.placement)
        else:
            residency = RESIDENCY_ON_DEMAND if pod.on_demand else RESIDENCY_ALWAYS
            claim = pod_claim(
                pod.uid,
                pod.namespace,
                pod.name,
                pod.node_name,
                pod.gpu_uuid,
                pod.model_id,
                residency,
            )
            proof = ring.verify(claim, pod.placement)
    except ProofError as e:
        return Unproven(pod, _REASONS.get(e.kind, CHANGED))
    if proof.request <= 0 or not pod.model_id:
        # The binder never places such a pod: the proof was made for something else.
        return Unproven(pod, CHANGED)
    return pod if proof.request == pod.request else replace(pod, request=proof.request)


def same_proof(charged: PodInfo, pod: PodInfo) -> bool:
    """Whether a pod's update leaves everything its proof covers as it was when it was charged,
    so the earlier verification still holds (pods change status often; HMAC once per change of
    placement, not per event)."""
    return (
        charged.placement == pod.placement
        and charged.node_name == pod.node_name
        and charged.gpu_uuid == pod.gpu_uuid
        and charged.model_id == pod.model_id
        and charged.on_demand == pod.on_demand
        and charged.name == pod.name
        and charged.namespace == pod.namespace
        and bool(pod.placement)
    )
