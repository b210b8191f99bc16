"""The Pod Security Standards: upstream pod-security-admission's checks of a pod's metadata and
spec against `baseline` or `restricted`, with its reasons and details word for word.

`evaluate(level, version, metadata, spec)` returns the failed checks in upstream's order
(baseline checks by id, then restricted ones by id; a restricted check replaces the baseline one
it overrides) as `(reason, detail)` pairs; `privileged` fails none. Versions: `latest` and every
`v1.x` from v1.31 up are the rules of Kubernetes 1.31, the version the simulated API server
reports; an older `v1.x` leaves out the checks and values added after it, as upstream's
versioned checks do. Windows-only fields are checked; the user-namespace relaxations and the
probe-host check of later releases are not (they postdate 1.31). The restricted checks are
here, the baseline ones in `podsecuritybaseline`. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.apiserver.admission.podsecuritybaseline import (
    Check,
    JsonObject,
    Result,
    Version,
    added,
    all_containers,
    apparmor,
    capabilities_baseline,
    field,
    host_namespaces,
    host_path_volumes,
    host_ports,
    host_process,
    name_of,
    names,
    plural,
    privileged,
    proc_mount,
    quote,
    seccomp_baseline,
    seccomp_profiles,
    selinux,
    setters,
    sysctls,
    windows,
)

LATEST: Version = (1, 31)
LEVELS = ("privileged", "baseline", "restricted")


RESTRICTED_VOLUME_SOURCES = names(
    "configMap csi downwardAPI emptyDir ephemeral persistentVolumeClaim projected secret"
)


def _restricted_volumes(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    bad, types = [], set()
    for volume in spec.get("volumes") or []:
        if not isinstance(volume, dict):
            continue
        sources = [k for k, v in volume.items() if k != "name" and v is not None]
        if any(source in RESTRICTED_VOLUME_SOURCES for source in sources):
            continue
        bad.append(str(volume.get("name", "")))
        types.add(sources[0] if sources else "unknown")
    if not bad:
        return None
    return "restricted volume types", (
        f"{plural('volume', 'volumes', len(bad))} {quote(bad)} {plural('uses', 'use', len(bad))}"
        f" {plural('restricted volume type', 'restricted volume types', len(types))}"
        f" {quote(sorted(types))}"
    )


def _privilege_escalation(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    if version >= (1, 25) and windows(spec):
        return None
    key = ("securityContext", "allowPrivilegeEscalation")
    bad = [name_of(c) for c in all_containers(spec) if field(c, *key) is not False]
    if not bad:
        return None
    return "allowPrivilegeEscalation != false", (
        f"{plural('container', 'containers', len(bad))} {quote(bad)} must set"
        " securityContext.allowPrivilegeEscalation=false"
    )


def _run_as_non_root(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    pod = field(spec, "securityContext", "runAsNonRoot")
    explicit, implicit = [], []
    for container in all_containers(spec):
        own = field(container, "securityContext", "runAsNonRoot")
        if own is False:
            explicit.append(name_of(container))
        elif own is None and pod is not True:
            implicit.append(name_of(container))
    if pod is False or explicit:
        suffix = " must not set securityContext.runAsNonRoot=false"
        return "runAsNonRoot != true", setters(pod is False, explicit, suffix)
    if not implicit:
        return None
    return "runAsNonRoot != true", (
        f"pod or {plural('container', 'containers', len(implicit))} {quote(implicit)} must set"
        " securityContext.runAsNonRoot=true"
    )


def _run_as_user(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    pod = field(spec, "securityContext", "runAsUser") == 0
    bad = [
        name_of(c) for c in all_containers(spec) if field(c, "securityContext", "runAsUser") == 0
    ]
    if not pod and not bad:
        return None
    return "runAsUser=0", setters(pod, bad, " must not set runAsUser=0")


def _seccomp_restricted(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    if version >= (1, 25) and windows(spec):
        return None
    pod, explicit, unset, values = seccomp_profiles(spec, implicit=True)
    if pod or explicit:
        suffix = f" must not set securityContext.seccompProfile.type to {values}"
        return "seccompProfile", setters(pod, explicit, suffix)
    if not unset:
        return None
    return "seccompProfile", (
        f"pod or {plural('container', 'containers', len(unset))} {quote(unset)} must set"
        ' securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"'
    )


def _capabilities_restricted(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    if version >= (1, 25) and windows(spec):
        return None
    no_drop, adding, forbidden = [], [], set()
    for container in all_containers(spec):
        if "ALL" not in (field(container, "securityContext", "capabilities", "drop") or []):
            no_drop.append(name_of(container))
        extra = added(container, frozenset({"NET_BIND_SERVICE"}))
        if extra:
            adding.append(name_of(container))
            forbidden.update(extra)
    details = []
    if no_drop:
        details.append(
            f"{plural('container', 'containers', len(no_drop))} {quote(no_drop)} must set"
            ' securityContext.capabilities.drop=["ALL"]'
        )
    if adding:
        details.append(
            f"{plural('container', 'containers', len(adding))} {quote(adding)} must not include"
            f" {quote(sorted(forbidden))} in securityContext.capabilities.add"
        )
    return ("unrestricted capabilities", "; ".join(details)) if details else None


@dataclass(frozen=True)
class _Rule:
    id: str
    check: Check
    since: Version = (1, 0)
    overrides: str = ""
    """The baseline check this restricted one replaces."""


# By id, as upstream's registry orders them.
BASELINE = (
    _Rule("appArmorProfile", apparmor),
    _Rule("capabilities_baseline", capabilities_baseline),
    _Rule("hostNamespaces", host_namespaces),
    _Rule("hostPathVolumes", host_path_volumes),
    _Rule("hostPorts", host_ports),
    _Rule("privileged", privileged),
    _Rule("procMount", proc_mount),
    _Rule("seLinuxOptions", selinux),
    _Rule("seccompProfile_baseline", seccomp_baseline),
    _Rule("sysctls", sysctls),
    _Rule("windowsHostProcess", host_process),
)
RESTRICTED = (
    _Rule("allowPrivilegeEscalation", _privilege_escalation, (1, 8)),
    _Rule("capabilities_restricted", _capabilities_restricted, (1, 22), "capabilities_baseline"),
    _Rule("restrictedVolumes", _restricted_volumes, overrides="hostPathVolumes"),
    _Rule("runAsNonRoot", _run_as_non_root),
    _Rule("runAsUser", _run_as_user, (1, 23)),
    _Rule("seccompProfile_restricted", _seccomp_restricted, (1, 19), "seccompProfile_baseline"),
)


def evaluate(
    level: str, version: Version, metadata: JsonObject, spec: JsonObject
) -> list[tuple[str, str]]:
    """The checks of `level` at `version` that the pod (its metadata and spec) fails, as
    upstream's (reason, detail) pairs in upstream's order; empty when it passes."""
    if level == "privileged":
        return []
    version = min(version, LATEST)
    rules = [r for r in RESTRICTED if version >= r.since] if level == "restricted" else []
    replaced = {r.overrides for r in rules}
    failed = []
    for rule in [r for r in BASELINE if r.id not in replaced] + rules:
        result = rule.check(metadata, spec, version)
        if result is not None:
            failed.append(result)
    return failed


def describe(failed: list[tuple[str, str]]) -> str:
    """Upstream's summary: `reason (detail), reason (detail)`."""
    return ", ".join(f"{reason} ({detail})" if detail else reason for reason, detail in failed)
