"""`GET pods/<name>/log`: a container's log, fetched from the kubelet of the pod's node, as
kube-apiserver does (`kubectl logs`, the client's `read_namespaced_pod_log`).

The pod's container is checked here with upstream's messages (a name must be given when the pod
has several; it must be one of the pod's; the pod must be on a node); the node's kubelet is
found at its InternalIP and `status.daemonEndpoints.kubeletEndpoint.Port` (the simulated kubelet,
`sim.node.logserver`, publishes it; a node whose kubelet publishes none has no logs to give) and
asked with the same parameters: `container`, `previous`, `tailLines`, `limitBytes`, `follow`.
Its answer is streamed back as it comes; its refusals become a Status with its words.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web

from sim.apiserver.errors import ApiError, bad_request, not_found
from sim.apiserver.resources import NODES, PODS
from sim.apiserver.store import Store

JsonObject = dict[str, Any]
PARAMETERS = ("previous", "tailLines", "limitBytes", "follow")
_REASONS = {400: "BadRequest", 404: "NotFound", 403: "Forbidden"}


def _names(containers: Any) -> list[str]:
    return [str(c.get("name")) for c in containers or [] if isinstance(c, dict)]


def container_of(pod: JsonObject, given: str) -> str:
    """The container the request is for, or upstream's 400."""
    name = str(pod["metadata"]["name"])
    spec = pod.get("spec") or {}
    mains, inits = _names(spec.get("containers")), _names(spec.get("initContainers"))
    ephemeral = _names(spec.get("ephemeralContainers"))
    if not given:
        if len(mains) == 1:
            return mains[0]
        choices = f"choose one of: [{' '.join(mains)}]"
        if inits:
            choices += f" or one of the init containers: [{' '.join(inits)}]"
        raise bad_request(f"a container name must be specified for pod {name}, {choices}")
    if given not in mains + inits + ephemeral:
        raise bad_request(f"container {given} is not valid for pod {name}")
    return given


def kubelet_url(store: Store, pod: JsonObject, container: str) -> str:
    """Where the pod's node's kubelet serves this container's log."""
    name = str(pod["metadata"]["name"])
    node_name = str((pod.get("spec") or {}).get("nodeName") or "")
    if not node_name:
        raise bad_request(f"pod {name} does not have a host assigned")
    node = store.get(NODES, "", node_name)
    status = (node.obj.get("status") or {}) if node is not None else {}
    port = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port")
    address = next(
        (
            a.get("address")
            for a in status.get("addresses") or []
            if isinstance(a, dict) and a.get("type") == "InternalIP"
        ),
        None,
    )
    if not port or not address:
        raise ApiError(
            500,
            "InternalError",
            f'the kubelet of node "{node_name}" serves no logs (the node publishes no'
            " status.daemonEndpoints.kubeletEndpoint.Port): its pods run nowhere to read from",
        )
    namespace = str(pod["metadata"].get("namespace", ""))
    path = "/".join(quote(p, safe="") for p in (namespace, name, container))
    return f"http://{address}:{port}/containerLogs/{path}"


async def serve(
    request: web.Request, store: Store, session: aiohttp.ClientSession, namespace: str, name: str
) -> web.StreamResponse:
    """Answer `GET pods/<name>/log` from the node's kubelet."""
    stored = store.get(PODS, namespace, name)
    if stored is None:
        raise not_found(PODS.group_resource, name)
    container = container_of(stored.obj, request.query.get("container", ""))
    url = kubelet_url(store, stored.obj, container)
    query = {k: request.query[k] for k in PARAMETERS if request.query.get(k)}
    try:
        async with session.get(url, params=query) as answer:
            if answer.status != 200:
                text = (await answer.text()).strip()
                raise ApiError(answer.status, _REASONS.get(answer.status, "InternalError"), text)
            response = web.StreamResponse(headers={"Content-Type": "text/plain"})
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response
    except aiohttp.ClientError as e:
        raise ApiError(500, "InternalError", f"Get {url!r}: the kubelet did not answer: {e}") from e
