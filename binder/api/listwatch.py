"""What the binder lists and watches: the collections (`Kind`s) and `ListWatch`, which reads them
as raw API dicts (camelCase, no model deserialisation) over a common.kubeapi.session.Session.

A list or a watch is tried once: their callers (the informers of binder.api.informer) own the
retry. Watches can be cut from another thread (`close_watches`), so shutdown never waits for a
read timeout.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import quote, urlencode

from common.kubeapi.errors import UnavailableError, api_error
from common.kubeapi.session import JsonObject, Session
from common.kubeapi.transport import Stream

WATCH_TIMEOUT_SECONDS = 300
LIST_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True)
class Kind:
    """A watched collection: its name and the API path that lists it."""

    name: str
    path: str


NODES = Kind("nodes", "/api/v1/nodes")
PODS = Kind("pods", "/api/v1/pods")
NAMESPACES = Kind("namespaces", "/api/v1/namespaces")
BUDGETS = Kind("poddisruptionbudgets", "/apis/policy/v1/poddisruptionbudgets")
QUOTAS = Kind("resourcequotas", "/api/v1/resourcequotas")
PRIORITY_CLASSES = Kind("priorityclasses", "/apis/scheduling.k8s.io/v1/priorityclasses")
TRITONMODELS = Kind("tritonmodels", "/apis/tritonshare.io/v1alpha1/tritonmodels")
HORIZONTAL_POD_AUTOSCALERS = Kind(
    "horizontalpodautoscalers", "/apis/autoscaling/v2/horizontalpodautoscalers"
)
DEPLOYMENTS = Kind("deployments", "/apis/apps/v1/deployments")
INFERENCESERVICES = Kind("inferenceservices", "/apis/serving.kserve.io/v1beta1/inferenceservices")
SERVINGRUNTIMES = Kind("servingruntimes", "/apis/serving.kserve.io/v1alpha1/servingruntimes")
CLUSTERSERVINGRUNTIMES = Kind(
    "clusterservingruntimes", "/apis/serving.kserve.io/v1alpha1/clusterservingruntimes"
)


def leases_in(namespace: str) -> Kind:
    """The Leases of one namespace."""
    path = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace, safe='')}/leases"
    return Kind("leases", path)


class ListWatch:
    """Lists and watches over one session; remembers its open watches so they can be cut."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._lock = threading.Lock()
        self._watches: set[Stream] = set()
        self._closed = False

    def list_all(self, kind: Kind, page: int = 500) -> tuple[list[JsonObject], str]:
        """Every object of the kind (paginated) and the list's resourceVersion. One attempt:
        raises UnavailableError when the server cannot answer."""
        items: list[JsonObject] = []
        token = None
        while True:
            query: dict[str, str | int] = {"limit": page}
            if token:
                query["continue"] = token
            data = self._session.request(
                "GET", f"{kind.path}?{urlencode(query)}", LIST_TIMEOUT_SECONDS
            )
            body = json.loads(data)
            items.extend(body.get("items") or [])
            meta = body.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                return items, str(meta.get("resourceVersion", ""))

    def watch(
        self,
        kind: Kind,
        resource_version: str,
        on_open: Callable[[], None] = lambda: None,
    ) -> Iterator[tuple[str, JsonObject]]:
        """Watch events (type, object) from `resource_version`, bookmarks included; ends when the
        server closes the stream. `on_open` is called once the server has accepted the watch.
        Raises GoneError when the version is too old, UnavailableError when the server cannot be
        reached or the stream breaks."""
        query = urlencode(
            {
                "watch": "true",
                "resourceVersion": resource_version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": WATCH_TIMEOUT_SECONDS,
            }
        )
        stream = self._session.stream(f"{kind.path}?{query}", WATCH_TIMEOUT_SECONDS + 30)
        with self._lock:
            if self._closed:
                stream.close()
                return
            self._watches.add(stream)
        try:
            on_open()
            for line in stream.lines():
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
        except (OSError, ValueError) as e:
            if not self._closed:
                raise UnavailableError(0, "WatchBroken", f"the {kind.name} watch broke: {e}") from e
        finally:
            with self._lock:
                self._watches.discard(stream)
            stream.close()

    def close_watches(self) -> None:
        """End every open watch now (from any thread), and refuse new ones."""
        with self._lock:
            self._closed = True
            streams = list(self._watches)
        for stream in streams:
            try:
                stream.shutdown()
            except Exception:  # noqa: S112 - best effort during shutdown
                continue
