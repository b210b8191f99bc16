"""The one agent client against a grpc.aio server that implements the generated servicer and
records what reaches it: the bearer token, each request, and how a failed call comes back.

The loader's and the proxy's use of it are in tests/loader/test_agentclient.py and
tests/proxy/test_agent_unload.py.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio
import pytest

from common.agentrpc import AgentCallError, AgentRpc, BearerToken, TokenFileError, agent_channel
from protos import agent_pb2, agent_pb2_grpc
from tests.agentserver import agent_server


@dataclass
class UnloadingAgent(agent_pb2_grpc.AgentServicer):  # type: ignore[misc]
    """Keeps every token and UnloadModel request; refuses to unload the model `refused`."""

    tokens: list[str] = field(default_factory=list)
    unloads: list[agent_pb2.UnloadModelRequest] = field(default_factory=list)
    refused: str = "theirs"

    async def UnloadModel(  # noqa: N802 - the generated servicer's name
        self,
        request: agent_pb2.UnloadModelRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> agent_pb2.ModelStatus:
        self.tokens.append(str(dict(context.invocation_metadata() or ()).get("authorization")))
        self.unloads.append(request)
        if request.model_id == self.refused:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "pod a/b does not own it")
        return agent_pb2.ModelStatus(
            model_id=request.model_id, state=agent_pb2.MODEL_STATE_INSTALLED, sleeping=True
        )


@pytest.fixture
async def agent() -> AsyncIterator[tuple[UnloadingAgent, str]]:
    servicer = UnloadingAgent()
    async with agent_server(servicer) as address:
        yield servicer, address


@pytest.fixture
def token(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """The pod's token file: "t" and a newline, or the bytes a test names (None: no file)."""
    path = tmp_path / "token"
    content: bytes | None = getattr(request, "param", b"t\n")
    if content is not None:
        path.write_bytes(content)
    return path


async def unload(address: str, token: Path, model_id: str) -> agent_pb2.ModelStatus:
    """One UnloadModel of `model_id` on a channel of its own."""
    async with agent_channel(address, 1.0) as channel:
        return await AgentRpc(channel, BearerToken(token)).unload_model(model_id, 5.0)


async def test_a_call_sends_the_token_read_then_and_every_field(
    agent: tuple[UnloadingAgent, str], token: Path
) -> None:
    servicer, address = agent
    async with agent_channel(address, 1.0) as channel:
        rpc = AgentRpc(channel, BearerToken(token))
        asleep = await rpc.unload_model("mine", 5.0, replica=2, idle=True)
        await asyncio.to_thread(token.write_text, "rotated")
        await rpc.unload_model("mine", 5.0)
    assert asleep.sleeping
    assert servicer.tokens == ["Bearer t", "Bearer rotated"]
    sent = [(r.idle, r.HasField("replica"), r.replica) for r in servicer.unloads]
    assert sent == [(True, True, 2), (False, False, 0)]


@pytest.mark.parametrize(
    ("token", "words"),
    [
        (None, r"does not exist; mount a projected service-account token"),
        (b" \n", r"is empty; mount a real token"),
        (b"\xff\xfe", r"cannot be read"),
    ],
    indirect=["token"],
)
async def test_a_token_file_that_gives_no_token_stops_the_call_before_it_is_sent(
    agent: tuple[UnloadingAgent, str], token: Path, words: str
) -> None:
    servicer, address = agent
    with pytest.raises(TokenFileError, match=f"token file {re.escape(str(token))} {words}"):
        await unload(address, token, "mine")
    assert servicer.unloads == []


async def test_a_failed_call_carries_the_agents_status_and_whether_it_was_reached(
    agent: tuple[UnloadingAgent, str], token: Path
) -> None:
    _, address = agent
    with pytest.raises(AgentCallError) as refused:
        await unload(address, token, "theirs")
    assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert refused.value.details == "pod a/b does not own it"
    assert refused.value.connected
    assert str(refused.value) == "PERMISSION_DENIED: pod a/b does not own it"

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{probe.getsockname()[1]}"
    with pytest.raises(AgentCallError) as unreached:
        await unload(closed, token, "mine")
    assert unreached.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert not unreached.value.connected
