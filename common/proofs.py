"""The proof of placement: what the binder signs when it places a pod, and what agents verify.

A tenant with full rights in its namespace can write any label, annotation or `spec.nodeName` on its
pods, so nothing on a pod proves that the binder placed it. The binder therefore signs the placement
(pod uid, namespace, name, node, GPU UUID, model id, GPU-memory request and, for an `on-demand` pod,
its residency class, bound together) with HMAC-SHA256 under a key only the binder and the agents can
read (a Secret in the system namespace, mounted as files), and writes the result into the
`<prefix>placement` annotation in the same patch as the GPU, so binding still costs two API writes.
An agent rebuilds the claim from the pod as it is now and checks the signature: a proof copied onto
another pod (another uid), a pod created with `spec.nodeName` (no proof), or an annotation edited
after binding (another GPU, model id or residency class) does not verify.

The annotation is `v1.<key id>.<request bytes>.<signature>`: the key id names which key signed (so
keys rotate: agents accept the current and the previous one), the request is carried because it is
part of what was decided, and the signature is unpadded base64url.

This module is pure but for `KeyDirectory`, which reads the key files and rereads them when they
change (kubelet updates a mounted Secret in place). It knows nothing of pods as API objects: the
binder and the agent each build a `Claim` from their own view of the pod.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from common.contract import RESIDENCY_ALWAYS, RESIDENCY_ON_DEMAND

PROOF_VERSION = "v1"
CURRENT_KEY_FILE = "current"
PREVIOUS_KEY_FILE = "previous"
MIN_KEY_BYTES = 32
"""A key shorter than this is refused: HMAC-SHA256 wants at least 256 bits of secret."""
_PROOF_RE = re.compile(r"v1\.([0-9a-f]{16})\.(0|[1-9][0-9]{0,18})\.([A-Za-z0-9_-]{43})")
_DOMAIN = b"tritonshare.io/placement"


class PlacementKeyError(ValueError):
    """The placement keys cannot be used; the message says which file and what to do."""


class ProofError(ValueError):
    """A placement proof is absent, malformed, or does not verify; the message says which and
    `kind` names it for code: `absent`, `malformed`, `unknown-key` or `mismatch`."""

    def __init__(self, message: str, kind: str = "mismatch") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Claim:
    """What one placement decided, as the signature binds it."""

    pod_uid: str
    namespace: str
    name: str
    node: str
    gpu_uuid: str
    model_id: str
    request: int
    """The pod's effective GPU-memory request, in bytes."""
    residency: str = RESIDENCY_ALWAYS
    """The pod's residency class: `always` or `on-demand` (`common.contract`)."""

    def message(self) -> bytes:
        """The signed bytes: every field length-prefixed, so no two claims share an encoding.
        The residency class is signed only when it is `on-demand`: proofs made before it was
        signed are proofs of `always` pods, and verify as such."""
        fields: tuple[str, ...] = (
            PROOF_VERSION,
            self.pod_uid,
            self.namespace,
            self.name,
            self.node,
            self.gpu_uuid,
            self.model_id,
            str(self.request),
        )
        if self.residency == RESIDENCY_ON_DEMAND:
            fields += (self.residency,)
        parts = [_DOMAIN]
        for value in fields:
            data = value.encode()
            parts.append(len(data).to_bytes(4, "big") + data)
        return b"".join(parts)


def pod_claim(
    pod_uid: str, namespace: str, name: str, node: str, gpu_uuid: str, model_id: str, residency: str
) -> Claim:
    """The claim a bound pod makes as it is now, to verify against its proof: the request is
    left 0 because `KeyRing.verify` takes it from the proof."""
    return Claim(pod_uid, namespace, name, node, gpu_uuid, model_id, 0, residency)


@dataclass(frozen=True, slots=True)
class Proof:
    """A parsed `<prefix>placement` annotation."""

    key_id: str
    request: int
    signature: bytes


def key_id(key: bytes) -> str:
    """A key's public name: 16 hex digits of a hash that reveals nothing usable about the key."""
    return hashlib.sha256(b"tritonshare key id\0" + key).hexdigest()[:16]


def parse_proof(value: str) -> Proof:
    """The annotation value as a Proof, or ProofError saying what is wrong with it."""
    if not value:
        raise ProofError(
            "the pod carries no placement proof: it was not placed by the binder", "absent"
        )
    match = _PROOF_RE.fullmatch(value)
    if match is None:
        raise ProofError(
            "the pod's placement proof is malformed (it was not written by the binder)",
            "malformed",
        )
    signature = base64.urlsafe_b64decode(match.group(3) + "=")
    return Proof(match.group(1), int(match.group(2)), signature)


@dataclass(frozen=True)
class KeyRing:
    """The keys in force: `current` signs; `current` and `previous` verify."""

    current: bytes
    previous: bytes | None = None

    def __post_init__(self) -> None:
        for name, key in (("current", self.current), ("previous", self.previous)):
            if key is not None and len(key) < MIN_KEY_BYTES:
                raise PlacementKeyError(
                    f"the {name} placement key has {len(key)} bytes; use at least "
                    f"{MIN_KEY_BYTES} random bytes (for example `head -c 32 /dev/urandom | "
                    f"base64`)"
                )

    @cached_property
    def _keys(self) -> dict[str, bytes]:
        """By key id; computed once per ring (the binder verifies every bound pod it sees)."""
        keys = {key_id(self.current): self.current}
        if self.previous is not None:
            keys.setdefault(key_id(self.previous), self.previous)
        return keys

    def sign(self, claim: Claim) -> str:
        """The annotation value proving `claim`, signed with the current key."""
        digest = hmac.new(self.current, claim.message(), hashlib.sha256).digest()
        signature = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        return f"{PROOF_VERSION}.{key_id(self.current)}.{claim.request}.{signature}"

    def verify(self, claim: Claim, value: str) -> Proof:
        """The proof if `value` proves `claim` (its request taken from the proof), else
        ProofError. The caller fills `claim` from the pod as it is now."""
        proof = parse_proof(value)
        key = self._keys.get(proof.key_id)
        if key is None:
            raise ProofError(
                f"the pod's placement proof was signed with key {proof.key_id}, which this node "
                f"does not hold (rotated out, or never the binder's)",
                "unknown-key",
            )
        signed = Claim(
            claim.pod_uid,
            claim.namespace,
            claim.name,
            claim.node,
            claim.gpu_uuid,
            claim.model_id,
            proof.request,
            claim.residency,
        )
        expected = hmac.new(key, signed.message(), hashlib.sha256).digest()
        if not hmac.compare_digest(expected, proof.signature):
            raise ProofError(
                "the pod's placement proof does not match the pod (it was copied from another "
                "pod, or the pod's node, GPU or model id changed after the binder placed it, or "
                "its residency class did)"
            )
        return proof


def _read_key(path: Path) -> bytes:
    try:
        data = path.read_bytes().strip()
    except OSError as e:
        raise PlacementKeyError(
            f"cannot read the placement key {path} ({e.strerror}); mount the placement-key "
            f"Secret there (see docs/security.md)"
        ) from e
    if not data:
        raise PlacementKeyError(f"the placement key file {path} is empty; see docs/security.md")
    return data


def load_key_ring(directory: Path) -> KeyRing:
    """The ring in `directory`: `current` is required, `previous` optional (during a rotation)."""
    current = _read_key(directory / CURRENT_KEY_FILE)
    previous_path = directory / PREVIOUS_KEY_FILE
    previous = _read_key(previous_path) if previous_path.exists() else None
    return KeyRing(current, previous)


class KeyDirectory:
    """A key ring read from a directory, reread when its files change (checked at most every
    `recheck_seconds`), so rotating the Secret needs no restart. A ring that fails to reload keeps
    the last good one in force and says why in `error`."""

    def __init__(
        self,
        directory: Path,
        *,
        recheck_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self._recheck = recheck_seconds
        self._clock = clock
        self._ring = load_key_ring(directory)
        self._stamp = self._files_stamp()
        self._checked = clock()
        self.error = ""

    def _files_stamp(self) -> tuple[tuple[str, int, int], ...]:
        stamp = []
        for name in (CURRENT_KEY_FILE, PREVIOUS_KEY_FILE):
            try:
                info = (self.directory / name).stat()
            except OSError:
                continue
            stamp.append((name, info.st_mtime_ns, info.st_ino))
        return tuple(stamp)

    def ring(self) -> KeyRing:
        now = self._clock()
        if now - self._checked >= self._recheck:
            self._checked = now
            stamp = self._files_stamp()
            if stamp != self._stamp:
                try:
                    self._ring = load_key_ring(self.directory)
                except PlacementKeyError as e:
                    self.error = str(e)
                else:
                    self._stamp, self.error = stamp, ""
        return self._ring
