"""GPU nodes as `tritonshare preflight` finds them, the node pod's place on each, and the node
daemons tritonshare's GPU-node policy judges.

A node has GPUs by any of: GPU feature discovery's nvidia.com/gpu.present, allocatable
nvidia.com/gpu (a device plugin runs there), the clouds' accelerator labels (GKE, EKS, AKS) or
Karpenter's GPU count. The node pod's selection and fit follow kube-scheduler's own rules
(`binder.framework.noderules`) and requests (`common.podresources`). The policy is judged by the
API server itself: `daemonset_pod` builds the pod the DaemonSet controller would create, which
`binder.cli.preflight` dry-runs. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from binder.cli.checks import (
    FAIL,
    OK,
    WARN,
    Check,
    JsonObject,
    Survey,
    cpus,
    key_of,
    meta_of,
    name_of,
)
from binder.cluster.objects import constraints_from_spec, node_from_api
from binder.framework.noderules import REASON_DEDICATED, REASON_NOT_DEDICATED, kubernetes_reasons
from common.contract import GPU_NODE_TAINT_EFFECT, Keys
from common.podresources import CPU, MEMORY, node_allocatable, pod_requests
from common.quantity import QuantityError, format_bytes

GPU_LABELS = (
    "cloud.google.com/gke-accelerator",
    "k8s.amazonaws.com/accelerator",
    "kubernetes.azure.com/accelerator",
    "nvidia.com/gpu.product",
)
"""Labels that name a node's accelerator: GKE's, EKS's, AKS's, GPU feature discovery's."""
GPU_PRESENT = "nvidia.com/gpu.present"
GPU_COUNT_LABELS = ("nvidia.com/gpu.count", "karpenter.k8s.aws/instance-gpu-count")
"""GPU feature discovery's and Karpenter's; the operator's own `<prefix>gpu-count` too."""
NVIDIA_GPU = "nvidia.com/gpu"

CHART_SIDECAR_REQUESTS = {CPU: 600, MEMORY: 256 << 20}
"""The node pod's requests beside Triton's with the chart's defaults: the agent 100m / 128Mi, the
gateway 500m / 128Mi."""
CHART_TRITON_PER_GPU = {CPU: 2000, MEMORY: 32 << 30}
CHART_TRITON_GPU_COUNTS = frozenset({1, 2, 4, 8})
"""Triton asks 2 CPUs and 32Gi per GPU on nodes of these counts (node.tritonResourcesByGpus),
else a 1-GPU node's (triton.resources)."""


def chart_node_pod_requests(gpus: int) -> dict[str, int]:
    """The node pod's CPU and memory requests on a node of `gpus` GPUs with the chart's defaults:
    what --pre checks each GPU node's room against."""
    share = gpus if gpus in CHART_TRITON_GPU_COUNTS else 1
    return {r: CHART_SIDECAR_REQUESTS[r] + share * CHART_TRITON_PER_GPU[r] for r in (CPU, MEMORY)}


DEFAULT_EXEMPT = ("kube-system", "gpu-operator")
"""The namespaces the chart's GPU-node policy leaves alone by default, beside its own."""

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


def gpu_nodes(nodes: Sequence[JsonObject], keys: Keys) -> list[GpuNode]:
    """The nodes that have GPUs by any of: GPU feature discovery's nvidia.com/gpu.present,
    allocatable nvidia.com/gpu, the clouds' accelerator labels, Karpenter's GPU count, the GPUs
    tritonshare's agent publishes on the node."""
    found = []
    for node in nodes:
        labels = meta_of(node).get("labels") or {}
        published = _published_gpus(meta_of(node).get("annotations") or {}, keys)
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
        for key in (*GPU_COUNT_LABELS, f"{keys.prefix}gpu-count"):
            value = str(labels.get(key, ""))
            if value.isdigit() and int(value) > 0:
                signals.append(f"{key}={value}")
                counted = counted or int(value)
        if published:
            signals.append(f"{published} published by tritonshare's agent ({keys.gpus})")
        if signals:
            gpus = advertised or counted or published
            found.append(
                GpuNode(name_of(node), gpus, tuple(signals), allocatable, advertised > 0, node)
            )
    return sorted(found, key=lambda n: n.name)


def _published_gpus(annotations: Mapping[str, Any], keys: Keys) -> int:
    """How many GPUs the node's agent lists in its annotation (0: none, or unreadable)."""
    try:
        listed = json.loads(str(annotations.get(keys.gpus) or "[]"))
    except ValueError:
        return 0
    return len(listed) if isinstance(listed, list) else 0


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
    return [
        ds for ds in survey.daemonsets if meta_of(ds).get("namespace") == survey.system_namespace
    ]


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
            owners, requests, gpus = set(), chart_node_pod_requests(node.gpus), 0
        else:
            chosen = [
                ds for ds in daemonsets if not _selects(_template_spec(ds), node.obj, survey.keys)
            ]
            if not chosen:
                unserved.append(node.name)
                names = ", ".join(name_of(ds) for ds in daemonsets)
                details.append(f"{node.name}: no node pod; none of {names} selects it")
                continue
            owners = {meta_of(ds).get("uid") for ds in chosen}
            requests = pod_requests(_template_spec(chosen[0]))
            gpus = requests.get(NVIDIA_GPU, 0)
            if gpus and node.gpus and gpus < node.gpus:
                partial.append(node.name)
        # Before installing, a node pod already there is the one the chart's would replace.
        skip = survey.system_namespace if pre else None
        used = _requests_on(survey.pods, node.name, owners, skip)
        free = {r: node.allocatable.get(r, 0) - used.get(r, 0) for r in (CPU, MEMORY)}
        asks = f"asks {cpus(requests.get(CPU, 0))} CPU, {format_bytes(requests.get(MEMORY, 0))}"
        room = f"{cpus(free[CPU])} CPU, {format_bytes(free[MEMORY])} free"
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


def node_pools_check(survey: Survey, pre: bool) -> Check:
    """Each installed node DaemonSet (a pool) selects a node: a pool whose selector no node
    matches (a GPU feature discovery label on nodes without GFD, a mistyped instance type) runs
    no node pod, and nothing else says so."""
    if pre:
        return Check("node-pools", OK, "the pools are checked once installed")
    idle = [
        ds
        for ds in node_daemonsets(survey)
        if not any(not _selects(_template_spec(ds), node, survey.keys) for node in survey.nodes)
    ]
    if not idle:
        return Check("node-pools", OK, "every node pool selects a node")
    details = tuple(
        f"{name_of(ds)}: nodeSelector {dict(_template_spec(ds).get('nodeSelector') or {})}"
        + (", and a node affinity" if _template_spec(ds).get("affinity") else "")
        for ds in idle
    )
    return Check(
        "node-pools",
        WARN,
        f"{len(idle)} node pool(s) select no node, so run no node pod: "
        + ", ".join(name_of(ds) for ds in idle),
        "select the pool's nodes by the labels they have (node.pools[].nodeSelector: an "
        "instance type, an accelerator, or tritonshare.io/gpu-count set on the node pool)",
        details,
    )


def _requests_on(
    pods: Sequence[JsonObject], node: str, skip_owners: set[Any], skip_namespace: str | None
) -> dict[str, int]:
    """CPU and memory requested by the node's running pods, but those of `skip_owners` and of
    `skip_namespace`."""
    total = {CPU: 0, MEMORY: 0}
    for pod in pods:
        spec = pod.get("spec") or {}
        if spec.get("nodeName") != node or meta_of(pod).get("namespace") == skip_namespace:
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        owners = {r.get("uid") for r in meta_of(pod).get("ownerReferences") or []}
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
        generateName=f"{name_of(ds)[:57]}-",
        namespace=meta_of(ds).get("namespace"),
        ownerReferences=[
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "name": name_of(ds),
                "uid": meta_of(ds).get("uid"),
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
        effect = t.get("effect") or GPU_NODE_TAINT_EFFECT
        tolerated = t.get("operator") == "Exists" or key
        if key in ("", keys.gpu_node) and effect == GPU_NODE_TAINT_EFFECT and tolerated:
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
            and meta_of(ds).get("namespace") not in (survey.system_namespace, *DEFAULT_EXEMPT)
        ]
        if not judged:
            return Check(
                "gpu-node-policy",
                OK,
                f"no DaemonSet outside {', '.join(DEFAULT_EXEMPT)} tolerates the GPU-node taint",
            )
        details = tuple(
            f"{key_of(ds)} (service account {_service_account(ds)})"
            + _on(gpu_nodes_of(ds, nodes, survey.keys))
            for ds in judged
        )
        why = survey.dry_run_problem or "which it refuses depends on the installed policy's values"
        return Check(
            "gpu-node-policy",
            WARN,
            f"{len(judged)} DaemonSet(s) outside {', '.join(DEFAULT_EXEMPT)} tolerate the GPU-node "
            f"taint, so the GPU-node policy judges their pods ({why})",
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
