"""The proxy's calls to the node agent: ask what the node has of the pod's model (so a model
gone from the node is noticed and reinstalled, proxy.reinstall), put an idle on-demand model (a
model pod's, or each of a host's) to sleep and wake it (proxy.residency), and unload it when the
pod terminates.

Every call carries `authorization: Bearer <token>`, the pod's projected service-account token read
from its file at call time (the kubelet rotates it), so the agent can check with TokenReview that
the caller is the pod owning the model. Failures are logged, never raised: the agent also unloads
models of pods that are gone, so a missed call delays freeing memory but loses nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio

from protos import agent_pb2, agent_pb2_grpc
from proxy.residency import AgentAnswer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelOnNode:
    """The agent's answer about the pod's model: its state name (`ABSENT`, `READY`, `FAILED`...,
    agent.proto's ModelState without its prefix) and the agent's reason, if any."""

    state: str
    reason: str = ""
    sleeping: bool = False
    """An on-demand model unloaded while idle, its files kept: not lost, the next request wakes
    it."""


class AgentUnavailableError(Exception):
    """The agent could not be asked (no connection, no token, or it failed the call); the message
    says which."""


class AgentClient:
    """Asks the agent at `address` about `model_id`, or to unload it, authenticated by
    `token_file`."""

    def __init__(self, address: str, token_file: Path, timeout: float) -> None:
        self._address = address
        self._token_file = token_file
        self._timeout = timeout

    @property
    def token_file(self) -> Path:
        """The pod's token file, read at each call (the kubelet rotates it)."""
        return self._token_file

    async def model_on_node(self, model_id: str, channel: grpc.aio.Channel) -> ModelOnNode:
        """The agent's view of the pod's model (NOT_FOUND reads as ABSENT), asked on `channel`
        (the caller's one channel, kept open between checks); AgentUnavailableError when it
        cannot be had. A refusal (the pod may not act on the model) is an answer, not an
        error: state `REFUSED` with the agent's reason."""
        try:
            token = self._token_file.read_text().strip()
        except OSError as e:
            raise AgentUnavailableError(
                f"the pod's token file {self._token_file} cannot be read ({e.strerror})"
            ) from e
        stub = agent_pb2_grpc.AgentStub(channel)
        try:
            status = await stub.GetModel(
                agent_pb2.GetModelRequest(model_id=model_id),
                metadata=(("authorization", f"Bearer {token}"),),
                timeout=self._timeout,
            )
        except grpc.aio.AioRpcError as e:
            code = e.code()
            if code == grpc.StatusCode.NOT_FOUND:
                return ModelOnNode("ABSENT")
            if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                return ModelOnNode("REFUSED", e.details() or code.name)
            raise AgentUnavailableError(
                f"the agent at {self._address} did not answer ({code.name}: {e.details()})"
            ) from e
        state = agent_pb2.ModelState.Name(status.state).removeprefix("MODEL_STATE_")
        return ModelOnNode(state, status.reason, status.sleeping)

    def channel(self) -> grpc.aio.Channel:
        """A channel to the agent for repeated calls; the caller closes it."""
        return grpc.aio.insecure_channel(
            self._address,
            # gRPC's reconnect backoff grows to 120 s by default: a node pod that came back
            # would go unnoticed that long. Stay within a few checks.
            options=[
                ("grpc.initial_reconnect_backoff_ms", 250),
                ("grpc.min_reconnect_backoff_ms", 250),
                ("grpc.max_reconnect_backoff_ms", 2000),
            ],
        )

    async def unload(self, model_id: str) -> bool:
        """Ask for the unload and wait for the answer; True when the agent confirmed it."""
        try:
            token = self._token_file.read_text().strip()
        except OSError as e:
            log.error(
                "Cannot read the pod's token file %s (%s): not asking the agent to unload model "
                "%s; the agent will unload it once it sees the pod gone.",
                self._token_file,
                e.strerror,
                model_id,
            )
            return False
        async with grpc.aio.insecure_channel(self._address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            try:
                status = await stub.UnloadModel(
                    agent_pb2.UnloadModelRequest(model_id=model_id),
                    metadata=(("authorization", f"Bearer {token}"),),
                    timeout=self._timeout,
                )
            except grpc.aio.AioRpcError as e:
                log.error(
                    "The agent at %s refused or failed to unload model %s (%s: %s); it will "
                    "unload it once it sees the pod gone.",
                    self._address,
                    model_id,
                    e.code().name,
                    e.details(),
                )
                return False
        log.info(
            "The agent at %s unloaded model %s (state %s).",
            self._address,
            model_id,
            agent_pb2.ModelState.Name(status.state),
        )
        return True


class AgentCalls:
    """The agent calls of proxy.residency for every model of the proxy (a model pod's one, a
    host's table), over one channel held from the first call to `close`."""

    def __init__(self, client: AgentClient, timeout: float) -> None:
        self._client = client
        self._timeout = timeout
        self._channel: grpc.aio.Channel | None = None

    def of(self, model_id: str) -> ResidencyCalls:
        """The calls for `model_id`: its residency's `Agent`."""
        return ResidencyCalls(self, model_id)

    async def sleep(self, model_id: str) -> AgentAnswer:
        request = agent_pb2.UnloadModelRequest(model_id=model_id, idle=True)
        return await self._call("UnloadModel", request)

    async def wake(self, model_id: str) -> AgentAnswer:
        request = agent_pb2.LoadModelRequest(model_id=model_id)
        return await self._call("LoadModel", request)

    async def asleep(self, model_id: str) -> bool | None:
        """Whether the node holds `model_id` asleep (True) or READY (False); None when the
        agent cannot tell now or says something else (the next look asks again)."""
        if self._channel is None:
            self._channel = self._client.channel()
        try:
            seen = await self._client.model_on_node(model_id, self._channel)
        except AgentUnavailableError as e:
            log.warning("Cannot ask whether model %s is asleep: %s.", model_id, e)
            return None
        if seen.sleeping:
            return True
        return False if seen.state == "READY" else None

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(None)
            self._channel = None

    async def _call(self, method: str, request: object) -> AgentAnswer:
        client = self._client
        try:
            token = client.token_file.read_text().strip()
        except OSError as e:
            return AgentAnswer(
                False, "UNAUTHENTICATED", f"the pod's token file cannot be read ({e.strerror})"
            )
        if self._channel is None:
            self._channel = client.channel()
        stub = agent_pb2_grpc.AgentStub(self._channel)
        try:
            status = await getattr(stub, method)(
                request,
                metadata=(("authorization", f"Bearer {token}"),),
                timeout=self._timeout,
            )
        except grpc.aio.AioRpcError as e:
            return AgentAnswer(False, e.code().name, e.details() or "no reason given")
        if method == "LoadModel" and status.state != agent_pb2.MODEL_STATE_READY:
            state = agent_pb2.ModelState.Name(status.state).removeprefix("MODEL_STATE_")
            return AgentAnswer(False, state, status.reason or "no reason given")
        return AgentAnswer(True)


class ResidencyCalls:
    """The `Agent` of one model's residency: `AgentCalls` for `model_id`."""

    def __init__(self, calls: AgentCalls, model_id: str) -> None:
        self._calls = calls
        self._model_id = model_id

    async def sleep(self) -> AgentAnswer:
        return await self._calls.sleep(self._model_id)

    async def wake(self) -> AgentAnswer:
        return await self._calls.wake(self._model_id)
