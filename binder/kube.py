"""The binder's only door to the Kubernetes API (the only binder module importing `kubernetes`).

Blocking calls, meant to run on worker threads: list and watch raw API dicts (camelCase, no model
deserialisation), patch a pod's annotation, post a Binding, record an Event, set the PodScheduled
condition, and read/write the leader Lease. Failures become binder.errors.ApiError subclasses
carrying the status. Watches can be cut from another thread (`close_watches`), so shutdown never
waits for a read timeout. No scheduling logic lives here.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kubernetes.client
import kubernetes.config
import urllib3
from kubernetes.client.exceptions import ApiException

from binder.errors import ApiError, ConfigError, GoneError, api_error

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]
VERSION = "0.1.0"
USER_AGENT = f"tritonshare-binder/{VERSION}"
WATCH_TIMEOUT_SECONDS = 300
# Raw JSON answers (no model deserialisation), and no call may hang a worker thread forever.
_RAW: dict[str, Any] = {"_preload_content": False, "_request_timeout": (10, 30)}


@dataclass(frozen=True)
class Kind:
    """A watched collection."""

    name: str
    list_call: Callable[..., Any]
    namespace: str | None = None


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _error(e: ApiException) -> ApiError:
    reason, message = str(e.reason or ""), str(e.body or e.reason or "")
    try:
        body = json.loads(e.body) if e.body else {}
        reason = str(body.get("reason") or reason)
        message = str(body.get("message") or message)
    except (ValueError, AttributeError):
        pass
    return api_error(int(e.status or 0), reason, message)


class Kube:
    """One ApiClient per process, shared by every thread (urllib3's pool is thread-safe)."""

    def __init__(
        self,
        kubeconfig: str | None,
        *,
        user_agent: str = USER_AGENT,
        pool_size: int = 32,
    ) -> None:
        # The client's own annotations do not describe raw (`_preload_content=False`) calls.
        loader: Any = kubernetes.config
        configuration = kubernetes.client.Configuration()
        try:
            if kubeconfig:
                loader.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
            else:
                loader.load_incluster_config(client_configuration=configuration)
        except (kubernetes.config.ConfigException, OSError, ValueError) as e:
            where = f"kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster service account"
            raise ConfigError(
                f"cannot configure the Kubernetes client from {where}: {e}; pass --kubeconfig "
                f"(or KUBECONFIG) outside a cluster"
            ) from e
        configuration.connection_pool_maxsize = pool_size
        self.client: Any = kubernetes.client.ApiClient(configuration)
        self.client.user_agent = user_agent
        self.core: Any = kubernetes.client.CoreV1Api(self.client)
        self.coordination: Any = kubernetes.client.CoordinationV1Api(self.client)
        self._watches: set[urllib3.HTTPResponse] = set()
        self._lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        self.close_watches()
        self.client.close()

    # ---- list and watch ------------------------------------------------------------------------

    def nodes(self) -> Kind:
        return Kind("nodes", self.core.list_node)

    def pods(self) -> Kind:
        return Kind("pods", self.core.list_pod_for_all_namespaces)

    def leases(self, namespace: str) -> Kind:
        return Kind("leases", self.coordination.list_namespaced_lease, namespace)

    def _call(self, kind: Kind, **kwargs: Any) -> Any:
        if kind.namespace is not None:
            return kind.list_call(kind.namespace, _preload_content=False, **kwargs)
        return kind.list_call(_preload_content=False, **kwargs)

    def list_all(self, kind: Kind, page: int = 500) -> tuple[list[JsonObject], str]:
        """Every object of the kind (paginated) and the list's resourceVersion."""
        items: list[JsonObject] = []
        token = None
        while True:
            try:
                kwargs: dict[str, Any] = {"limit": page, "_request_timeout": (10, 60)}
                if token:
                    kwargs["_continue"] = token
                response = self._call(kind, **kwargs)
            except ApiException as e:
                raise _error(e) from e
            body = json.loads(response.data)
            items.extend(body.get("items") or [])
            meta = body.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                return items, str(meta.get("resourceVersion", ""))

    def watch(self, kind: Kind, resource_version: str) -> Iterator[tuple[str, JsonObject]]:
        """Watch events (type, object) from `resource_version`, bookmarks included; ends when the
        server closes the stream. Raises GoneError when the version is too old."""
        try:
            response = self._call(
                kind,
                watch=True,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=WATCH_TIMEOUT_SECONDS,
                _request_timeout=(10, WATCH_TIMEOUT_SECONDS + 30),
            )
        except ApiException as e:
            raise _error(e) from e
        with self._lock:
            if self._closed:
                response.release_conn()
                return
            self._watches.add(response)
        try:
            for line in response:
                if not line.strip():
                    continue
                event = json.loads(line)
                kind_type = str(event.get("type", ""))
                obj = event.get("object") or {}
                if kind_type == "ERROR":
                    raise api_error(
                        int(obj.get("code") or 500),
                        str(obj.get("reason", "")),
                        str(obj.get("message", "")),
                    )
                yield kind_type, obj
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as e:
            if not self._closed:
                raise ApiError(0, "WatchBroken", f"the {kind.name} watch broke: {e}") from e
        finally:
            with self._lock:
                self._watches.discard(response)
            response.release_conn()

    def close_watches(self) -> None:
        """End every open watch now (from any thread), and refuse new ones."""
        with self._lock:
            self._closed = True
            responses = list(self._watches)
        for response in responses:
            try:
                response.shutdown()
            except Exception:  # noqa: S112 - best effort during shutdown
                continue

    # ---- writes for scheduling -----------------------------------------------------------------

    def patch_pod_annotations(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """One merge patch of the pod's annotations (the binder's placement: GPU and proof)."""
        body = {"metadata": {"annotations": annotations}}
        try:
            self.core.patch_namespaced_pod(name, namespace, body, **_RAW)
        except ApiException as e:
            raise _error(e) from e

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """POST pods/{name}/binding, as kube-scheduler does. `_preload_content=False`: the
        client's V1Binding model fails to read the Status the server answers with
        (kubernetes-client/python #547, #825)."""
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            self.core.create_namespaced_pod_binding(name, namespace, body, **_RAW)
        except ApiException as e:
            raise _error(e) from e

    def set_unschedulable(self, namespace: str, name: str, message: str) -> None:
        """PodScheduled=False, reason Unschedulable, as kube-scheduler writes it."""
        body = {
            "status": {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": message,
                        "lastProbeTime": None,
                        "lastTransitionTime": now_rfc3339(),
                    }
                ]
            }
        }
        try:
            self.core.patch_namespaced_pod_status(name, namespace, body, **_RAW)
        except ApiException as e:
            raise _error(e) from e

    def record_event(
        self,
        namespace: str,
        name: str,
        uid: str,
        *,
        reason: str,
        message: str,
        reporting_instance: str,
        event_type: str = "Warning",
        component: str = "tritonshare",
    ) -> None:
        """A core/v1 Event about a pod, as kube-scheduler records one."""
        stamp = now_rfc3339()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": name,
                "namespace": namespace,
                "uid": uid,
            },
            "reason": reason,
            "message": message,
            "type": event_type,
            "count": 1,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "source": {"component": component},
            "reportingComponent": component,
            "reportingInstance": reporting_instance,
            "action": "Scheduling",
        }
        try:
            self.core.create_namespaced_event(namespace, body, **_RAW)
        except ApiException as e:
            raise _error(e) from e

    # ---- leases --------------------------------------------------------------------------------

    def get_lease(self, namespace: str, name: str) -> JsonObject | None:
        try:
            response = self.coordination.read_namespaced_lease(name, namespace, **_RAW)
        except ApiException as e:
            error = _error(e)
            if error.status == 404:
                return None
            raise error from e
        result: JsonObject = json.loads(response.data)
        return result

    def create_lease(self, namespace: str, body: JsonObject) -> JsonObject:
        try:
            response = self.coordination.create_namespaced_lease(namespace, body, **_RAW)
        except ApiException as e:
            raise _error(e) from e
        result: JsonObject = json.loads(response.data)
        return result

    def replace_lease(self, namespace: str, name: str, body: JsonObject) -> JsonObject:
        """PUT with the body's resourceVersion: a 409 means someone else wrote it first."""
        try:
            response = self.coordination.replace_namespaced_lease(name, namespace, body, **_RAW)
        except ApiException as e:
            raise _error(e) from e
        result: JsonObject = json.loads(response.data)
        return result

    def read_pod(self, namespace: str, name: str) -> JsonObject:
        try:
            response = self.core.read_namespaced_pod(name, namespace, **_RAW)
        except ApiException as e:
            raise _error(e) from e
        result: JsonObject = json.loads(response.data)
        return result


__all__ = ["USER_AGENT", "ApiError", "GoneError", "JsonObject", "Kind", "Kube", "micro_time"]
