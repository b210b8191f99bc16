"""Services as kube-apiserver's Service strategy writes them: the defaults of a ClusterIP
Service (`type`, `sessionAffinity`, each port's `protocol` and `targetPort`) and its cluster IP,
allocated on create from the simulated service range.

The range is 127.2.0.0/16 (pods have 127.1.0.0/16): loopback addresses, so a program on this
machine reaches a Service's address as a pod reaches it on a cluster; `sim.service.ServiceProxy`
plays kube-proxy for it. Headless (`clusterIP: None`) and explicit addresses are kept as written.
Pure apart from reading the store; no I/O.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from sim.apiserver.errors import ApiError
from sim.apiserver.resources import SERVICES
from sim.apiserver.store import Store

JsonObject = dict[str, Any]

SERVICE_RANGE = ipaddress.IPv4Network("127.2.0.0/16")


def apply_defaults(store: Store, obj: JsonObject) -> None:
    """Default the Service `obj` in place and give it a cluster IP if it has none."""
    spec = obj.setdefault("spec", {})
    if not isinstance(spec, dict):
        return
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    for port in spec.get("ports") or []:
        if isinstance(port, dict):
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
    if not spec.get("clusterIP"):
        spec["clusterIP"] = _free_address(store)
    if spec["clusterIP"] != "None":
        spec.setdefault("clusterIPs", [spec["clusterIP"]])
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
    obj.setdefault("status", {"loadBalancer": {}})


def _free_address(store: Store) -> str:
    taken = {
        str((stored.obj.get("spec") or {}).get("clusterIP"))
        for stored in store.objects(SERVICES, None)
    }
    for address in SERVICE_RANGE.hosts():
        if str(address) not in taken:
            return str(address)
    raise ApiError(
        500,
        "InternalError",
        f"failed to allocate a serviceIP: range {SERVICE_RANGE} is full; delete a Service",
        {},
    )
