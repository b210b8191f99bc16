"""The Service-style path to a workload's pods: what the EndpointSlice controller and kube-proxy
give a client of a Service, for tests and the demo.

`Endpoints` lists and watches the pods a label selector picks (the official client) and keeps the
addresses of those that are Ready and not being deleted, as a Service's ready endpoints are: a
pod leaves them as soon as it is marked for deletion (its proxy then drains) or stops being Ready,
and joins once Ready. `pick()` hands them out in turn, as kube-proxy spreads connections, from
the set kube-proxy last synced: kube-proxy rewrites its rules on a change at most as often as its
minimum sync period allows (`--iptables-min-sync-period`, 1 s, with bursts of 2), so a new
replica is not routed to sooner than on a real node (`RuleSyncs`). What it cannot show: the
time a real node takes to write its rules, and the fallback to terminating endpoints when no
ready one is left.
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

KUBE_PROXY_MIN_SYNC_SECONDS = 1.0
"""kube-proxy's default `--iptables-min-sync-period`."""
KUBE_PROXY_BURST_SYNCS = 2
"""The syncs kube-proxy may run back to back before its minimum period applies."""


class RuleSyncs:
    """When kube-proxy applies an endpoints change: at once while it has a sync to spend, else
    when the next one accrues (a token bucket: one sync per `min_seconds`, at most `burst`
    saved), as its bounded-frequency sync runner does. Pure: the caller gives the time."""

    def __init__(self, min_seconds: float, burst: int, now: float) -> None:
        if min_seconds < 0 or burst < 1:
            raise ValueError(
                f"a minimum sync period of {min_seconds} s with bursts of {burst}: the period "
                f"must be 0 or more seconds and the burst at least 1"
            )
        self.min_seconds = min_seconds
        self.burst = burst
        self._tokens = float(burst)
        self._at = now

    def take(self, now: float) -> bool:
        """Whether a pending change may be applied at `now` (spends a sync when it may)."""
        if self.min_seconds == 0:
            return True
        self._tokens = min(self.burst, self._tokens + (now - self._at) / self.min_seconds)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


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

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        selector: str,
        *,
        min_sync_seconds: float = KUBE_PROXY_MIN_SYNC_SECONDS,
        burst_syncs: int = KUBE_PROXY_BURST_SYNCS,
    ) -> None:
        self.core = cast(Any, client.CoreV1Api(api_client))
        self.namespace = namespace
        self.selector = selector
        self._pods: dict[str, str] = {}
        """The serving pods' addresses by name, as the EndpointSlice holds them."""
        self._routed: list[str] = []
        """The addresses kube-proxy last synced into its rules."""
        self._pending = False
        self._syncs = RuleSyncs(min_sync_seconds, burst_syncs, time.monotonic())
        self._lock = threading.Lock()
        self._turn = itertools.count()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"endpoints-{selector}")

    def addresses(self) -> list[str]:
        """The addresses routed to now."""
        with self._lock:
            self._sync()
            return list(self._routed)

    def pick(self) -> str | None:
        """The next routed endpoint in turn, or None when there is none."""
        with self._lock:
            self._sync()
            ready = self._routed
        return ready[next(self._turn) % len(ready)] if ready else None

    def _sync(self) -> None:
        """Apply the pending change if kube-proxy would have by now (lock held). Applied when
        next read rather than by a timer: what a client sees is the same."""
        if self._pending and self._syncs.take(time.monotonic()):
            self._routed = sorted(self._pods.values())
            self._pending = False

    def _apply(self, event_type: str, pod: JsonObject) -> None:
        name = pod["metadata"]["name"]
        address = _serving(pod) if event_type != "DELETED" else None
        with self._lock:
            if address is None:
                changed = self._pods.pop(name, None) is not None
            else:
                changed = self._pods.get(name) != address
                self._pods[name] = address
            if changed:
                self._pending = True
                self._sync()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                listed = json.loads(
                    self.core.list_namespaced_pod(
                        self.namespace, label_selector=self.selector, _preload_content=False
                    ).data
                )
                serving = {
                    pod["metadata"]["name"]: address
                    for pod in listed.get("items", [])
                    if (address := _serving(pod)) is not None
                }
                with self._lock:
                    self._pods = serving
                    self._pending = True
                    self._sync()
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
