"""The proxy's caller key: asked of an agent (a grpc.aio servicer standing in for it) with the
pod's token, kept in the process state the connections to the gateway read, and kept through an
agent that stops answering; a key the node changes is followed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio

from common.callerkeys import preamble
from protos import agent_pb2, agent_pb2_grpc
from proxy.agentclient import AgentClient
from proxy.callerkey import CallerKeyKeeper
from proxy.processflags import ProxyState
from tests.agentserver import agent_server


@dataclass
class KeyingAgent(agent_pb2_grpc.AgentServicer):  # type: ignore[misc]
    """Answers CallerKey with `key`, or refuses while `key` is empty; keeps every token."""

    key: bytes = b"k" * 32
    tokens: list[str] = field(default_factory=list)

    async def CallerKey(  # noqa: N802 - the generated servicer's name
        self,
        request: agent_pb2.CallerKeyRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> agent_pb2.CallerKeyResponse:
        self.tokens.append(str(dict(context.invocation_metadata() or ()).get("authorization")))
        if not self.key:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the agent is starting")
        return agent_pb2.CallerKeyResponse(key=self.key, pod="team/pod")


async def test_the_key_is_asked_with_the_pods_token_and_kept(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("pod-token\n")
    servicer = KeyingAgent()
    state = ProxyState()
    async with agent_server(servicer) as address:
        keeper = CallerKeyKeeper(AgentClient(address, token, 5.0), state)
        assert await keeper.ask()
        assert state.caller_key == preamble(b"k" * 32)
        assert servicer.tokens == ["Bearer pod-token"]
        # An agent that cannot answer leaves the key the connections use as it was.
        servicer.key = b""
        assert not await keeper.ask()
        assert state.caller_key == preamble(b"k" * 32)
        # A node that made a new secret gives a new key: the next connections present it.
        servicer.key = b"n" * 32
        assert await keeper.ask()
        assert state.caller_key == preamble(b"n" * 32)


async def test_a_malformed_key_is_not_sent(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("pod-token\n")
    state = ProxyState()
    async with agent_server(KeyingAgent(key=b"short")) as address:
        assert not await CallerKeyKeeper(AgentClient(address, token, 5.0), state).ask()
    assert state.caller_key == b""
