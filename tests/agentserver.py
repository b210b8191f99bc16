"""A grpc.aio server of the agent's API on a free local port, for tests whose servicer stands in for
the node agent (tests/agent/ runs the real one)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc.aio

from protos import agent_pb2_grpc


@contextlib.asynccontextmanager
async def agent_server(servicer: agent_pb2_grpc.AgentServicer) -> AsyncIterator[str]:
    """Serve `servicer`; yields its address (`127.0.0.1:PORT`) and stops it on the way out."""
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)
