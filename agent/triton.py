"""The adapter for Triton's APIs: liveness, the repository index, load and unload.

The agent is the only caller of Triton's repository API on a node. Facts it relies on: explicit
model-control mode; load is synchronous and returns Triton's reason on failure; unload returns
before the model is gone, so `wait_unloaded` polls the index until the model is UNAVAILABLE (or
absent). When Triton restricts its repository API, every call carries the configured header.
It knows nothing of pods or files.

Load and unload go over Triton's gRPC API, everything else over HTTP (one aiohttp session and
one grpc channel per process). Triton 2.51's HTTP load holds every open HTTP connection to it
for as long as the load runs: measured (2026-11-23), a Python-backend model taking 9.4 s to load
over HTTP stalled REST inference on each of 16 keep-alive connections, and the repository index,
for 9.4 s, while the same load over gRPC stalled none of them (10 ms at most). Every tenant's REST
inference reaches Triton on such connections (the node gateway keeps them open), so a slow load
over HTTP, a big model's or a hostile one's, stalled every tenant's REST calls on the node.

Index calls are single-flight: callers that ask while one is in flight share its answer, so the
agent holds at most one of Triton's HTTP threads, whatever its reconciler, loaders and readiness
checks ask meanwhile.
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
import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from agent.errors import TritonError, TritonNotConnectedError, TritonUnreachableError

log = logging.getLogger(__name__)

READY = "READY"
UNAVAILABLE = "UNAVAILABLE"
LOADING = "LOADING"
UNLOADING = "UNLOADING"
KNOWN_TO_THIS_PROCESS = (READY, LOADING, UNLOADING, UNAVAILABLE)
"""States only the Triton process that answers can have given a model (loaded, loading, being
unloaded, unloaded or failed): a Triton started again lists its repository's models with no
state, so a model in one of these was sent to it, and it has not exited since."""


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


GRPC_HEADER_PREFIX = "triton-grpc-protocol-"
"""Triton expects a restricted gRPC protocol's header as metadata with this prefix (its own
refusal says so: "expecting header 'triton-grpc-protocol-<name>'")."""


class TritonClient:
    """Calls one Triton: `url` is its HTTP "host:port" (tritonclient's form) or a full URL,
    `grpc_url` its gRPC "host:port", which loads and unloads go to."""

    def __init__(
        self,
        url: str,
        grpc_url: str,
        *,
        admin_header: tuple[str, str] | None = None,
        request_timeout: float = 10.0,
        load_timeout: float = 600.0,
    ) -> None:
        self.base = url if "://" in url else f"http://{url}"
        self.grpc_url = grpc_url
        self._headers = {admin_header[0]: admin_header[1]} if admin_header else {}
        self._metadata = (
            ((GRPC_HEADER_PREFIX + admin_header[0].lower(), admin_header[1]),)
            if admin_header
            else ()
        )
        self._channel: grpc.aio.Channel | None = None
        self._request_timeout = request_timeout
        self._load_timeout = load_timeout
        self._session: aiohttp.ClientSession | None = None
        self._index_in_flight: asyncio.Future[dict[str, IndexEntry]] | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers)
        return self._session

    def _stub(self) -> service_pb2_grpc.GRPCInferenceServiceStub:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self.grpc_url)
        return service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    async def close(self) -> None:
        if self._index_in_flight is not None:
            self._index_in_flight.cancel()
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._channel is not None:
            await self._channel.close(None)
            self._channel = None

    def _grpc_error(self, error: grpc.aio.AioRpcError, method: str, what: str) -> TritonError:
        """Triton's refusal of a repository call over gRPC, or that it did not answer."""
        details = error.details() or ""
        # A restricted protocol is refused UNAVAILABLE too, saying so.
        restricted = "restricted" in details and error.code() == grpc.StatusCode.UNAVAILABLE
        if not restricted and error.code() in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
        ):
            # gRPC says so when no connection was made for the call: it was never sent.
            unsent = "failed to connect" in details.lower()
            kind = TritonNotConnectedError if unsent else TritonUnreachableError
            return kind(
                f"Triton at {self.grpc_url} (gRPC) does not answer {method} "
                f"({error.code().name}: {details}); check that the Triton container is running "
                f"and --triton-grpc-url names its gRPC port"
            )
        return self._refusal(what, details, restricted=restricted)

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
            kind = (
                TritonNotConnectedError
                if isinstance(e, aiohttp.ClientConnectorError)
                else TritonUnreachableError
            )
            raise kind(
                f"Triton at {self.base} does not answer {method} {path} ({type(e).__name__}: "
                f"{e}); check that the Triton container is running"
            ) from e

    @staticmethod
    def _error_text(payload: Any) -> str:
        if isinstance(payload, dict) and "error" in payload:
            return str(payload["error"])
        return json.dumps(payload)

    @staticmethod
    def _refusal(what: str, message: str, *, restricted: bool) -> TritonError:
        """Triton's refusal of `what`, over either API."""
        if restricted:
            return TritonError(
                f"Triton refused {what} because its repository API is restricted ({message}); "
                f"give the agent the header Triton expects with --triton-admin-header"
            )
        return TritonError(f"Triton refused {what}: {message}")

    def _refused(self, status: int, payload: Any, what: str) -> TritonError:
        return self._refusal(what, self._error_text(payload), restricted=status == 403)

    async def live(self) -> bool:
        """True when Triton answers /v2/health/live with 200."""
        try:
            status, _ = await self._request(
                "GET", "/v2/health/live", time_limit=min(self._request_timeout, 3.0)
            )
        except TritonUnreachableError:
            return False
        return status == 200

    async def server_version(self) -> str:
        """Triton's own version, from its server metadata (`GET /v2`: `2.51.0`)."""
        status, payload = await self._request("GET", "/v2", time_limit=self._request_timeout)
        version = payload.get("version") if isinstance(payload, dict) else None
        if status != 200 or not isinstance(version, str) or not version:
            raise self._refused(status, payload, "its server metadata")
        return version

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
        """Load (or reload) `name`, with the config override if given; Triton's reason on error.
        Over gRPC: see the module docstring."""
        request = service_pb2.RepositoryModelLoadRequest(model_name=name)
        if config_json is not None:
            request.parameters["config"].string_param = config_json
        try:
            await self._stub().RepositoryModelLoad(
                request, metadata=self._metadata, timeout=self._load_timeout
            )
        except grpc.aio.AioRpcError as e:
            raise self._grpc_error(e, "RepositoryModelLoad", f"to load model {name!r}") from None

    async def unload(self, name: str) -> None:
        """Ask Triton to unload `name`; it returns before the model is gone (see wait_unloaded).
        Unloading a model Triton does not have succeeds."""
        request = service_pb2.RepositoryModelUnloadRequest(model_name=name)
        try:
            await self._stub().RepositoryModelUnload(
                request, metadata=self._metadata, timeout=self._request_timeout
            )
        except grpc.aio.AioRpcError as e:
            raise self._grpc_error(
                e, "RepositoryModelUnload", f"to unload model {name!r}"
            ) from None

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
