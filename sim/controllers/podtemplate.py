"""Pod templates as the workload controllers compare and name them, and their shared arithmetic.

`template_hash` is kube-controller-manager's `pod-template-hash`: FNV-1a (32 bits) of the
template, then of the collision count's 8 little-endian bytes when the Deployment has one, written
as the decimal of the sum with each digit mapped onto upstream's safe alphabet (no vowels, so no
words). Upstream hashes a Go dump of the template's structs; this hashes its canonical JSON, so the
values differ from a real cluster's while keeping their shape and their behaviour: equal templates
hash equal, any change to the template (a label, an annotation, an image) changes the hash.

Also: the IntOrString scaling of maxSurge and maxUnavailable, pod readiness and availability
(minReadySeconds), and the controller ownerReference. Pure; no I/O.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

JsonObject = dict[str, Any]

HASH_LABEL = "pod-template-hash"
_SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193
_PERCENT = re.compile(r"^([0-9]+)%$")


def _fnv1a_32(data: bytes, state: int = _FNV_OFFSET) -> int:
    for byte in data:
        state = ((state ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return state


def template_hash(template: JsonObject, collision_count: int | None = None) -> str:
    """The `pod-template-hash` of a Deployment's pod template (see the module docstring)."""
    canonical = json.dumps(template, sort_keys=True, separators=(",", ":")).encode()
    state = _fnv1a_32(canonical)
    if collision_count is not None:
        state = _fnv1a_32((collision_count & 0xFFFFFFFF).to_bytes(4, "little") + bytes(4), state)
    return "".join(_SAFE_ALPHABET[ord(digit) % len(_SAFE_ALPHABET)] for digit in str(state))


def without_hash(template: JsonObject) -> JsonObject:
    """The template with its `pod-template-hash` label removed (upstream's EqualIgnoreHash)."""
    labels = dict((template.get("metadata") or {}).get("labels") or {})
    labels.pop(HASH_LABEL, None)
    metadata = dict(template.get("metadata") or {})
    if labels:
        metadata["labels"] = labels
    else:
        metadata.pop("labels", None)
    result = dict(template)
    result["metadata"] = metadata
    return result


def equal_ignoring_hash(a: JsonObject, b: JsonObject) -> bool:
    return without_hash(a) == without_hash(b)


def scaled_value(value: int | str, total: int, round_up: bool) -> int:
    """An IntOrString against `total`: the integer, or the percentage of total rounded up
    (maxSurge) or down (maxUnavailable), as upstream's GetScaledValueFromIntOrPercent."""
    if isinstance(value, int):
        return value
    match = _PERCENT.match(value)
    if match is None:
        raise ValueError(f"invalid value for IntOrString: invalid value {value!r}")
    product = int(match.group(1)) * total
    return -(-product // 100) if round_up else product // 100


def parse_time(text: Any) -> float | None:
    """A Kubernetes `Time` (`2024-01-02T03:04:05Z`; the official client writes the offset as
    `+00:00`) as seconds since the epoch."""
    if not isinstance(text, str):
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(int(seconds), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ready_since(pod: JsonObject) -> float | None:
    """When the pod became Ready (its Ready condition's lastTransitionTime), or None if it is not
    Ready; a Ready condition without a time counts as ready since the epoch's start."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            if condition.get("status") != "True":
                return None
            return parse_time(condition.get("lastTransitionTime")) or 0.0
    return None


def is_available(pod: JsonObject, min_ready_seconds: int, now: float) -> bool:
    """Ready for at least minReadySeconds (upstream's IsPodAvailable: strictly before now)."""
    since = ready_since(pod)
    if since is None:
        return False
    return min_ready_seconds == 0 or since + min_ready_seconds < now


def is_active(pod: JsonObject) -> bool:
    """Counted by its ReplicaSet: not finished and not being deleted (upstream's
    FilterActivePods), so a terminating pod is neither a replica nor available."""
    phase = (pod.get("status") or {}).get("phase")
    return phase not in ("Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp")


def controller_uid(obj: JsonObject) -> str | None:
    for owner in obj["metadata"].get("ownerReferences") or []:
        if owner.get("controller"):
            return str(owner.get("uid") or "")
    return None


def owner_reference(owner: JsonObject) -> JsonObject:
    """The controller ownerReference a child carries (blockOwnerDeletion, as upstream sets)."""
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
