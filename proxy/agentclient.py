"""The proxy's calls to the node agent: ask what the node has of the pod's model (so a model
gone from the node is noticed and reinstalled, proxy.reinstall), put an idle on-demand model (a
model pod's, or each of a host's) to sleep and wake it (proxy.residency), and unload it when the
pod terminates.

The calls are common.agentrpc's: each carries the pod's projected service-account token, read
from its file at call time, so the agent can check with TokenReview that the caller is the pod
owning the model. Failures are logged or answered, never raised: the agent also unloads models of
pods that are gone, so a missed call delays freeing memory but loses nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio

from common.agentrpc import AgentCallError, AgentRpc, BearerToken, TokenFileError, agent_channel
from protos import agent_pb2
from proxy.residency import AgentAnswer

log = logging.getLogger(__name__)

_RECONNECT_MAX_SECONDS = 2.0


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
        self._token = BearerToken(token_file)
        self._timeout = timeout

    def rpc(self, channel: grpc.aio.Channel) -> AgentRpc:
        """The agent's calls on `channel`, with the pod's token."""
        return AgentRpc(channel, self._token)

    async def model_on_node(self, model_id: str, channel: grpc.aio.Channel) -> ModelOnNode:
        """The agent's view of the pod's model (NOT_FOUND reads as ABSENT), asked on `channel`
        (the caller's one channel, kept open between checks); AgentUnavailableError when it
        cannot be had. A refusal (the pod may not act on the model) is an answer, not an
        error: state `REFUSED` with the agent's reason."""
        try:
            status = await self.rpc(channel).get_model(model_id, self._timeout)
        except TokenFileError as e:
            raise AgentUnavailableError(str(e)) from e
        except AgentCallError as e:
            if e.code == grpc.StatusCode.NOT_FOUND:
                return ModelOnNode("ABSENT")
            if e.code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                return ModelOnNode("REFUSED", e.details or e.code.name)
            raise AgentUnavailableError(f"the agent at {self._address} did not answer ({e})") from e
        return ModelOnNode(_state_name(status), status.reason, status.sleeping)

    def channel(self) -> grpc.aio.Channel:
        """A channel to the agent for repeated calls; the caller closes it. A node pod that
        came back is noticed within a few checks (reconnecting within 2 s)."""
        return agent_channel(self._address, _RECONNECT_MAX_SECONDS)

    async def caller_key(self) -> bytes:
        """The pod's key for the node gateway; AgentUnavailableError when it cannot be had."""
        async with self.channel() as channel:
            try:
                return await self.rpc(channel).caller_key(self._timeout)
            except TokenFileError as e:
                raise AgentUnavailableError(str(e)) from e
            except AgentCallError as e:
                raise AgentUnavailableError(
                    f"the agent at {self._address} did not give it ({e})"
                ) from e

    async def unload(self, model_id: str) -> bool:
        """Ask for the unload and wait for the answer; True when the agent confirmed it."""
        async with self.channel() as channel:
            try:
                status = await self.rpc(channel).unload_model(model_id, self._timeout)
            except TokenFileError as e:
                log.error(
                    "Not asking the agent to unload model %s (%s); the agent will unload it once "
                    "it sees the pod gone.",
                    model_id,
                    e,
                )
                return False
            except AgentCallError as e:
                log.error(
                    "The agent at %s refused or failed to unload model %s (%s); it will unload "
                    "it once it sees the pod gone.",
                    self._address,
                    model_id,
                    e,
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
        self._rpc: AgentRpc | None = None

    def of(self, model_id: str) -> ResidencyCalls:
        """The calls for `model_id`: its residency's `Agent`."""
        return ResidencyCalls(self, model_id)

    async def sleep(self, model_id: str) -> AgentAnswer:
        try:
            await self._held().unload_model(model_id, self._timeout, idle=True)
        except TokenFileError as e:
            return AgentAnswer(False, "UNAUTHENTICATED", str(e))
        except AgentCallError as e:
            return AgentAnswer(False, e.code.name, e.details or "no reason given")
        return AgentAnswer(True)

    async def wake(self, model_id: str) -> AgentAnswer:
        try:
            status = await self._held().load_model(model_id, self._timeout)
        except TokenFileError as e:
            return AgentAnswer(False, "UNAUTHENTICATED", str(e))
        except AgentCallError as e:
            return AgentAnswer(False, e.code.name, e.details or "no reason given")
        if status.state != agent_pb2.MODEL_STATE_READY:
            return AgentAnswer(False, _state_name(status), status.reason or "no reason given")
        return AgentAnswer(True)

    async def asleep(self, model_id: str) -> bool | None:
        """Whether the node holds `model_id` asleep (True) or READY (False); None when the
        agent cannot tell now or says something else (the next look asks again)."""
        try:
            seen = await self._client.model_on_node(model_id, self._held().channel)
        except AgentUnavailableError as e:
            log.warning("Cannot ask whether model %s is asleep: %s.", model_id, e)
            return None
        if seen.sleeping:
            return True
        return False if seen.state == "READY" else None

    async def close(self) -> None:
        if self._rpc is not None:
            await self._rpc.channel.close(None)
            self._rpc = None

    def _held(self) -> AgentRpc:
        """The calls on the one channel, opened at the first call."""
        if self._rpc is None:
            self._rpc = self._client.rpc(self._client.channel())
        return self._rpc


class ResidencyCalls:
    """The `Agent` of one model's residency: `AgentCalls` for `model_id`."""

    def __init__(self, calls: AgentCalls, model_id: str) -> None:
        self._calls = calls
        self._model_id = model_id

    async def sleep(self) -> AgentAnswer:
        return await self._calls.sleep(self._model_id)

    async def wake(self) -> AgentAnswer:
        return await self._calls.wake(self._model_id)


def _state_name(status: agent_pb2.ModelStatus) -> str:
    """agent.proto's ModelState name without its prefix: `READY`, `FAILED`..."""
    return agent_pb2.ModelState.Name(status.state).removeprefix("MODEL_STATE_")
