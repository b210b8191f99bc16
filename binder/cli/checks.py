"""The checks of `tritonshare preflight`: pure functions of what the CLI read from the cluster.

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
from binder.cluster.objects import constraints_from_spec, node_from_api
from binder.cluster.rules import REASON_DEDICATED, REASON_NOT_DEDICATED, kubernetes_reasons
from common.contract import GPU_NODE_TAINT_EFFECT, Keys
from common.podresources import CPU, MEMORY, node_allocatable, pod_requests
from common.quantity import QuantityError, format_bytes

JsonObject = dict[str, Any]
OK, WARN, FAIL = "ok", "warn", "fail"
_RANK = {OK: 0, WARN: 1, FAIL: 2}

MIN_VERSION = (1, 30)
"""ValidatingAdmissionPolicy is GA (admissionregistration.k8s.io/v1) from 1.30."""

GPU_LABELS = (
    "cloud.google.com/gke-accelerator",
    "k8s.amazonaws.com/accelerator",
    "kubernetes.azure.com/accelerator",
    "nvidia.com/gpu.product",
)
"""Labels that name a node's accelerator: GKE's, EKS's, AKS's, GPU feature discovery's."""
GPU_PRESENT = "nvidia.com/gpu.present"
GPU_COUNT_LABELS = ("nvidia.com/gpu.count", "karpenter.k8s.aws/instance-gpu-count")
NVIDIA_GPU = "nvidia.com/gpu"

CHART_NODE_POD_REQUESTS = {CPU: 2600, MEMORY: (32 << 30) + (256 << 20)}
"""The node pod's requests with the chart's default values (Triton 2 CPU / 32Gi, the agent
100m / 128Mi, the gateway 500m / 128Mi), what --pre checks the GPU nodes' room against."""

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


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _name(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj).get("name", ""))


def _key(obj: Mapping[str, Any]) -> str:
    return f"{_meta(obj).get('namespace', '')}/{_name(obj)}"


def _cpu(millis: int) -> str:
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
    labels = {_name(ns): (_meta(ns).get("labels") or {}) for ns in survey.namespaces if _name(ns)}
    level_key = "pod-security.kubernetes.io/enforce"
    details = tuple(
        f"{name}: enforce={labels[name].get(level_key, '(unset)')}" for name in sorted(labels)
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


# ---- GPU nodes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuNode:
    name: str
    gpus: int
    """Allocatable nvidia.com/gpu, else a GPU count label, else 0."""
    signals: tuple[str, ...]
    """How it was found: each label or resource that says it has GPUs."""
    allocatable: Mapping[str, int]
    device_plugin: bool
    """Whether it advertises nvidia.com/gpu (a device plugin runs there)."""
    obj: JsonObject


def gpu_nodes(nodes: Sequence[JsonObject]) -> list[GpuNode]:
    """The nodes that have GPUs by any of: GPU feature discovery's nvidia.com/gpu.present,
    allocatable nvidia.com/gpu, the clouds' accelerator labels, Karpenter's GPU count."""
    found = []
    for node in nodes:
        labels = _meta(node).get("labels") or {}
        status = node.get("status") or {}
        try:
            allocatable = node_allocatable(status) if "allocatable" in status else {}
        except QuantityError:
            allocatable = {}
        signals = []
        if labels.get(GPU_PRESENT) == "true":
            signals.append(f"{GPU_PRESENT}=true")
        advertised = allocatable.get(NVIDIA_GPU, 0)
        if advertised > 0:
            signals.append(f"allocatable {NVIDIA_GPU}={advertised}")
        signals += [f"{k}={labels[k]}" for k in GPU_LABELS if labels.get(k)]
        counted = 0
        for key in GPU_COUNT_LABELS:
            value = str(labels.get(key, ""))
            if value.isdigit() and int(value) > 0:
                signals.append(f"{key}={value}")
                counted = counted or int(value)
        if signals:
            gpus = advertised or counted
            found.append(
                GpuNode(_name(node), gpus, tuple(signals), allocatable, advertised > 0, node)
            )
    return sorted(found, key=lambda n: n.name)


def gpu_node_check(nodes: Sequence[GpuNode], keys: Keys) -> Check:
    if not nodes:
        return Check(
            "gpu-nodes",
            FAIL,
            f"no GPU node found: no node has {GPU_PRESENT}=true, allocatable {NVIDIA_GPU}, a "
            f"cloud accelerator label or a Karpenter GPU count",
            "add GPU nodes with the NVIDIA GPU Operator or your cloud's NVIDIA device plugin",
        )
    details = []
    status = OK
    blind = [n.name for n in nodes if not n.device_plugin]
    untainted = []
    for node in nodes:
        taints = (node.obj.get("spec") or {}).get("taints") or []
        tainted = any(
            t.get("key") == keys.gpu_node and t.get("effect") == GPU_NODE_TAINT_EFFECT
            for t in taints
        )
        if not tainted:
            untainted.append(node.name)
        count = f"{node.gpus} GPU{'' if node.gpus == 1 else 's'}" if node.gpus else "GPUs"
        details.append(
            f"{node.name}: {count} ({', '.join(node.signals)})"
            + ("" if tainted else f"; not tainted {keys.gpu_node}")
        )
    message = f"{len(nodes)} GPU node{'' if len(nodes) == 1 else 's'}"
    fix = ""
    if untainted:
        status = WARN
        message += (
            f"; {len(untainted)} without the {keys.gpu_node}=true:{GPU_NODE_TAINT_EFFECT} taint, "
            f"so any pod may run there beside the node pod"
        )
        fix = f"kubectl taint node {untainted[0]} {keys.gpu_node}=true:{GPU_NODE_TAINT_EFFECT}"
    if blind:
        status = WARN
        message += (
            f"; {len(blind)} advertise no allocatable {NVIDIA_GPU} ({', '.join(blind)}): no "
            f"device plugin runs there"
        )
        fix = fix or "run the NVIDIA device plugin there (the GPU Operator or the cloud's)"
    return Check("gpu-nodes", status, message, fix, tuple(details))


def node_daemonsets(survey: Survey) -> list[JsonObject]:
    """tritonshare's node DaemonSets: those in its system namespace (one per pool)."""
    return [ds for ds in survey.daemonsets if _meta(ds).get("namespace") == survey.system_namespace]


def _template_spec(ds: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = ((ds.get("spec") or {}).get("template") or {}).get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _selects(spec: Mapping[str, Any], node: JsonObject, keys: Keys) -> list[str]:
    """Why a pod of this spec would not run on the node (empty: it would)."""
    reasons = kubernetes_reasons(constraints_from_spec(spec), node_from_api(node, keys))
    return [r for r in reasons if r not in (REASON_DEDICATED, REASON_NOT_DEDICATED)]


def node_pod_fit(survey: Survey, nodes: Sequence[GpuNode], pre: bool) -> Check:
    """Each GPU node runs a node pod (after install: one of the installed DaemonSets selects it)
    and has room for its CPU and memory requests beside the pods already on it."""
    if not nodes:
        return Check("node-pod-fit", WARN, "no GPU node to check the node pod against")
    daemonsets = [] if pre else node_daemonsets(survey)
    if not pre and not daemonsets:
        return Check(
            "node-pod-fit",
            FAIL,
            f"no node DaemonSet in {survey.system_namespace}: tritonshare is not installed there",
            "install tritonshare (docs/deploy.md), or run `tritonshare preflight --pre`",
        )
    details, unserved, tight, partial = [], [], [], []
    for node in nodes:
        if pre:
            owners, requests, gpus = set(), dict(CHART_NODE_POD_REQUESTS), 0
        else:
            chosen = [
                ds for ds in daemonsets if not _selects(_template_spec(ds), node.obj, survey.keys)
            ]
            if not chosen:
                unserved.append(node.name)
                names = ", ".join(_name(ds) for ds in daemonsets)
                details.append(f"{node.name}: no node pod; none of {names} selects it")
                continue
            owners = {_meta(ds).get("uid") for ds in chosen}
            requests = pod_requests(_template_spec(chosen[0]))
            gpus = requests.get(NVIDIA_GPU, 0)
            if gpus and node.gpus and gpus < node.gpus:
                partial.append(node.name)
        used = _requests_on(survey.pods, node.name, owners)
        free = {r: node.allocatable.get(r, 0) - used.get(r, 0) for r in (CPU, MEMORY)}
        asks = f"asks {_cpu(requests.get(CPU, 0))} CPU, {format_bytes(requests.get(MEMORY, 0))}"
        room = f"{_cpu(free[CPU])} CPU, {format_bytes(free[MEMORY])} free"
        short = [r for r in (CPU, MEMORY) if requests.get(r, 0) > free[r]]
        if short:
            tight.append(node.name)
        line = f"{node.name}: node pod {asks}; {room}"
        if gpus and node.gpus and gpus < node.gpus:
            line += f"; it takes {gpus} of the node's {node.gpus} GPUs"
        details.append(line + (f" (too little {' and '.join(short)})" if short else ""))
    problems, fix = [], ""
    if unserved:
        problems.append(f"{len(unserved)} GPU node(s) run no node pod ({', '.join(unserved)})")
        fix = "add a pool for those nodes (chart value node.pools), or label them as a pool selects"
    if tight:
        problems.append(f"the node pod does not fit on {', '.join(tight)}")
        fix = fix or "give those nodes' pool smaller Triton requests (node.pools[].tritonResources)"
    if partial:
        problems.append(f"the node pod takes fewer GPUs than {', '.join(partial)} have")
        fix = fix or "give those nodes a pool of their GPU count (node.pools[].gpus)"
    if problems:
        return Check("node-pod-fit", FAIL, "; ".join(problems), fix, tuple(details))
    what = "with the chart's defaults " if pre else ""
    return Check(
        "node-pod-fit", OK, f"the node pod fits {what}on every GPU node", "", tuple(details)
    )


def _requests_on(pods: Sequence[JsonObject], node: str, skip_owners: set[Any]) -> dict[str, int]:
    """CPU and memory requested by the node's running pods, but those of `skip_owners`."""
    total = {CPU: 0, MEMORY: 0}
    for pod in pods:
        spec = pod.get("spec") or {}
        if spec.get("nodeName") != node:
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        owners = {r.get("uid") for r in _meta(pod).get("ownerReferences") or []}
        if owners & skip_owners:
            continue
        try:
            asked = pod_requests(spec)
        except QuantityError:
            continue
        for resource in total:
            total[resource] += asked.get(resource, 0)
    return total


# ---- node daemons and the GPU-node policy ----------------------------------------------------


def daemonset_pod(ds: Mapping[str, Any], node: str | None) -> JsonObject:
    """The pod the DaemonSet controller would create for `node` (None: for no node in
    particular): its template, owned by it, pinned by node affinity, with the tolerations the
    controller adds."""
    template = (ds.get("spec") or {}).get("template") or {}
    meta = dict(template.get("metadata") or {})
    spec = dict(template.get("spec") or {})
    meta.update(
        generateName=f"{_name(ds)[:57]}-",
        namespace=_meta(ds).get("namespace"),
        ownerReferences=[
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "name": _name(ds),
                "uid": _meta(ds).get("uid"),
                "controller": True,
            }
        ],
    )
    meta.pop("name", None)
    tolerations = list(spec.get("tolerations") or [])
    added = [
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ]
    if spec.get("hostNetwork"):
        added.append(("node.kubernetes.io/network-unavailable", "NoSchedule"))
    for key, effect in added:
        if not any(t.get("key") == key and t.get("effect") == effect for t in tolerations):
            tolerations.append({"key": key, "operator": "Exists", "effect": effect})
    spec["tolerations"] = tolerations
    if node is not None:
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        affinity = dict(spec.get("affinity") or {})
        affinity["nodeAffinity"] = {
            **(affinity.get("nodeAffinity") or {}),
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]},
        }
        spec["affinity"] = affinity
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def gpu_nodes_of(ds: Mapping[str, Any], nodes: Sequence[GpuNode], keys: Keys) -> tuple[str, ...]:
    """The GPU nodes the DaemonSet's pods would run on (its selector and tolerations)."""
    spec = _template_spec(ds)
    return tuple(n.name for n in nodes if not _selects(spec, n.obj, keys))


def tolerates_gpu_node(ds: Mapping[str, Any], keys: Keys) -> bool:
    """Whether its pods tolerate the GPU-node taint (by its key, or every taint)."""
    for t in _template_spec(ds).get("tolerations") or []:
        key = t.get("key") or ""
        if key in ("", keys.gpu_node) and (t.get("operator") == "Exists" or key):
            return True
    return False


def policy_check(survey: Survey, nodes: Sequence[GpuNode], pre: bool) -> Check:
    """After install: the DaemonSets whose pods tritonshare's GPU-node policy refuses, as the
    API server answered their dry runs. Before: those it will judge (they tolerate the taint)."""
    if pre or survey.dry_runs is None:
        judged = [
            ds
            for ds in survey.daemonsets
            if tolerates_gpu_node(ds, survey.keys)
            and _meta(ds).get("namespace") not in (survey.system_namespace, "kube-system")
        ]
        if not judged:
            return Check(
                "gpu-node-policy",
                OK,
                "no node daemon outside kube-system tolerates the GPU-node taint",
            )
        details = tuple(
            f"{_key(ds)} (service account {_service_account(ds)})"
            + _on(gpu_nodes_of(ds, nodes, survey.keys))
            for ds in judged
        )
        why = survey.dry_run_problem or "the GPU-node policy is not installed yet"
        return Check(
            "gpu-node-policy",
            WARN,
            f"{len(judged)} DaemonSet(s) tolerate the GPU-node taint, so the GPU-node policy "
            f"judges their pods ({why})",
            "after installing, run `tritonshare preflight`: it names those the policy refuses",
            details,
        )
    refused = [d for d in survey.dry_runs if d.refused_by]
    other = [d for d in survey.dry_runs if not d.refused_by and d.message]
    details = tuple(
        f"{d.namespace}/{d.name} (service account {d.service_account}){_on(d.gpu_nodes)}: "
        f"{d.message}"
        for d in refused + other
    )
    if refused:
        first = refused[0]
        return Check(
            "gpu-node-policy",
            FAIL,
            f"the GPU-node policy refuses the pods of {len(refused)} DaemonSet(s): "
            + ", ".join(f"{d.namespace}/{d.name}" for d in refused),
            f"allow namespace {first.namespace} (service account {first.service_account}) in "
            f"the policy's node daemons (chart values admissionPolicies), or drop the "
            f"DaemonSet's toleration of every taint",
            details,
        )
    if other:
        return Check(
            "gpu-node-policy",
            WARN,
            f"the API server refuses the pods of {len(other)} DaemonSet(s), not by tritonshare's "
            f"policy: " + ", ".join(f"{d.namespace}/{d.name}" for d in other),
            "see each refusal below",
            details,
        )
    return Check(
        "gpu-node-policy",
        OK,
        f"the GPU-node policy admits the pods of all {len(survey.dry_runs)} DaemonSets",
    )


def _on(nodes: Sequence[str]) -> str:
    return f", runs on GPU nodes {', '.join(nodes)}" if nodes else ", on no GPU node"


def _service_account(ds: Mapping[str, Any]) -> str:
    spec = _template_spec(ds)
    return str(spec.get("serviceAccountName") or spec.get("serviceAccount") or "default")


def cni_check(daemonsets: Sequence[JsonObject]) -> Check:
    """The CNI, from its node DaemonSet's name, and what is known of its hostPort path."""
    seen = sorted({CNIS[_name(ds)] for ds in daemonsets if _name(ds) in CNIS})
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
    """tritonshare's mutating webhooks (their service in the system namespace): a caBundle set
    and current, and the serving certificate's Secret present, current and issued by it."""
    system = survey.system_namespace
    hooks = [
        (config, hook)
        for config in survey.webhooks
        for hook in config.get("webhooks") or []
        if ((hook.get("clientConfig") or {}).get("service") or {}).get("namespace") == system
    ]
    if not hooks:
        return Check(
            "webhook-certificate",
            FAIL,
            f"no admission webhook calls a service in {system}: the model pod webhook is not "
            f"installed",
            "install tritonshare with its webhook (docs/deploy.md)",
        )
    problems: list[str] = []
    details: list[str] = []
    authorities = []
    soon = False
    for config, hook in hooks:
        name = f"{_name(config)}/{hook.get('name')}"
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
            problems.append(f"Secret {_name(secret)}'s tls.crt cannot be read: {e}")
            continue
        serving = certificates[0]
        details.append(
            f"Secret {_name(secret)}: tls.crt valid for {_days(serving.not_after - now)}"
        )
        soon = soon or serving.not_after - now < CERT_WARN_SECONDS
        if serving.not_after <= now:
            problems.append(f"Secret {_name(secret)}'s certificate expired")
        if authorities and not any(a.subject == serving.issuer for a in authorities):
            problems.append(
                f"Secret {_name(secret)}'s certificate is not issued by the webhook's caBundle"
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
        if _meta(pod).get("namespace") != survey.system_namespace:
            continue
        status = pod.get("status") or {}
        for container in (status.get("initContainerStatuses") or []) + (
            status.get("containerStatuses") or []
        ):
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in PULL_FAILURES:
                failing.append(
                    f"{_key(pod)} {container.get('name')}: {waiting.get('reason')} "
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
