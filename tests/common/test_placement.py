"""The residency class in the proof of placement: signed for on-demand pods only, so proofs of
`always` pods made before it was signed still verify, and an edited class never does."""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import replace

import pytest

from agent.errors import NotPlacedError
from agent.pods.modelpods import PodInfo
from agent.pods.provenpods import PlacementVerifier
from common.proofs import Claim, KeyRing, ProofError

KEY = b"k" * 32
RING = KeyRing(KEY)
ALWAYS = Claim("uid-1", "team-a", "pod-1", "node-1", "GPU-1", "resnet", 2 * 1024**3)
ON_DEMAND = replace(ALWAYS, residency="on-demand")


def legacy_proof(claim: Claim) -> str:
    """A proof as binders signed it before the residency class was part of the claim."""
    fields: tuple[str, ...] = ("v1", claim.pod_uid, claim.namespace, claim.name, claim.node)
    fields += (claim.gpu_uuid,)
    fields += (claim.model_id, str(claim.request))
    message = b"tritonshare.io/placement" + b"".join(
        len(f.encode()).to_bytes(4, "big") + f.encode() for f in fields
    )
    digest = hmac.new(KEY, message, hashlib.sha256).digest()
    signature = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    return RING.sign(claim).rsplit(".", 1)[0] + "." + signature


def test_a_proof_made_before_the_class_was_signed_proves_an_always_pod_only() -> None:
    old = legacy_proof(ALWAYS)
    assert RING.verify(ALWAYS, old).request == ALWAYS.request
    with pytest.raises(ProofError, match="residency class"):
        RING.verify(ON_DEMAND, old)


@pytest.mark.parametrize(
    ("signed", "edited"), [(ALWAYS, ON_DEMAND), (ON_DEMAND, ALWAYS)], ids=["to-on-demand", "back"]
)
def test_a_residency_class_edited_after_binding_fails_verification(
    signed: Claim, edited: Claim
) -> None:
    proof = RING.sign(signed)
    assert RING.verify(signed, proof).request == signed.request
    with pytest.raises(ProofError) as refused:
        RING.verify(edited, proof)
    assert refused.value.kind == "mismatch"


def pod(residency: str, placement: str) -> PodInfo:
    return PodInfo(
        "team-a",
        "pod-1",
        "uid-1",
        "node-1",
        "tritonshare",
        "Running",
        "resnet",
        "GPU-1",
        placement=placement,
        residency=residency,
    )


def test_the_agent_acts_on_the_class_the_binder_signed_not_on_the_annotation() -> None:
    verifier = PlacementVerifier(lambda: RING, "node-1")
    proof = RING.sign(ALWAYS)
    assert not verifier.prove(pod("always", proof)).on_demand
    with pytest.raises(NotPlacedError, match="residency class") as refused:
        verifier.prove(pod("on-demand", proof))
    assert refused.value.event_reason == "PlacementChanged"
    assert verifier.prove(pod("on-demand", RING.sign(ON_DEMAND))).on_demand
