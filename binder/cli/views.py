"""What `tritonshare status` and `tritonshare explain POD|tm/NAME` print: the cluster listed once,
folded into the binder's own cache (a replica charged only when its proof verifies, as the
binder's), and the binder's own placement run on it; nothing is changed.

`status` prints every node and GPU with capacity, allocated (placed), loaded (measured), sleeping
(on-demand pods not loaded) and free GPU memory and the pods and TritonModel replicas on it (as
`kubectl inspect gpushare` does for GPU sharing); `explain` prints, for every node, why a pod
does or does not fit there and what the binder would decide now; for a TritonModel, where each
replica is or would be placed (`binder.cli.modelreport`). `-o json|yaml` prints the same as data
(`binder.cli.report`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from binder.api.kube import Kube
from binder.api.listwatch import (
    NAMESPACES,
    NODES,
    PODS,
    PRIORITY_CLASSES,
    QUOTAS,
    TRITONMODELS,
    Kind,
    leases_in,
)
from binder.cli.isvcreport import isvc_document, owns, write_isvc
from binder.cli.modelreport import find_model, model_document, write_model
from binder.cli.report import (
    explain_document,
    load_state,
    published_allowance,
    published_tenant_code,
    residency_figures,
    shown,
    write_document,
)
from binder.cluster.cache import ClusterCache
from binder.cluster.chargedpods import Unproven
from binder.cluster.clusterstate import ClusterState
from binder.cluster.ledger import Ledger
from binder.cluster.objects import PodInfo, pod_from_api
from binder.framework.noderules import NODE_RULES
from binder.framework.placement import Placement, explain, place
from binder.framework.quota import Usage
from common.contract import Keys
from common.kubeapi.errors import ApiError, NotFoundError, UnavailableError
from common.kubeapi.session import JsonObject
from common.proofs import KeyRing
from common.quantity import format_bytes


class _Quiet:
    """A cache listener that ignores changes: the CLI reads one snapshot."""

    def pending_changed(self, pod: PodInfo, relevant: bool) -> None:
        pass

    def pending_gone(self, uid: str) -> None:
        pass

    def cluster_changed(self, why: str) -> None:
        pass

    def unproven_seen(self, verdict: Unproven) -> None:
        pass


@dataclass(frozen=True)
class Listing:
    """One list of each kind the CLI reads, as the API server returned them."""

    nodes: list[JsonObject]
    leases: list[JsonObject]
    """The system namespace's: the agents' and the binder leader's."""
    pods: list[JsonObject]
    namespaces: list[JsonObject] = field(default_factory=list)
    """For pod affinity terms' namespaceSelector (empty when they cannot be listed)."""
    models: list[JsonObject] = field(default_factory=list)
    """The TritonModels, whose placed replicas the binder charges (empty without the CRD)."""
    priority_classes: list[JsonObject] = field(default_factory=list)
    """For the replicas' priorities, as the binder resolves them."""


def list_cluster(kube: Kube, namespace: str) -> Listing:
    try:
        namespaces = kube.list_all(NAMESPACES)[0]
    except ApiError:
        namespaces = []  # a user who may not list namespaces still gets the rest
    return Listing(
        kube.list_all(NODES)[0],
        kube.list_all(leases_in(namespace))[0],
        kube.list_all(PODS)[0],
        namespaces,
        _optional(kube, TRITONMODELS),
        _optional(kube, PRIORITY_CLASSES),
    )


def _optional(kube: Kube, kind: Kind) -> list[JsonObject]:
    """Every object of `kind`; none when the kind is not served (no CRD) or may not be listed."""
    try:
        return kube.list_all(kind)[0]
    except UnavailableError:
        raise
    except ApiError:
        return []


def fold(
    listing: Listing, keys: Keys, scheduler: str, reserve: int, ring: KeyRing | None = None
) -> ClusterCache:
    """The listing folded into the binder's cache, as the binder folds its own lists. Proofs of
    placement are verified with `ring`, or checked for form only without one; the namespaces
    allowed tenant code are those the binder's leader publishes."""
    cache = ClusterCache(
        keys,
        Ledger(ClusterState(rules=NODE_RULES, reserve=reserve)),
        scheduler_name=scheduler,
        listener=_Quiet(),
        placement_keys=None if ring is None else lambda: ring,
        tenant_code=published_tenant_code(listing.leases, keys),
        allowance=published_allowance(listing.leases, keys),
    )
    cache.replace_nodes(listing.nodes)
    cache.replace_namespaces(listing.namespaces)
    cache.replace_leases(listing.leases)
    cache.models.replace_priority_classes(listing.priority_classes)
    cache.replace_pods(listing.pods)
    cache.models.replace_models(listing.models)
    cache.state.arrays()
    return cache


def load(
    kube: Kube,
    keys: Keys,
    namespace: str,
    scheduler: str,
    reserve: int,
    ring: KeyRing | None = None,
) -> ClusterCache:
    """One list of nodes, agent leases and pods, folded into the binder's cache."""
    return fold(list_cluster(kube, namespace), keys, scheduler, reserve, ring)


def counted(number: int, noun: str) -> str:
    """`1 node`, `3 nodes`."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        out.write("\n")


def write_usage(rows: list[Usage], output: str, out: TextIO) -> None:
    """`tritonshare quota`: each GPU memory limit with its pods' and replicas' use, the
    per-process allowance booked with them included (and shown apart)."""
    if output != "text":
        fields = ("namespace", "quota", "key", "hard", "pods", "replicas", "used", "allowance")
        document = [{name: getattr(row, name) for name in fields} for row in rows]
        write_document({"quotas": document}, output, out)
    elif not rows:
        out.write("No ResourceQuota limits GPU memory.\n")
    else:
        header = ["NAMESPACE", "QUOTA", "RESOURCE", "HARD", "PODS", "REPLICAS", "USED", "FREE"]
        table = [[*header, "ALLOWANCE"]]
        for row in rows:
            free = max(0, row.hard - row.used)
            sizes = (row.hard, row.pods, row.replicas, row.used, free, row.allowance)
            table.append([row.namespace, row.quota, row.key, *(format_bytes(n) for n in sizes)])
        _table(table, out)


def status(
    cache: ClusterCache,
    out: TextIO,
    now: float,
    namespace: str | None = None,
    asleep: frozenset[str] = frozenset(),
    *,
    notes: bool = False,
) -> None:
    """Every node and GPU (the figures count every namespace: GPUs are shared), with the pods
    and TritonModel replicas on each, of `namespace` alone when given; `notes`: how old the
    agents' figures may be, too (`status -v`)."""
    state = cache.state
    header = ["NODE", "AGENT", "GPU", "UUID", "PRODUCT", "CAPACITY", "ALLOCATED", "LOADED"]
    header += ["SLEEPING", "FREE", "USED"]
    rows = [[*header, "PODS: MODEL (REQUEST, MEASURED)"]]
    total_capacity = total_allocated = 0
    for name in state.names:
        info = state.nodes[name]
        agent = "alive" if state.leases.get(name, 0.0) > now else "down"
        if not info.gpus:
            why = "unreadable GPU annotation" if info.gpu_problem else "no GPUs published"
            rows.append([name, agent, "-", why, "", "", "", "", "", "", "", ""])
            continue
        allocated = state.memory.allocated(name)
        free = state.memory.free(name)
        models: dict[int, list[str]] = {}
        placed: dict[int, list[PodInfo]] = {}
        for pod, position in state.pods_on(name):
            measured = info.measured_of(pod)
            uses = f", uses {format_bytes(measured)}" if measured is not None else ""
            if pod.on_demand:
                uses += ", on-demand" + (", asleep" if pod.key in asleep else "")
            placed.setdefault(position, []).append(pod)
            if namespace is not None and pod.namespace != namespace:
                continue
            label = f"{shown(pod)}: {pod.model_id or '-'} (asks {format_bytes(pod.request)}{uses})"
            models.setdefault(position, []).append(label)
        for position, gpu in enumerate(info.gpus):
            capacity = state.memory.usable(gpu)
            total_capacity += capacity
            total_allocated += allocated[position]
            loaded, sleeping = residency_figures(info, placed.get(position, []))
            rows.append(
                [
                    name,
                    agent,
                    str(gpu.index),
                    gpu.uuid,
                    gpu.product + ("" if gpu.healthy else " (unhealthy)"),
                    format_bytes(capacity),
                    format_bytes(allocated[position]),
                    format_bytes(loaded),
                    format_bytes(sleeping),
                    format_bytes(free[position]),
                    format_bytes(gpu.used) if gpu.used is not None else "-",
                    ", ".join(sorted(models.get(position, []))) or "-",
                ]
            )
    _table(rows, out)
    out.write(
        f"\n{counted(len(state.names), 'node')}; GPU memory allocated "
        f"{format_bytes(total_allocated)} of {format_bytes(total_capacity)}; "
        f"{counted(len(pending(cache, namespace)), 'pod')} pending"
        f"{'' if namespace is None else ' in ' + namespace}.\n"
    )
    if notes and any(state.nodes[name].gpus for name in state.names):
        out.write(
            "LOADED, SLEEPING, USED and `uses` are what each agent last published: it rewrites "
            "them at most every --usage-publish-seconds (60 s by default), so they may be that "
            "old; `asleep` is the model's condition, written as it falls asleep.\n"
        )
    unproven_status(cache, out)


def pending(cache: ClusterCache, namespace: str | None) -> list[PodInfo]:
    """The pending pods, of `namespace` alone when given."""
    return [p for p in cache.pending.values() if namespace is None or p.namespace == namespace]


def unproven_status(cache: ClusterCache, out: TextIO) -> None:
    """The pods the binder does not charge, and the used memory nothing charged explains."""
    unproven = sorted(
        (v for v in cache.unproven.values() if cache.ledger.on_tritonshare_node(v.pod)),
        key=lambda v: (v.pod.node_name, v.pod.key),
    )
    if unproven:
        out.write(
            f"\n{counted(len(unproven), 'pod')} on tritonshare nodes "
            f"{'proves' if len(unproven) == 1 else 'prove'} no placement by the binder: "
            f"not charged, not served.\n"
        )
        rows = [["POD", "NODE", "ASKS", "MODEL", "REASON"]]
        for v in unproven:
            pod = v.pod
            rows.append(
                [
                    pod.key,
                    pod.node_name,
                    format_bytes(pod.request),
                    pod.model_id or "-",
                    v.reason,
                ]
            )
        _table(rows, out)
    unexplained = [row for row in unattributed(cache) if row[2] > 0]
    if unexplained:
        out.write(
            "\nGPU memory in use that no charged pod's measured model explains (FREE above "
            "already leaves it out):\n"
        )
        _table(
            [["NODE", "GPU", "UNATTRIBUTED"]]
            + [[node, str(index), format_bytes(size)] for node, index, size in unexplained],
            out,
        )
    if cache.proofs_checked_for_form_only:
        out.write(
            "\nProofs of placement were checked for form only (no --placement-key-dir): the "
            "binder also checks their signatures.\n"
        )


def unattributed(cache: ClusterCache) -> list[tuple[str, int, int]]:
    """Per GPU with a published NVML figure: (node, GPU index, used bytes that the measured
    models of the pods charged to it do not account for). Triton's own CUDA context shows here
    too; it is what --gpu-mem-reserve is for."""
    state = cache.state
    rows = []
    for name in state.names:
        info = state.nodes[name]
        explained = [0] * len(info.gpus)
        for pod, position in state.pods_on(name):
            if 0 <= position < len(explained):
                explained[position] += info.measured_of(pod) or 0
        for position, gpu in enumerate(info.gpus):
            if gpu.used is not None:
                rows.append((name, gpu.index, max(0, gpu.used - explained[position])))
    return rows


def explain_pod(cache: ClusterCache, pod: PodInfo, out: TextIO, now: float) -> None:
    out.write(
        f"Pod {pod.key} asks for {format_bytes(pod.request)} of GPU memory for model "
        f"{pod.model_id or '(none)'}.\n"
    )
    if pod.node_name:
        gpu = pod.gpu_uuid or "(not annotated)"
        out.write(f"It is bound to node {pod.node_name}, GPU {gpu}.\n")
        if explain_unproven(cache, pod, out):
            return
        node = cache.state.nodes.get(pod.node_name)
        if pod.triton_name:
            out.write(
                f"Its model's name in Triton (Triton's log and nv_* series) is {pod.triton_name}, "
                f"or {pod.model_id} if its agent installed it before private names.\n"
            )
        measured = node.measured_of(pod) if node is not None else None
        if measured is not None:
            out.write(
                f"Its model is measured to use {format_bytes(measured)} "
                f"(it asked for {format_bytes(pod.request)}); the binder counts "
                f"{format_bytes(max(measured, pod.request))}.\n"
            )
        return
    result = place(cache.state, pod, now=now)
    if isinstance(result, Placement):
        out.write(
            f"The binder would place it now on node {result.node}, GPU {result.gpu.index} "
            f"({result.gpu.uuid}).\n\n"
        )
    else:
        out.write(f"It fits nowhere now: {result.message}\n\n")
    if pod.problem:
        return
    rows = [["NODE", "FITS", "FREE PER GPU", "REASONS"]]
    for verdict in explain(cache.state, pod, now=now):
        rows.append(
            [
                verdict.node,
                "no" if verdict.reasons else "yes",
                " ".join(format_bytes(f) for f in verdict.free) or "-",
                "; ".join(verdict.reasons) or "-",
            ]
        )
    _table(rows, out)


def explain_unproven(cache: ClusterCache, pod: PodInfo, out: TextIO) -> bool:
    """Say so when the binder does not charge a bound pod; True when it does not."""
    verdict = cache.unproven.get(pod.uid)
    if verdict is None:
        return False
    out.write(
        f"The binder does not charge it ({verdict.reason}): {verdict.why}. Its GPU memory and "
        f"model id do not count on the node, and the node's agent does not serve it.\n"
    )
    return True


POD_KINDS = frozenset({"pod", "pods", "po"})
MODEL_KINDS = frozenset({"tm", "tritonmodel", "tritonmodels", "tritonmodel.tritonshare.io"})
ISVC_KINDS = frozenset(
    {"isvc", "inferenceservice", "inferenceservices", "inferenceservice.serving.kserve.io"}
)


def explain_target(words: Sequence[str]) -> tuple[str, str, str]:
    """(kind, namespace, name) of what `explain` is asked about, kubectl's ways: `NAME`,
    `NAMESPACE/NAME`, `KIND/NAME`, `KIND/NAMESPACE/NAME` or `KIND NAME`; kind "pod",
    "tritonmodel", "inferenceservice", or "" for a bare name (the pod of that name, else the
    TritonModel); namespace "" when not given. ValueError saying what to write otherwise."""
    kinds = POD_KINDS | MODEL_KINDS | ISVC_KINDS
    if len(words) == 2 and words[0].lower() in kinds:
        words = [f"{words[0]}/{words[1]}"]
    if len(words) != 1:
        raise ValueError(
            f"explain takes one name, not {' '.join(words)!r}: write POD, NAMESPACE/POD, "
            f"tm/NAME, isvc/NAME or `tritonmodel NAME`"
        )
    first, _, rest = words[0].partition("/")
    kind = ""
    if rest and first.lower() in kinds:
        kind = (
            "pod"
            if first.lower() in POD_KINDS
            else "tritonmodel"
            if first.lower() in MODEL_KINDS
            else "inferenceservice"
        )
        words = [rest]
    namespace, _, name = words[0].rpartition("/")
    if not name or "/" in namespace:
        raise ValueError(
            f"{' '.join(words)!r} names nothing to explain: write POD, NAMESPACE/POD, tm/NAME, "
            f"isvc/NAME or tm/NAMESPACE/NAME"
        )
    return kind, namespace, name


def explain_command(
    kube: Kube,
    keys: Keys,
    cache: ClusterCache,
    target: tuple[str, str, str],
    output: str,
    out: TextIO,
    now: float,
    models: Sequence[JsonObject] = (),
) -> int:
    """`explain`: what the binder does with the pod, TritonModel or InferenceService `target`
    (kind, namespace, name); 1 when there is none. `models`: the TritonModels as listed."""
    kind, namespace, name = target
    if kind == "inferenceservice":
        return _explain_isvc(kube, keys, cache, (namespace, name), models, output, out, now)
    raw = None
    if kind != "tritonmodel":
        try:
            raw = kube.read_pod(namespace, name)
        except NotFoundError:
            if kind == "pod":
                print(
                    f"{prog_name(sys.argv[0])}: pod {namespace}/{name} does not exist",
                    file=sys.stderr,
                )
                return 1
    if raw is None:
        model = find_model(cache, namespace, name)
        if model is None:
            what = "TritonModel" if kind else "pod or TritonModel"
            print(
                f"{prog_name(sys.argv[0])}: {what} {namespace}/{name} does not exist",
                file=sys.stderr,
            )
            return 1
        cache.replace_quotas(kube.list_all(QUOTAS)[0])  # the controller judges them first
        document = model_document(cache, model, now, keys)
        if output == "text":
            write_model(document, out)
        else:
            write_document(document, output, out)
        return 0
    pod = pod_from_api(raw, keys, cache.tenant_code, cache.min_gpu_mem, cache.allowance)
    served = load_state(raw, keys.model_loaded) if pod.node_name else None
    if output == "text":
        explain_pod(cache, pod, out, now)
        if served is not None:
            state, why = served
            out.write(f"Its model is {state}" + (f": {why}" if why else "") + ".\n")
    else:
        document = explain_document(cache, pod, now)
        if served is not None:
            document["load"] = {"state": served[0], "reason": served[1] or None}
        write_document(document, output, out)
    return 0


def _explain_isvc(
    kube: Kube,
    keys: Keys,
    cache: ClusterCache,
    key: tuple[str, str],
    models: Sequence[JsonObject],
    output: str,
    out: TextIO,
    now: float,
) -> int:
    """`explain isvc/NAME`: its status and the TritonModel it owns (`binder.cli.isvcreport`)."""
    namespace, name = key
    try:
        isvc = kube.read_inferenceservice(namespace, name)
    except NotFoundError:
        print(
            f"{prog_name(sys.argv[0])}: InferenceService {namespace}/{name} does not exist",
            file=sys.stderr,
        )
        return 1
    raw = next(
        (
            m
            for m in models
            if (m.get("metadata") or {}).get("namespace") == namespace
            and (m.get("metadata") or {}).get("name") == name
        ),
        None,
    )
    model = find_model(cache, namespace, name)
    explained = None
    if raw is not None and model is not None and owns(isvc, raw):
        cache.replace_quotas(kube.list_all(QUOTAS)[0])
        explained = model_document(cache, model, now, keys)
    document = isvc_document(isvc, raw, explained)
    if output == "text":
        write_isvc(document, out)
    else:
        write_document(document, output, out)
    return 0


def prog_name(argv0: str) -> str:
    """`kubectl tritonshare` when kubectl runs us as its plugin `kubectl-tritonshare`."""
    name = Path(argv0).name
    return "kubectl tritonshare" if name.startswith("kubectl-") else "tritonshare"
