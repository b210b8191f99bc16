"""The one client of the node agent's gRPC API (protos/agent.proto), for the loader and the proxy.

It does what every caller of the agent does alike: opens the channel, with gRPC's reconnect
backoff kept short (`agent_channel`); reads the pod's projected service-account token from its
file for each call, because the kubelet rotates it, and sends it as `authorization: Bearer`
(`BearerToken`); gives each call its deadline; and turns a failed call into one error,
`AgentCallError`, which carries the status code, the agent's words and whether the channel had a
connection when the call failed.

What a failure means (retry, exit code, log line, "the model is absent") is the caller's to
decide: loader/agentclient.py and proxy/agentclient.py are the two parts' adapters onto this one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from protos import agent_pb2, agent_pb2_grpc

Metadata = tuple[tuple[str, str], ...]


def agent_channel(address: str, reconnect_max_seconds: float) -> grpc.aio.Channel:
    """A channel to the agent at `address`; the caller closes it.

    gRPC's own reconnect backoff grows to 120 s by default; while it waits, every call fails at
    once, so an agent that came back would go unnoticed for up to two minutes. The backoff here
    stays within `reconnect_max_seconds` (at least 0.1 s), starting at 250 ms at most.
    """
    reconnect_ms = max(100, int(reconnect_max_seconds * 1000))
    return grpc.aio.insecure_channel(
        address,
        options=[
            ("grpc.initial_reconnect_backoff_ms", min(250, reconnect_ms)),
            ("grpc.min_reconnect_backoff_ms", min(250, reconnect_ms)),
            ("grpc.max_reconnect_backoff_ms", reconnect_ms),
        ],
    )


class TokenFileError(Exception):
    """The token file gives no token: it is missing, unreadable or empty; the message says which
    and what to do."""


class BearerToken:
    """The pod's projected service-account token (with the agent's audience), read from `path` at
    each call."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def metadata(self) -> Metadata:
        """The call's `authorization` metadata; TokenFileError when the file gives no token."""
        try:
            token = self.path.read_text(encoding="utf-8").strip()
        except FileNotFoundError as e:
            raise TokenFileError(
                f"token file {self.path} does not exist; mount a projected service-account "
                f"token with the agent's audience there, or set --token-file"
            ) from e
        except (OSError, UnicodeDecodeError) as e:
            raise TokenFileError(f"token file {self.path} cannot be read: {e}") from e
        if not token:
            raise TokenFileError(f"token file {self.path} is empty; mount a real token")
        return (("authorization", f"Bearer {token}"),)


class AgentCallError(Exception):
    """An agent call failed: `code` and `details` are gRPC's status; `connected` says whether the
    channel had a connection when it failed (the channel's state, not grpc-core's wording, tells
    "no connection" from the agent's own UNAVAILABLE)."""

    def __init__(self, code: grpc.StatusCode, details: str, *, connected: bool) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.connected = connected


class AgentRpc:
    """The agent's calls on `channel` (the caller closes it), each authenticated by
    `token` and ended after `time_limit` seconds. A call raises TokenFileError before anything is
    sent when the token cannot be read, and AgentCallError when the agent fails it."""

    def __init__(self, channel: grpc.aio.Channel, token: BearerToken) -> None:
        self.channel = channel
        self.token = token
        self._stub = agent_pb2_grpc.AgentStub(channel)

    async def get_model(
        self, model_id: str, time_limit: float, *, replica: int | None = None
    ) -> agent_pb2.ModelStatus:
        """The agent's view of `model_id` (NOT_FOUND: the node has none of it)."""
        request = agent_pb2.GetModelRequest(model_id=model_id, replica=replica)
        return await self._status(self._stub.GetModel, request, time_limit)

    async def load_model(
        self, model_id: str, time_limit: float, *, replica: int | None = None
    ) -> agent_pb2.ModelStatus:
        """Load an installed (or sleeping) model; the agent answers once it is READY or FAILED."""
        request = agent_pb2.LoadModelRequest(model_id=model_id, replica=replica)
        return await self._status(self._stub.LoadModel, request, time_limit)

    async def unload_model(
        self, model_id: str, time_limit: float, *, replica: int | None = None, idle: bool = False
    ) -> agent_pb2.ModelStatus:
        """Unload the model and remove its files, or with `idle` put it to sleep (files kept);
        the agent answers once it is done."""
        request = agent_pb2.UnloadModelRequest(model_id=model_id, replica=replica, idle=idle)
        return await self._status(self._stub.UnloadModel, request, time_limit)

    async def list_hosted(
        self, failures: list[agent_pb2.LoadFailure], time_limit: float
    ) -> agent_pb2.ListHostedResponse:
        """The replicas of the calling model host (its token says which host calls), telling
        the agent the ones it fails to load now."""
        request = agent_pb2.ListHostedRequest(failures=failures)
        reply: agent_pb2.ListHostedResponse = await self._call(
            self._stub.ListHosted, request, time_limit
        )
        return reply

    async def caller_key(self, time_limit: float) -> bytes:
        """The calling pod's key for the node gateway (`common.callerkeys`)."""
        reply: agent_pb2.CallerKeyResponse = await self._call(
            self._stub.CallerKey, agent_pb2.CallerKeyRequest(), time_limit
        )
        return bytes(reply.key)

    async def install_model(
        self, requests: AsyncIterator[agent_pb2.InstallModelRequest], time_limit: float
    ) -> agent_pb2.InstallModelResponse:
        """Stream an install: the header first, then the files' chunks."""
        reply: agent_pb2.InstallModelResponse = await self._call(
            self._stub.InstallModel, requests, time_limit
        )
        return reply

    async def install_kept(
        self, header: agent_pb2.InstallHeader, time_limit: float
    ) -> agent_pb2.InstallModelResponse:
        """Install from files the node kept for the namespace (NOT_FOUND: it keeps none)."""
        reply: agent_pb2.InstallModelResponse = await self._call(
            self._stub.InstallKept, header, time_limit
        )
        return reply

    async def _status(
        self, method: Callable[..., Awaitable[Any]], request: object, time_limit: float
    ) -> agent_pb2.ModelStatus:
        """A call the agent answers with a model's status."""
        reply: agent_pb2.ModelStatus = await self._call(method, request, time_limit)
        return reply

    async def _call(
        self, method: Callable[..., Awaitable[Any]], request: object, time_limit: float
    ) -> Any:
        metadata = self.token.metadata()
        try:
            return await method(request, metadata=metadata, timeout=time_limit)
        except grpc.aio.AioRpcError as e:
            connected = self.channel.get_state() is grpc.ChannelConnectivity.READY
            raise AgentCallError(e.code(), e.details() or "", connected=connected) from e
