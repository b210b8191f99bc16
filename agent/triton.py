"""The adapter for Triton's HTTP API: liveness, the repository index, load and unload.

The agent is the only caller of Triton's repository API on a node. Facts it relies on: explicit
model-control mode; load is synchronous and returns Triton's reason on failure; unload returns
before the model is gone, so `wait_unloaded` polls the index until the model is UNAVAILABLE (or
absent). When Triton restricts its repository API, every call carries the configured header.
One aiohttp client session per process. It knows nothing of pods or files.

Index calls are single-flight: callers that ask while one is in flight share its answer. While a
load runs, Triton answers the index only when the load ends (both take its repository lock), and
each waiting call holds one of Triton's HTTP threads, which every tenant's REST inference shares;
so the agent holds at most one, whatever its reconciler, loaders and readiness checks ask meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from agent.errors import NotFoundError, TritonError, TritonUnreachableError

log = logging.getLogger(__name__)

READY = "READY"
UNAVAILABLE = "UNAVAILABLE"
LOADING = "LOADING"
UNLOADING = "UNLOADING"


@dataclass(frozen=True)
class IndexEntry:
    """One model in Triton's repository index: its state across versions and Triton's reason."""

    name: str
    state: str
    reason: str = ""


def _merge_state(states: list[str]) -> str:
    # A model counts as READY if any version is; otherwise the most "in progress" state.
    for state in (READY, LOADING, UNLOADING, UNAVAILABLE):
        if state in states:
            return state
    return ""


class TritonClient:
    """Calls one Triton over HTTP; `url` is "host:port" (tritonclient's form) or a full URL."""

    def __init__(
        self,
        url: str,
        *,
        admin_header: tuple[str, str] | None = None,
        request_timeout: float = 10.0,
        load_timeout: float = 600.0,
    ) -> None:
        self.base = url if "://" in url else f"http://{url}"
        self._headers = {admin_header[0]: admin_header[1]} if admin_header else {}
        self._request_timeout = request_timeout
        self._load_timeout = load_timeout
        self._session: aiohttp.ClientSession | None = None
        self._index_in_flight: asyncio.Future[dict[str, IndexEntry]] | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers)
        return self._session

    async def close(self) -> None:
        if self._index_in_flight is not None:
            self._index_in_flight.cancel()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(
        self, method: str, path: str, body: dict[str, Any] | None = None, *, time_limit: float
    ) -> tuple[int, Any]:
        try:
            async with self._client().request(
                method,
                self.base + path,
                json=body,
                timeout=aiohttp.ClientTimeout(total=time_limit),
            ) as response:
                text = await response.text()
                try:
                    payload = json.loads(text) if text else None
                except ValueError:
                    payload = {"error": text}
                return response.status, payload
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise TritonUnreachableError(
                f"Triton at {self.base} does not answer {method} {path} ({type(e).__name__}: "
                f"{e}); check that the Triton container is running"
            ) from e

    @staticmethod
    def _error_text(payload: Any) -> str:
        if isinstance(payload, dict) and "error" in payload:
            return str(payload["error"])
        return json.dumps(payload)

    def _refused(self, status: int, payload: Any, what: str) -> TritonError:
        message = self._error_text(payload)
        if status == 403:
            return TritonError(
                f"Triton refused {what} because its repository API is restricted ({message}); "
                f"give the agent the header Triton expects with --triton-admin-header"
            )
        return TritonError(f"Triton refused {what}: {message}")

    async def live(self) -> bool:
        """True when Triton answers /v2/health/live with 200."""
        try:
            status, _ = await self._request(
                "GET", "/v2/health/live", time_limit=min(self._request_timeout, 3.0)
            )
        except TritonUnreachableError:
            return False
        return status == 200

    async def index(self) -> dict[str, IndexEntry]:
        """Every model in Triton's repository, by name (shared with the calls made meanwhile)."""
        if self._index_in_flight is None:
            self._index_in_flight = asyncio.ensure_future(self._read_index())
            self._index_in_flight.add_done_callback(self._index_done)
        return await asyncio.shield(self._index_in_flight)

    def _index_done(self, future: asyncio.Future[dict[str, IndexEntry]]) -> None:
        if self._index_in_flight is future:
            self._index_in_flight = None
        if not future.cancelled():
            future.exception()  # retrieved: each caller that awaited it got it already

    async def _read_index(self) -> dict[str, IndexEntry]:
        status, payload = await self._request(
            "POST", "/v2/repository/index", {}, time_limit=self._request_timeout
        )
        if status != 200 or not isinstance(payload, list):
            raise self._refused(status, payload, "the repository index")
        grouped: dict[str, list[dict[str, Any]]] = {}
        for item in payload:
            grouped.setdefault(str(item.get("name", "")), []).append(item)
        entries = {}
        for name, items in grouped.items():
            state = _merge_state([str(i.get("state", "")) for i in items])
            reasons = [str(i["reason"]) for i in items if i.get("reason")]
            entries[name] = IndexEntry(name=name, state=state, reason="; ".join(reasons))
        return entries

    async def state(self, name: str) -> IndexEntry | None:
        return (await self.index()).get(name)

    async def config(self, name: str) -> dict[str, Any] | None:
        """The configuration Triton runs `name` with (JSON), or None when it has no ready
        version."""
        status, payload = await self._request(
            "GET", f"/v2/models/{quote(name, safe='')}/config", time_limit=self._request_timeout
        )
        if status != 200 or not isinstance(payload, dict):
            return None
        return payload

    async def gpu_memory(self, name: str, gpu_index: int) -> int | None:
        """GPU memory Triton's statistics attribute to `name` on GPU `gpu_index` (the backend's
        `memory_usage`), or None when it reports none (most backends, and every CPU model)."""
        try:
            status, payload = await self._request(
                "GET", f"/v2/models/{quote(name, safe='')}/stats", time_limit=self._request_timeout
            )
        except TritonUnreachableError:
            return None
        if status != 200 or not isinstance(payload, dict):
            return None
        total, found = 0, False
        for stats in payload.get("model_stats") or []:
            for usage in (stats or {}).get("memory_usage") or []:
                if usage.get("type") == "GPU" and int(usage.get("id", -1)) == gpu_index:
                    total += int(usage.get("byte_size", 0))
                    found = True
        return total if found else None

    async def load(self, name: str, config_json: str | None = None) -> None:
        """Load (or reload) `name`, with the config override if given; Triton's reason on error."""
        body: dict[str, Any] = {}
        if config_json is not None:
            body["parameters"] = {"config": config_json}
        status, payload = await self._request(
            "POST",
            f"/v2/repository/models/{quote(name, safe='')}/load",
            body,
            time_limit=self._load_timeout,
        )
        if status != 200:
            raise self._refused(status, payload, f"to load model {name!r}")

    async def unload(self, name: str) -> None:
        """Ask Triton to unload `name`; it returns before the model is gone (see wait_unloaded)."""
        status, payload = await self._request(
            "POST",
            f"/v2/repository/models/{quote(name, safe='')}/unload",
            {},
            time_limit=self._request_timeout,
        )
        if status != 200:
            error = self._refused(status, payload, f"to unload model {name!r}")
            if status == 400 and "not found" in str(error).lower():
                raise NotFoundError(str(error)) from None
            raise error

    async def wait_unloaded(self, name: str, time_limit: float, poll: float = 0.1) -> None:
        """Poll the index until `name` is UNAVAILABLE or absent, or raise TritonError."""
        deadline = time.monotonic() + time_limit
        while True:
            entry = await self.state(name)
            if entry is None or entry.state in (UNAVAILABLE, ""):
                return
            if time.monotonic() >= deadline:
                raise TritonError(
                    f"Triton still reports model {name!r} as {entry.state} "
                    f"{time_limit:.0f} s after unload; stuck instances? See Triton's log"
                )
            await asyncio.sleep(poll)
