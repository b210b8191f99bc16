"""A Service's Endpoints and EndpointSlices, as kube-controller-manager's Endpoints and
EndpointSlice controllers write them from the pods the Service selects. Pure: the controller
manager (`sim.controllers.manager`) reads the cache, calls these, and writes what they return.

Which pods, and which of them are ready, is `sim.service`'s judgement, the one the simulated
kube-proxy routes by: a pod of the Service's namespace whose labels match its selector and that
has an address, not Succeeded or Failed; ready when its Ready condition is True and it is not
being deleted (`serving_address`). The Endpoints object lists the ready ones in `addresses`, the
others not being deleted in `notReadyAddresses`, one subset per set of ports (a named
`targetPort` is each pod's container port of that name; a pod without it has no such port);
the EndpointSlices (one per set of ports, IPv4) list every one with `conditions.ready`,
`serving` and `terminating`, labelled `kubernetes.io/service-name` and owned by the Service. A
Service with no selector is left alone (its Endpoints are the user's). What it cannot show:
`publishNotReadyAddresses`, dual stack, and the 1,000-endpoint split of a large slice.
"""

from __future__ import annotations

import hashlib
from typing import Any

from sim.service import named_ports, serving_address

JsonObject = dict[str, Any]

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MANAGED_BY = "endpointslice-controller.k8s.io"
_TERMINAL = frozenset({"Succeeded", "Failed"})

Ports = tuple[tuple[str, int, str], ...]
"""(name, port, protocol) of each port an endpoint offers."""


def selects(service: JsonObject, pod: JsonObject) -> bool:
    """Whether the Service's selector picks the pod (same namespace, every label equal)."""
    selector = (service.get("spec") or {}).get("selector") or {}
    if not selector:
        return False
    if pod["metadata"].get("namespace") != service["metadata"].get("namespace"):
        return False
    labels = pod["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def _ports(service: JsonObject, pod: JsonObject) -> Ports:
    """The Service's ports as the pod offers them: each target port resolved on the pod."""
    named = named_ports(pod)
    ports = []
    for port in (service.get("spec") or {}).get("ports") or []:
        target = port.get("targetPort", port.get("port"))
        number = named.get(target) if isinstance(target, str) and not target.isdigit() else target
        if number is None:
            continue
        ports.append((str(port.get("name") or ""), int(number), str(port.get("protocol") or "TCP")))
    return tuple(ports)


class _Member:
    """One pod the Service selects, as its endpoints show it."""

    def __init__(self, service: JsonObject, pod: JsonObject) -> None:
        metadata, status = pod["metadata"], pod.get("status") or {}
        self.ip = str(status.get("podIP"))
        self.ready = serving_address(pod) is not None
        self.terminating = bool(metadata.get("deletionTimestamp"))
        self.serving = self.ready or (self.terminating and _ready_condition(pod))
        self.node = str((pod.get("spec") or {}).get("nodeName") or "")
        self.ref = {
            "kind": "Pod",
            "namespace": str(metadata.get("namespace")),
            "name": str(metadata["name"]),
            "uid": str(metadata.get("uid", "")),
        }
        self.ports = _ports(service, pod)


def _ready_condition(pod: JsonObject) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def members(service: JsonObject, pods: list[JsonObject]) -> list[_Member]:
    """The pods the Service selects that have an address and have not ended, by name."""
    chosen = [
        _Member(service, pod)
        for pod in pods
        if selects(service, pod)
        and (pod.get("status") or {}).get("podIP")
        and (pod.get("status") or {}).get("phase") not in _TERMINAL
    ]
    return sorted(chosen, key=lambda m: m.ref["name"])


def endpoints(service: JsonObject, pods: list[JsonObject]) -> JsonObject | None:
    """The Service's Endpoints object (None: the Service has no selector)."""
    if not (service.get("spec") or {}).get("selector"):
        return None
    subsets: dict[Ports, JsonObject] = {}
    for member in members(service, pods):
        if member.terminating:
            continue
        subset = subsets.setdefault(member.ports, {})
        address: JsonObject = {"ip": member.ip, "targetRef": member.ref}
        if member.node:
            address["nodeName"] = member.node
        subset.setdefault("addresses" if member.ready else "notReadyAddresses", []).append(address)
    metadata = service["metadata"]
    body: JsonObject = {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "labels": dict(metadata.get("labels") or {}),
        },
    }
    listed = [
        {**subset, "ports": [_port(p) for p in ports]}
        for ports, subset in sorted(subsets.items())
        if ports
    ]
    if listed:
        body["subsets"] = listed
    return body


def endpoint_slices(service: JsonObject, pods: list[JsonObject]) -> list[JsonObject]:
    """The Service's EndpointSlices, by name (none: the Service has no selector); one with no
    endpoints while it selects none, as upstream keeps one."""
    if not (service.get("spec") or {}).get("selector"):
        return []
    groups: dict[Ports, list[_Member]] = {}
    for member in members(service, pods):
        groups.setdefault(member.ports, []).append(member)
    if not groups:
        groups[()] = []
    return [_slice(service, ports, group) for ports, group in sorted(groups.items())]


def _slice(service: JsonObject, ports: Ports, group: list[_Member]) -> JsonObject:
    metadata = service["metadata"]
    name = str(metadata["name"])
    digest = hashlib.sha256(repr((metadata.get("uid"), ports)).encode()).hexdigest()[:5]
    listed = []
    for member in group:
        endpoint: JsonObject = {
            "addresses": [member.ip],
            "conditions": {
                "ready": member.ready,
                "serving": member.serving,
                "terminating": member.terminating,
            },
            "targetRef": member.ref,
        }
        if member.node:
            endpoint["nodeName"] = member.node
        listed.append(endpoint)
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{name}-{digest}",
            "namespace": metadata["namespace"],
            "labels": {
                **(metadata.get("labels") or {}),
                SERVICE_NAME_LABEL: name,
                MANAGED_BY_LABEL: MANAGED_BY,
            },
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "name": name,
                    "uid": metadata.get("uid", ""),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "addressType": "IPv4",
        "endpoints": listed,
        "ports": [_port(p) for p in ports],
    }


def _port(port: tuple[str, int, str]) -> JsonObject:
    name, number, protocol = port
    return {"name": name, "port": number, "protocol": protocol}


def same(written: JsonObject | None, wanted: JsonObject) -> bool:
    """Whether an object as stored already says what `wanted` says (labels and content; the
    server's own metadata aside)."""
    if written is None:
        return False
    labels = (written.get("metadata") or {}).get("labels") or {}
    if labels != wanted["metadata"].get("labels", {}):
        return False
    keys = ("subsets",) if wanted["kind"] == "Endpoints" else ("endpoints", "ports", "addressType")
    return all((written.get(k) or None) == (wanted.get(k) or None) for k in keys)
