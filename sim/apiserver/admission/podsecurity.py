"""Pod Security admission, as kube-apiserver's built-in PodSecurity plugin runs it with its
default configuration (no exemptions, every mode `privileged:latest` unless a namespace says).

A namespace chooses its levels with the labels `pod-security.kubernetes.io/<mode>` (`enforce`,
`warn`, `audit`: `privileged`, `baseline` or `restricted`) and `<mode>-version` (`latest` or
`v1.x`); a namespace whose labels name another value is refused (422), as upstream. Then:

- `enforce` refuses a pod (create, an update of its spec or its AppArmor and seccomp annotations,
  an ephemeral container) that fails the level: 403 `pods "x" is forbidden: violates PodSecurity
  "restricted:latest": <reasons>`. A workload is never refused: its controller's pods are.
- `warn` adds a `Warning` (`would violate PodSecurity "<level>:<version>": ...`) for such a pod
  and for a workload whose pod template fails (create, or an update that changes the template):
  Deployment, ReplicaSet, DaemonSet, StatefulSet, Job, CronJob, ReplicationController,
  PodTemplate. A warning equal to a refusal is not repeated.
- `audit` adds the annotation `pod-security.kubernetes.io/audit-violations` to the request's
  audit record (and logs it), as upstream's audit annotations.
- Changing a namespace's `enforce` label warns about the pods already there that fail the new
  level, grouped as upstream words it.

The checks themselves are `podsecuritystandards`. Pure: reads the store, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sim.apiserver.admission import podsecuritystandards as standards
from sim.apiserver.admission.podsecuritybaseline import (
    APPARMOR_ANNOTATION,
    SECCOMP_CONTAINER_ANNOTATION,
    SECCOMP_POD_ANNOTATION,
    Version,
)
from sim.apiserver.errors import ApiError, invalid
from sim.apiserver.resources import NAMESPACES, PODS, Resource
from sim.apiserver.store import Store

JsonObject = dict[str, Any]
PREFIX = "pod-security.kubernetes.io/"
MODES = ("enforce", "audit", "warn")
AUDIT_VIOLATIONS = PREFIX + "audit-violations"
ENFORCE_POLICY = PREFIX + "enforce-policy"
_VERSION = re.compile(r"v1\.(0|[1-9][0-9]*)")

# Where each workload kind keeps its pod template.
TEMPLATE_PATHS: dict[tuple[str, str], tuple[str, ...]] = {
    ("apps", "Deployment"): ("spec", "template"),
    ("apps", "ReplicaSet"): ("spec", "template"),
    ("apps", "DaemonSet"): ("spec", "template"),
    ("apps", "StatefulSet"): ("spec", "template"),
    ("batch", "Job"): ("spec", "template"),
    ("batch", "CronJob"): ("spec", "jobTemplate", "spec", "template"),
    ("", "ReplicationController"): ("spec", "template"),
    ("", "PodTemplate"): ("template",),
}


@dataclass(frozen=True)
class LevelVersion:
    level: str = "privileged"
    version: str = "latest"

    def __str__(self) -> str:
        return f"{self.level}:{self.version}"

    @property
    def parsed_version(self) -> Version:
        match = _VERSION.fullmatch(self.version)
        return (1, int(match.group(1))) if match else standards.LATEST

    def failures(self, metadata: JsonObject, spec: JsonObject) -> list[tuple[str, str]]:
        return standards.evaluate(self.level, self.parsed_version, metadata, spec)

    def same_as(self, other: LevelVersion) -> bool:
        both_privileged = self.level == other.level == "privileged"
        return both_privileged or (self.level, self.parsed_version) == (
            other.level,
            other.parsed_version,
        )


@dataclass(frozen=True)
class Policy:
    enforce: LevelVersion = LevelVersion()
    audit: LevelVersion = LevelVersion()
    warn: LevelVersion = LevelVersion()


@dataclass
class Outcome:
    """What an admitted request carries on: warnings for its response, annotations for its
    audit record."""

    warnings: list[str] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)


def label_causes(labels: JsonObject) -> list[tuple[str, str]]:
    """The (field, message) problems of a namespace's Pod Security labels, in upstream's words."""
    causes = []
    for mode in MODES:
        level, version = PREFIX + mode, f"{PREFIX}{mode}-version"
        if level in labels and labels[level] not in standards.LEVELS:
            expected = "must be one of " + ", ".join(standards.LEVELS)
            causes.append(
                (f"metadata.labels[{level}]", f'Invalid value: "{labels[level]}": {expected}')
            )
        given = str(labels.get(version, "latest"))
        if given != "latest" and _VERSION.fullmatch(given) is None:
            expected = 'must be "latest" or "v1.x"'
            causes.append((f"metadata.labels[{version}]", f'Invalid value: "{given}": {expected}'))
    return causes


def policy_of(labels: JsonObject) -> Policy:
    """The namespace's policy: each mode's level and version, `privileged:latest` where unset;
    `warn` follows a stricter `enforce` when it is not set itself, as upstream."""

    def mode(name: str, fallback: LevelVersion) -> LevelVersion:
        level = str(labels.get(PREFIX + name, fallback.level))
        version = str(labels.get(f"{PREFIX}{name}-version", fallback.version))
        return LevelVersion(level if level in standards.LEVELS else "restricted", version)

    enforce = mode("enforce", LevelVersion())
    warn = mode("warn", LevelVersion())
    if PREFIX + "warn" not in labels and _rank(enforce.level) > _rank(warn.level):
        warn = mode("warn", enforce)
    return Policy(enforce, mode("audit", LevelVersion()), warn)


def _rank(level: str) -> int:
    return standards.LEVELS.index(level)


def _labels(store: Store, namespace: str) -> JsonObject:
    stored = store.get(NAMESPACES, "", namespace)
    return dict((stored.obj["metadata"].get("labels") or {}) if stored else {})


def _dig(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def _pod_parts(resource: Resource, obj: JsonObject | None) -> tuple[JsonObject, JsonObject] | None:
    """The (metadata, spec) Pod Security looks at in a pod or a workload's template."""
    if obj is None:
        return None
    if resource is PODS:
        return obj.get("metadata") or {}, obj.get("spec") or {}
    path = TEMPLATE_PATHS.get((resource.group, resource.kind))
    template = _dig(obj, path) if path else None
    if not isinstance(template, dict):
        return None
    return template.get("metadata") or {}, template.get("spec") or {}


def _checked_annotations(metadata: JsonObject) -> dict[str, Any]:
    return {
        k: v
        for k, v in (metadata.get("annotations") or {}).items()
        if k.startswith((APPARMOR_ANNOTATION, SECCOMP_CONTAINER_ANNOTATION))
        or k == SECCOMP_POD_ANNOTATION
    }


def _significant(
    old: tuple[JsonObject, JsonObject] | None, new: tuple[JsonObject, JsonObject]
) -> bool:
    """Whether an update changes what Pod Security looks at (upstream's isSignificantPodUpdate):
    the spec, or the AppArmor and seccomp annotations; labels and the rest of the metadata
    never count, so a label on a pod that predates its namespace's level passes."""
    if old is None:
        return True
    return old[1] != new[1] or _checked_annotations(old[0]) != _checked_annotations(new[0])


def admit(
    store: Store,
    operation: str,
    resource: Resource,
    subresource: str,
    namespace: str,
    name: str,
    obj: JsonObject | None,
    old: JsonObject | None,
) -> Outcome:
    """Pod Security admission of one write; raises the 403 (or 422 for a namespace's labels)
    that refuses it."""
    outcome = Outcome()
    if resource is NAMESPACES:
        if obj is not None and subresource == "":
            _admit_namespace(store, operation, name, obj, old, outcome)
        return outcome
    is_pod = resource is PODS
    if operation not in ("CREATE", "UPDATE") or subresource not in (
        ("", "ephemeralcontainers") if is_pod else ("",)
    ):
        return outcome
    parts = _pod_parts(resource, obj)
    if parts is None:
        return outcome
    if operation == "UPDATE" and not _significant(_pod_parts(resource, old), parts):
        return outcome
    policy = policy_of(_labels(store, namespace))
    metadata, spec = parts
    enforced: list[tuple[str, str]] = []
    if is_pod:
        outcome.annotations[ENFORCE_POLICY] = str(policy.enforce)
        enforced = policy.enforce.failures(metadata, spec)
        if enforced:
            raise ApiError(
                403,
                "Forbidden",
                f'pods "{name}" is forbidden: violates PodSecurity "{policy.enforce}":'
                f" {standards.describe(enforced)}",
                {"name": name, "kind": "pods"},
            )
    audited = policy.audit.failures(metadata, spec)
    if audited:
        outcome.annotations[AUDIT_VIOLATIONS] = (
            f'would violate PodSecurity "{policy.audit}": {standards.describe(audited)}'
        )
    warned = policy.warn.failures(metadata, spec)
    if warned and not (is_pod and policy.warn.same_as(policy.enforce)):
        outcome.warnings.append(
            f'would violate PodSecurity "{policy.warn}": {standards.describe(warned)}'
        )
    return outcome


def _admit_namespace(
    store: Store,
    operation: str,
    name: str,
    obj: JsonObject,
    old: JsonObject | None,
    outcome: Outcome,
) -> None:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    causes = label_causes(labels)
    if causes:
        raise invalid("Namespace", "", name, causes)
    if operation != "UPDATE" or old is None:
        return
    enforce = policy_of(labels).enforce
    if enforce.same_as(policy_of((old.get("metadata") or {}).get("labels") or {}).enforce):
        return
    groups: dict[tuple[str, ...], list[str]] = {}
    for stored in sorted(store.objects(PODS, name), key=lambda s: s.name):
        pod = stored.obj
        failed = enforce.failures(pod.get("metadata") or {}, pod.get("spec") or {})
        if failed:
            groups.setdefault(tuple(reason for reason, _ in failed), []).append(stored.name)
    if not groups:
        return
    outcome.warnings.append(
        f'existing pods in namespace "{name}" violate the new PodSecurity enforce level "{enforce}"'
    )
    for reasons, pods in groups.items():
        others = len(pods) - 1
        who = pods[0] + (
            f" (and {others} other {'pod' if others == 1 else 'pods'})" if others else ""
        )
        outcome.warnings.append(f"{who}: {', '.join(reasons)}")
