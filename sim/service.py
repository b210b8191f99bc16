"""The Service-style path to a workload's pods: what the EndpointSlice controller and kube-proxy
give a client of a Service, for tests and the demo.

`Endpoints` lists and watches the pods a label selector picks (the official client) and keeps the
addresses of those that are Ready and not being deleted, as a Service's ready endpoints are: a
pod leaves them as soon as it is marked for deletion (its proxy then drains) or stops being Ready,
and joins once Ready. `pick()` hands them out in turn, as kube-proxy spreads connections. What it
cannot show: kube-proxy's own lag in rewriting its rules (here milliseconds, the watch's), and
the fallback to terminating endpoints when no ready one is left.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from typing import Any, cast

from kubernetes import client

from sim.watching import watch_events

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]


def _serving(pod: JsonObject) -> str | None:
    """The pod's address if a Service would send it traffic, else None."""
    if pod["metadata"].get("deletionTimestamp"):
        return None
    status = pod.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    address = status.get("podIP")
    return str(address) if ready and address else None


class Endpoints:
    """The ready endpoints of the pods of `namespace` matching `selector`; start() and stop(),
    or use as a context manager."""

    def __init__(self, api_client: client.ApiClient, namespace: str, selector: str) -> None:
        self.core = cast(Any, client.CoreV1Api(api_client))
        self.namespace = namespace
        self.selector = selector
        self._pods: dict[str, str] = {}
        self._lock = threading.Lock()
        self._turn = itertools.count()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"endpoints-{selector}")

    def addresses(self) -> list[str]:
        with self._lock:
            return sorted(self._pods.values())

    def pick(self) -> str | None:
        """The next ready endpoint in turn, or None when there is none."""
        with self._lock:
            ready = sorted(self._pods.values())
        return ready[next(self._turn) % len(ready)] if ready else None

    def _apply(self, event_type: str, pod: JsonObject) -> None:
        name = pod["metadata"]["name"]
        address = _serving(pod) if event_type != "DELETED" else None
        with self._lock:
            if address is None:
                self._pods.pop(name, None)
            else:
                self._pods[name] = address

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                listed = json.loads(
                    self.core.list_namespaced_pod(
                        self.namespace, label_selector=self.selector, _preload_content=False
                    ).data
                )
                with self._lock:
                    self._pods.clear()
                for pod in listed.get("items", []):
                    self._apply("ADDED", pod)
                version = listed["metadata"]["resourceVersion"]
                for event_type, raw in watch_events(
                    self.core.list_namespaced_pod,
                    self._stop,
                    version,
                    self.namespace,
                    label_selector=self.selector,
                ):
                    self._apply(event_type, raw)
            except Exception as e:
                if self._stop.is_set():
                    return
                log.warning("The endpoints watch (%s) failed: %s; listing again.", self.selector, e)
                time.sleep(0.5)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(15)

    def __enter__(self) -> Endpoints:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
