"""Scale to zero: where a TritonModel at zero replicas is parked, so that its Service keeps an
endpoint that holds its requests (Knative's activator).

A model with spec.autoscaling that the autoscaler scaled to 0 is parked on one of its
namespace's model hosts: the binder keeps that host (created again if it is gone), names the
model (and its spec.modelName, the id its requests are held by) in the host's
`<prefix>parked-models` annotation and labels the host
`<prefix>serves-<model>: "true"`, so the model's Service reaches it. The host's proxy holds the
model's requests (`proxy.parking`), which the built-in autoscaler reads from that host as the
model's concurrency: it scales the model to 1 (or more), and the binder places the replica
where its rules say, the parking host's node first in score when it fits (the model's files are
kept there). The model stays parked until one of its replicas is served, so no request finds
the Service empty in between.

The activator is the namespace's own pod: it holds that namespace's requests only, and a wake
places a replica of that namespace, charged to its quotas. A parked-models annotation a tenant
writes on its own host parks its own models only. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from binder.cluster.modelviews import ModelInfo
from common.contract import Keys
from common.hosted import decode_parked, parked_models_annotation

JsonObject = dict[str, Any]
MOST_PARKED = 10_000
"""The most models read from one host's parked-models annotation."""


def parked_on(host: Mapping[str, Any], keys: Keys) -> list[str]:
    """The models a host's parked-models annotation names (none when it is malformed)."""
    annotations = (host.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(parked_models_annotation(keys), "")
    return [parked.model for parked in decode_parked(str(value), MOST_PARKED)[0]]


def parks(model: ModelInfo) -> bool:
    """Whether `model` is to be parked when it has no replica served: scaled by the built-in
    autoscaler (spec.autoscaling) to zero replicas."""
    return model.autoscaling is not None and model.replicas == 0


def park_node(
    model: ModelInfo,
    *,
    current: str | None,
    replica_nodes: Iterable[str],
    served: bool,
    hosts: Mapping[str, JsonObject],
    keys: Keys,
) -> str | None:
    """The node `model` is parked on now, or None: parked from the moment it is scaled to zero
    until a replica of it is served again. `current`: where it is parked now; `replica_nodes`:
    its charged replicas' nodes (the last one, draining, when it has just been scaled to zero);
    `hosts`: its namespace's hosts by node. After a restart the host whose annotation names it
    is kept, whatever its replicas: a park moved would put a host whose proxy does not hold the
    model yet behind its Service, and take away the one holding its requests. A host being
    deleted is never chosen."""
    if served or (model.replicas == 0 and model.autoscaling is None):
        return None  # served again, or nothing would scale it up
    if current is not None:
        return current
    if model.autoscaling is None:
        return None  # never parked: no host's annotation to read
    # A host being deleted (replaced) holds nothing new: its proxy is leaving.
    hosts = {
        n: h for n, h in hosts.items() if not (h.get("metadata") or {}).get("deletionTimestamp")
    }
    named = sorted(node for node, host in hosts.items() if model.name in parked_on(host, keys))
    if named:
        return named[0]
    if not parks(model):
        return None
    nodes = sorted(replica_nodes)
    if nodes:
        return nodes[0]
    return min(hosts) if hosts else None
