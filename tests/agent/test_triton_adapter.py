"""The Triton adapter against a real Triton whose repository API is restricted, and the agent's
behaviour when NVML is missing on a CPU-only node."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
from pathlib import Path

import pynvml
import pytest

from agent.errors import TritonError, TritonUnreachableError
from agent.gpus.nvml import PYNVML, GpuReader
from agent.kube.client import KubeClient
from agent.metrics import AgentMetrics
from agent.status.node import NodePublisher, NodeSettings
from agent.triton import READY, TritonClient
from common.contract import Keys
from sim.triton import TritonServer, free_port
from tests.conftest import copy_model
from tests.executors import CallerThread


@pytest.mark.triton
async def test_a_restricted_repository_api_needs_the_admin_header(
    triton_install: object, model_repository: Path
) -> None:
    copy_model("add_one", model_repository)
    with TritonServer(model_repository, restricted=True) as server:
        plain = TritonClient(server.http_url, server.grpc_url)
        admin = TritonClient(
            server.http_url, server.grpc_url, admin_header=("tritonshare-admin-key", "local")
        )
        try:
            assert await plain.live()
            with pytest.raises(TritonError, match="--triton-admin-header"):
                await plain.index()
            with pytest.raises(TritonError, match="--triton-admin-header"):
                await plain.load("add_one")  # over gRPC: its own header, refused the same way
            await admin.load("add_one")
            entry = await admin.state("add_one")
            assert entry is not None and entry.state == READY
            await admin.unload("add_one")
            await admin.wait_unloaded("add_one", 30)
            entry = await admin.state("add_one")
            assert entry is not None and entry.state == "UNAVAILABLE"
        finally:
            await plain.close()
            await admin.close()


async def test_an_unreachable_triton_is_reported_as_such() -> None:
    client = TritonClient(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}", request_timeout=2)
    try:
        assert not await client.live()
        with pytest.raises(TritonUnreachableError, match="does not answer"):
            await client.index()
        with pytest.raises(TritonUnreachableError, match="--triton-grpc-url"):
            await client.unload("add_one")
    finally:
        await client.close()


def _nvml_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.parametrize("cpu_only", [True, False])
async def test_a_node_without_nvml(cpu_only: bool, kubeconfig: Path) -> None:
    if _nvml_present():
        pytest.skip("this machine has NVML; the test is about machines without it")
    kube = KubeClient(str(kubeconfig))
    try:
        node = NodePublisher(
            kube,
            GpuReader(nvml=PYNVML),
            AgentMetrics(),
            NodeSettings(
                node_name="cpu-node",
                keys=Keys(),
                system_namespace="tritonshare-system",
                cpu_only=cpu_only,
            ),
            nvml_executor=CallerThread(),
            on_snapshot=lambda snapshot: None,
            usage=lambda snapshot: None,  # the measured memory is not published
        )
        snapshot = node.read_gpus()
    finally:
        await kube.close()
    if cpu_only:
        assert node.gpus_read and snapshot is not None and snapshot.gpus == ()
    else:
        assert not node.gpus_read
        assert "--cpu-only" in node.nvml_error and "libnvidia-ml" in node.nvml_error


@pytest.mark.triton
async def test_index_calls_made_meanwhile_share_one_request_to_triton(
    triton_install: object, model_repository: Path
) -> None:
    """Each waiting index request holds one of Triton's HTTP threads, which every tenant's REST
    inference shares: the agent's callers (its reconciler, loaders' GetModel, readiness) share
    one request instead of holding one each."""
    copy_model("add_one", model_repository)
    with TritonServer(model_repository) as server:
        client = TritonClient(server.http_url, server.grpc_url)
        try:
            await client.load("add_one")
            answers = await asyncio.gather(*(client.index() for _ in range(10)))
            assert all(a is answers[0] for a in answers), "each caller made its own request"
            assert answers[0]["add_one"].state == READY
            later = await client.index()
            assert later is not answers[0] and later == answers[0]
        finally:
            await client.close()


async def test_a_failed_index_is_every_waiting_callers_failure_and_the_next_call_asks_again() -> (
    None
):
    client = TritonClient(f"127.0.0.1:{free_port()}", "127.0.0.1:9", request_timeout=2)
    try:
        results = await asyncio.gather(*(client.index() for _ in range(3)), return_exceptions=True)
        assert all(isinstance(r, TritonUnreachableError) for r in results)
        assert results[0] is results[1] is results[2]
        with pytest.raises(TritonUnreachableError):
            await client.index()
    finally:
        await client.close()


SLOW_MODEL = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(3)

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy() + 1)]
            )
            for r in requests
        ]
"""
INFER = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
).encode()


@pytest.mark.triton
async def test_a_slow_load_does_not_hold_rest_inference_on_open_connections(
    triton_install: object, model_repository: Path
) -> None:
    """Triton 2.51's HTTP load holds every open HTTP connection to it until the load ends
    (every tenant's REST inference and the index stalled 9.4 s for a 9.4 s load); the agent
    loads over gRPC, so a model taking 3 s to load stalls no keep-alive connection meanwhile.
    Failed with the HTTP load: each connection's worst request took the whole 3 s."""
    copy_model("add_one", model_repository, as_name="fast")
    slow = copy_model("add_one", model_repository, as_name="slow")
    (slow / "1" / "model.py").write_text(SLOW_MODEL)
    with TritonServer(model_repository) as server:
        client = TritonClient(server.http_url, server.grpc_url)
        host, port = server.http_url.split(":")
        try:
            await client.load("fast")
            connections = [
                http.client.HTTPConnection(host, int(port), timeout=30) for _ in range(4)
            ]
            worst = [0.0] * len(connections)
            loading = threading.Event()
            done = threading.Event()

            def infer(i: int) -> None:
                while not done.is_set():
                    started = time.monotonic()
                    path = "/v2/repository/index" if i == 0 else "/v2/models/fast/infer"
                    connections[i].request("POST", path, b"{}" if i == 0 else INFER)
                    assert connections[i].getresponse().read()
                    if loading.is_set():
                        worst[i] = max(worst[i], time.monotonic() - started)
                    time.sleep(0.02)

            threads = [threading.Thread(target=infer, args=(i,)) for i in range(len(connections))]
            for thread in threads:
                thread.start()
            try:
                loading.set()
                started = time.monotonic()
                await client.load("slow")
                took = time.monotonic() - started
            finally:
                done.set()
                for thread in threads:
                    thread.join(30)
                for connection in connections:
                    connection.close()
            assert took >= 3.0
            assert max(worst) < 1.0, f"worst request per open connection during the load: {worst}"
        finally:
            await client.close()
