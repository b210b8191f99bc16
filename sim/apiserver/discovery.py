"""Discovery documents: `/api`, `/apis`, `/api/v1`, `/apis/<group>/v1` and `/version`.

Built from the served kinds in `resources`, so `kubectl` finds them (short names included).
Pure data; no I/O.
"""

from __future__ import annotations

from typing import Any

from sim.apiserver.resources import ALL, BY_GROUP_VERSION, STORED

JsonObject = dict[str, Any]

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


def api_groups() -> JsonObject:
    groups = sorted({r.group for r in ALL if r.group})
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [
            {
                "name": g,
                "versions": [{"groupVersion": f"{g}/v1", "version": "v1"}],
                "preferredVersion": {"groupVersion": f"{g}/v1", "version": "v1"},
            }
            for g in groups
        ],
    }


def resource_list(group: str, version: str) -> JsonObject | None:
    """The APIResourceList of a group/version, or None if it is not served."""
    served = BY_GROUP_VERSION.get((group, version))
    if served is None:
        return None
    resources: list[JsonObject] = []
    for resource in served.values():
        entry: JsonObject = {
            "name": resource.plural,
            "singularName": resource.kind.lower(),
            "namespaced": resource.namespaced,
            "kind": resource.kind,
            "verbs": sorted(resource.verbs),
        }
        if resource.short_names:
            entry["shortNames"] = list(resource.short_names)
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
                else (["get", "patch", "update"] if resource in STORED else []),
            }
            if sub == "eviction":
                # As upstream: the Eviction kind is policy/v1's, served under core pods.
                sub_entry["group"] = "policy"
                sub_entry["version"] = "v1"
            elif sub == "scale":
                # As upstream: apps/v1 serves autoscaling/v1's Scale.
                sub_entry["group"] = "autoscaling"
                sub_entry["version"] = "v1"
            resources.append(sub_entry)
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }
