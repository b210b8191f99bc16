"""Each Pod Security Standards check, on its own, with upstream pod-security-admission's reason
and detail: a pod that passes `restricted` is changed in one field at a time, and the level that
forbids the change names it; the level below lets it pass."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from sim.apiserver.admission.podsecurity import label_causes, policy_of
from sim.apiserver.admission.podsecuritystandards import LATEST, describe, evaluate

Pod = dict[str, Any]


def restricted_pod() -> Pod:
    """metadata and spec of a pod every level admits."""
    return {
        "metadata": {"name": "p"},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "app",
                    "image": "x",
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
            "volumes": [{"name": "scratch", "emptyDir": {}}],
        },
    }


def _container(pod: Pod) -> Pod:
    return pod["spec"]["containers"][0]  # type: ignore[no-any-return]


def _context(pod: Pod) -> Pod:
    return _container(pod)["securityContext"]  # type: ignore[no-any-return]


def _set(path: str, value: Any) -> Callable[[Pod], None]:
    def change(pod: Pod) -> None:
        target: Any = pod
        keys = path.split(".")
        for key in keys[:-1]:
            target = target[int(key)] if key.isdigit() else target.setdefault(key, {})
        target[keys[-1]] = value

    return change


BASELINE_CASES: list[tuple[str, Callable[[Pod], None], str, str]] = [
    (
        "hostNetwork",
        lambda p: p["spec"].update(hostNetwork=True, hostPID=True),
        "host namespaces",
        "hostNetwork=true, hostPID=true",
    ),
    ("hostIPC", _set("spec.hostIPC", True), "host namespaces", "hostIPC=true"),
    (
        "privileged",
        lambda p: _context(p).update(privileged=True),
        "privileged",
        'container "app" must not set securityContext.privileged=true',
    ),
    (
        "capabilities",
        lambda p: _context(p)["capabilities"].update(add=["SYS_ADMIN", "CHOWN", "NET_ADMIN"]),
        "non-default capabilities",
        'container "app" must not include "NET_ADMIN", "SYS_ADMIN" in'
        " securityContext.capabilities.add",
    ),
    (
        "hostPath",
        lambda p: p["spec"]["volumes"].append({"name": "root", "hostPath": {"path": "/"}}),
        "hostPath volumes",
        'volume "root"',
    ),
    (
        "hostPort",
        lambda p: _container(p).update(
            ports=[{"containerPort": 80, "hostPort": 8100}, {"containerPort": 81, "hostPort": 8010}]
        ),
        "hostPort",
        'container "app" uses hostPorts 8010, 8100',
    ),
    (
        "appArmor field",
        lambda p: _context(p).update(appArmorProfile={"type": "Unconfined"}),
        "forbidden AppArmor profile",
        'container "app" must not set AppArmor profile type to "Unconfined"',
    ),
    (
        "appArmor annotation",
        lambda p: p["metadata"].update(
            annotations={"container.apparmor.security.beta.kubernetes.io/app": "unconfined"}
        ),
        "forbidden AppArmor profile",
        "annotation must not set AppArmor profile type to"
        ' "container.apparmor.security.beta.kubernetes.io/app="unconfined""',
    ),
    (
        "seLinux",
        lambda p: _context(p).update(seLinuxOptions={"type": "spc_t", "user": "root"}),
        "seLinuxOptions",
        'container "app" set forbidden securityContext.seLinuxOptions: type "spc_t";'
        " user may not be set",
    ),
    (
        "procMount",
        lambda p: _context(p).update(procMount="Unmasked"),
        "procMount",
        'container "app" must not set securityContext.procMount to "Unmasked"',
    ),
    (
        "seccomp",
        _set("spec.securityContext.seccompProfile", {"type": "Unconfined"}),
        "seccompProfile",
        'pod must not set securityContext.seccompProfile.type to "Unconfined"',
    ),
    (
        "sysctls",
        _set(
            "spec.securityContext.sysctls",
            [{"name": "kernel.msgmax", "value": "1"}, {"name": "net.ipv4.tcp_syncookies"}],
        ),
        "forbidden sysctls",
        "kernel.msgmax",
    ),
    (
        "hostProcess",
        lambda p: _context(p).update(windowsOptions={"hostProcess": True}),
        "hostProcess",
        'container "app" must not set securityContext.windowsOptions.hostProcess=true',
    ),
]

RESTRICTED_CASES: list[tuple[str, Callable[[Pod], None], str, str]] = [
    (
        "volume type",
        lambda p: p["spec"]["volumes"].append({"name": "share", "nfs": {"server": "s"}}),
        "restricted volume types",
        'volume "share" uses restricted volume type "nfs"',
    ),
    (
        "privilege escalation",
        lambda p: _context(p).pop("allowPrivilegeEscalation"),
        "allowPrivilegeEscalation != false",
        'container "app" must set securityContext.allowPrivilegeEscalation=false',
    ),
    (
        "runAsNonRoot unset",
        lambda p: p["spec"]["securityContext"].pop("runAsNonRoot"),
        "runAsNonRoot != true",
        'pod or container "app" must set securityContext.runAsNonRoot=true',
    ),
    (
        "runAsNonRoot false",
        lambda p: _context(p).update(runAsNonRoot=False),
        "runAsNonRoot != true",
        'container "app" must not set securityContext.runAsNonRoot=false',
    ),
    (
        "runAsUser 0",
        _set("spec.securityContext.runAsUser", 0),
        "runAsUser=0",
        "pod must not set runAsUser=0",
    ),
    (
        "seccomp unset",
        lambda p: p["spec"]["securityContext"].pop("seccompProfile"),
        "seccompProfile",
        'pod or container "app" must set securityContext.seccompProfile.type to'
        ' "RuntimeDefault" or "Localhost"',
    ),
    (
        "drop ALL",
        lambda p: _context(p).pop("capabilities"),
        "unrestricted capabilities",
        'container "app" must set securityContext.capabilities.drop=["ALL"]',
    ),
    (
        "add beyond NET_BIND_SERVICE",
        lambda p: _context(p)["capabilities"].update(add=["NET_BIND_SERVICE", "CHOWN"]),
        "unrestricted capabilities",
        'container "app" must not include "CHOWN" in securityContext.capabilities.add',
    ),
]


def _failures(level: str, change: Callable[[Pod], None], version: tuple[int, int] = LATEST) -> Any:
    pod = copy.deepcopy(restricted_pod())
    change(pod)
    return evaluate(level, version, pod["metadata"], pod["spec"])


def test_the_base_pod_passes_every_level() -> None:
    pod = restricted_pod()
    for level in ("privileged", "baseline", "restricted"):
        assert evaluate(level, LATEST, pod["metadata"], pod["spec"]) == []


@pytest.mark.parametrize(("case", "change", "reason", "detail"), BASELINE_CASES)
def test_baseline_check(case: str, change: Any, reason: str, detail: str) -> None:
    assert _failures("baseline", change) == [(reason, detail)]
    assert _failures("restricted", change)  # the same check, or the one that replaces it
    assert _failures("privileged", change) == []


@pytest.mark.parametrize(("case", "change", "reason", "detail"), RESTRICTED_CASES)
def test_restricted_check(case: str, change: Any, reason: str, detail: str) -> None:
    assert _failures("restricted", change) == [(reason, detail)]
    assert _failures("baseline", change) == []


def test_restricted_checks_replace_the_baseline_ones_they_override() -> None:
    added = BASELINE_CASES[3][1]
    assert _failures("restricted", added) == [
        (
            "unrestricted capabilities",
            'container "app" must not include "CHOWN", "NET_ADMIN", "SYS_ADMIN" in'
            " securityContext.capabilities.add",
        )
    ]
    host_path = BASELINE_CASES[4][1]
    assert _failures("restricted", host_path) == [
        ("restricted volume types", 'volume "root" uses restricted volume type "hostPath"')
    ]


def test_an_empty_pod_fails_restricted_in_upstreams_order() -> None:
    spec = {"containers": [{"name": "a"}, {"name": "b"}], "initContainers": [{"name": "i"}]}
    assert describe(evaluate("restricted", LATEST, {}, spec)) == (
        'allowPrivilegeEscalation != false (containers "i", "a", "b" must set'
        " securityContext.allowPrivilegeEscalation=false), unrestricted capabilities"
        ' (containers "i", "a", "b" must set securityContext.capabilities.drop=["ALL"]),'
        ' runAsNonRoot != true (pod or containers "i", "a", "b" must set'
        " securityContext.runAsNonRoot=true), seccompProfile (pod or containers"
        ' "i", "a", "b" must set securityContext.seccompProfile.type to "RuntimeDefault" or'
        ' "Localhost")'
    )


def test_rules_follow_the_version_label() -> None:
    root = _set("spec.securityContext.runAsUser", 0)
    assert _failures("restricted", root, (1, 22)) == []
    assert _failures("restricted", root, (1, 23)) == [
        ("runAsUser=0", "pod must not set runAsUser=0")
    ]
    engine = lambda p: _context(p).update(seLinuxOptions={"type": "container_engine_t"})  # noqa: E731
    assert _failures("baseline", engine, (1, 30))[0][0] == "seLinuxOptions"
    assert _failures("baseline", engine, (1, 31)) == []
    # A version newer than the server's rules is today's rules.
    assert _failures("baseline", engine, (1, 40)) == []


def test_namespace_labels_choose_each_mode() -> None:
    policy = policy_of({"pod-security.kubernetes.io/enforce": "baseline"})
    assert (str(policy.enforce), str(policy.warn), str(policy.audit)) == (
        "baseline:latest",
        "baseline:latest",  # warn follows a stricter enforce, as upstream
        "privileged:latest",
    )
    policy = policy_of(
        {
            "pod-security.kubernetes.io/enforce": "privileged",
            "pod-security.kubernetes.io/warn": "restricted",
            "pod-security.kubernetes.io/warn-version": "v1.30",
        }
    )
    assert (str(policy.enforce), str(policy.warn)) == ("privileged:latest", "restricted:v1.30")


def test_bad_namespace_labels_are_named() -> None:
    assert label_causes(
        {
            "pod-security.kubernetes.io/enforce": "strict",
            "pod-security.kubernetes.io/warn-version": "1.30",
        }
    ) == [
        (
            "metadata.labels[pod-security.kubernetes.io/enforce]",
            'Invalid value: "strict": must be one of privileged, baseline, restricted',
        ),
        (
            "metadata.labels[pod-security.kubernetes.io/warn-version]",
            'Invalid value: "1.30": must be "latest" or "v1.x"',
        ),
    ]
