"""The checks of `tritonshare preflight`: pure functions of what the CLI read from the cluster.

The cluster-wide checks live here; the GPU nodes' and the node daemons' in `binder.cli.gpunodes`.
A `Survey` holds the lists as the API server returned them (and, for the GPU-node policy, the
answers of its dry runs); each check returns a `Check`: ok, warn or fail, one line saying what it
found, one line saying how to fix it, and the details (one line per node, DaemonSet, ...). What a
check cannot know from the API it says it does not know, as a warning. No I/O, no clock (`now` is
passed in): `binder.cli.preflight` reads the cluster and writes the report.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from binder.cli.certificates import pem_certificates
from common.contract import Keys

JsonObject = dict[str, Any]
OK, WARN, FAIL = "ok", "warn", "fail"
_RANK = {OK: 0, WARN: 1, FAIL: 2}

MIN_VERSION = (1, 30)
"""ValidatingAdmissionPolicy is GA (admissionregistration.k8s.io/v1) from 1.30."""

PROMETHEUS_OPERATOR_CRDS = (
    "podmonitors.monitoring.coreos.com",
    "prometheusrules.monitoring.coreos.com",
)
PULL_FAILURES = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName"})
CERT_WARN_SECONDS = 30 * 86400

CNIS: Mapping[str, tuple[str, bool]] = {
    "aws-node": ("AWS VPC CNI", True),
    "calico-node": ("Calico", True),
    "canal": ("Canal", True),
    "kube-flannel-ds": ("Flannel", True),
    "kube-flannel": ("Flannel", True),
    "azure-cni": ("Azure CNI", True),
    "azure-cns": ("Azure CNI", True),
    "kindnet": ("kindnet", True),
    "weave-net": ("Weave Net", True),
    "cilium": ("Cilium", False),
    "anetd": ("GKE Dataplane V2 (Cilium)", False),
    "antrea-agent": ("Antrea", False),
    "kube-router": ("kube-router", False),
    "ovnkube-node": ("OVN-Kubernetes", False),
}
"""A CNI's node DaemonSet name: (the CNI, whether it publishes hostPorts through the CNI portmap
plugin). Those without are 'unknown': their hostPort path is their own dataplane's."""


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    message: str
    fix: str = ""
    details: tuple[str, ...] = ()

    def document(self) -> JsonObject:
        return {
            "name": self.name,
            "status": self.status,
            "message": self.message,
            "fix": self.fix or None,
            "details": list(self.details),
        }


def worst(checks: Sequence[Check]) -> str:
    return max((c.status for c in checks), key=_RANK.__getitem__, default=OK)


@dataclass(frozen=True)
class DryRun:
    """What the API server answered to a dry-run create of one DaemonSet's pod."""

    namespace: str
    name: str
    service_account: str
    refused_by: str
    """The refusing policy's name, "" when admitted or refused by something else."""
    message: str
    """The refusal's message ("" when admitted)."""
    gpu_nodes: tuple[str, ...]
    """The GPU nodes its pods would run on."""


@dataclass(frozen=True)
class Survey:
    """What the CLI read; lists are empty where the kind could not be read."""

    keys: Keys
    system_namespace: str
    version: JsonObject
    nodes: list[JsonObject]
    namespaces: list[JsonObject]
    daemonsets: list[JsonObject]
    pods: list[JsonObject]
    crds: list[str]
    webhooks: list[JsonObject] = field(default_factory=list)
    secrets: list[JsonObject] = field(default_factory=list)
    dry_runs: list[DryRun] | None = None
    """None when not run (--pre, or tritonshare's policy is not installed)."""
    dry_run_problem: str = ""


def meta_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def name_of(obj: Mapping[str, Any]) -> str:
    return str(meta_of(obj).get("name", ""))


def key_of(obj: Mapping[str, Any]) -> str:
    return f"{meta_of(obj).get('namespace', '')}/{name_of(obj)}"


def cpus(millis: int) -> str:
    return f"{millis / 1000:g}"


# ---- the cluster -----------------------------------------------------------------------------


def kubernetes_version(version: Mapping[str, Any]) -> Check:
    """1.30 or newer (EKS and GKE write the minor as `30+`)."""
    text = str(version.get("gitVersion") or f"{version.get('major')}.{version.get('minor')}")
    try:
        found = (int(str(version.get("major"))), int(str(version.get("minor")).rstrip("+")))
    except ValueError:
        return Check("kubernetes-version", WARN, f"the API server's version {text} is unreadable")
    wanted = f"{MIN_VERSION[0]}.{MIN_VERSION[1]}"
    if found < MIN_VERSION:
        return Check(
            "kubernetes-version",
            FAIL,
            f"Kubernetes {text}: tritonshare needs {wanted} or newer (its admission policies are "
            f"admissionregistration.k8s.io/v1 ValidatingAdmissionPolicies)",
            f"upgrade the cluster to Kubernetes {wanted} or newer",
        )
    return Check("kubernetes-version", OK, f"Kubernetes {text} (supported: {wanted} and newer)")


def pod_security(survey: Survey) -> Check:
    """The system namespace's Pod Security enforce level admits the node pod's hostPorts only
    at `privileged`; the other namespaces' levels are listed."""
    system = survey.system_namespace
    labels = {
        name_of(ns): (meta_of(ns).get("labels") or {}) for ns in survey.namespaces if name_of(ns)
    }
    level_key = "pod-security.kubernetes.io/enforce"
    used = {system} | {
        str(meta_of(p).get("namespace")) for p in survey.pods if _is_model(p, survey)
    }
    details = tuple(
        f"{name}: enforce={labels[name].get(level_key, '(unset)')}"
        + (" (tritonshare's own)" if name == system else " (model pods)")
        for name in sorted(used & set(labels))
    )
    fix = f"kubectl label namespace {system} {level_key}=privileged --overwrite"
    if system not in labels:
        return Check(
            "pod-security",
            OK,
            f"namespace {system} does not exist yet; it needs Pod Security enforce=privileged "
            f"(the node pod publishes hostPorts): the kustomize base labels it so; with "
            f"`helm install --create-namespace` the cluster's default level applies",
            f"if your cluster's default level is not privileged: {fix}",
            details,
        )
    level = labels[system].get(level_key)
    if level is None:
        return Check(
            "pod-security",
            WARN,
            f"namespace {system} sets no Pod Security enforce level: the cluster's default "
            f"applies (privileged unless an AdmissionConfiguration says otherwise), and the node "
            f"pod's hostPorts need privileged",
            fix,
            details,
        )
    if level != "privileged":
        return Check(
            "pod-security",
            FAIL,
            f"namespace {system} enforces Pod Security level {level}: the node pod's hostPorts "
            f"are refused (only privileged admits them)",
            fix,
            details,
        )
    return Check("pod-security", OK, f"namespace {system} enforces privileged", "", details)


def _is_model(pod: Mapping[str, Any], survey: Survey) -> bool:
    """A model pod: one of its containers limits tritonshare's GPU memory resource."""
    spec = pod.get("spec") or {}
    return any(
        survey.keys.gpu_mem in ((c.get("resources") or {}).get("limits") or {})
        for c in spec.get("containers") or []
    )


def cni_check(daemonsets: Sequence[JsonObject]) -> Check:
    """The CNI, from its node DaemonSet's name, and what is known of its hostPort path."""
    seen = sorted({CNIS[name_of(ds)] for ds in daemonsets if name_of(ds) in CNIS})
    how = "the gateway knows a model pod by the source address of its connection to the hostPort"
    if not seen:
        return Check(
            "cni",
            WARN,
            f"no known CNI DaemonSet found: whether it keeps a pod's source address on hostPort "
            f"traffic is unknown ({how})",
            "check that a model is served through its Service once installed; if every request "
            "is refused, the CNI rewrites source addresses",
        )
    names = ", ".join(name for name, _ in seen)
    if all(portmap for _, portmap in seen):
        return Check(
            "cni",
            WARN,
            f"{names}: hostPorts through the CNI portmap plugin, which keeps a pod's source "
            f"address unless masquerading is on (its masqAll, or an SNAT rule for node-local "
            f"traffic); not verified on this cluster ({how})",
            "keep portmap's masqAll off; check that a model is served through its Service once "
            "installed",
        )
    return Check(
        "cni",
        WARN,
        f"{names}: whether its hostPort path keeps a pod's source address is unknown ({how}; "
        f"eBPF dataplanes and masquerading rules may rewrite it)",
        "check that a model is served through its Service once installed; if every request is "
        "refused, the CNI rewrites source addresses",
    )


# ---- what the chart needs, and what is installed ---------------------------------------------


def prometheus_check(crds: Sequence[str]) -> Check:
    missing = [c for c in PROMETHEUS_OPERATOR_CRDS if c not in crds]
    if missing:
        return Check(
            "prometheus-operator",
            WARN,
            f"Prometheus Operator CRDs missing ({', '.join(missing)}): the chart's PodMonitors "
            f"and alerts cannot be installed",
            "install the Prometheus Operator (kube-prometheus-stack), or set "
            "monitoring.podMonitors.enabled=false and monitoring.alerts.enabled=false",
        )
    return Check("prometheus-operator", OK, "Prometheus Operator CRDs present")


def webhook_check(survey: Survey, now: float) -> Check:
    """tritonshare's mutating webhooks (their service in the system namespace, or their name in
    the key prefix's domain, `model-pods.tritonshare.io`): a caBundle set and current, and the
    serving certificate's Secret present, current and issued by it."""
    system = survey.system_namespace
    domain = "." + survey.keys.prefix.split("/")[0]
    hooks = [
        (config, hook)
        for config in survey.webhooks
        for hook in config.get("webhooks") or []
        if ((hook.get("clientConfig") or {}).get("service") or {}).get("namespace") == system
        or str(hook.get("name", "")).endswith(domain)
    ]
    if not hooks:
        return Check(
            "webhook-certificate",
            FAIL,
            f"no admission webhook calls a service in {system} or is named *{domain}: the model "
            f"pod webhook is not installed",
            "install tritonshare with its webhook (docs/deploy.md)",
        )
    problems: list[str] = []
    details: list[str] = []
    authorities = []
    soon = False
    for config, hook in hooks:
        name = f"{name_of(config)}/{hook.get('name')}"
        bundle = str((hook.get("clientConfig") or {}).get("caBundle") or "")
        if not bundle:
            problems.append(f"{name} has no caBundle: the API server cannot call it")
            continue
        try:
            certificates = pem_certificates(base64.b64decode(bundle))
        except ValueError as e:
            problems.append(f"{name}'s caBundle cannot be read: {e}")
            continue
        authorities += certificates
        expiry = min(c.not_after for c in certificates)
        details.append(f"{name}: caBundle valid for {_days(expiry - now)}")
        soon = soon or expiry - now < CERT_WARN_SECONDS
        if expiry <= now:
            problems.append(f"{name}'s caBundle expired")
    tls = [s for s in survey.secrets if s.get("type") == "kubernetes.io/tls"]
    if not tls:
        problems.append(f"no TLS Secret in {system}: the webhook has no serving certificate")
    for secret in tls:
        data = secret.get("data") or {}
        try:
            certificates = pem_certificates(base64.b64decode(str(data.get("tls.crt") or "")))
        except ValueError as e:
            problems.append(f"Secret {name_of(secret)}'s tls.crt cannot be read: {e}")
            continue
        serving = certificates[0]
        details.append(
            f"Secret {name_of(secret)}: tls.crt valid for {_days(serving.not_after - now)}"
        )
        soon = soon or serving.not_after - now < CERT_WARN_SECONDS
        if serving.not_after <= now:
            problems.append(f"Secret {name_of(secret)}'s certificate expired")
        if authorities and not any(a.subject == serving.issuer for a in authorities):
            problems.append(
                f"Secret {name_of(secret)}'s certificate is not issued by the webhook's caBundle"
            )
    if problems:
        return Check(
            "webhook-certificate",
            FAIL,
            "; ".join(problems),
            "renew the webhook certificate: with cert-manager, check its Certificate and CA "
            "injector; without, `helm upgrade` issues a new one",
            tuple(details),
        )
    if soon:
        return Check(
            "webhook-certificate",
            WARN,
            "the webhook's certificate expires within 30 days",
            "renew it: cert-manager does on its own; without it, `helm upgrade` issues a new one",
            tuple(details),
        )
    return Check(
        "webhook-certificate",
        OK,
        "the webhook's certificate is set and current",
        "",
        tuple(details),
    )


def _days(seconds: float) -> str:
    return f"{seconds / 86400:.0f} days" if seconds > 0 else "0 days (expired)"


def image_check(survey: Survey) -> Check:
    """Pods in the system namespace whose images do not pull, as their statuses say."""
    failing = []
    for pod in survey.pods:
        if meta_of(pod).get("namespace") != survey.system_namespace:
            continue
        status = pod.get("status") or {}
        for container in (status.get("initContainerStatuses") or []) + (
            status.get("containerStatuses") or []
        ):
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in PULL_FAILURES:
                failing.append(
                    f"{key_of(pod)} {container.get('name')}: {waiting.get('reason')} "
                    f"{container.get('image')}: {waiting.get('message', '')}".rstrip(": ")
                )
    if failing:
        return Check(
            "images",
            FAIL,
            f"{len(failing)} container(s) of tritonshare's pods cannot pull their image",
            "check the image name and tag, the registry's reachability from the nodes, and "
            "imagePullSecrets (chart values image.*, imagePullSecrets)",
            tuple(failing),
        )
    return Check("images", OK, "no tritonshare pod waits on an image pull that failed")
