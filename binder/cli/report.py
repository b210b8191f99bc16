"""What `tritonshare status` and `tritonshare explain` report, as data and as the lines under the
table: each GPU's pods with their load state (from the pod's status), the reserve the binder
leader publishes, and the documents `-o json` and `-o yaml` print. Pure: it reads the cache and
API objects the CLI listed, and writes only to the stream it is given.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

import yaml

from binder.cluster.cache import ClusterCache
from binder.cluster.modelviews import is_replica
from binder.cluster.objects import NodeInfo, PodInfo
from binder.framework.placement import Placement, explain, place
from common.contract import BINDER_LEADER_LEASE, Keys
from common.hosted import LOAD_FAILURE_REASONS, SLEEPING_REASON, host_label, loaded_condition
from common.kubeapi.session import JsonObject
from common.quantity import format_bytes
from common.settings import names


def residency_figures(info: NodeInfo, pods: Iterable[PodInfo]) -> tuple[int, int]:
    """What a GPU's pods hold now, by the node's published figures: (bytes measured for the
    models the node reports loaded; bytes requested by `on-demand` pods whose model it does not
    report loaded: asleep, or not loaded yet)."""
    loaded = sleeping = 0
    for pod in pods:
        measured = info.measured_of(pod)
        if measured is not None:
            loaded += measured
        elif pod.on_demand:
            sleeping += pod.request
    return loaded, sleeping


def asleep_keys(
    objects: Iterable[JsonObject], charged: Iterable[PodInfo], keys: Keys
) -> frozenset[str]:
    """The pods and TritonModel replicas (by `PodInfo.key`) whose on-demand model the agent
    reports asleep: a model pod's ModelLoaded condition, a replica's loaded condition on its
    host, False with reason ModelSleeping. Written by the agent as the model falls asleep or
    wakes, so it is current where the published measurements may be a period old (a model
    not measured yet is loading, not asleep). `objects`: the pods as listed; `charged`: the
    pods and replicas on the nodes."""
    sleeping: set[str] = set()
    hosts: dict[tuple[str, str], dict[str, str]] = {}
    for pod in objects:
        metadata = pod.get("metadata") or {}
        reasons = {
            str(c.get("type")): str(c.get("reason") or "")
            for c in (pod.get("status") or {}).get("conditions") or []
            if c.get("status") == "False"
        }
        namespace = str(metadata.get("namespace", ""))
        if (metadata.get("labels") or {}).get(host_label(keys)) == "true":
            node = str((pod.get("spec") or {}).get("nodeName") or "")
            hosts[(namespace, node)] = reasons
        elif reasons.get(keys.model_loaded) == SLEEPING_REASON:
            sleeping.add(f"{namespace}/{metadata.get('name', '')}")
    for replica in charged:
        model, _, ordinal = replica.name.rpartition("/")
        if not is_replica(replica.uid) or not ordinal.isdigit():
            continue
        reasons = hosts.get((replica.namespace, replica.node_name), {})
        if reasons.get(loaded_condition(keys, model, int(ordinal))) == SLEEPING_REASON:
            sleeping.add(replica.key)
    return frozenset(sleeping)


def published_reserve(leases: list[JsonObject], keys: Keys) -> int | None:
    """The GPU memory reserve the binder places with, as its leader publishes it on the leader
    Lease (from its --gpu-mem-reserve); None when no binder has published one."""
    return _published_bytes(leases, keys.gpu_mem_reserve)


def published_allowance(leases: list[JsonObject], keys: Keys) -> int:
    """The per-process allowance the binder books, as its leader publishes it (from its
    --gpu-mem-process-allowance); 0 when no binder has published one."""
    return _published_bytes(leases, keys.gpu_mem_process_allowance) or 0


def _published_bytes(leases: list[JsonObject], key: str) -> int | None:
    for lease in leases:
        metadata = lease.get("metadata") or {}
        if metadata.get("name") != BINDER_LEADER_LEASE:
            continue
        value = str((metadata.get("annotations") or {}).get(key, ""))
        return int(value) if value.isdigit() else None
    return None


def published_tenant_code(leases: list[JsonObject], keys: Keys) -> tuple[str, ...]:
    """The namespaces the binder places as tenant code, as its leader publishes them on the
    leader Lease (from its --tenant-code-namespaces); none when no binder has published any."""
    for lease in leases:
        metadata = lease.get("metadata") or {}
        if metadata.get("name") == BINDER_LEADER_LEASE:
            value = str((metadata.get("annotations") or {}).get(keys.tenant_code_namespaces, ""))
            return names(value)
    return ()


def load_state(pod: JsonObject, model_loaded: str = Keys().model_loaded) -> tuple[str, str]:
    """Where a bound model pod's model stands, from the pod's status as the kubelet and the agent
    report it: (`serving`, ""), (`not served`, the ModelLoaded condition's reason and message:
    missing on the node and being reinstalled, failed, the node's agent down), (`loading`, ""),
    (`failed`, the loader's termination message: the agent's refusal, such as
    TenantCodeNotAllowed, or Triton's reason), (`starting`, "") once loaded and waiting for the
    proxy, or (`waiting`, "") before the loader runs."""
    status = pod.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    if (conditions.get("Ready") or {}).get("status") == "True":
        return "serving", ""
    loaded = conditions.get(model_loaded) or {}
    if loaded and loaded.get("status") != "True":
        why = f"{loaded.get('reason', '')}: {loaded.get('message', '')}".strip(": ")
        return "not served", why[:300]
    inits = status.get("initContainerStatuses") or []
    for init in inits:
        for where in ("state", "lastState"):
            ended = (init.get(where) or {}).get("terminated") or {}
            if ended and ended.get("exitCode", 0) != 0:
                message = str(ended.get("message") or ended.get("reason") or "").strip()
                return "failed", f"{init.get('name', 'init')}: {message.splitlines()[0]}"[:300]
        if "running" in (init.get("state") or {}):
            return "loading", ""
    if inits and all("terminated" in (i.get("state") or {}) for i in inits):
        return "starting", ""
    return "waiting", ""


def load_states(
    pods: list[JsonObject], model_loaded: str = Keys().model_loaded
) -> dict[str, tuple[str, str]]:
    """`load_state` of every bound pod, by namespace/name."""
    states = {}
    for pod in pods:
        metadata = pod.get("metadata") or {}
        if (pod.get("spec") or {}).get("nodeName"):
            key = f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"
            states[key] = load_state(pod, model_loaded)
    return states


def shown(pod: PodInfo) -> str:
    """A pod as `namespace/name`, a TritonModel's replica as `namespace/model replica N`."""
    if is_replica(pod.uid):
        model, _, ordinal = pod.name.rpartition("/")
        return f"{pod.namespace}/{model} replica {ordinal}"
    return pod.key


def replica_states(models: list[JsonObject]) -> dict[str, tuple[str, str]]:
    """Each placed replica's load state by its key (`namespace/model/ordinal`), as `load_state`
    gives a pod's: from its TritonModel's status.placements (`ready`, `message`), which the
    binder writes from the agent's condition on the host: `serving`, `failed` when its host's
    loader cannot fetch or load it (a reason of `LOAD_FAILURE_REASONS`, as a model pod's loader
    failing reads), else `waiting`, each with the message."""
    states = {}
    for obj in models:
        metadata = obj.get("metadata") or {}
        for entry in (obj.get("status") or {}).get("placements") or []:
            if not isinstance(entry, Mapping):
                continue
            key = f"{metadata.get('namespace')}/{metadata.get('name')}/{entry.get('replica')}"
            message = str(entry.get("message") or "")
            if entry.get("ready") is True:
                states[key] = ("serving", "")
            elif message.partition(":")[0] in LOAD_FAILURE_REASONS:
                states[key] = ("failed", message)
            else:
                states[key] = ("waiting", message)
    return states


def write_unserved(
    cache: ClusterCache,
    states: Mapping[str, tuple[str, str]],
    out: TextIO,
    namespace: str | None = None,
) -> None:
    """Below the table: each pod or replica charged to a GPU (of `namespace` alone when given)
    whose model is not served, and why. Its request stays allocated as long as the pod exists,
    as kube-scheduler keeps a crash-looping pod's requests: the binder counts it too, and the
    GPU is its when the cause is fixed."""
    rows = []
    for name in cache.state.names:
        for pod, _ in cache.state.pods_on(name):
            if namespace is not None and pod.namespace != namespace:
                continue
            state, why = states.get(pod.key, ("waiting", ""))
            if state != "serving":
                rows.append(f"  {shown(pod)} on {name}: {state}" + (f": {why}" if why else ""))
    if rows:
        out.write(
            "\nModels allocated but not served (the allocation is held while the pod exists):\n"
        )
        out.write("\n".join(sorted(rows)) + "\n")


def quarantined(nodes: list[JsonObject], keys: Keys) -> list[dict[str, Any]]:
    """The models each node's agent quarantined (its `quarantined` annotation): Triton exited
    while loading them too many times in a row, so the node never loads them again; and the
    pods whose requests were at Triton at too many of its exits in a row (`cause` "requests"),
    which the node's gateway refuses."""
    rows = []
    for node in nodes:
        metadata = node.get("metadata") or {}
        raw = (metadata.get("annotations") or {}).get(keys.quarantined) or ""
        try:
            shown = json.loads(raw) if raw else []
        except ValueError:
            shown = []
        for item in shown if isinstance(shown, list) else []:
            if isinstance(item, dict):
                model = str(item.get("model", ""))
                crashes = int(item.get("crashes", 0) or 0)
                kind = KINDS.get(str(item.get("cause") or ""), str(item.get("cause") or ""))
                rows.append(
                    {
                        "node": str(metadata.get("name", "")),
                        "kind": kind,
                        "namespace": model.partition("/")[0],
                        "model": model,
                        "pod": str(item.get("pod", "")),
                        "crashes": crashes,
                        "digest": str(item.get("digest", "")),
                        "since": str(item.get("since") or ""),
                        "reason": str(item.get("reason") or "") or _reason(kind, crashes),
                        # The node's pods that still want the quarantined files.
                        "wanted_by": [str(p) for p in item.get("wanted_by") or []],
                        # A pod's requests ("requests"); absent for a model's files.
                        **({"cause": str(item["cause"])} if item.get("cause") else {}),
                    }
                )
    return sorted(rows, key=lambda r: (r["node"], r["model"], r["digest"]))


KINDS = {"": "files", "requests": "pod"}
"""The `cause` of an entry of the `quarantined` annotation -> what is quarantined."""


def _reason(kind: str, crashes: int) -> str:
    if kind == "files":
        return f"Triton exited while loading these files {crashes} times in a row"
    if kind == "pod":
        return f"its requests were at Triton at {crashes} of its exits in a row"
    return f"{crashes} of Triton's exits in a row"


def write_quarantine_list(rows: list[dict[str, Any]], out: TextIO) -> None:
    """`quarantine list`: one line per quarantine, as `kubectl get` prints a table."""
    if not rows:
        out.write("Nothing is quarantined.\n")
        return
    table = [["NODE", "KIND", "NAMESPACE", "POD/DIGEST", "SINCE", "CRASHES", "REASON"]]
    for row in rows:
        named = row["pod"] if row["kind"] != "files" else row["digest"][:12]
        if row["kind"] == "files":
            named += f" ({row['model'].partition('/')[2]})"
        table.append(
            [
                row["node"],
                row["kind"],
                row["namespace"],
                named,
                row["since"] or "-",
                str(row["crashes"]),
                row["reason"]
                + (f"; still wanted by {', '.join(row['wanted_by'])}" if row["wanted_by"] else ""),
            ]
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]) - 1)]
    for line in table:
        cells = [cell.ljust(width) for cell, width in zip(line, widths, strict=False)]
        out.write("   ".join([*cells, line[-1]]).rstrip() + "\n")


def write_quarantined(rows: list[dict[str, Any]], out: TextIO) -> None:
    """Below the table: the quarantined models, and how to lift a quarantine."""
    if not rows:
        return
    out.write(
        "\nModels quarantined on a node (Triton exited while loading them; lift with "
        "`tritonshare quarantine clear NODE NAMESPACE/MODEL`):\n"
    )
    for row in rows:
        if row.get("cause") == "namespace":
            out.write(
                f"  namespace {row['model'].removesuffix('/*')} on {row['node']}: Triton exited "
                f"{row['crashes']} more times under its loads after its files were quarantined, "
                f"last for pod {row['pod']}; the node loads none of its new models (lift with "
                f"`tritonshare quarantine clear {row['node']} {row['model']}`)\n"
            )
            continue
        if row.get("cause") == "requests":
            out.write(
                f"  pod {row['pod']} ({row['model']}) on {row['node']}: its requests were at "
                f"Triton at {row['crashes']} exits in a row; the gateway refuses them (lift with "
                f"`tritonshare quarantine clear {row['node']} {row['pod']}`)\n"
            )
            continue
        out.write(
            f"  {row['model']} on {row['node']}: {row['crashes']} crashes in a row, last for "
            f"pod {row['pod']} (files {row['digest'][:12]})\n"
        )


def status_document(
    cache: ClusterCache,
    now: float,
    states: Mapping[str, tuple[str, str]] | None = None,
    namespace: str | None = None,
    asleep: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """What `status` prints, for `-o json` and `-o yaml`: bytes as integers, every pod and
    TritonModel replica charged to a GPU (of `namespace` alone when given) with its request, its
    model's measured bytes and its load state, and the pods still pending."""
    states = states or {}
    state = cache.state
    nodes: list[dict[str, Any]] = []
    for name in state.names:
        info = state.nodes[name]
        node: dict[str, Any] = {
            "name": name,
            "agent": "alive" if state.leases.get(name, 0.0) > now else "down",
            "problem": info.gpu_problem or None,
            "gpus": [],
        }
        nodes.append(node)
        allocated, free = state.memory.allocated(name), state.memory.free(name)
        charged: dict[int, list[dict[str, Any]]] = {}
        placed: dict[int, list[PodInfo]] = {}
        for pod, position in state.pods_on(name):
            placed.setdefault(position, []).append(pod)
            if namespace is not None and pod.namespace != namespace:
                continue
            charged.setdefault(position, []).append(
                {
                    "pod": pod.key,
                    "model": pod.model_id,
                    "tritonName": pod.triton_name or None,
                    "request": pod.request,
                    "residency": "on-demand" if pod.on_demand else "always",
                    "asleep": pod.key in asleep,
                    "measured": info.measured_of(pod),
                    "holds": state.memory.held(pod, name),
                    "load": dict(
                        zip(("state", "message"), states.get(pod.key, ("waiting", "")), strict=True)
                    ),
                }
            )
        for position, gpu in enumerate(info.gpus):
            loaded, sleeping = residency_figures(info, placed.get(position, []))
            node["gpus"].append(
                {
                    "index": gpu.index,
                    "uuid": gpu.uuid,
                    "product": gpu.product,
                    "healthy": gpu.healthy,
                    "capacity": state.memory.usable(gpu),
                    "allocated": allocated[position] if position < len(allocated) else 0,
                    "loaded": loaded,
                    "sleeping": sleeping,
                    "free": free[position] if position < len(free) else 0,
                    "used": gpu.used,
                    "pods": sorted(charged.get(position, []), key=lambda p: str(p["pod"])),
                }
            )
        if -1 in charged:
            node["unattributed"] = sorted(charged[-1], key=lambda p: str(p["pod"]))
    gpus = [g for n in nodes for g in n["gpus"]]
    return {
        "reserve": state.memory.reserve,
        "nodes": nodes,
        "capacity": sum(g["capacity"] for g in gpus),
        "allocated": sum(g["allocated"] for g in gpus),
        "pending": sorted(
            p.key for p in cache.pending.values() if namespace in (None, p.namespace)
        ),
    }


def write_reserve(
    reserve: int, given: int | None, published: int | None, out: TextIO, *, always: bool = False
) -> None:
    """Where the reserve in the figures above comes from, so a mismatch with the binder shows:
    said when the figures may differ from the binder's (a reserve given that differs from the
    leader's, or none published), else only when `always` (`status -v`)."""
    if given is not None:
        where = "from --gpu-mem-reserve"
        if published is not None and published != given:
            where += f"; the binder leader places with {format_bytes(published)}"
        elif not always:
            return
    elif published is not None:
        if not always:
            return
        where = "as the binder leader publishes it"
    else:
        where = "no binder leader has published its own; pass --gpu-mem-reserve"
    out.write(f"GPU memory reserve {format_bytes(reserve)} per GPU ({where}).\n")


def write_document(document: object, output: str, out: TextIO) -> None:
    """`document` as JSON or YAML, as `kubectl get -o json|yaml` writes objects."""
    if output == "yaml":
        yaml.safe_dump(document, out, sort_keys=False)
    else:
        json.dump(document, out, indent=2)
        out.write("\n")


def explain_document(cache: ClusterCache, pod: PodInfo, now: float) -> dict[str, Any]:
    """What `explain` prints, for `-o json` and `-o yaml`."""
    document: dict[str, Any] = {
        "pod": pod.key,
        "model": pod.model_id or None,
        "request": pod.request,
        "problem": pod.problem or None,
    }
    if pod.node_name:
        node = cache.state.nodes.get(pod.node_name)
        document["bound"] = {
            "node": pod.node_name,
            "gpu": pod.gpu_uuid or None,
            "tritonName": pod.triton_name or None,
            "measured": node.measured_of(pod) if node is not None else None,
        }
        return document
    result = place(cache.state, pod, now=now)
    if isinstance(result, Placement):
        document["decision"] = {"node": result.node, "gpu": result.gpu.uuid}
    else:
        document["decision"] = None
        document["message"] = result.message
    if not pod.problem:
        document["nodes"] = [
            {
                "node": v.node,
                "fits": not v.reasons,
                "free": list(v.free),
                "reasons": list(v.reasons),
            }
            for v in explain(cache.state, pod, now=now)
        ]
    return document
