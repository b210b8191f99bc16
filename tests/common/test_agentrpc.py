"""The one agent client against a grpc.aio server that implements the generated servicer and
records what reaches it: the bearer token, each request, and how a failed call comes back.

The loader's and the proxy's use of it are in tests/loader/test_agentclient.py and
tests/proxy/test_agent_unload.py.
"""

from __future__ import annotations

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


@dataclass
class RecordingAgent(agent_pb2_grpc.AgentServicer):  # type: ignore[misc]
    """Keeps every token and request it sees; UnloadModel of `refused` is PERMISSION_DENIED."""

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
async def agent() -> AsyncIterator[tuple[RecordingAgent, str]]:
    servicer = RecordingAgent()
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def test_a_call_sends_the_token_read_then_and_every_field(
    agent: tuple[RecordingAgent, str], tmp_path: Path
) -> None:
    servicer, address = agent
    token = tmp_path / "token"
    token.write_text("first\n")
    async with agent_channel(address, 1.0) as channel:
        rpc = AgentRpc(channel, BearerToken(token))
        asleep = await rpc.unload_model("mine", 5.0, replica=2, idle=True)
        token.write_text("rotated")
        await rpc.unload_model("mine", 5.0)
    assert asleep.sleeping
    assert servicer.tokens == ["Bearer first", "Bearer rotated"]
    sent = [(r.idle, r.HasField("replica"), r.replica) for r in servicer.unloads]
    assert sent == [(True, True, 2), (False, False, 0)]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (None, r"does not exist; mount a projected service-account token"),
        (b" \n", r"is empty; mount a real token"),
        (b"\xff\xfe", r"cannot be read"),
    ],
)
async def test_a_token_file_that_gives_no_token_stops_the_call_before_it_is_sent(
    agent: tuple[RecordingAgent, str], tmp_path: Path, content: bytes | None, words: str
) -> None:
    servicer, address = agent
    token = tmp_path / "token"
    if content is not None:
        token.write_bytes(content)
    async with agent_channel(address, 1.0) as channel:
        with pytest.raises(TokenFileError, match=f"token file {re.escape(str(token))} {words}"):
            await AgentRpc(channel, BearerToken(token)).unload_model("mine", 5.0)
    assert servicer.unloads == []


async def test_a_failed_call_carries_the_agents_status_and_whether_it_was_reached(
    agent: tuple[RecordingAgent, str], tmp_path: Path
) -> None:
    _, address = agent
    token = tmp_path / "token"
    token.write_text("t")
    async with agent_channel(address, 1.0) as channel:
        with pytest.raises(AgentCallError) as refused:
            await AgentRpc(channel, BearerToken(token)).unload_model("theirs", 5.0)
    assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert refused.value.details == "pod a/b does not own it"
    assert refused.value.connected
    assert str(refused.value) == "PERMISSION_DENIED: pod a/b does not own it"

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{probe.getsockname()[1]}"
    async with agent_channel(closed, 1.0) as channel:
        with pytest.raises(AgentCallError) as unreached:
            await AgentRpc(channel, BearerToken(token)).unload_model("mine", 5.0)
    assert unreached.value.code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    )
    assert not unreached.value.connected
