"""`tritonshare status` and `tritonshare explain POD|tm/NAME`: the cluster as the binder sees it.

Installed twice: as `tritonshare`, and as `kubectl-tritonshare` so that kubectl runs it as its
plugin (`kubectl tritonshare status`). Either way it finds the cluster as kubectl does:
--kubeconfig, $KUBECONFIG or ~/.kube/config, --context, and -n/--namespace (else the context's).

`status` prints every node and GPU with capacity, allocated (placed), loaded (measured), sleeping
(on-demand pods not loaded) and free GPU memory and the pods and TritonModel replicas on it (as
`kubectl inspect gpushare` does for GPU sharing); -n narrows what it lists to a namespace. `explain`
prints, for every node, why a pod does or does not fit there, and what the binder would decide now;
for a TritonModel, where each replica is or would be placed (`binder.cli.modelreport`). Both list
the cluster once (TritonModels and PriorityClasses too), fold it into the binder's own cache, which
charges a replica only when its proof verifies as the binder's does, and run the binder's own
placement code on it, with the GPU memory reserve the binder leader publishes on its Lease unless
--gpu-mem-reserve is given; they change nothing. `-o json|yaml` prints the same as data
(`binder.cli.report`). `quarantine list` prints what the nodes' agents quarantined (from their
Nodes' annotations, the one reader `binder.cli.report.quarantined`); `quarantine clear` asks an
agent to lift one, and refuses while a pod on the node still wants the quarantined files unless
--force.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import yaml

from binder.api.kube import JsonObject, Kind, Kube, kubeconfig_namespace
from binder.cli import preflight, uninstall
from binder.cli.modelreport import find_model, model_document, write_model
from binder.cli.report import (
    asleep_keys,
    explain_document,
    load_state,
    load_states,
    published_allowance,
    published_reserve,
    published_tenant_code,
    quarantined,
    replica_states,
    residency_figures,
    shown,
    status_document,
    write_document,
    write_quarantine_list,
    write_quarantined,
    write_reserve,
    write_unserved,
)
from binder.cluster.cache import ClusterCache, Ledger
from binder.cluster.clusterstate import ClusterState
from binder.cluster.objects import TERMINATED_PHASES, PodInfo, pod_from_api
from binder.cluster.proofs import Unproven
from binder.errors import ApiError, BinderError, NotFoundError, SettingsError, UnavailableError
from binder.framework.placement import Placement, explain, place
from binder.framework.quota import Usage, usage
from common.contract import DEFAULT_PREFIX, DEFAULT_SCHEDULER_NAME, DEFAULT_SYSTEM_NAMESPACE, Keys
from common.proofs import KeyRing, PlacementKeyError, load_key_ring
from common.quantity import format_bytes
from common.settings import Declaration, Setting, key_prefix, one_of, quantity, text
from common.settings import path as directory
from common.version import VERSION, version_line


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
        namespaces = kube.list_all(kube.namespaces())[0]
    except ApiError:
        namespaces = []  # a user who may not list namespaces still gets the rest
    return Listing(
        kube.list_all(kube.nodes())[0],
        kube.list_all(kube.leases(namespace))[0],
        kube.list_all(kube.pods())[0],
        namespaces,
        _optional(kube, kube.tritonmodels()),
        _optional(kube, kube.priority_classes()),
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
        Ledger(ClusterState(reserve=reserve)),
        scheduler_name=scheduler,
        listener=_Quiet(),
        placement_keys=None if ring is None else lambda: ring,
        tenant_code=published_tenant_code(listing.leases, keys),
        allowance=published_allowance(listing.leases, keys),
    )
    cache.replace_nodes(listing.nodes)
    cache.replace_namespaces(listing.namespaces)
    cache.replace_leases(listing.leases)
    cache.replace_priority_classes(listing.priority_classes)
    cache.replace_pods(listing.pods)
    cache.replace_models(listing.models)
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
) -> None:
    """Every node and GPU (the figures count every namespace: GPUs are shared), with the pods
    and TritonModel replicas on each, of `namespace` alone when given."""
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
        allocated = state.allocated(name)
        free = state.gpu_free(name)
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
            capacity = state.usable(gpu)
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
    if any(state.nodes[name].gpus for name in state.names):
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


def explain_target(words: Sequence[str]) -> tuple[str, str, str]:
    """(kind, namespace, name) of what `explain` is asked about, kubectl's ways: `NAME`,
    `NAMESPACE/NAME`, `KIND/NAME`, `KIND/NAMESPACE/NAME` or `KIND NAME`; kind "pod",
    "tritonmodel", or "" for a bare name (the pod of that name, else the TritonModel); namespace
    "" when not given. ValueError saying what to write otherwise."""
    if len(words) == 2 and words[0].lower() in POD_KINDS | MODEL_KINDS:
        words = [f"{words[0]}/{words[1]}"]
    if len(words) != 1:
        raise ValueError(
            f"explain takes one name, not {' '.join(words)!r}: write POD, NAMESPACE/POD, "
            f"tm/NAME or `tritonmodel NAME`"
        )
    first, _, rest = words[0].partition("/")
    kind = ""
    if rest and first.lower() in POD_KINDS | MODEL_KINDS:
        kind = "pod" if first.lower() in POD_KINDS else "tritonmodel"
        words = [rest]
    namespace, _, name = words[0].rpartition("/")
    if not name or "/" in namespace:
        raise ValueError(
            f"{' '.join(words)!r} names nothing to explain: write POD, NAMESPACE/POD, tm/NAME "
            f"or tm/NAMESPACE/NAME"
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
) -> int:
    """`explain`: what the binder does with the pod or TritonModel `target` (kind, namespace,
    name); 1 when there is none."""
    kind, namespace, name = target
    raw = None
    if kind != "tritonmodel":
        try:
            raw = kube.read_pod(namespace, name)
        except NotFoundError:
            if kind == "pod":
                print(
                    f"{_prog(sys.argv[0])}: pod {namespace}/{name} does not exist", file=sys.stderr
                )
                return 1
    if raw is None:
        model = find_model(cache, namespace, name)
        if model is None:
            what = "TritonModel" if kind else "pod or TritonModel"
            print(
                f"{_prog(sys.argv[0])}: {what} {namespace}/{name} does not exist",
                file=sys.stderr,
            )
            return 1
        document = model_document(cache, model, now)
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


FLAGS = Declaration(
    "tritonshare",
    "The flags every command takes, before or after it, as kubectl's are.",
    [
        Setting(
            "kubeconfig",
            "kubeconfig file, or files joined by ':' (default: $KUBECONFIG, else ~/.kube/config, "
            "else the in-cluster service account)",
            env=None,
        ),
        Setting("context", "kubeconfig context (default: the current one)", env=None),
        Setting(
            "namespace",
            "namespace of what `explain` looks up when NAME has none (default: the context's, "
            "else default); `status` and `quarantine list` show only its pods, replicas and "
            "quarantines (default: every namespace's)",
            env=None,
            aliases=("-n",),
        ),
        Setting(
            "all-namespaces",
            "`status` and `quarantine list`: every namespace's (their default)",
            switch=True,
            env=None,
            aliases=("-A",),
        ),
        Setting("key-prefix", "prefix of the contract's keys", key_prefix, DEFAULT_PREFIX, "keys"),
        Setting(
            "system-namespace",
            "namespace of the agent leases and the binder leader's",
            text,
            DEFAULT_SYSTEM_NAMESPACE,
        ),
        Setting("scheduler-name", "spec.schedulerName of the pods", text, DEFAULT_SCHEDULER_NAME),
        Setting(
            "output",
            "text, json or yaml (json and yaml give bytes as integers, for scripts)",
            one_of("text", "json", "yaml"),
            "text",
            env=None,
            aliases=("-o",),
        ),
        Setting(
            "gpu-mem-reserve",
            "bytes kept free on every GPU (default: the value the binder leader publishes on "
            "its Lease, else 0)",
            quantity(),
        ),
        Setting(
            "placement-key-dir",
            "directory of the placement-key Secret's files, to verify proofs of placement as the "
            "binder does (default: proofs are checked for form only)",
            directory,
        ),
    ],
    error=SettingsError,
)
"""Added to the top parser and to each command's, so `explain POD -n models` works; a flag given
before the command is not reset by the command's parser (unset flags leave no attribute)."""


def build_parser(prog: str = "tritonshare") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog=prog, description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--version",
        action="version",
        version=version_line(prog),
        help="print the version of tritonshare and exit",
    )
    FLAGS.add_to(parser)
    commands = parser.add_subparsers(dest="command", required=True)
    status_parser = commands.add_parser(
        "status", help="nodes and GPUs: capacity, allocated, free, models", allow_abbrev=False
    )
    FLAGS.add_to(status_parser)
    why = commands.add_parser(
        "explain",
        help="what the binder does with a pod or a TritonModel, and why on each node",
        description="Explain a pod (POD, NAMESPACE/POD, pod/POD) or a TritonModel (tm/NAME, "
        "tritonmodel/NAME, `tritonmodel NAME`); a bare NAME is the pod of that name, else the "
        "TritonModel.",
        allow_abbrev=False,
    )
    why.add_argument("target", nargs="+", metavar="NAME", help="[KIND/][NAMESPACE/]NAME")
    FLAGS.add_to(why)
    quota = commands.add_parser(
        "quota",
        help="GPU memory quotas: what each namespace's pods and TritonModel replicas use",
        description="Each ResourceQuota limit on GPU memory, with what its namespace's pods and "
        "TritonModel replicas use of it together (the binder places neither past it).",
        allow_abbrev=False,
    )
    quota.add_argument("quota_namespace", nargs="?", metavar="NAMESPACE", help="only this one")
    FLAGS.add_to(quota)
    check = commands.add_parser(
        "preflight",
        help="what would break tritonshare on this cluster, and how to fix it",
        description="Check the cluster before and after installing: the Kubernetes version, Pod "
        "Security, the GPU nodes and the node pod's fit on each, the DaemonSets the GPU-node "
        "policy refuses (dry runs), the CNI, the Prometheus Operator's CRDs, the webhook's "
        "certificate and image pulls. Each check is ok, warn or fail with its fix; exits 1 when "
        "one fails. Needs list on nodes, namespaces, pods, daemonsets, CRDs, webhook "
        "configurations, admission policies and the system namespace's secrets, and create on "
        "pods for the dry runs (they store nothing).",
        allow_abbrev=False,
    )
    check.add_argument(
        "--pre",
        action="store_true",
        help="before installing: check against the chart's defaults and leave out what only an "
        "installed tritonshare has",
    )
    FLAGS.add_to(check)
    cleanup = commands.add_parser(
        "uninstall-cleanup",
        help="after uninstalling, remove the agents' node annotations and resources and the "
        "Leases tritonshare left behind",
        description="Remove what tritonshare wrote at run time and Helm or kustomize do not "
        "delete: the agents' annotations and extended resource on every Node, and the agents' "
        "and the binder leader's Leases in --system-namespace. Run it after the DaemonSet is "
        "gone: it refuses while an agent's Lease is live. Needs patch on nodes and nodes/status, "
        "list and delete on leases.",
        allow_abbrev=False,
    )
    cleanup.add_argument(
        "--dry-run",
        action="store_true",
        help="print what would be removed and change nothing",
    )
    cleanup.add_argument(
        "--force",
        action="store_true",
        help="clean up even while agents' Leases are live (they write their annotations back)",
    )
    FLAGS.add_to(cleanup)
    quarantine = commands.add_parser(
        "quarantine", help="models and pods quarantined on a node after crashing its Triton"
    )
    actions = quarantine.add_subparsers(dest="action", required=True)
    clear = actions.add_parser(
        "clear",
        help="let a node load a quarantined model, or serve a quarantined pod, again",
        description="Ask NODE's agent to lift the quarantine of MODEL (NAMESPACE/MODEL-ID, a "
        "model id, a pod as NAMESPACE/NAME, or 12+ characters of its files' digest, as "
        "`tritonshare status` shows them). The agent lifts it within its Lease renewal period: "
        "it loads the model again if its pod still wants it, and the node gateway serves a pod "
        "whose requests were quarantined again. Refuses while a pod on NODE still wants the "
        "quarantined files (the agent lists them on the Node), unless --force. Needs get on pods "
        "and patch on nodes.",
        allow_abbrev=False,
    )
    clear.add_argument("node", help="the node the model is quarantined on")
    clear.add_argument("model", help="NAMESPACE/MODEL-ID (or what `status` shows)")
    clear.add_argument(
        "--force",
        action="store_true",
        help="clear even while a pod on the node still wants the quarantined files (the node "
        "loads them again: they crashed its Triton before)",
    )
    FLAGS.add_to(clear)
    listing = actions.add_parser(
        "list",
        help="what is quarantined, on every node or on NODE",
        description="Print each quarantine (node, kind: files, pod or namespace, namespace, "
        "pod or files' digest, since, crashes in a row, reason) as the nodes' agents publish "
        "them on their Nodes. Needs get and list on nodes.",
        allow_abbrev=False,
    )
    listing.add_argument("node", nargs="?", help="only this node")
    FLAGS.add_to(listing)
    FLAGS.add_to(quarantine)
    return parser


def list_quarantines(
    kube: Kube,
    keys: Keys,
    args: argparse.Namespace,
    output: str,
    out: TextIO,
    namespace: str | None = None,
) -> int:
    """`quarantine list [NODE]` (of `namespace` alone when given): 1 when NODE does not
    exist."""
    nodes = kube.list_all(kube.nodes())[0]
    if args.node:
        nodes = [n for n in nodes if n["metadata"]["name"] == args.node]
        if not nodes:
            print(f"{_prog(sys.argv[0])}: node {args.node} does not exist", file=sys.stderr)
            return 1
    rows = [r for r in quarantined(nodes, keys) if namespace in (None, r["namespace"])]
    if output == "text":
        write_quarantine_list(rows, out)
    else:
        write_document({"quarantined": rows}, output, out)
    return 0


def clear_quarantine(kube: Kube, keys: Keys, args: argparse.Namespace, out: TextIO) -> int:
    """`quarantine clear NODE MODEL`: write the node's `quarantine-clear` annotation, which its
    agent carries out and removes; 1 when the node does not exist or quarantines no such model."""
    prog = _prog(sys.argv[0])
    nodes = [n for n in kube.list_all(kube.nodes())[0] if n["metadata"]["name"] == args.node]
    if not nodes:
        print(f"{prog}: node {args.node} does not exist", file=sys.stderr)
        return 1
    held = quarantined(nodes, keys)
    wanted = str(args.model)
    named = [row for row in held if _names(row, wanted)]
    if not named:
        there = ", ".join(sorted({str(row["model"]) for row in held})) or "none"
        print(
            f"{prog}: node {args.node} quarantines no model {wanted} (it quarantines: {there}); "
            f"`tritonshare quarantine list` lists them",
            file=sys.stderr,
        )
        return 1
    for row in named if not args.force else []:
        pods = _still_wanting(kube, row)
        if pods:
            print(
                f"{prog}: pod {', '.join(pods)} on node {args.node} still wants the files of "
                f"{row['model']} (digest {row['digest'][:12]}), which crashed its Triton "
                f"{row['crashes']} times in a row: cleared now, the node loads them again and "
                f"every model on it goes down with Triton each time. Delete the pod or give it "
                f"fixed files first, or pass --force",
                file=sys.stderr,
            )
            return 1
    kube.merge_patch_node(args.node, {"metadata": {"annotations": {keys.quarantine_clear: wanted}}})
    out.write(
        f"Asked the agent of node {args.node} to lift the quarantine of {wanted}; "
        f"`tritonshare status` stops listing it once it has.\n"
    )
    return 0


def _still_wanting(kube: Kube, row: Mapping[str, object]) -> list[str]:
    """The pods the node's agent shows wanting a quarantined entry's files that still exist
    and have not finished (the agent's annotation may be a renewal period old)."""
    found = []
    wanted_by = row.get("wanted_by")
    for key in wanted_by if isinstance(wanted_by, list) else []:
        namespace, _, name = str(key).partition("/")
        try:
            pod = kube.read_pod(namespace, name)
        except NotFoundError:
            continue
        if (pod.get("status") or {}).get("phase") not in TERMINATED_PHASES:
            found.append(str(key))
    return found


def _names(row: Mapping[str, object], selector: str) -> bool:
    """Whether `selector` names a quarantined model as the agent matches it
    (`agent.quarantine.records.CrashRecord.matches`)."""
    model, digest = str(row["model"]), str(row["digest"])
    return selector in (model, model.partition("/")[2], str(row["pod"])) or (
        len(selector) >= 12 and digest.startswith(selector)
    )


def uninstall_cleanup(
    kube: Kube, keys: Keys, system_namespace: str, args: argparse.Namespace, prog: str, out: TextIO
) -> int:
    """`uninstall-cleanup`: 0 when done (or nothing was left), 1 when agents still run."""
    nodes = kube.list_all(kube.nodes())[0]
    leases = kube.list_all(kube.leases(system_namespace))[0]
    cleanup = uninstall.plan(nodes, leases, keys, time.time())
    if cleanup.live_agents and not args.force:
        print(
            f"{prog}: the agents of {counted(len(cleanup.live_agents), 'node')} still run "
            f"({', '.join(cleanup.live_agents)}) and would write their annotations back: "
            f"uninstall tritonshare first (its DaemonSet), wait until their Leases run out, or "
            f"pass --force if those nodes are gone",
            file=sys.stderr,
        )
        return 1
    if cleanup.empty:
        out.write("Nothing to clean up: no node or Lease carries what tritonshare writes.\n")
        return 0
    for line in cleanup.describe():
        out.write(("would " if args.dry_run else "") + line + "\n")
    if args.dry_run:
        return 0
    uninstall.carry_out(kube, cleanup, system_namespace)
    touched = len(set(cleanup.annotations) | set(cleanup.resources))
    out.write(
        f"Removed tritonshare's annotations and resources from {counted(touched, 'node')} and "
        f"deleted {counted(len(cleanup.leases), 'Lease')} in {system_namespace}.\n"
    )
    return 0


def kubeconfig_path(flag: str | None, environ: Mapping[str, str], home: Path) -> str | None:
    """The kubeconfig kubectl would use: --kubeconfig, else $KUBECONFIG (a ':'-joined list is
    merged), else ~/.kube/config when it exists; None means the in-cluster service account."""
    if flag:
        return flag
    if environ.get("KUBECONFIG"):
        return environ["KUBECONFIG"]
    default = home / ".kube" / "config"
    return str(default) if default.exists() else None


def current_context(kubeconfig: str) -> str | None:
    """The current context of a ':'-joined kubeconfig list as kubectl picks it: from the first
    file that sets one. (The Python client's merge lets the last file win instead.)"""
    for path in kubeconfig.split(os.pathsep):
        try:
            document = yaml.safe_load(Path(path).expanduser().read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(document, dict) and document.get("current-context"):
            return str(document["current-context"])
    return None


def _prog(argv0: str) -> str:
    """`kubectl tritonshare` when kubectl runs us as its plugin `kubectl-tritonshare`."""
    name = Path(argv0).name
    return "kubectl tritonshare" if name.startswith("kubectl-") else "tritonshare"


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run one command; returns the exit code: 0 done, 1 the cluster could not be read (or the
    pod does not exist), 2 bad flags or kubeconfig, 141 the reader of the output went away."""
    out = out or sys.stdout
    try:
        code = _run(argv, out)
        out.flush()
    except BrokenPipeError:
        # The reader went away (`tritonshare status | head`): there is no one left to tell, so
        # no traceback. stdout now points at /dev/null, or Python's own flush at exit fails
        # again. 141 is what a shell reports for a command that SIGPIPE ended.
        if out is sys.stdout:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        return 128 + signal.SIGPIPE
    return code


def _run(argv: Sequence[str] | None, out: TextIO) -> int:
    prog = _prog(sys.argv[0])
    args = build_parser(prog).parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        flags = FLAGS.resolve(vars(args), os.environ)
    except SettingsError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    keys: Keys = flags["keys"]
    given_reserve: int | None = flags.get("gpu_mem_reserve")
    system_namespace: str = flags["system_namespace"]
    scheduler_name: str = flags["scheduler_name"]
    output: str = flags["output"]
    given_context: str | None = flags.get("context")
    kubeconfig = kubeconfig_path(flags.get("kubeconfig"), os.environ, Path.home())
    if kubeconfig is None and given_context:
        print(
            f"{prog}: --context {given_context} needs a kubeconfig, and none was found: pass "
            f"--kubeconfig, set KUBECONFIG, or write ~/.kube/config",
            file=sys.stderr,
        )
        return 2
    context = given_context or (current_context(kubeconfig) if kubeconfig else None)
    key_dir: Path | None = flags.get("placement_key_dir")
    try:
        ring = load_key_ring(key_dir) if key_dir is not None else None
    except PlacementKeyError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    try:
        context_namespace = kubeconfig_namespace(kubeconfig, context) if kubeconfig else None
        kube = Kube(kubeconfig, context=context, user_agent=f"tritonshare-cli/{VERSION}")
    except BinderError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    try:
        if args.command == "preflight":
            return preflight.preflight(
                kube, keys, system_namespace, args.pre, output, out, time.time()
            )
        if args.command == "uninstall-cleanup":
            return uninstall_cleanup(kube, keys, system_namespace, args, prog, out)
        # -n narrows the lists to a namespace; -A (their default) or no -n shows every one.
        only = None if flags.get("all_namespaces") else flags.get("namespace")
        if args.command == "quarantine" and args.action == "list":
            return list_quarantines(kube, keys, args, output, out, only)
        if args.command == "quarantine":
            return clear_quarantine(kube, keys, args, out)
        listing = list_cluster(kube, system_namespace)
        published = published_reserve(listing.leases, keys)
        reserve = given_reserve if given_reserve is not None else published or 0
        cache = fold(listing, keys, scheduler_name, reserve, ring)
        now = time.time()
        if args.command == "quota":
            cache.replace_quotas(kube.list_all(kube.quotas())[0])
            with contextlib.suppress(NotFoundError):  # no TritonModel CRD: no replicas
                cache.replace_models(kube.list_all(kube.tritonmodels())[0])
            write_usage(usage(cache.ledger, keys, args.quota_namespace), output, out)
            return 0
        if args.command == "status":
            states = load_states(listing.pods, keys.model_loaded)
            states.update(replica_states(listing.models))
            charged = [p for name in cache.state.names for p, _ in cache.state.pods_on(name)]
            asleep = asleep_keys(listing.pods, charged, keys)
            held = [r for r in quarantined(listing.nodes, keys) if only in (None, r["namespace"])]
            if output == "text":
                status(cache, out, now, only, asleep)
                write_unserved(cache, states, out, only)
                write_quarantined(held, out)
                write_reserve(reserve, given_reserve, published, out)
            else:
                document = status_document(cache, now, states, only, asleep)
                document["quarantined"] = held
                write_document(document, output, out)
            return 0
        try:
            kind, namespace, name = explain_target(args.target)
        except ValueError as e:
            print(f"{prog}: {e}", file=sys.stderr)
            return 2
        namespace = namespace or flags.get("namespace") or context_namespace or "default"
        return explain_command(kube, keys, cache, (kind, namespace, name), output, out, now)
    except UnavailableError as e:
        if e.status == 0:
            print(
                f"{prog}: the cluster could not be read: the API server {kube.server} cannot be "
                f"reached ({e.message.removeprefix('the API server could not be reached: ')}); "
                f"check --kubeconfig and --context (now {kubeconfig or 'in-cluster'}, "
                f"{context or 'its current context'}) and that the cluster is up",
                file=sys.stderr,
            )
        else:
            print(
                f"{prog}: the cluster could not be read: the API server {kube.server} is "
                f"unavailable ({e.status} {e.reason}: {e.message}); try again later",
                file=sys.stderr,
            )
        return 1
    except BinderError as e:
        print(f"{prog}: the cluster could not be read: {e}", file=sys.stderr)
        return 1
    finally:
        kube.close()


if __name__ == "__main__":
    sys.exit(main())
