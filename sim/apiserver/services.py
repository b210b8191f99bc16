"""Services as kube-apiserver's Service strategy writes them: the defaults of a ClusterIP
Service (`type`, `sessionAffinity`, each port's `protocol` and `targetPort`) and its cluster IP,
allocated on create from the simulated service range.

The range is 127.2.0.0/16 (pods have 127.1.0.0/16): loopback addresses, so a program on this
machine reaches a Service's address as a pod reaches it on a cluster; `sim.service.ServiceProxy`
plays kube-proxy for it. Several simulated clusters may run on one machine (the tests' workers
do), so each cluster starts at a random address of the range, as kube-apiserver takes one, and
takes the next free one after the last it gave (two clusters' Services draw apart: they meet
only when their starts are as close as their counts), only where no simulated pod holds it
(`sim.claims`) and no process listens on one of the Service's ports.
Headless (`clusterIP: None`) and explicit addresses are kept as written.
"""

from __future__ import annotations

import ipaddress
import os
from typing import Any

from sim.apiserver.errors import ApiError
from sim.apiserver.resources import SERVICES
from sim.apiserver.store import Store
from sim.claims import claim, ports_free

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
        ports = [
            port["port"]
            for port in spec.get("ports") or []
            if isinstance(port, dict) and isinstance(port.get("port"), int)
        ]
        spec["clusterIP"] = _free_address(store, ports)
    if spec["clusterIP"] != "None":
        spec.setdefault("clusterIPs", [spec["clusterIP"]])
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
    obj.setdefault("status", {"loadBalancer": {}})


def _free_address(store: Store, ports: list[int]) -> str:
    taken = {
        str((stored.obj.get("spec") or {}).get("clusterIP"))
        for stored in store.objects(SERVICES, None)
    }
    size = SERVICE_RANGE.num_addresses - 2
    start = store.service_cursor
    for step in range(size):
        at = (start + step) % size
        address = str(SERVICE_RANGE.network_address + 1 + at)
        if address in taken:
            continue
        descriptor = claim(address)
        if descriptor is None:
            continue  # a pod of a simulated cluster of the machine holds it
        os.close(descriptor)
        if ports_free(address, ports):
            store.service_cursor = at + 1
            return address
    raise ApiError(
        500,
        "InternalError",
        f"failed to allocate a serviceIP: range {SERVICE_RANGE} is full; delete a Service",
        {},
    )
