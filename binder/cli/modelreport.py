"""What `tritonshare explain` says of a TritonModel: each replica as the binder sees it, with the
model host pod that serves it, and the model's GPU memory as its status.gpuMemory says it
(declared, the first estimate, or measured: `binder.cluster.modelsizes`).

A replica placed in the model's status is charged when its proof verifies (the binder's own cache
decided that when the listing was folded, `binder.cluster.modelcache`), and is served or not as its
status.placements entry says (`ready`, and why not: the agent's loaded condition on its host,
such as its host's loader failing to fetch or load it); each other replica wanted is what the
binder's model controller would place next, in order of ordinal: refused for the same model-level
reasons (`host_storage_problem`, the priority class, a model id another TritonModel of the
namespace has: `Ledger.name_clash`), then by the namespace's GPU-memory quotas as the controller
judges them (`replica_quota`: the replicas past the room they leave are refused in their words),
else judged by the binder's placement core (`place`) on the same snapshot, each placed replica
assumed before the next is judged, as the controller assumes it. Pure: reads the cache, writes
only the assumptions into the CLI's own copy of it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any, TextIO

from binder.cluster.cache import ClusterCache
from binder.cluster.modelsizes import ESTIMATED, MEASURED
from binder.cluster.modelviews import ModelInfo
from binder.framework.placement import Placement, place
from binder.framework.quota import replica_quota
from common.contract import Keys
from common.hosted import host_storage_problem
from common.quantity import format_bytes


def find_model(cache: ClusterCache, namespace: str, name: str) -> ModelInfo | None:
    """The TritonModel `namespace/name` as the binder's cache holds it."""
    for uid in cache.ledger.by_namespace.get(namespace, ()):
        model = cache.ledger.models.get(uid)
        if model is not None and model.name == name:
            return model
    return None


def _refusal(cache: ClusterCache, model: ModelInfo) -> str:
    """Why the binder places no replica of `model` whatever the nodes ("" when it would try)."""
    return (
        host_storage_problem(model.storage_uri, model.storage_secret)
        or model.priority_problem
        or cache.ledger.name_clash(model)
    )


def model_document(cache: ClusterCache, model: ModelInfo, now: float, keys: Keys) -> dict[str, Any]:
    """What `explain tm/NAME` prints, for `-o json|yaml` and the text: per wanted (or still
    charged) replica, where it is placed, or the binder's decision now (its quotas' refusal
    first, as the controller's)."""
    state = cache.state
    template = model.template
    sized = model.status.get("gpuMemory")  # `binder.cluster.modelsizes`
    document: dict[str, Any] = {
        "tritonModel": model.key,
        "model": template.model_id,
        "request": template.request,
        "replicas": model.replicas,
        "problem": template.problem or None,
        "gpuMemory": dict(sized) if isinstance(sized, Mapping) else None,
        "placements": [],
    }
    refusal = _refusal(cache, model)
    span = max(model.replicas, max(model.placed, default=-1) + 1)
    charged = {
        ordinal: replica
        for ordinal in range(span)
        if (replica := state.charged_pod(model.replica(ordinal).uid)) is not None
    }
    written = _written_placements(model)
    for ordinal, replica in sorted(charged.items()):
        node = state.nodes.get(replica.node_name)
        gpu = next((g for g in (node.gpus if node else ()) if g.uuid == replica.gpu_uuid), None)
        served = written.get(ordinal, {})
        document["placements"].append(
            {
                "replica": ordinal,
                "placed": {
                    "node": replica.node_name,
                    "gpu": replica.gpu_uuid,
                    "index": gpu.index if gpu is not None else None,
                    "measured": node.measured_of(replica) if node is not None else None,
                    "host": str(served.get("host") or "") or None,
                },
                "ready": served.get("ready") is True,
                "message": str(served.get("message") or "") or None,
            }
        )
    unproven = sorted(set(model.placed) - set(charged))
    document["unproven"] = unproven
    missing = model.replicas - len(charged)  # the controller's count (surplus ones leave)
    free = (o for o in itertools.count() if o not in charged)
    quota = replica_quota(cache.ledger, keys, model) if not refusal and missing > 0 else None
    for nth, ordinal in enumerate(itertools.islice(free, max(0, missing))):
        entry: dict[str, Any] = {"replica": ordinal, "decision": None}
        replica = model.replica(ordinal)
        if refusal:
            entry["message"] = refusal
        elif quota is not None and nth >= quota.room:
            entry["message"] = quota.exceeded
            entry["quota"] = True
        else:
            result = place(state, replica, now=now)
            if isinstance(result, Placement):
                where, uuid = result.node, result.gpu.uuid
                entry["decision"] = {"node": where, "gpu": uuid, "index": result.gpu.index}
                state.assume(replica, where, uuid)  # the next replica sees it, as the binder's
            else:
                entry["message"] = result.message
        document["placements"].append(entry)
    return document


def _written_placements(model: ModelInfo) -> dict[int, Mapping[str, Any]]:
    """status.placements as the binder wrote them, by ordinal."""
    found: dict[int, Mapping[str, Any]] = {}
    for entry in model.status.get("placements") or []:
        if isinstance(entry, Mapping) and type(entry.get("replica")) is int:
            found[entry["replica"]] = entry
    return found


def write_model(document: dict[str, Any], out: TextIO) -> None:
    """`model_document` as sentences."""
    out.write(
        f"TritonModel {document['tritonModel']} asks for {format_bytes(document['request'])} "
        f"of GPU memory per replica for model {document['model']}; "
        f"{document['replicas']} wanted.\n"
    )
    size = _size_sentence(document.get("gpuMemory") or {})
    if size:
        out.write(size + "\n")
    for ordinal in document["unproven"]:
        out.write(
            f"Replica {ordinal}'s placement in its status proves nothing the binder signed: not "
            f"charged; the binder places it again.\n"
        )
    for entry in document["placements"]:
        ordinal = entry["replica"]
        placed = entry.get("placed")
        if placed is not None:
            index = "?" if placed["index"] is None else placed["index"]
            served = (
                "served"
                if entry.get("ready")
                else f"not served: {entry['message']}"
                if entry.get("message")
                else "not served yet"
            )
            host = f", model host pod {placed['host']}" if placed.get("host") else ""
            out.write(
                f"Replica {ordinal} is placed on node {placed['node']}, GPU {index} "
                f"({placed['gpu']}){host}; {served}.\n"
            )
        elif entry["decision"] is not None:
            decision = entry["decision"]
            out.write(
                f"Replica {ordinal}: the binder would place it now on node {decision['node']}, "
                f"GPU {decision['index']} ({decision['gpu']}).\n"
            )
        elif entry.get("quota"):
            why = entry["message"]
            out.write(f"Replica {ordinal} is refused by its namespace's quota: {why}\n")
        else:
            out.write(f"Replica {ordinal} fits nowhere now: {entry['message']}\n")


def _size_sentence(sized: Mapping[str, Any]) -> str:
    """What status.gpuMemory says of a model that declares no GPU memory ("" for one that
    does: the first line names its size)."""
    if sized.get("source") == MEASURED:
        return (
            f"It declares no GPU memory: its files measured {sized.get('measured')} at their "
            f"load, so its next replica is booked at {sized.get('booked')} (the measure and its "
            f"margin; first estimate {sized.get('estimate')})."
        )
    if sized.get("source") == ESTIMATED:
        return (
            f"It declares no GPU memory and its files are not measured yet: its next replica "
            f"is booked at the first estimate, {sized.get('booked')}, until one has loaded."
        )
    return ""
