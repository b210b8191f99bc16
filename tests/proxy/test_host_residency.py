"""On-demand models of a model host: the host's proxy (--models-file) against a real Triton of the
test's own, with tritonclient as the tenant and a stand-in agent (the agent's gRPC API, unloading
and loading the model in Triton as the real agent's idle unload and wake do). The on-demand entry
sleeps after its own idle time through the agent, with the host's token, while the host stays
ready; its next request (REST or gRPC) wakes it and is answered; one already asleep when the proxy
starts is looked up at the agent and woken by its first request; the always entry is never put to
sleep."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from protos import agent_pb2, agent_pb2_grpc
from proxy.residency import ASLEEP, LOADED
from sim.triton import TritonServer
from tests.conftest import copy_model
from tests.proxy.conftest import proxy_settings, running_proxy
from tests.proxy.test_host import _scrape

pytestmark = pytest.mark.triton

TOKEN = "host-token"


def _repository(triton: TritonServer, model: str, action: str) -> None:
    request = urllib.request.Request(
        f"http://{triton.http_url}/v2/repository/models/{model}/{action}", method="POST"
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200, f"Triton did not {action} {model}"


def _ready_in_triton(triton: TritonServer, model: str) -> bool:
    try:
        with urllib.request.urlopen(
            f"http://{triton.http_url}/v2/models/{model}/ready", timeout=10
        ) as response:
            return bool(response.status == 200)
    except urllib.error.HTTPError:
        return False


class StandInAgent(agent_pb2_grpc.AgentServicer):  # type: ignore[misc]
    """The agent's residency calls for a host: an idle unload unloads the model from Triton and
    keeps it asleep, a load loads it again; every call's model, idle flag and token noted."""

    def __init__(self, triton: TritonServer) -> None:
        self.triton = triton
        self.asleep: set[str] = set()
        self.calls: list[tuple[str, str, bool]] = []
        self.tokens: set[str] = set()

    def _note(self, rpc: str, model: str, context: Any, idle: bool = False) -> None:
        self.tokens.update(v for k, v in context.invocation_metadata() if k == "authorization")
        self.calls.append((rpc, model, idle))

    def count(self, rpc: str, model: str, idle: bool = False) -> int:
        return self.calls.count((rpc, model, idle))

    def sleep(self, model: str) -> None:
        _repository(self.triton, model, "unload")
        self.asleep.add(model)

    def _status(self, model: str) -> agent_pb2.ModelStatus:
        asleep = model in self.asleep
        state = agent_pb2.MODEL_STATE_INSTALLED if asleep else agent_pb2.MODEL_STATE_READY
        return agent_pb2.ModelStatus(model_id=model, state=state, sleeping=asleep)

    def GetModel(self, request: Any, context: Any) -> agent_pb2.ModelStatus:  # noqa: N802
        self._note("GetModel", request.model_id, context)
        return self._status(request.model_id)

    def UnloadModel(self, request: Any, context: Any) -> agent_pb2.ModelStatus:  # noqa: N802
        self._note("UnloadModel", request.model_id, context, request.idle)
        if request.idle:
            self.sleep(request.model_id)
        # The unload at the proxy's exit is noted only: the shared Triton keeps its models.
        return self._status(request.model_id)

    def LoadModel(self, request: Any, context: Any) -> agent_pb2.ModelStatus:  # noqa: N802
        self._note("LoadModel", request.model_id, context)
        _repository(self.triton, request.model_id, "load")
        self.asleep.discard(request.model_id)
        return self._status(request.model_id)


@pytest.fixture
def models(triton: TritonServer, model_repository: Path) -> TritonServer:
    """A Triton of this test's own serving add_one and identity (the shared one's Python
    backend processes must not change under the other tests)."""
    for name in ("add_one", "identity"):
        copy_model(name, model_repository)
        _repository(triton, name, "load")
    return triton


@pytest.fixture
def agent(models: TritonServer) -> Iterator[tuple[StandInAgent, str]]:
    servicer = StandInAgent(models)
    executor = ThreadPoolExecutor(4)
    server = grpc.server(executor)
    agent_pb2_grpc.add_AgentServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        server.stop(None).wait()
        executor.shutdown(wait=True)


def _until(condition: Callable[[], object], what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.05)


def _infer_identity(client: Any, module: Any) -> None:
    data = np.arange(5, dtype=np.float32)
    tensor = module.InferInput("INPUT_FP32", [5], "FP32")
    tensor.set_data_from_numpy(data)
    result = client.infer("identity", [tensor])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT_FP32"), data)


def test_an_on_demand_model_of_a_host_sleeps_when_idle_and_its_next_request_wakes_it(
    agent: tuple[StandInAgent, str], models: TritonServer, tmp_path: Path
) -> None:
    servicer, address = agent
    (tmp_path / "token").write_text(TOKEN)
    table = tmp_path / "models.json"
    entries = [
        {"model": "add_one", "idleSeconds": 1},
        {"model": "identity", "residency": "on-demand", "idleSeconds": 1},
    ]
    table.write_text(json.dumps(entries))
    # Asleep before the proxy starts (a restarted proxy container).
    servicer.sleep("identity")
    settings = proxy_settings(
        models,
        model_id="",
        models_file=table,
        models_check_seconds=0.1,
        agent_address=address,
        token_file=tmp_path / "token",
    )
    with running_proxy(settings) as host:
        residencies = host.proxy.residencies.models
        assert list(residencies) == ["identity"], "add_one is always loaded"
        identity = residencies["identity"]
        _until(lambda: identity.state == ASLEEP, "identity looked up at the agent: asleep")
        rest = httpclient.InferenceServerClient(host.http_url)
        rpc = grpcclient.InferenceServerClient(host.grpc_url)
        try:
            _infer_identity(rest, httpclient)  # waits for its wake
            assert servicer.count("LoadModel", "identity") == 1
            assert identity.state == LOADED

            _until(lambda: servicer.count("UnloadModel", "identity", idle=True) == 1, "a sleep")
            # The agent's answer reaches the proxy a moment after the agent counts the call.
            _until(lambda: identity.state == ASLEEP, "identity asleep once the agent answered")
            assert not _ready_in_triton(models, "identity")
            readyz = host.metrics_url.replace("/metrics", "/readyz")
            with urllib.request.urlopen(readyz, timeout=10) as response:
                assert response.status == 200, "the host stays ready while a model sleeps"
            scraped = _scrape(host)
            state = "tritonshare_proxy_model_state"
            assert scraped[(state, (("model", "identity"), ("state", ASLEEP)))] == 1.0
            assert not [k for k in scraped if k[0] == state and ("model", "add_one") in k[1]]

            _infer_identity(rpc, grpcclient)
            assert servicer.count("LoadModel", "identity") == 2
            assert _ready_in_triton(models, "identity")
            wakes = _scrape(host)[
                ("tritonshare_proxy_model_wakes_total", (("model", "identity"), ("outcome", "ok")))
            ]
            assert wakes == 2.0
        finally:
            rest.close()
            rpc.close()
    assert servicer.count("UnloadModel", "add_one", idle=True) == 0
    assert servicer.count("LoadModel", "add_one") == 0
    assert servicer.tokens == {f"Bearer {TOKEN}"}
