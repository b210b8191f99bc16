"""What a pod asks of a node, as Kubernetes counts it: its effective resource requests and its
host ports. One reading shared by the binder (NodeResourcesFit, NodePorts) and the simulated
kubelet's admission, so a binding the binder makes is judged by the same sums the kubelet uses.

It also defines what a model host costs its node (`MODEL_HOST_BASE`, `MODEL_HOST_PER_MODEL`):
one pod per (namespace, node) that serves every TritonModel replica of its namespace placed
there, so the replicas take no pod slot of their own.

A pod's request of a resource is the larger of (the sum over its app containers and its sidecars,
the init containers with `restartPolicy: Always`) and, for each ordinary init container, its own
request plus the sidecars started before it; then the pod overhead is added
(k8s.io/component-helpers resource.PodRequests). A container's request of a resource is its
request, else its limit: the API server defaults a missing request to the limit, and a pod read
before defaulting means the same. CPU is counted in millicores, everything else in whole units
(bytes for memory, ephemeral-storage and hugepages), fractions rounded up.

Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from types import MappingProxyType
from typing import Any

from common.quantity import QuantityError, quantity_decimal

CPU, MEMORY, EPHEMERAL, PODS = "cpu", "memory", "ephemeral-storage", "pods"

Resources = dict[str, int]
"""Resource name -> amount: millicores for cpu, whole units for the others."""

MODEL_HOST_BASE: Mapping[str, int] = MappingProxyType({CPU: 250, MEMORY: 128 << 20})
"""What a model host asks of its node before any model (250m CPU, 128Mi), besides its one pod
slot: the requests of the one proxy it runs, the same as a model pod's proxy container."""
MODEL_HOST_PER_MODEL: Mapping[str, int] = MappingProxyType({CPU: 5, MEMORY: 4 << 20})
"""What each replica on a host adds to the host's requests (5m CPU, 4Mi). An idle model costs
its host a concurrency limit, a queue, metrics series and a residency timer: well under 1 MiB
of the proxy's memory and no CPU to speak of (a host of 100 idle models is meant to stay under
150 MiB), so 4Mi leaves headroom for its in-flight requests' buffers, and 5m per model gives
100 models half a core for health checks, scrapes and wakes. A model's traffic is scaled by
its replicas, not by these requests."""


_EMPTY: Mapping[str, Any] = {}


def _mapping(value: object) -> Mapping[str, Any]:
    # JSON decodes to dicts: `type is` skips the abstract-class check, which costs more.
    if type(value) is dict:
        return value
    return value if isinstance(value, Mapping) else _EMPTY


def _sequence(value: object) -> Sequence[Any]:
    return value if isinstance(value, list | tuple) else ()


_READ: dict[tuple[bool, str], int] = {}
"""(is cpu, quantity) already read: a cluster repeats a few quantities in every pod, and the
binder reads each pod at every watch event."""
_READ_MAX = 4096


def amount(resource: str, raw: object, *, what: str = "", container: object = None) -> int:
    """One quantity in the resource's unit (millicores for cpu), rounded up; QuantityError when
    the API server would refuse it or it is negative, naming `what` (or the container's
    request)."""
    if type(raw) is str:
        key = (resource == CPU, raw)
        known = _READ.get(key)
        if known is None:
            known = _amount(resource, raw, what, container)
            if len(_READ) < _READ_MAX:
                _READ[key] = known
        return known
    return _amount(resource, raw, what, container)


def _amount(resource: str, raw: object, what: str, container: object) -> int:
    if container is not None:
        what = f"container {container!r}: {resource} request"
    where = what or resource
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise QuantityError(f"{where}: {raw!r} is not a quantity")
    value = quantity_decimal(str(raw).strip()) if not isinstance(raw, int) else Decimal(raw)
    if value is None:
        raise QuantityError(
            f"{where}: {raw!r} is not a Kubernetes quantity; write a number with an optional "
            f"suffix such as '500m', '2', '4Gi' or '1e9'"
        )
    if value < 0:
        raise QuantityError(f"{where}: {raw!r} is negative")
    if resource == CPU:
        value *= 1000
    return math.ceil(value)


def container_requests(container: Mapping[str, Any]) -> Resources:
    """A container's requests: each request, else its limit."""
    resources = _mapping(container.get("resources"))
    if not resources:
        return {}
    requests = _mapping(resources.get("requests"))
    limits = _mapping(resources.get("limits"))
    out: Resources = {}
    for source in (limits, requests):  # a request wins over its limit
        for resource, raw in source.items():
            if raw is None:
                continue
            out[str(resource)] = amount(str(resource), raw, container=container.get("name"))
    return out


def _add(total: Resources, more: Mapping[str, int]) -> None:
    for resource, value in more.items():
        total[resource] = total.get(resource, 0) + value


def _max(total: Resources, other: Mapping[str, int]) -> None:
    for resource, value in other.items():
        if value > total.get(resource, 0):
            total[resource] = value


def container_limits(container: Mapping[str, Any]) -> Resources:
    """A container's limits (a request is no limit)."""
    limits = _mapping(_mapping(container.get("resources")).get("limits"))
    name = container.get("name")
    return {
        str(resource): amount(str(resource), raw, container=name)
        for resource, raw in limits.items()
        if raw is not None
    }


def pod_requests(spec: Mapping[str, Any]) -> Resources:
    """The pod's effective requests, per resource (resources it asks none of are absent).
    Raises QuantityError naming the container and resource of an unreadable quantity."""
    return _pod_total(spec, container_requests)


def pod_limits(spec: Mapping[str, Any]) -> Resources:
    """The pod's effective limits, summed as its requests are (k8s.io/component-helpers
    resource.PodLimits; the overhead counts only for a resource some container limits)."""
    return _pod_total(spec, container_limits)


def _pod_total(
    spec: Mapping[str, Any], of_container: Callable[[Mapping[str, Any]], Resources]
) -> Resources:
    sidecars: Resources = {}
    init_peak: Resources = {}
    for container in map(_mapping, _sequence(spec.get("initContainers"))):
        requests = of_container(container)
        if container.get("restartPolicy") == "Always":
            _add(sidecars, requests)
            _max(init_peak, sidecars)
        else:
            running = dict(sidecars)
            _add(running, requests)
            _max(init_peak, running)
    total: Resources = {}
    for container in map(_mapping, _sequence(spec.get("containers"))):
        _add(total, of_container(container))
    _add(total, sidecars)
    _max(total, init_peak)
    for resource, raw in _mapping(spec.get("overhead")).items():
        if of_container is container_limits and str(resource) not in total:
            continue
        overhead = {str(resource): amount(str(resource), raw, what=f"pod overhead: {resource}")}
        _add(total, overhead)
    return {resource: value for resource, value in total.items() if value}


def node_allocatable(status: Mapping[str, Any]) -> Resources:
    """A node's `status.allocatable` in the same units (a quantity that does not parse counts as
    0, as a node offering nothing of it)."""
    out: Resources = {}
    for resource, raw in _mapping(status.get("allocatable")).items():
        try:
            out[str(resource)] = amount(str(resource), raw)
        except QuantityError:
            out[str(resource)] = 0
    return out


HostPort = tuple[str, str, int]
"""(host IP, protocol, host port); "0.0.0.0" stands for every address."""


def host_ports(spec: Mapping[str, Any]) -> tuple[HostPort, ...]:
    """The host ports the pod's containers (and init containers) ask for, as kube-scheduler's
    NodePorts reads them: a port of 0 asks for none, an empty IP means every address, an empty
    protocol means TCP."""
    ports: list[HostPort] = []
    for key in ("initContainers", "containers"):
        for container in map(_mapping, _sequence(spec.get(key))):
            for port in map(_mapping, _sequence(container.get("ports"))):
                number = port.get("hostPort")
                if not isinstance(number, int) or isinstance(number, bool) or number <= 0:
                    continue
                ip = str(port.get("hostIP") or "0.0.0.0")
                protocol = str(port.get("protocol") or "TCP")
                ports.append((ip, protocol, number))
    return tuple(ports)


def ports_conflict(wanted: HostPort, used: HostPort) -> bool:
    """Whether two host ports collide: same protocol and port, and the same IP or either is the
    wildcard."""
    wildcard = "0.0.0.0"
    return (
        wanted[1] == used[1]
        and wanted[2] == used[2]
        and (wanted[0] == used[0] or wanted[0] == wildcard or used[0] == wildcard)
    )
