"""The Table form of gets and lists (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`).

`kubectl get` asks for it and prints the server's columns: the same as kube-apiserver's printers
for pods (`-o wide`: IP, node, nominated node, readiness gates), events, nodes, namespaces,
deployments, replica sets, services, endpoints, endpoint slices, config maps, leases, HPAs and
budgets; a custom resource's `additionalPrinterColumns`; Name and Created At for the rest. Cells
are always the wide set, as upstream's, and kubectl leaves out the columns of priority 1 unless
asked for `-o wide`. Each row carries its object's metadata (or the object, or nothing, by
`includeObject`). Pure functions.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sim.apiserver.customresources import field_at
from sim.apiserver.errors import bad_request
from sim.apiserver.resources import Resource

JsonObject = dict[str, Any]
Cells = list[Any]
NONE = "<none>"

_TABLE_GROUP = "meta.k8s.io"
_TABLE_VERSIONS = ("v1", "v1beta1")


def wanted_version(accept: str) -> str | None:
    """The meta.k8s.io version of Table the Accept header asks for first, or None."""
    for media_range in accept.split(","):
        media, *params = (part.strip() for part in media_range.split(";"))
        if media not in ("application/json", "*/*"):
            continue
        values = dict(p.partition("=")[::2] for p in params)
        if values.get("as") == "Table" and values.get("g") == _TABLE_GROUP:
            version = values.get("v", "v1")
            if version in _TABLE_VERSIONS:
                return version
    return None


def human_duration(seconds: float) -> str:
    """apimachinery's duration.HumanDuration: `45s`, `3m20s`, `5h`, `12d`."""
    whole = int(seconds)
    if whole < -1:
        return "<invalid>"
    if whole < 0:
        return "0s"
    if whole < 120:
        return f"{whole}s"
    minutes = whole // 60
    if minutes < 10:
        rest = whole % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = whole // 3600
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d{rest}h" if rest else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        rest = (hours // 24) % 365
        years = hours // 24 // 365
        return f"{years}y{rest}d" if rest else f"{years}y"
    return f"{hours // 24 // 365}y"


def _epoch(stamp: Any) -> float | None:
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        parsed = time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None
    return float(calendar.timegm(parsed))


def _since(stamp: Any, now: float) -> str:
    seconds = _epoch(stamp)
    return "<unknown>" if seconds is None else human_duration(now - seconds)


def _column(name: str, kind: str = "string", priority: int = 0, fmt: str = "") -> JsonObject:
    return {"name": name, "type": kind, "format": fmt, "description": "", "priority": priority}


# the printers, one per kind: (column definitions, cells of one object at `now`)

Printer = tuple[Sequence[JsonObject], Callable[[JsonObject, float], Cells]]


def _pod_status(pod: JsonObject) -> tuple[str, int, int]:
    """(status, ready containers, restarts) as kubectl's pod printer reads them."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    reason = str(status.get("reason") or status.get("phase") or "")
    restarts = 0
    initializing = False
    init_statuses = status.get("initContainerStatuses") or []
    for index, container in enumerate(init_statuses):
        restarts += int(container.get("restartCount") or 0)
        state = container.get("state") or {}
        terminated, waiting = state.get("terminated"), state.get("waiting")
        if terminated is not None and int(terminated.get("exitCode") or 0) == 0:
            continue
        if terminated is not None:
            reason = "Init:" + str(
                terminated.get("reason") or f"ExitCode:{terminated.get('exitCode')}"
            )
        elif waiting and waiting.get("reason") and waiting.get("reason") != "PodInitializing":
            reason = f"Init:{waiting['reason']}"
        else:
            reason = f"Init:{index}/{len(spec.get('initContainers') or [])}"
        initializing = True
        break
    ready = 0
    if not initializing:
        restarts = 0
        running = False
        for container in reversed(status.get("containerStatuses") or []):
            restarts += int(container.get("restartCount") or 0)
            state = container.get("state") or {}
            terminated, waiting = state.get("terminated"), state.get("waiting")
            if waiting and waiting.get("reason"):
                reason = str(waiting["reason"])
            elif terminated and terminated.get("reason"):
                reason = str(terminated["reason"])
            elif terminated:
                reason = f"ExitCode:{terminated.get('exitCode')}"
            elif container.get("ready") and state.get("running") is not None:
                running = True
                ready += 1
        if reason == "Completed" and running:
            reason = "Running"
    if pod["metadata"].get("deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    return reason, ready, restarts


def _pod_cells(pod: JsonObject, now: float) -> Cells:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    reason, ready, restarts = _pod_status(pod)
    gates = spec.get("readinessGates") or []
    if gates:
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        passed = sum(1 for g in gates if conditions.get(g.get("conditionType")) == "True")
        readiness = f"{passed}/{len(gates)}"
    else:
        readiness = NONE
    return [
        pod["metadata"]["name"],
        f"{ready}/{len(spec.get('containers') or [])}",
        reason,
        restarts,
        _since(pod["metadata"].get("creationTimestamp"), now),
        status.get("podIP") or NONE,
        spec.get("nodeName") or NONE,
        status.get("nominatedNodeName") or NONE,
        readiness,
    ]


_POD: Printer = (
    [
        _column("Name", fmt="name"),
        _column("Ready"),
        _column("Status"),
        _column("Restarts", "string"),
        _column("Age"),
        _column("IP", priority=1),
        _column("Node", priority=1),
        _column("Nominated Node", priority=1),
        _column("Readiness Gates", priority=1),
    ],
    _pod_cells,
)


def _event_cells(event: JsonObject, now: float) -> Cells:
    first = event.get("firstTimestamp") or event.get("eventTime")
    last = event.get("lastTimestamp") or first
    count = int(event.get("count") or 0) or 1
    series = event.get("series")
    if isinstance(series, dict):
        last = series.get("lastObservedTime") or last
        count = int(series.get("count") or count)
    involved = event.get("involvedObject") or {}
    kind = str(involved.get("kind") or "").lower()
    target = f"{kind}/{involved['name']}" if involved.get("name") else kind
    source = event.get("source") or {}
    component = source.get("component") or event.get("reportingComponent") or ""
    host = source.get("host") or event.get("reportingInstance") or ""
    return [
        _since(last, now),
        event.get("type") or "",
        event.get("reason") or "",
        target,
        involved.get("fieldPath") or "",
        f"{component}, {host}" if host else component,
        str(event.get("message") or "").strip(),
        _since(first, now),
        count,
        event["metadata"]["name"],
    ]


_EVENT: Printer = (
    [
        _column("Last Seen"),
        _column("Type"),
        _column("Reason"),
        _column("Object"),
        _column("Subobject", priority=1),
        _column("Source", priority=1),
        _column("Message"),
        _column("First Seen", priority=1),
        _column("Count", "integer", priority=1),
        _column("Name", priority=1, fmt="name"),
    ],
    _event_cells,
)


def _node_cells(node: JsonObject, now: float) -> Cells:
    meta, spec, status = node["metadata"], node.get("spec") or {}, node.get("status") or {}
    ready = next(
        (c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"),
        None,
    )
    shown = {"True": "Ready", "False": "NotReady"}.get(str(ready), "Unknown")
    if spec.get("unschedulable"):
        shown += ",SchedulingDisabled"
    roles = sorted(
        key.removeprefix("node-role.kubernetes.io/")
        for key in meta.get("labels") or {}
        if key.startswith("node-role.kubernetes.io/")
    )
    info = status.get("nodeInfo") or {}
    addresses = status.get("addresses") or []

    def address(kind: str) -> str:
        return next((a["address"] for a in addresses if a.get("type") == kind), NONE)

    return [
        meta["name"],
        shown,
        ",".join(roles) or NONE,
        _since(meta.get("creationTimestamp"), now),
        info.get("kubeletVersion") or "",
        address("InternalIP"),
        address("ExternalIP"),
        info.get("osImage") or "<unknown>",
        info.get("kernelVersion") or "<unknown>",
        info.get("containerRuntimeVersion") or "<unknown>",
    ]


_NODE: Printer = (
    [
        _column("Name", fmt="name"),
        _column("Status"),
        _column("Roles"),
        _column("Age"),
        _column("Version"),
        _column("Internal-IP", priority=1),
        _column("External-IP", priority=1),
        _column("OS-Image", priority=1),
        _column("Kernel-Version", priority=1),
        _column("Container-Runtime", priority=1),
    ],
    _node_cells,
)


def _selector_text(selector: Any) -> str:
    if not isinstance(selector, dict):
        return NONE
    terms = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expression in selector.get("matchExpressions") or []:
        values = ",".join(expression.get("values") or [])
        operator = str(expression.get("operator", "")).lower()
        key = expression.get("key", "")
        if operator == "exists":
            terms.append(str(key))
        elif operator == "doesnotexist":
            terms.append(f"!{key}")
        else:
            terms.append(f"{key} {operator} ({values})")
    return ",".join(terms) or NONE


def _template_containers(obj: JsonObject) -> tuple[str, str]:
    pod_spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    containers = pod_spec.get("containers") or []
    return (
        ",".join(str(c.get("name", "")) for c in containers),
        ",".join(str(c.get("image", "")) for c in containers),
    )


def _deployment_cells(obj: JsonObject, now: float) -> Cells:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    names, images = _template_containers(obj)
    return [
        obj["metadata"]["name"],
        f"{int(status.get('readyReplicas') or 0)}/{int(spec.get('replicas') or 0)}",
        int(status.get("updatedReplicas") or 0),
        int(status.get("availableReplicas") or 0),
        _since(obj["metadata"].get("creationTimestamp"), now),
        names,
        images,
        _selector_text(spec.get("selector")),
    ]


_DEPLOYMENT: Printer = (
    [
        _column("Name", fmt="name"),
        _column("Ready"),
        _column("Up-to-date", "integer"),
        _column("Available", "integer"),
        _column("Age"),
        _column("Containers", priority=1),
        _column("Images", priority=1),
        _column("Selector", priority=1),
    ],
    _deployment_cells,
)


def _replica_set_cells(obj: JsonObject, now: float) -> Cells:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    names, images = _template_containers(obj)
    return [
        obj["metadata"]["name"],
        int(spec.get("replicas") or 0),
        int(status.get("replicas") or 0),
        int(status.get("readyReplicas") or 0),
        _since(obj["metadata"].get("creationTimestamp"), now),
        names,
        images,
        _selector_text(spec.get("selector")),
    ]


_REPLICA_SET: Printer = (
    [
        _column("Name", fmt="name"),
        _column("Desired", "integer"),
        _column("Current", "integer"),
        _column("Ready", "integer"),
        _column("Age"),
        _column("Containers", priority=1),
        _column("Images", priority=1),
        _column("Selector", priority=1),
    ],
    _replica_set_cells,
)


def _service_cells(obj: JsonObject, now: float) -> Cells:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    kind = str(spec.get("type") or "ClusterIP")
    external: list[str] = list(spec.get("externalIPs") or [])
    if kind == "LoadBalancer":
        ingress = (status.get("loadBalancer") or {}).get("ingress") or []
        external += [str(i.get("ip") or i.get("hostname") or "") for i in ingress]
        shown_external = ",".join(external) or "<pending>"
    elif kind == "ExternalName":
        shown_external = str(spec.get("externalName") or NONE)
    else:
        shown_external = ",".join(external) or NONE
    ports = []
    for port in spec.get("ports") or []:
        text = f"{port.get('port')}"
        if port.get("nodePort"):
            text += f":{port['nodePort']}"
        ports.append(f"{text}/{port.get('protocol') or 'TCP'}")
    selector = spec.get("selector") or {}
    return [
        obj["metadata"]["name"],
        kind,
        spec.get("clusterIP") or NONE,
        shown_external,
        ",".join(ports) or NONE,
        _since(obj["metadata"].get("creationTimestamp"), now),
        ",".join(f"{k}={v}" for k, v in sorted(selector.items())) or NONE,
    ]


_SERVICE: Printer = (
    [
        _column("Name", fmt="name"),
        _column("Type"),
        _column("Cluster-IP"),
        _column("External-IP"),
        _column("Port(s)"),
        _column("Age"),
        _column("Selector", priority=1),
    ],
    _service_cells,
)

ENDPOINTS_SHOWN = 3
"""Addresses a row shows before `+ N more...`, as upstream's printer."""


def _shown_endpoints(addresses: list[str]) -> str:
    if not addresses:
        return NONE
    more = len(addresses) - ENDPOINTS_SHOWN
    return ",".join(addresses[:ENDPOINTS_SHOWN]) + (f" + {more} more..." if more > 0 else "")


def _endpoints_cells(obj: JsonObject, now: float) -> Cells:
    """`ip:port` of each ready address and port, as `kubectl get endpoints` shows them."""
    shown = []
    for subset in obj.get("subsets") or []:
        ports = [p.get("port") for p in subset.get("ports") or []] or [None]
        for address in subset.get("addresses") or []:
            for port in ports:
                ip = address.get("ip", "")
                shown.append(f"{ip}:{port}" if port is not None else str(ip))
    return [
        obj["metadata"]["name"],
        _shown_endpoints(shown),
        _since(obj["metadata"].get("creationTimestamp"), now),
    ]


_ENDPOINTS: Printer = (
    [_column("Name", fmt="name"), _column("Endpoints"), _column("Age")],
    _endpoints_cells,
)


def _endpoint_slice_cells(obj: JsonObject, now: float) -> Cells:
    ports = [str(p.get("port")) for p in obj.get("ports") or [] if p.get("port") is not None]
    addresses = [
        str(address)
        for endpoint in obj.get("endpoints") or []
        for address in endpoint.get("addresses") or []
    ]
    return [
        obj["metadata"]["name"],
        obj.get("addressType") or "",
        ",".join(ports) or NONE,
        _shown_endpoints(addresses),
        _since(obj["metadata"].get("creationTimestamp"), now),
    ]


_ENDPOINT_SLICE: Printer = (
    [
        _column("Name", fmt="name"),
        _column("AddressType"),
        _column("Ports"),
        _column("Endpoints"),
        _column("Age"),
    ],
    _endpoint_slice_cells,
)

_CONFIG_MAP: Printer = (
    [_column("Name", fmt="name"), _column("Data", "integer"), _column("Age")],
    lambda obj, now: [
        obj["metadata"]["name"],
        len(obj.get("data") or {}) + len(obj.get("binaryData") or {}),
        _since(obj["metadata"].get("creationTimestamp"), now),
    ],
)

_NAMESPACE: Printer = (
    [_column("Name", fmt="name"), _column("Status"), _column("Age")],
    lambda obj, now: [
        obj["metadata"]["name"],
        (obj.get("status") or {}).get("phase") or "",
        _since(obj["metadata"].get("creationTimestamp"), now),
    ],
)

_LEASE: Printer = (
    [_column("Name", fmt="name"), _column("Holder"), _column("Age")],
    lambda obj, now: [
        obj["metadata"]["name"],
        (obj.get("spec") or {}).get("holderIdentity") or "",
        _since(obj["metadata"].get("creationTimestamp"), now),
    ],
)


def _hpa_targets(spec: JsonObject, status: JsonObject) -> str:
    """TARGETS as kubectl shows them: `current/target` per metric, `(avg)` for averages."""
    readings = status.get("currentMetrics") or []
    shown = []
    for index, metric in enumerate(spec.get("metrics") or []):
        kind = str(metric.get("type", ""))
        key = kind[:1].lower() + kind[1:]  # External -> external, Pods -> pods
        target = (metric.get(key) or {}).get("target") or {}
        reading = readings[index] if index < len(readings) else {}
        now = (reading.get(key) or {}).get("current") or {}
        if target.get("type") == "AverageValue":
            shown.append(
                f"{now.get('averageValue', '<unknown>')}/{target.get('averageValue')} (avg)"
            )
        elif target.get("type") == "Utilization":
            value = now.get("averageUtilization")
            current = "<unknown>" if value is None else f"{value}%"
            shown.append(f"{current}/{target.get('averageUtilization')}%")
        else:
            shown.append(f"{now.get('value', '<unknown>')}/{target.get('value')}")
    if len(shown) > 3:
        shown = [*shown[:3], f"+ {len(shown) - 3} more..."]
    return ", ".join(shown) or NONE


def _hpa_cells(obj: JsonObject, now: float) -> Cells:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    target = spec.get("scaleTargetRef") or {}
    return [
        obj["metadata"]["name"],
        f"{target.get('kind', '')}/{target.get('name', '')}",
        _hpa_targets(spec, status),
        spec.get("minReplicas") or 1,
        spec.get("maxReplicas") or 0,
        int(status.get("currentReplicas") or 0),
        _since(obj["metadata"].get("creationTimestamp"), now),
    ]


_HPA: Printer = (
    [
        _column("Name", fmt="name"),
        _column("Reference"),
        _column("Targets"),
        _column("MinPods", "integer"),
        _column("MaxPods", "integer"),
        _column("Replicas", "integer"),
        _column("Age"),
    ],
    _hpa_cells,
)

_PDB: Printer = (
    [
        _column("Name", fmt="name"),
        _column("Min Available"),
        _column("Max Unavailable"),
        _column("Allowed Disruptions", "integer"),
        _column("Age"),
    ],
    lambda obj, now: [
        obj["metadata"]["name"],
        str((obj.get("spec") or {}).get("minAvailable", "N/A")),
        str((obj.get("spec") or {}).get("maxUnavailable", "N/A")),
        int((obj.get("status") or {}).get("disruptionsAllowed") or 0),
        _since(obj["metadata"].get("creationTimestamp"), now),
    ],
)


def _quota_cells(obj: JsonObject, now: float) -> Cells:
    """Each hard resource as `name: used/hard`, the `limits.` ones in their own column."""
    status = obj.get("status") or {}
    used, hard = status.get("used") or {}, status.get("hard") or {}
    columns: dict[bool, list[str]] = {False: [], True: []}
    for name in sorted((obj.get("spec") or {}).get("hard") or {}):
        text = f"{name}: {used.get(name, '0')}/{hard.get(name, '0')}"
        columns[name.split(".")[0] == "limits" and "." in name].append(text)
    return [
        obj["metadata"]["name"],
        _since(obj["metadata"].get("creationTimestamp"), now),
        ", ".join(columns[False]),
        ", ".join(columns[True]),
    ]


_QUOTA: Printer = (
    [_column("Name", fmt="name"), _column("Age"), _column("Request"), _column("Limit")],
    _quota_cells,
)

_DEFAULT: Printer = (
    [_column("Name", fmt="name"), _column("Created At", "date")],
    lambda obj, now: [obj["metadata"]["name"], obj["metadata"].get("creationTimestamp")],
)

PRINTERS: Mapping[str, Printer] = {
    "pods": _POD,
    "events": _EVENT,
    "nodes": _NODE,
    "namespaces": _NAMESPACE,
    "deployments.apps": _DEPLOYMENT,
    "replicasets.apps": _REPLICA_SET,
    "services": _SERVICE,
    "endpoints": _ENDPOINTS,
    "endpointslices.discovery.k8s.io": _ENDPOINT_SLICE,
    "configmaps": _CONFIG_MAP,
    "leases.coordination.k8s.io": _LEASE,
    "horizontalpodautoscalers.autoscaling": _HPA,
    "poddisruptionbudgets.policy": _PDB,
    "resourcequotas": _QUOTA,
}
"""The printers by group_resource (a kind this server does not serve simply never matches)."""


def _custom_printer(resource: Resource) -> Printer:
    assert resource.custom is not None
    columns = resource.custom.columns
    definitions = [_column("Name", fmt="name")] + [
        _column(c.name, c.type, c.priority, c.format) for c in columns
    ]

    def cells(obj: JsonObject, now: float) -> Cells:
        row: Cells = [obj["metadata"]["name"]]
        for column in columns:
            value = field_at(obj, column.json_path)
            if column.type == "date" and value is not None:
                value = _since(value, now)
            elif isinstance(value, dict | list):
                value = str(value)
            row.append(value)
        return row

    return definitions, cells


def table(
    resource: Resource,
    objects: Sequence[JsonObject],
    *,
    version: str,
    now: float,
    metadata: JsonObject,
    include_object: str,
) -> JsonObject:
    """The Table of these objects (one for a get, the items of a list)."""
    if include_object not in ("", "None", "Metadata", "Object"):
        raise bad_request(
            f'includeObject must be "None", "Metadata" or "Object", not "{include_object}"'
        )
    definitions, cells = (
        _custom_printer(resource)
        if resource.custom is not None
        else PRINTERS.get(resource.group_resource, _DEFAULT)
    )
    rows = []
    for obj in objects:
        row: JsonObject = {"cells": cells(obj, now)}
        if include_object == "Object":
            row["object"] = obj
        elif include_object != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": f"{_TABLE_GROUP}/{version}",
                "metadata": obj["metadata"],
            }
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": f"{_TABLE_GROUP}/{version}",
        "metadata": metadata,
        "columnDefinitions": list(definitions),
        "rows": rows,
    }
