"""The simulated controller manager's writes of Services' Endpoints and EndpointSlices: what
`sim.controllers.endpoints` says a Service's should be, created, replaced or deleted through the
official client, only where they differ from what it last wrote (read from the API server the
first time it syncs a Service). A Service deleted takes its Endpoints and EndpointSlices with it.
"""

from __future__ import annotations

import json
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sim.controllers.endpoints import SERVICE_NAME_LABEL, endpoint_slices, endpoints, same

JsonObject = dict[str, Any]
Key = tuple[str, str]


class EndpointsWriter:
    """Keeps each Service's Endpoints and EndpointSlices as its pods say; call `sync`."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.core = cast(Any, client.CoreV1Api(api_client))
        self.discovery = cast(Any, client.DiscoveryV1Api(api_client))
        self._written: dict[Key, tuple[JsonObject | None, dict[str, JsonObject]]] = {}
        """(namespace, Service name) -> its Endpoints and EndpointSlices as last written."""

    def sync(self, key: Key, service: JsonObject | None, pods: list[JsonObject]) -> None:
        """Bring the Service `key`'s objects to what `service` (None: deleted) and the pods of
        its namespace say. ApiException when a write fails (the caller retries)."""
        namespace, name = key
        held, slices = self._written.get(key) or self._read(key)
        if service is None:
            if held is not None:
                self._ignore_missing(self.core.delete_namespaced_endpoints, name, namespace)
            for slice_name in slices:
                self._ignore_missing(
                    self.discovery.delete_namespaced_endpoint_slice, slice_name, namespace
                )
            self._written.pop(key, None)
            return
        wanted = endpoints(service, pods)
        if wanted is None:  # no selector: the Endpoints are the user's
            self._written[key] = (held, slices)
            return
        if not same(held, wanted):
            held = _json(
                self.core.replace_namespaced_endpoints(
                    name, namespace, wanted, _preload_content=False
                )
            )
        kept: dict[str, JsonObject] = {}
        for piece in endpoint_slices(service, pods):
            slice_name = piece["metadata"]["name"]
            old = slices.get(slice_name)
            if same(old, piece):
                assert old is not None
                kept[slice_name] = old
                continue
            if old is None:
                call = self.discovery.create_namespaced_endpoint_slice(
                    namespace, piece, _preload_content=False
                )
            else:
                call = self.discovery.replace_namespaced_endpoint_slice(
                    slice_name, namespace, piece, _preload_content=False
                )
            kept[slice_name] = _json(call)
        for slice_name in set(slices) - set(kept):
            self._ignore_missing(
                self.discovery.delete_namespaced_endpoint_slice, slice_name, namespace
            )
        self._written[key] = (held, kept)

    def _read(self, key: Key) -> tuple[JsonObject | None, dict[str, JsonObject]]:
        namespace, name = key
        try:
            held = _json(
                self.core.read_namespaced_endpoints(name, namespace, _preload_content=False)
            )
        except ApiException as e:
            if e.status != 404:
                raise
            held = None
        listed = _json(
            self.discovery.list_namespaced_endpoint_slice(
                namespace,
                label_selector=f"{SERVICE_NAME_LABEL}={name}",
                _preload_content=False,
            )
        )
        return held, {s["metadata"]["name"]: s for s in listed.get("items", [])}

    @staticmethod
    def _ignore_missing(delete: Any, name: str, namespace: str) -> None:
        try:
            delete(name, namespace)
        except ApiException as e:
            if e.status != 404:
                raise


def _json(response: Any) -> JsonObject:
    found: JsonObject = json.loads(response.data)
    return found
