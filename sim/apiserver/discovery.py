"""Discovery documents: `/api`, `/apis`, `/api/v1`, `/apis/<group>/<version>` and `/version`.

Built from a server's `Catalog` (its built-in kinds and its custom resources), so `kubectl` finds
them (short names and categories included) and every group/version advertised is one served:
kubectl warns about any it cannot read. Pure data; no I/O.
"""

from __future__ import annotations

import re
from typing import Any

from sim.apiserver.resources import STORED, Catalog

JsonObject = dict[str, Any]

_VERSION = re.compile(r"v(\d+)(?:(alpha|beta)(\d+))?")


def _priority(version: str) -> tuple[int, int, int]:
    """Kubernetes' version priority, highest first when sorted: GA, then beta, then alpha."""
    match = _VERSION.fullmatch(version)
    if match is None:
        return (0, 0, 0)
    major, stage, minor = match.groups()
    rank = {None: 3, "beta": 2, "alpha": 1}[stage]
    return (rank, int(major), int(minor or 0))


SERVER_VERSION: JsonObject = {
    "major": "1",
    "minor": "31",
    "gitVersion": "v1.31.0-tritonshare-sim",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-08-13T00:00:00Z",
    "goVersion": "go1.22.5",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def api_versions() -> JsonObject:
    return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}


def api_groups(catalog: Catalog) -> JsonObject:
    """The APIGroupList: each served group with exactly the versions it serves."""
    versions: dict[str, set[str]] = {}
    for group, version in catalog.by_group_version:
        if group:
            versions.setdefault(group, set()).add(version)
    groups = []
    for group in sorted(versions):
        ordered = sorted(versions[group], key=_priority, reverse=True)
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in ordered]
        groups.append({"name": group, "versions": entries, "preferredVersion": entries[0]})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def resource_list(catalog: Catalog, group: str, version: str) -> JsonObject | None:
    """The APIResourceList of a group/version, or None if it is not served."""
    served = catalog.by_group_version.get((group, version))
    if not served:
        return None
    resources: list[JsonObject] = []
    for resource in served.values():
        custom = resource.custom
        entry: JsonObject = {
            "name": resource.plural,
            "singularName": custom.singular if custom else resource.kind.lower(),
            "namespaced": resource.namespaced,
            "kind": resource.kind,
            "verbs": sorted(resource.verbs),
        }
        if resource.short_names:
            entry["shortNames"] = list(resource.short_names)
        if custom and custom.categories:
            entry["categories"] = list(custom.categories)
        resources.append(entry)
        for sub in sorted(resource.subresources):
            creates = sub in ("binding", "token", "eviction")
            kinds = {
                "binding": "Binding",
                "token": "TokenRequest",
                "eviction": "Eviction",
                "scale": "Scale",
            }
            sub_entry: JsonObject = {
                "name": f"{resource.plural}/{sub}",
                "singularName": "",
                "namespaced": resource.namespaced,
                "kind": kinds.get(sub, resource.kind),
                "verbs": ["create"]
                if creates
                else (["get", "patch", "update"] if resource in STORED or custom else []),
            }
            if sub == "eviction":
                # As upstream: the Eviction kind is policy/v1's, served under core pods.
                sub_entry["group"] = "policy"
                sub_entry["version"] = "v1"
            elif sub == "scale":
                # As upstream: apps/v1 and custom resources serve autoscaling/v1's Scale.
                sub_entry["group"] = "autoscaling"
                sub_entry["version"] = "v1"
            resources.append(sub_entry)
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }
