"""The baseline checks of the Pod Security Standards, and the helpers every check shares:
upstream pod-security-admission's reasons and details word for word, for a pod's metadata and
spec at a version (`podsecuritystandards` runs them in upstream's order). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

JsonObject = dict[str, Any]
Version = tuple[int, int]
Result = tuple[str, str] | None
"""A failed check's (reason, detail), or None when it passes."""
Check = Callable[[JsonObject, JsonObject, Version], Result]


def plural(singular: str, plural: str, count: int) -> str:
    return singular if count == 1 else plural


def quote(items: list[str]) -> str:
    return ", ".join(f'"{item}"' for item in items)


def field(obj: Any, *path: str) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def all_containers(spec: JsonObject) -> Iterator[JsonObject]:
    """Init containers, containers, then ephemeral containers, as upstream visits them."""
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for container in spec.get(key) or []:
            if isinstance(container, dict):
                yield container


def name_of(container: JsonObject) -> str:
    return str(container.get("name", ""))


def windows(spec: JsonObject) -> bool:
    return bool(field(spec, "os", "name") == "windows")


def setters(pod: bool, containers: list[str], suffix: str) -> str:
    who = ["pod"] if pod else []
    if containers:
        who.append(f"{plural('container', 'containers', len(containers))} {quote(containers)}")
    return " and ".join(who) + suffix


def names(text: str) -> frozenset[str]:
    return frozenset(text.split())


def go_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def host_process(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    key = ("securityContext", "windowsOptions", "hostProcess")
    bad = [name_of(c) for c in all_containers(spec) if field(c, *key) is True]
    pod = field(spec, *key) is True
    if not bad and not pod:
        return None
    return "hostProcess", setters(
        pod, bad, " must not set securityContext.windowsOptions.hostProcess=true"
    )


def host_namespaces(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    found = [f"{key}=true" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    return ("host namespaces", ", ".join(found)) if found else None


def privileged(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    bad = [
        name_of(c)
        for c in all_containers(spec)
        if field(c, "securityContext", "privileged") is True
    ]
    if not bad:
        return None
    container = plural("container", "containers", len(bad))
    return "privileged", f"{container} {quote(bad)} must not set securityContext.privileged=true"


BASELINE_CAPABILITIES = names(
    "AUDIT_WRITE CHOWN DAC_OVERRIDE FOWNER FSETID KILL MKNOD NET_BIND_SERVICE"
    " SETFCAP SETGID SETPCAP SETUID SYS_CHROOT"
)


def added(container: JsonObject, allowed: frozenset[str]) -> list[str]:
    added = field(container, "securityContext", "capabilities", "add") or []
    return [str(c) for c in added if str(c) not in allowed]


def capabilities_baseline(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    bad, forbidden = [], set()
    for container in all_containers(spec):
        extra = added(container, BASELINE_CAPABILITIES)
        if extra:
            bad.append(name_of(container))
            forbidden.update(extra)
    if not bad:
        return None
    return "non-default capabilities", (
        f"{plural('container', 'containers', len(bad))} {quote(bad)} must not include"
        f" {quote(sorted(forbidden))} in securityContext.capabilities.add"
    )


def host_path_volumes(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    bad = [
        str(v.get("name", ""))
        for v in spec.get("volumes") or []
        if isinstance(v, dict) and v.get("hostPath") is not None
    ]
    if not bad:
        return None
    return "hostPath volumes", f"{plural('volume', 'volumes', len(bad))} {quote(bad)}"


def host_ports(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    bad, ports = [], set()
    for container in all_containers(spec):
        used = [
            str(p["hostPort"])
            for p in container.get("ports") or []
            if isinstance(p, dict) and p.get("hostPort")
        ]
        if used:
            bad.append(name_of(container))
            ports.update(used)
    if not bad:
        return None
    return "hostPort", (
        f"{plural('container', 'containers', len(bad))} {quote(bad)}"
        f" {plural('uses', 'use', len(bad))} {plural('hostPort', 'hostPorts', len(ports))}"
        f" {', '.join(sorted(ports))}"
    )


APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


def apparmor(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    setters, values = [], set()
    pod_type = field(spec, "securityContext", "appArmorProfile", "type")
    if pod_type is not None and pod_type not in ("RuntimeDefault", "Localhost"):
        setters.append("pod")
        values.add(str(pod_type))
    bad = []
    for container in all_containers(spec):
        kind = field(container, "securityContext", "appArmorProfile", "type")
        if kind is not None and kind not in ("RuntimeDefault", "Localhost"):
            bad.append(name_of(container))
            values.add(str(kind))
    if bad:
        setters.append(f"{plural('container', 'containers', len(bad))} {quote(bad)}")
    annotations = [
        f"{key}={go_quote(str(value))}"
        for key, value in (meta.get("annotations") or {}).items()
        if key.startswith(APPARMOR_ANNOTATION)
        and value
        and value != "runtime/default"
        and not str(value).startswith("localhost/")
    ]
    shown = sorted(values)
    if annotations:
        shown += sorted(annotations)
        setters.append(plural("annotation", "annotations", len(annotations)))
    if not setters:
        return None
    reason = plural("forbidden AppArmor profile", "forbidden AppArmor profiles", len(shown))
    return reason, f"{' and '.join(setters)} must not set AppArmor profile type to {quote(shown)}"


def selinux(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
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

    pod = bad(field(spec, "securityContext", "seLinuxOptions"))
    containers = [
        name_of(c)
        for c in all_containers(spec)
        if bad(field(c, "securityContext", "seLinuxOptions"))
    ]
    if not pod and not containers:
        return None
    data = [f"{plural('type', 'types', len(types))} {quote(sorted(types))}"] if types else []
    data += ["user may not be set"] if user else []
    data += ["role may not be set"] if role else []
    suffix = f" set forbidden securityContext.seLinuxOptions: {'; '.join(data)}"
    return "seLinuxOptions", setters(pod, containers, suffix)


def proc_mount(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    bad, types = [], set()
    for container in all_containers(spec):
        mount = field(container, "securityContext", "procMount")
        if mount not in (None, "Default"):
            bad.append(name_of(container))
            types.add(str(mount))
    if not bad:
        return None
    return "procMount", (
        f"{plural('container', 'containers', len(bad))} {quote(bad)} must not set"
        f" securityContext.procMount to {quote(sorted(types))}"
    )


SECCOMP_POD_ANNOTATION = "seccomp.security.alpha.kubernetes.io/pod"
SECCOMP_CONTAINER_ANNOTATION = "container.seccomp.security.alpha.kubernetes.io/"


def seccomp_profiles(spec: JsonObject, implicit: bool) -> tuple[bool, list[str], list[str], str]:
    """(pod sets a bad type, containers that set one, containers left unset without a valid pod
    profile when `implicit`, the bad types quoted)."""
    values: set[str] = set()
    pod_profile = field(spec, "securityContext", "seccompProfile")
    pod_bad = pod_valid = False
    if isinstance(pod_profile, dict):
        if pod_profile.get("type") in ("RuntimeDefault", "Localhost"):
            pod_valid = True
        else:
            pod_bad = True
            values.add(str(pod_profile.get("type")))
    explicit, unset = [], []
    for container in all_containers(spec):
        profile = field(container, "securityContext", "seccompProfile")
        if isinstance(profile, dict):
            if profile.get("type") not in ("RuntimeDefault", "Localhost"):
                explicit.append(name_of(container))
                values.add(str(profile.get("type")))
        elif implicit and not pod_valid:
            unset.append(name_of(container))
    return pod_bad, explicit, unset, quote(sorted(values))


def seccomp_baseline(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    if version < (1, 19):
        annotations = meta.get("annotations") or {}
        keys = [SECCOMP_POD_ANNOTATION] + [
            SECCOMP_CONTAINER_ANNOTATION + name_of(c) for c in all_containers(spec)
        ]
        forbidden = sorted(
            f"{key}={go_quote(str(annotations[key]))}"
            for key in keys
            if key in annotations
            and annotations[key] not in ("runtime/default", "docker/default")
            and not str(annotations[key]).startswith("localhost/")
        )
        if not forbidden:
            return None
        which = plural("annotation", "annotations", len(forbidden))
        return "seccompProfile", f"forbidden {which} {', '.join(forbidden)}"
    pod, explicit, _, values = seccomp_profiles(spec, implicit=False)
    if not pod and not explicit:
        return None
    suffix = f" must not set securityContext.seccompProfile.type to {values}"
    return "seccompProfile", setters(pod, explicit, suffix)


SAFE_SYSCTLS: tuple[tuple[Version, frozenset[str]], ...] = (
    (
        (1, 0),
        names(
            "kernel.shm_rmid_forced net.ipv4.ip_local_port_range net.ipv4.tcp_syncookies"
            " net.ipv4.ping_group_range net.ipv4.ip_unprivileged_port_start"
        ),
    ),
    ((1, 27), frozenset({"net.ipv4.ip_local_reserved_ports"})),
    (
        (1, 29),
        names(
            "net.ipv4.tcp_keepalive_time net.ipv4.tcp_fin_timeout"
            " net.ipv4.tcp_keepalive_intvl net.ipv4.tcp_keepalive_probes"
        ),
    ),
)


def sysctls(meta: JsonObject, spec: JsonObject, version: Version) -> Result:
    safe = frozenset().union(*(names for since, names in SAFE_SYSCTLS if version >= since))
    forbidden = [
        str(s.get("name"))
        for s in field(spec, "securityContext", "sysctls") or []
        if isinstance(s, dict) and s.get("name") not in safe
    ]
    return ("forbidden sysctls", ", ".join(forbidden)) if forbidden else None
