"""The Pod Security Standards: upstream pod-security-admission's checks of a pod's metadata and
spec against `baseline` or `restricted`, with its reasons and details word for word.

`evaluate(level, version, metadata, spec)` returns the failed checks in upstream's order
(baseline checks by id, then restricted ones by id; a restricted check replaces the baseline one
it overrides) as `(reason, detail)` pairs; `privileged` fails none. Versions: `latest` and every
`v1.x` from v1.31 up are the rules of Kubernetes 1.31, the version the simulated API server
reports; an older `v1.x` leaves out the checks and values added after it, as upstream's
versioned checks do. Windows-only fields are checked; the user-namespace relaxations and the
probe-host check of later releases are not (they postdate 1.31). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

JsonObject = dict[str, Any]
Version = tuple[int, int]
LATEST: Version = (1, 31)
LEVELS = ("privileged", "baseline", "restricted")
Result = tuple[str, str] | None
"""A failed check's (reason, detail), or None when it passes."""


def _plural(singular: str, plural: str, count: int) -> str:
    return singular if count == 1 else plural


def _quote(items: list[str]) -> str:
    return ", ".join(f'"{item}"' for item in items)


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def _containers(spec: JsonObject) -> Iterator[JsonObject]:
    """Init containers, containers, then ephemeral containers, as upstream visits them."""
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for container in spec.get(key) or []:
            if isinstance(container, dict):
                yield container


def _name(container: JsonObject) -> str:
    return str(container.get("name", ""))


def _windows(spec: JsonObject) -> bool:
    return bool(_get(spec, "os", "name") == "windows")


def _setters(pod: bool, containers: list[str], suffix: str) -> str:
    who = ["pod"] if pod else []
    if containers:
        who.append(f"{_plural('container', 'containers', len(containers))} {_quote(containers)}")
    return " and ".join(who) + suffix


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


def _go_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


# baseline


def _host_process(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    key = ("securityContext", "windowsOptions", "hostProcess")
    bad = [_name(c) for c in _containers(spec) if _get(c, *key) is True]
    pod = _get(spec, *key) is True
    if not bad and not pod:
        return None
    return "hostProcess", _setters(
        pod, bad, " must not set securityContext.windowsOptions.hostProcess=true"
    )


def _host_namespaces(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    found = [f"{key}=true" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    return ("host namespaces", ", ".join(found)) if found else None


def _privileged(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    bad = [_name(c) for c in _containers(spec) if _get(c, "securityContext", "privileged") is True]
    if not bad:
        return None
    container = _plural("container", "containers", len(bad))
    return "privileged", f"{container} {_quote(bad)} must not set securityContext.privileged=true"


BASELINE_CAPABILITIES = _names(
    "AUDIT_WRITE CHOWN DAC_OVERRIDE FOWNER FSETID KILL MKNOD NET_BIND_SERVICE"
    " SETFCAP SETGID SETPCAP SETUID SYS_CHROOT"
)


def _added(container: JsonObject, allowed: frozenset[str]) -> list[str]:
    added = _get(container, "securityContext", "capabilities", "add") or []
    return [str(c) for c in added if str(c) not in allowed]


def _capabilities_baseline(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    bad, forbidden = [], set()
    for container in _containers(spec):
        extra = _added(container, BASELINE_CAPABILITIES)
        if extra:
            bad.append(_name(container))
            forbidden.update(extra)
    if not bad:
        return None
    return "non-default capabilities", (
        f"{_plural('container', 'containers', len(bad))} {_quote(bad)} must not include"
        f" {_quote(sorted(forbidden))} in securityContext.capabilities.add"
    )


def _host_path_volumes(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    bad = [
        str(v.get("name", ""))
        for v in spec.get("volumes") or []
        if isinstance(v, dict) and v.get("hostPath") is not None
    ]
    if not bad:
        return None
    return "hostPath volumes", f"{_plural('volume', 'volumes', len(bad))} {_quote(bad)}"


def _host_ports(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    bad, ports = [], set()
    for container in _containers(spec):
        used = [
            str(p["hostPort"])
            for p in container.get("ports") or []
            if isinstance(p, dict) and p.get("hostPort")
        ]
        if used:
            bad.append(_name(container))
            ports.update(used)
    if not bad:
        return None
    return "hostPort", (
        f"{_plural('container', 'containers', len(bad))} {_quote(bad)}"
        f" {_plural('uses', 'use', len(bad))} {_plural('hostPort', 'hostPorts', len(ports))}"
        f" {', '.join(sorted(ports))}"
    )


APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


def _apparmor(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    setters, values = [], set()
    pod_type = _get(spec, "securityContext", "appArmorProfile", "type")
    if pod_type is not None and pod_type not in ("RuntimeDefault", "Localhost"):
        setters.append("pod")
        values.add(str(pod_type))
    bad = []
    for container in _containers(spec):
        kind = _get(container, "securityContext", "appArmorProfile", "type")
        if kind is not None and kind not in ("RuntimeDefault", "Localhost"):
            bad.append(_name(container))
            values.add(str(kind))
    if bad:
        setters.append(f"{_plural('container', 'containers', len(bad))} {_quote(bad)}")
    annotations = [
        f"{key}={_go_quote(str(value))}"
        for key, value in (meta.get("annotations") or {}).items()
        if key.startswith(APPARMOR_ANNOTATION)
        and value
        and value != "runtime/default"
        and not str(value).startswith("localhost/")
    ]
    shown = sorted(values)
    if annotations:
        shown += sorted(annotations)
        setters.append(_plural("annotation", "annotations", len(annotations)))
    if not setters:
        return None
    reason = _plural("forbidden AppArmor profile", "forbidden AppArmor profiles", len(shown))
    return reason, f"{' and '.join(setters)} must not set AppArmor profile type to {_quote(shown)}"


def _selinux(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    allowed = {"", "container_t", "container_init_t", "container_kvm_t"}
    if version >= (1, 31):
        allowed.add("container_engine_t")
    types: set[str] = set()
    user = role = False

    def bad(options: Any) -> bool:
        nonlocal user, role
        if not isinstance(options, dict):
            return False
        wrong = False
        if str(options.get("type") or "") not in allowed:
            types.add(str(options.get("type")))
            wrong = True
        if options.get("user"):
            user = wrong = True
        if options.get("role"):
            role = wrong = True
        return wrong

    pod = bad(_get(spec, "securityContext", "seLinuxOptions"))
    containers = [
        _name(c) for c in _containers(spec) if bad(_get(c, "securityContext", "seLinuxOptions"))
    ]
    if not pod and not containers:
        return None
    data = [f"{_plural('type', 'types', len(types))} {_quote(sorted(types))}"] if types else []
    data += ["user may not be set"] if user else []
    data += ["role may not be set"] if role else []
    suffix = f" set forbidden securityContext.seLinuxOptions: {'; '.join(data)}"
    return "seLinuxOptions", _setters(pod, containers, suffix)


def _proc_mount(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    bad, types = [], set()
    for container in _containers(spec):
        mount = _get(container, "securityContext", "procMount")
        if mount not in (None, "Default"):
            bad.append(_name(container))
            types.add(str(mount))
    if not bad:
        return None
    return "procMount", (
        f"{_plural('container', 'containers', len(bad))} {_quote(bad)} must not set"
        f" securityContext.procMount to {_quote(sorted(types))}"
    )


SECCOMP_POD_ANNOTATION = "seccomp.security.alpha.kubernetes.io/pod"
SECCOMP_CONTAINER_ANNOTATION = "container.seccomp.security.alpha.kubernetes.io/"


def _seccomp_profiles(spec: JsonObject, implicit: bool) -> tuple[bool, list[str], list[str], str]:
    """(pod sets a bad type, containers that set one, containers left unset without a valid pod
    profile when `implicit`, the bad types quoted)."""
    values: set[str] = set()
    pod_profile = _get(spec, "securityContext", "seccompProfile")
    pod_bad = pod_valid = False
    if isinstance(pod_profile, dict):
        if pod_profile.get("type") in ("RuntimeDefault", "Localhost"):
            pod_valid = True
        else:
            pod_bad = True
            values.add(str(pod_profile.get("type")))
    explicit, unset = [], []
    for container in _containers(spec):
        profile = _get(container, "securityContext", "seccompProfile")
        if isinstance(profile, dict):
            if profile.get("type") not in ("RuntimeDefault", "Localhost"):
                explicit.append(_name(container))
                values.add(str(profile.get("type")))
        elif implicit and not pod_valid:
            unset.append(_name(container))
    return pod_bad, explicit, unset, _quote(sorted(values))


def _seccomp_baseline(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    if version < (1, 19):
        annotations = meta.get("annotations") or {}
        keys = [SECCOMP_POD_ANNOTATION] + [
            SECCOMP_CONTAINER_ANNOTATION + _name(c) for c in _containers(spec)
        ]
        forbidden = sorted(
            f"{key}={_go_quote(str(annotations[key]))}"
            for key in keys
            if key in annotations
            and annotations[key] not in ("runtime/default", "docker/default")
            and not str(annotations[key]).startswith("localhost/")
        )
        if not forbidden:
            return None
        which = _plural("annotation", "annotations", len(forbidden))
        return "seccompProfile", f"forbidden {which} {', '.join(forbidden)}"
    pod, explicit, _, values = _seccomp_profiles(spec, implicit=False)
    if not pod and not explicit:
        return None
    suffix = f" must not set securityContext.seccompProfile.type to {values}"
    return "seccompProfile", _setters(pod, explicit, suffix)


SAFE_SYSCTLS: tuple[tuple[Version, frozenset[str]], ...] = (
    (
        (1, 0),
        _names(
            "kernel.shm_rmid_forced net.ipv4.ip_local_port_range net.ipv4.tcp_syncookies"
            " net.ipv4.ping_group_range net.ipv4.ip_unprivileged_port_start"
        ),
    ),
    ((1, 27), frozenset({"net.ipv4.ip_local_reserved_ports"})),
    (
        (1, 29),
        _names(
            "net.ipv4.tcp_keepalive_time net.ipv4.tcp_fin_timeout"
            " net.ipv4.tcp_keepalive_intvl net.ipv4.tcp_keepalive_probes"
        ),
    ),
)


def _sysctls(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    safe = frozenset().union(*(names for since, names in SAFE_SYSCTLS if version >= since))
    forbidden = [
        str(s.get("name"))
        for s in _get(spec, "securityContext", "sysctls") or []
        if isinstance(s, dict) and s.get("name") not in safe
    ]
    return ("forbidden sysctls", ", ".join(forbidden)) if forbidden else None


# restricted


RESTRICTED_VOLUME_SOURCES = _names(
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
        f"{_plural('volume', 'volumes', len(bad))} {_quote(bad)} {_plural('uses', 'use', len(bad))}"
        f" {_plural('restricted volume type', 'restricted volume types', len(types))}"
        f" {_quote(sorted(types))}"
    )


def _privilege_escalation(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    if version >= (1, 25) and _windows(spec):
        return None
    key = ("securityContext", "allowPrivilegeEscalation")
    bad = [_name(c) for c in _containers(spec) if _get(c, *key) is not False]
    if not bad:
        return None
    return "allowPrivilegeEscalation != false", (
        f"{_plural('container', 'containers', len(bad))} {_quote(bad)} must set"
        " securityContext.allowPrivilegeEscalation=false"
    )


def _run_as_non_root(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    pod = _get(spec, "securityContext", "runAsNonRoot")
    explicit, implicit = [], []
    for container in _containers(spec):
        own = _get(container, "securityContext", "runAsNonRoot")
        if own is False:
            explicit.append(_name(container))
        elif own is None and pod is not True:
            implicit.append(_name(container))
    if pod is False or explicit:
        suffix = " must not set securityContext.runAsNonRoot=false"
        return "runAsNonRoot != true", _setters(pod is False, explicit, suffix)
    if not implicit:
        return None
    return "runAsNonRoot != true", (
        f"pod or {_plural('container', 'containers', len(implicit))} {_quote(implicit)} must set"
        " securityContext.runAsNonRoot=true"
    )


def _run_as_user(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    pod = _get(spec, "securityContext", "runAsUser") == 0
    bad = [_name(c) for c in _containers(spec) if _get(c, "securityContext", "runAsUser") == 0]
    if not pod and not bad:
        return None
    return "runAsUser=0", _setters(pod, bad, " must not set runAsUser=0")


def _seccomp_restricted(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    if version >= (1, 25) and _windows(spec):
        return None
    pod, explicit, unset, values = _seccomp_profiles(spec, implicit=True)
    if pod or explicit:
        suffix = f" must not set securityContext.seccompProfile.type to {values}"
        return "seccompProfile", _setters(pod, explicit, suffix)
    if not unset:
        return None
    return "seccompProfile", (
        f"pod or {_plural('container', 'containers', len(unset))} {_quote(unset)} must set"
        ' securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"'
    )


def _capabilities_restricted(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    if version >= (1, 25) and _windows(spec):
        return None
    no_drop, adding, forbidden = [], [], set()
    for container in _containers(spec):
        if "ALL" not in (_get(container, "securityContext", "capabilities", "drop") or []):
            no_drop.append(_name(container))
        extra = _added(container, frozenset({"NET_BIND_SERVICE"}))
        if extra:
            adding.append(_name(container))
            forbidden.update(extra)
    details = []
    if no_drop:
        details.append(
            f"{_plural('container', 'containers', len(no_drop))} {_quote(no_drop)} must set"
            ' securityContext.capabilities.drop=["ALL"]'
        )
    if adding:
        details.append(
            f"{_plural('container', 'containers', len(adding))} {_quote(adding)} must not include"
            f" {_quote(sorted(forbidden))} in securityContext.capabilities.add"
        )
    return ("unrestricted capabilities", "; ".join(details)) if details else None


Check = Callable[[JsonObject, JsonObject, Version], Result]


@dataclass(frozen=True)
class _Rule:
    id: str
    check: Check
    since: Version = (1, 0)
    overrides: str = ""
    """The baseline check this restricted one replaces."""


# By id, as upstream's registry orders them.
BASELINE = (
    _Rule("appArmorProfile", _apparmor),
    _Rule("capabilities_baseline", _capabilities_baseline),
    _Rule("hostNamespaces", _host_namespaces),
    _Rule("hostPathVolumes", _host_path_volumes),
    _Rule("hostPorts", _host_ports),
    _Rule("privileged", _privileged),
    _Rule("procMount", _proc_mount),
    _Rule("seLinuxOptions", _selinux),
    _Rule("seccompProfile_baseline", _seccomp_baseline),
    _Rule("sysctls", _sysctls),
    _Rule("windowsHostProcess", _host_process),
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
