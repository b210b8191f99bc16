"""The namespace's router: what a model host's `modelmesh-serving` ports may name, and where.

A host's proxy listens on two more ports (--listen-mesh-http, --listen-mesh-grpc) behind the
namespace's `modelmesh-serving` Service, which selects every host of the namespace. A request
there names any model of the namespace: one this host serves (its table's entry: the same
limiter, queue, metrics and residency as on the model's own ports) is served here; one it does
not is relayed to that model's own Service, one hop, where the model's hosts (or the host it is
parked on) serve it; any other name gets the unknown-model answer, as on the other ports.

The routes file (--routes-file, the binder's `tritonshare-mesh-routes` ConfigMap mounted in the
host) lists the namespace's models: `[{"model": ID, "address": CLUSTER_IP, "http": 9000, "grpc":
9001}]`, each model id by the strict grammar and each address an IP. Only those addresses are
ever relayed to: the binder writes the file from the namespace's own Services, and a tenant that
edits it reaches only what its namespace reaches anyway (the host pod has no more rights than its
namespace's pods). A relayed model's entry has its own limiter (its `maxConcurrency`, else
--container-concurrency, never unbounded: RELAYED_IN_FLIGHT) and metrics that are not exported:
the request counts where it is served. What it must not do: relay bytes (the relays do), or
relay to an address the routes file does not name.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from common.atomicfile import read_file
from common.contract import ContractError, validate_model_id
from proxy.table import ModelTable, Served

log = logging.getLogger(__name__)

RELAYED_IN_FLIGHT: Final = 64
"""A relayed model's requests in flight from one host when neither its `maxConcurrency` nor
--container-concurrency bounds them (the node gateway's default per pod): more queue."""
MOST_ROUTES: Final = 10_000
"""The most models a routes file may list."""


class RoutesError(ValueError):
    """The routes file cannot be read or does not hold a list of routes."""


@dataclass(frozen=True, slots=True)
class Route:
    """One model of the namespace and its Service."""

    model: str
    """The model id its clients send."""
    address: str
    """Its Service's ClusterIP."""
    http: int = 9000
    grpc: int = 9001
    max_concurrency: int = 0


def _port(entry: dict[str, object], key: str, default: int) -> int:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise RoutesError(f"`{key}` {value!r} is not a port")
    return value


def parse_routes(data: bytes) -> list[Route]:
    """The routes of a routes file's bytes (each model once, the first); RoutesError."""
    try:
        entries = json.loads(data) if data.strip() else []
    except ValueError as e:
        raise RoutesError(f"the routes file is not JSON ({e})") from e
    if not isinstance(entries, list) or len(entries) > MOST_ROUTES:
        raise RoutesError(f"the routes file holds no JSON list of at most {MOST_ROUTES} routes")
    routes: dict[str, Route] = {}
    for number, entry in enumerate(entries, 1):
        if not isinstance(entry, dict):
            raise RoutesError(f"route {number} is not an object")
        model, address = entry.get("model"), entry.get("address")
        limit = entry.get("maxConcurrency", 0)
        try:
            if not isinstance(model, str) or not isinstance(address, str):
                raise RoutesError("no `model` or `address` string")
            validate_model_id(model)
            ipaddress.ip_address(address)
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
                raise RoutesError(f"`maxConcurrency` {limit!r} is not a whole number")
            http, grpc = _port(entry, "http", 9000), _port(entry, "grpc", 9001)
        except (RoutesError, ContractError, ValueError) as e:
            raise RoutesError(f"route {number}: {e}") from e
        routes.setdefault(model, Route(model, address, http, grpc, limit))
    return list(routes.values())


class MeshTable:
    """What the router's ports may name: the table's models (served here) and the routes' (the
    others, relayed), as the sets and dicts the relays read on every request, rebuilt in place
    when either changes (`rebuild`)."""

    def __init__(self, table: ModelTable, make: Callable[[Route], Served]) -> None:
        self.table = table
        self._make = make
        self.routes: dict[str, Served] = {}
        """The relayed models' entries by model id (`Served.route` set)."""
        self.names: set[str] = set()
        self.encoded: set[bytes] = set()
        self.models: dict[str, Served] = {}
        self.served: dict[bytes, Served] = {}
        self._identity: tuple[int, int, int] | None = None
        self.on_change: Callable[[], None] | None = None
        """Told after the routes changed (the REST relay forgets its prepared heads)."""

    def set_routes(self, routes: list[Route]) -> None:
        """Relay exactly `routes`' models (a route whose Service or limit changed is made anew;
        requests in flight finish on the entry they hold)."""
        wanted = {route.model: route for route in routes}
        for model in [m for m, s in self.routes.items() if _route(s) != wanted.get(m)]:
            del self.routes[model]
        for model, route in wanted.items():
            if model not in self.routes:
                self.routes[model] = self._make(route)
        self.rebuild()
        if self.on_change is not None:
            self.on_change()

    def rebuild(self) -> None:
        """The sets and dicts again, in place: a model of the table is served here, another
        model of the routes relayed."""
        local = self.table.names
        models = {name: self.table.models[name] for name in local}
        for model, served in self.routes.items():
            models.setdefault(model, served)
        self.models.clear()
        self.models.update(models)
        self.served.clear()
        self.served.update((name.encode(), served) for name, served in models.items())
        self.names.clear()
        self.names.update(models)
        self.encoded.clear()
        self.encoded.update(self.served)

    def reread(self, path: Path) -> None:
        """Follow the routes file: read it again when it changed; missing: no routes; one that
        cannot be read keeps the routes, and says why."""
        try:
            stat = path.stat()
        except FileNotFoundError:
            if self._identity is not None or self.routes:
                log.info("No routes file %s: relaying no model to its Service.", path)
            self._identity = None
            if self.routes:
                self.set_routes([])
            return
        except OSError as e:
            log.error("Cannot read the routes file %s (%s): keeping the routes.", path, e.strerror)
            return
        identity = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if identity == self._identity:
            return
        try:
            data = read_file(path, "routes file", RoutesError, None) or b""
            routes = parse_routes(data)
        except RoutesError as e:
            log.error("The routes file %s: %s; keeping the routes.", path, e)
            return
        self._identity = identity
        self.set_routes(routes)
        log.info("Relaying %d models of the namespace to their Services.", len(self.routes))

    async def follow(self, path: Path, period: float, stop: asyncio.Event) -> None:
        """Reread `path` every `period` seconds until `stop` is set."""
        while not stop.is_set():
            self.reread(path)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period)


def _route(served: Served) -> Route | None:
    route = served.route
    if route is None:
        return None
    address, http, grpc = route
    return Route(served.model_id, address, http, grpc, served.entry.max_concurrency)
