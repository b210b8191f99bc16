"""SIGTERM on the proxy as a real process: not ready at once, serving through the drain period,
in-flight requests finished, then the agent asked to unload the model with the pod's token."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path

import aiohttp
import grpc
import grpc.aio
import pytest

from protos import agent_pb2, agent_pb2_grpc
from sim.triton import TritonServer, free_port

pytestmark = [pytest.mark.triton, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


class RecordingAgent(agent_pb2_grpc.AgentServicer):  # type: ignore[misc]
    """Stands in for the agent until `python -m agent` lands: records UnloadModel calls."""

    def __init__(self) -> None:
        self.unloads: list[tuple[str, str, float]] = []

    async def UnloadModel(  # noqa: N802 - the generated servicer's method name
        self,
        request: agent_pb2.UnloadModelRequest,
        context: grpc.aio.ServicerContext[agent_pb2.UnloadModelRequest, agent_pb2.ModelStatus],
    ) -> agent_pb2.ModelStatus:
        metadata = dict(context.invocation_metadata() or ())
        self.unloads.append(
            (request.model_id, str(metadata.get("authorization", "")), time.monotonic())
        )
        return agent_pb2.ModelStatus(model_id=request.model_id, state=agent_pb2.MODEL_STATE_ABSENT)


def _sleepy_body(ms: int) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [ms]}]}
    ).encode()


async def test_sigterm_drains_finishes_in_flight_then_unloads(
    served_triton: TritonServer, tmp_path: Path
) -> None:
    agent = RecordingAgent()
    agent_server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServicer_to_server(agent, agent_server)
    agent_port = agent_server.add_insecure_port("127.0.0.1:0")
    await agent_server.start()
    token = tmp_path / "token"
    token.write_text("pod-token-123\n")
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy",
            "--model-id", "sleepy",
            "--triton-http-url", served_triton.http_url,
            "--triton-grpc-url", served_triton.grpc_url,
            "--listen-http", f"127.0.0.1:{http_port}",
            "--listen-grpc", f"127.0.0.1:{grpc_port}",
            "--listen-metrics", f"127.0.0.1:{metrics_port}",
            "--drain-seconds", "1.5",
            "--finish-timeout", "20",
            "--agent-address", f"127.0.0.1:{agent_port}",
            "--token-file", str(token),
        cwd=ROOT,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    base = f"http://127.0.0.1:{http_port}"
    try:
        async with aiohttp.ClientSession() as session:

            async def status(url: str) -> int:
                try:
                    async with session.get(url) as response:
                        return response.status
                except aiohttp.ClientConnectionError:
                    return -1

            deadline = time.monotonic() + 30
            while await status(f"{base}/v2/health/ready") != 200:
                assert time.monotonic() < deadline, "the proxy did not become ready"
                assert process.returncode is None, "the proxy exited while starting"
                await asyncio.sleep(0.1)
            assert await status(f"http://127.0.0.1:{metrics_port}/readyz") == 200

            async def infer(ms: int) -> tuple[int, float]:
                async with session.post(
                    f"{base}/v2/models/sleepy/infer", data=_sleepy_body(ms)
                ) as response:
                    await response.read()
                    return response.status, time.monotonic()

            in_flight = asyncio.create_task(infer(3000))
            await asyncio.sleep(0.3)  # let it reach Triton
            process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 10
            while await status(f"{base}/v2/health/ready") != 503:
                assert time.monotonic() < deadline, "the proxy kept reporting ready"
                await asyncio.sleep(0.05)
            assert await status(f"http://127.0.0.1:{metrics_port}/readyz") == 503
            # Still serving during the drain period.
            assert (await infer(1))[0] == 200
            code, finished_at = await in_flight
            assert code == 200
        exit_code = await asyncio.wait_for(process.wait(), 30)
        assert exit_code == 0
        assert len(agent.unloads) == 1
        model, authorization, unloaded_at = agent.unloads[0]
        assert (model, authorization) == ("sleepy", "Bearer pod-token-123")
        assert unloaded_at >= finished_at - 0.05
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        assert process.stderr is not None
        log = (await process.stderr.read()).decode()
        await agent_server.stop(None)
    assert "unloaded model sleepy" in log
