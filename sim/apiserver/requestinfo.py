"""What an API request is about, from its method, path and query, as kube-apiserver's
RequestInfoFactory reads it: verb, API group/version, resource, subresource, namespace, name.

Routing and the audit log both use it. Pure: parses strings, touches no state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sim.apiserver.errors import bad_request
from sim.apiserver.resources import BY_GROUP_VERSION, NAMESPACES, Resource

_TRUE = frozenset({"1", "t", "T", "true", "TRUE", "True"})
_FALSE = frozenset({"0", "f", "F", "false", "FALSE", "False", ""})


def parse_bool(name: str, value: str | None) -> bool:
    """A query boolean as Go's strconv.ParseBool reads it (the Python client sends `True`)."""
    if value is None:
        return False
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise bad_request(f"invalid value for {name}: {value!r} is not a boolean")


@dataclass(frozen=True)
class RequestInfo:
    """One request's target. `resource` is None for discovery and unknown paths."""

    verb: str
    api_group: str
    api_version: str
    resource: Resource | None
    resource_name: str
    subresource: str
    namespace: str
    name: str
    is_resource_request: bool


def parse_request(
    method: str,
    path: str,
    watch_param: str | None,
    served_by_group_version: Mapping[tuple[str, str], Mapping[str, Resource]] = BY_GROUP_VERSION,
) -> RequestInfo:
    """The request's target among `served_by_group_version` (a `Catalog`'s, custom resources
    included; the built-in kinds by default)."""
    parts = [p for p in path.split("/") if p]
    group = version = ""
    rest: list[str] = []
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return RequestInfo(method.lower(), "", "", None, "", "", "", "", is_resource_request=False)
    legacy_watch = bool(rest) and rest[0] == "watch"
    if legacy_watch:
        rest = rest[1:]
    served = served_by_group_version.get((group, version), {})
    namespace = resource_name = name = subresource = ""
    if len(rest) >= 2 and rest[0] == "namespaces" and (len(rest) == 2 or rest[2] not in served):
        # /namespaces/{name}[/{subresource}]: the namespace object itself.
        resource_name, name = "namespaces", rest[1]
        subresource = rest[2] if len(rest) > 2 else ""
    elif len(rest) >= 3 and rest[0] == "namespaces":
        namespace = rest[1]
        resource_name = rest[2]
        name = rest[3] if len(rest) > 3 else ""
        subresource = rest[4] if len(rest) > 4 else ""
    elif rest:
        resource_name = rest[0]
        name = rest[1] if len(rest) > 1 else ""
        subresource = rest[2] if len(rest) > 2 else ""
    resource = served.get(resource_name)
    if resource_name == "namespaces" and group == "" and version == "v1":
        resource = NAMESPACES
    watching = legacy_watch or parse_bool("watch", watch_param)
    verb = {
        "GET": "get" if name else "list",
        "HEAD": "get" if name else "list",
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if name else "deletecollection",
    }.get(method.upper(), method.lower())
    if watching and method.upper() == "GET":
        verb = "watch"
    return RequestInfo(
        verb=verb,
        api_group=group,
        api_version=version,
        resource=resource,
        resource_name=resource_name,
        subresource=subresource,
        namespace=namespace,
        name=name,
        is_resource_request=bool(rest),
    )
