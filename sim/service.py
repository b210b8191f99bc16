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
ready one is left. `ServiceProxy` puts them behind each ClusterIP Service's address, as
kube-proxy does, for `make sim-up`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import socket
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
NO_ENDPOINT_WAIT_SECONDS = 5.0


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


def named_ports(pod: JsonObject) -> dict[str, int]:
    """The pod's container ports by name, as an EndpointSlice carries them."""
    return {
        str(port["name"]): int(port["containerPort"])
        for container in pod["spec"].get("containers", [])
        for port in container.get("ports") or []
        if port.get("name")
    }


def serving_address(pod: JsonObject) -> str | None:
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
        self._pods: dict[str, tuple[str, dict[str, int]]] = {}
        """The serving pods' addresses and named ports by name, as the EndpointSlice holds
        them: kube-proxy routes a named target port without asking the API server, so an
        outage of it leaves connections alone."""
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

    def port_of(self, address: str, name: str) -> int | None:
        """The port named `name` of the serving pod at `address`, or None."""
        with self._lock:
            for at, ports in self._pods.values():
                if at == address:
                    return ports.get(name)
        return None

    def _sync(self) -> None:
        """Apply the pending change if kube-proxy would have by now (lock held). Applied when
        next read rather than by a timer: what a client sees is the same."""
        if self._pending and self._syncs.take(time.monotonic()):
            self._routed = sorted(address for address, _ in self._pods.values())
            self._pending = False

    def _apply(self, event_type: str, pod: JsonObject) -> None:
        name = pod["metadata"]["name"]
        address = serving_address(pod) if event_type != "DELETED" else None
        with self._lock:
            if address is None:
                changed = self._pods.pop(name, None) is not None
            else:
                before = self._pods.get(name)
                changed = before is None or before[0] != address
                self._pods[name] = (address, named_ports(pod))
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
                    pod["metadata"]["name"]: (address, named_ports(pod))
                    for pod in listed.get("items", [])
                    if (address := serving_address(pod)) is not None
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


class ServiceProxy:
    """kube-proxy for the cluster's ClusterIP Services: every TCP port of every Service with a
    selector and a loopback cluster IP (`sim.apiserver.services` allocates them) listens on that
    address, and each connection is relayed to one of the Service's ready endpoints
    (`Endpoints`, in turn), on the target port (a number, or a container port's name, which the
    endpoints carry as an EndpointSlice does: no API call per connection). Services are listed
    every `period` seconds. A connection made while the Service has no ready endpoint waits up
    to `NO_ENDPOINT_WAIT_SECONDS` for one, then is closed (kube-proxy rejects it at once: the
    wait spares a script run right after `kubectl rollout status` the endpoint sync's second).
    start() and stop()."""

    def __init__(self, api_client: client.ApiClient, period: float = 1.0) -> None:
        self.api_client = api_client
        self.core = cast(Any, client.CoreV1Api(api_client))
        self.period = period
        self._stop = threading.Event()
        self._listeners: dict[tuple[str, str, int], _Listener] = {}
        self._endpoints: dict[tuple[str, str], Endpoints] = {}
        self._thread = threading.Thread(target=self._run, name="service-proxy")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(15)
        for listener in self._listeners.values():
            listener.close()
        for endpoints in self._endpoints.values():
            endpoints.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._sync()
            except Exception as e:
                log.warning("Listing Services failed: %s; trying again.", e)
            self._stop.wait(self.period)

    def _sync(self) -> None:
        listed = json.loads(self.core.list_service_for_all_namespaces(_preload_content=False).data)
        wanted: dict[tuple[str, str, int], tuple[JsonObject, JsonObject]] = {}
        for service in listed.get("items", []):
            spec = service.get("spec") or {}
            address = str(spec.get("clusterIP") or "")
            if not spec.get("selector") or not address.startswith("127."):
                continue
            for port in spec.get("ports") or []:
                if port.get("protocol", "TCP") == "TCP":
                    wanted[(service["metadata"]["namespace"], address, int(port["port"]))] = (
                        service,
                        port,
                    )
        for key in set(self._listeners) - set(wanted):
            self._listeners.pop(key).close()
        for key, (service, port) in wanted.items():
            if key in self._listeners:
                continue
            namespace, address, number = key
            selector = ",".join(f"{k}={v}" for k, v in sorted(service["spec"]["selector"].items()))
            endpoints = self._endpoints.get((namespace, selector))
            if endpoints is None:
                endpoints = Endpoints(self.api_client, namespace, selector)
                endpoints.start()
                self._endpoints[(namespace, selector)] = endpoints
            try:
                self._listeners[key] = _Listener(
                    address, number, endpoints, port.get("targetPort", number)
                )
            except OSError as e:
                log.warning(
                    "Service %s/%s: cannot listen on %s:%d (%s); it is not reachable here.",
                    namespace,
                    service["metadata"]["name"],
                    address,
                    number,
                    e,
                )


class _Listener:
    """One Service port: accepts on the cluster IP and relays each connection to an endpoint."""

    def __init__(
        self,
        address: str,
        port: int,
        endpoints: Endpoints,
        target: int | str,
    ) -> None:
        self.endpoints = endpoints
        self.target = target
        self.sock = socket.create_server((address, port))
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name=f"service-{address}:{port}", daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        self.sock.close()

    def _target_port(self, address: str) -> int | None:
        if isinstance(self.target, int) or str(self.target).isdigit():
            return int(self.target)
        return self.endpoints.port_of(address, str(self.target))

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        with conn:
            address = self.endpoints.pick()
            waited = time.monotonic() + NO_ENDPOINT_WAIT_SECONDS
            while address is None and time.monotonic() < waited and not self._closed.is_set():
                time.sleep(0.1)
                address = self.endpoints.pick()
            port = self._target_port(address) if address else None
            if address is None or port is None:
                return
            try:
                upstream = socket.create_connection((address, port), timeout=10)
            except OSError:
                return
            with upstream:
                upstream.settimeout(None)
                # Each read goes on at once, as kube-proxy's address rewriting in the kernel
                # does: with Nagle's algorithm a body written after its head would wait for
                # the head's acknowledgement, which the server delays (40 ms on Linux).
                for sock in (conn, upstream):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                back = threading.Thread(target=_pump, args=(upstream, conn), daemon=True)
                back.start()
                _pump(conn, upstream)
                back.join()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy until `source` ends, each read written on whole as it came, then end `sink`'s
    writing side."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)
