"""The API server's paths of the core/v1 objects the agent and the binder read and write: a
namespace's, a pod's and a Node's, names quoted, an optional subresource (`status`, `binding`,
`eviction`) after."""

from __future__ import annotations

from urllib.parse import quote


def namespace_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}"


def pod_path(namespace: str, name: str, subresource: str = "") -> str:
    path = f"{namespace_path(namespace)}/pods/{quote(name, safe='')}"
    return f"{path}/{subresource}" if subresource else path


def node_path(name: str, subresource: str = "") -> str:
    path = f"/api/v1/nodes/{quote(name, safe='')}"
    return f"{path}/{subresource}" if subresource else path
