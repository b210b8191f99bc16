"""Request crash quarantine through a real Triton, a real agent and a real node gateway: a model
whose loads are fine but whose request with a magic input kills Triton, sent by one tenant pod
`--crash-quarantine-after` times; after the last crash that pod's requests are refused by the
gateway with a clear error (REST 503 with JSON, gRPC FAILED_PRECONDITION), another namespace's
model on the node is served again within 15 s of Triton's restart, the pod's condition, Events,
the agent's metrics and `tritonshare status` name the quarantine, and the clearing command lets
the pod in again. Before the request quarantine the pod took Triton down at every such request,
however many times it sent one."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from tritonclient.grpc import service_pb2

from agent.errors import TritonUnreachableError
from agent.triton import READY
from protos import agent_pb2
from sim.apiserver import RunningApiServer
from sim.triton import TritonServer
from tests.agent.conftest import (
    NODE,
    StartAgent,
    bearer,
    eventually,
    install_dir,
    make_pod,
    name_in_triton,
)
from tests.agent.quarantine.test_quarantine import kubelet_restarts, run_cli
from tests.conftest import copy_model
from tests.proxy.gateway.conftest import gateway_settings, running_gateway
from tests.proxy.gateway.test_inflate_attacks import grpc_call

pytestmark = [pytest.mark.triton, pytest.mark.slow]

ATTACKER = "127.1.0.5"
NEIGHBOUR = "127.1.0.6"
MAGIC = 1000.0
"""An input value past this kills Triton (a backend bug a crafted input reaches)."""

# The stub's parent is tritonserver: killing it takes the whole server down, as a crashing
# backend library does.
KILLER = f"""import os
import signal

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if data.max() >= {MAGIC}:
                os.kill(os.getppid(), signal.SIGKILL)
            out = pb_utils.Tensor("OUTPUT0", (data + 1).astype(data.dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""


def infer(url: str, source: str, model_id: str, value: float) -> tuple[int, bytes]:
    """A REST inference from `source`; (status, body), (0, b"") when the connection broke."""
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [value]}]}
    ).encode()
    return exchange(url, source, f"POST /v2/models/{model_id}/infer", body)


def exchange(url: str, source: str, request_line: str, body: bytes = b"") -> tuple[int, bytes]:
    """One REST request from `source`; (status, body), (0, b"") when the connection broke."""
    head = (
        f"{request_line} HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    host, port = url.split(":")
    try:
        with socket.create_connection((host, int(port)), source_address=(source, 0)) as sock:
            sock.settimeout(30)
            sock.sendall(head.encode() + body)
            answer = b""
            while data := sock.recv(65536):
                answer += data
    except OSError:
        return 0, b""
    if not answer.startswith(b"HTTP/1.1 "):
        return 0, answer
    return int(answer[9:12]), answer.partition(b"\r\n\r\n")[2]


async def attacker_and_neighbour(
    running: Any,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    killer_source: Path,
    neighbour: tuple[str, Path],
) -> dict[str, str]:
    """The attacker's model pod (`killer`, namespace team-a, at ATTACKER) and a neighbour's
    (namespace team-b, at NEIGHBOUR), each Running with its model installed and loaded by the
    agent; each model's name in Triton by model id."""
    gpu = running.mock.gpus[0].uuid
    core: Any = kubernetes.client.CoreV1Api(kube_api)
    neighbour_id, neighbour_source = neighbour
    for namespace, model_id, address, source in (
        ("team-a", "killer", ATTACKER, killer_source),
        ("team-b", neighbour_id, NEIGHBOUR, neighbour_source),
    ):
        core.create_namespace({"metadata": {"name": namespace}})
        pod = f"{model_id}-pod"
        make_pod(kube_api, pod, model_id, gpu_uuid=gpu, phase="Running", namespace=namespace)
        set_address(kube_api, pod, namespace, address)
        token = apiserver.mint_token(namespace, pod)
        await install_dir(running.stub, token, source, model_id)
        loaded = await running.stub.LoadModel(
            agent_pb2.LoadModelRequest(model_id=model_id), metadata=bearer(token)
        )
        assert loaded.state == agent_pb2.MODEL_STATE_READY, loaded.reason
    return {
        "killer": name_in_triton(kube_api, "killer-pod", "killer", "team-a"),
        neighbour_id: name_in_triton(kube_api, f"{neighbour_id}-pod", neighbour_id, "team-b"),
    }


def set_address(api: kubernetes.client.ApiClient, name: str, namespace: str, ip: str) -> None:
    core: Any = kubernetes.client.CoreV1Api(api)
    core.patch_namespaced_pod_status(
        name, namespace, {"status": {"podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "127.0.0.1"}}
    )


def condition(api: kubernetes.client.ApiClient, pod: str, namespace: str) -> tuple[str, str, str]:
    core: Any = kubernetes.client.CoreV1Api(api)
    for c in core.read_namespaced_pod(pod, namespace).status.conditions or []:
        if c.type == "tritonshare.io/ModelLoaded":
            return c.status, c.reason, c.message
    return "", "", ""


def pod_events(api: kubernetes.client.ApiClient, pod: str, namespace: str) -> list[str]:
    core: Any = kubernetes.client.CoreV1Api(api)
    found = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod}")
    return [e.message for e in found.items if e.reason == "RequestsCrashedTriton"]


async def test_a_pod_whose_requests_kill_triton_is_refused_and_its_neighbour_is_served(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    kubeconfig: Path,
    tmp_path: Path,
) -> None:
    table = tmp_path / "gateway" / "callers.json"
    running = await start_custom_agent(
        crash_quarantine_after=2,
        lease_renew_seconds=0.5,
        gateway_table=table,
        gateway_table_refresh_seconds=0.5,
        # The requests' rule alone: the loads just before the attack are not watched (a load
        # settling when the requests kill Triton shares that exit with them:
        # tests/agent/quarantine/test_crash_blame.py).
        crash_settle_seconds=0.0,
    )
    gpu = running.mock.gpus[0].uuid
    killer_source = copy_model("add_one", tmp_path / "src", as_name="killer")
    (killer_source / "1" / "model.py").write_text(KILLER)
    sources = {
        ("team-a", "killer"): killer_source,
        ("team-b", "good"): copy_model("add_one", tmp_path / "src", as_name="good"),
    }
    core: Any = kubernetes.client.CoreV1Api(kube_api)
    for (namespace, model_id), address in zip(sources, (ATTACKER, NEIGHBOUR), strict=True):
        core.create_namespace({"metadata": {"name": namespace}})
        make_pod(
            kube_api,
            f"{model_id}-pod",
            model_id,
            gpu_uuid=gpu,
            phase="Running",
            namespace=namespace,
        )
        set_address(kube_api, f"{model_id}-pod", namespace, address)
        token = apiserver.mint_token(namespace, f"{model_id}-pod")
        await install_dir(running.stub, token, sources[(namespace, model_id)], model_id)
        loaded = await running.stub.LoadModel(
            agent_pb2.LoadModelRequest(model_id=model_id), metadata=bearer(token)
        )
        assert loaded.state == agent_pb2.MODEL_STATE_READY, loaded.reason
    names = {
        "killer": name_in_triton(kube_api, "killer-pod", "killer", "team-a"),
        "good": name_in_triton(kube_api, "good-pod", "good", "team-b"),
    }

    async def ready(model: str) -> bool:
        try:
            entry = await running.agent.triton.state(names[model])
        except TritonUnreachableError:
            return False  # restarting: not yet
        return entry is not None and entry.state == READY

    def callers() -> dict[str, str]:
        """Each caller's address in the table, and why it is quarantined ("": it is not)."""
        try:
            document = json.loads(table.read_text())
        except (OSError, ValueError):
            return {}
        return {c["address"]: c.get("quarantined", "") for c in document["callers"]}

    await eventually(lambda: set(callers()) == {ATTACKER, NEIGHBOUR}, what="both pods callers")
    registry = running.agent.metrics.registry
    labels = {"model_namespace": "team-a", "pod": "killer-pod", "model_id": "killer"}
    with running_gateway(gateway_settings(triton, table)) as gateway:
        url = gateway.http_url
        status, _ = await asyncio.to_thread(infer, url, ATTACKER, "killer", 1.0)
        assert status == 200, "an ordinary request of the attacker is served"
        async with kubelet_restarts(triton) as restarts:
            back = 0.0
            for crash in (1, 2):
                status, _ = await asyncio.to_thread(infer, url, ATTACKER, "killer", MAGIC)
                assert status in (0, 502), status  # Triton died under it
                await eventually(lambda n=crash: len(restarts) == n, what=f"crash {crash}")
                await eventually(running.agent.triton.live, limit=60, what="Triton restarted")
                back = time.monotonic()
                if crash == 1:
                    await eventually(lambda: ready("killer"), limit=60, what="killer reloaded")
                    assert not callers()[ATTACKER], "one crash quarantines no one"

            # Quarantined: the gateway refuses the pod's requests, saying why and what to do.
            await eventually(
                lambda: bool(callers()[ATTACKER]), what="the attacker quarantined in the table"
            )
            exits = registry.get_sample_value("tritonshare_agent_triton_exits_witnessed_total")
            assert exits == 2
            assert not callers()[NEIGHBOUR], "the neighbour had no request at Triton"
            await eventually(lambda: ready("good"), limit=60, what="the neighbour reloaded")
            status, body = await asyncio.to_thread(infer, url, NEIGHBOUR, "good", 1.0)
            assert status == 200, body
            assert time.monotonic() - back < 15, "the neighbour is served within 15 s"
            await eventually(lambda: ready("killer"), limit=60, what="the killer model loaded")
            for value in (MAGIC, 1.0):
                status, body = await asyncio.to_thread(infer, url, ATTACKER, "killer", value)
                assert status == 503, (status, body)
                error = json.loads(body)["error"]
                assert "quarantined" in error and "2 times in a row" in error, error
                assert "tritonshare quarantine clear <node> team-a/killer-pod" in error, error
            # Every request, its readiness too: the pod's proxy reports it not ready.
            probe = await asyncio.to_thread(exchange, url, ATTACKER, "GET /v2/models/killer/ready")
            assert probe[0] == 503 and b"quarantined" in probe[1], probe
            request = service_pb2.ModelInferRequest(model_name="killer")
            request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
            request.raw_input_contents.append(b"\x00\x00\x80\x3f")
            trailers = await asyncio.to_thread(
                grpc_call,
                gateway.grpc_url,
                ATTACKER,
                "/inference.GRPCInferenceService/ModelInfer",
                request.SerializeToString(),
                "identity",
            )
            assert trailers.get("grpc-status") == "9", trailers  # FAILED_PRECONDITION
            assert "quarantined" in trailers.get("grpc-message", ""), trailers
            assert len(restarts) == 2, "the refused requests never reached Triton"

            # The pod, its Events, the agent's metrics and `tritonshare status` name it.
            await eventually(
                lambda: (
                    condition(kube_api, "killer-pod", "team-a")[:2]
                    == ("False", "RequestsCrashedTriton")
                ),
                what="the pod's condition",
            )
            assert pod_events(kube_api, "killer-pod", "team-a")
            assert not pod_events(kube_api, "good-pod", "team-b")
            assert registry.get_sample_value("tritonshare_agent_quarantined_pods", labels) == 1
            code, out = await asyncio.to_thread(run_cli, kubeconfig, "status")
            assert code == 0 and f"pod team-a/killer-pod (team-a/killer) on {NODE}" in out, out

            # The operator clears it: the pod is served again.
            code, out = await asyncio.to_thread(
                run_cli, kubeconfig, "quarantine", "clear", NODE, "team-a/killer-pod"
            )
            assert code == 0, out
            await eventually(lambda: not callers()[ATTACKER], what="the quarantine lifted")

            async def attacker_served() -> bool:
                # The gateway rereads the table on its own poll, a moment after it changes.
                return (await asyncio.to_thread(infer, url, ATTACKER, "killer", 1.0))[0] == 200

            await eventually(attacker_served, what="the attacker served again")
            assert registry.get_sample_value("tritonshare_agent_quarantined_pods", labels) is None


SLOW = """import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.5)  # a busy model: its requests are at Triton most of the time
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (data + 1).astype(data.dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""


async def test_a_busy_neighbour_at_every_crash_is_never_quarantined_with_the_attacker(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    """Another namespace's never idle model has requests at Triton at the first crash of the
    attacker's: that exit counts against neither and puts both on probation; the gateway then
    lets the attacker's requests reach Triton only between the neighbour's, so its next crashes
    find it alone and it is quarantined after 2 of them; the neighbour is served again after
    every restart and never quarantined. Before probation the neighbour was quarantined with it
    at the second crash."""
    table = tmp_path / "gateway" / "callers.json"
    running = await start_custom_agent(
        crash_quarantine_after=2,
        lease_renew_seconds=0.5,
        gateway_table=table,
        gateway_table_refresh_seconds=0.5,
    )
    killer_source = copy_model("add_one", tmp_path / "src", as_name="killer")
    (killer_source / "1" / "model.py").write_text(KILLER)
    busy_source = copy_model("add_one", tmp_path / "src", as_name="busy")
    (busy_source / "1" / "model.py").write_text(SLOW)
    names = await attacker_and_neighbour(
        running, apiserver, kube_api, killer_source, ("busy", busy_source)
    )

    async def ready(model: str) -> bool:
        try:
            entry = await running.agent.triton.state(names[model])
        except TritonUnreachableError:
            return False  # restarting: not yet
        return entry is not None and entry.state == READY

    def callers() -> dict[str, dict[str, Any]]:
        try:
            return {c["address"]: c for c in json.loads(table.read_text())["callers"]}
        except (OSError, ValueError):
            return {}

    await eventually(lambda: set(callers()) == {ATTACKER, NEIGHBOUR}, what="both pods callers")
    served: list[float] = []  # when each of the neighbour's requests was answered 200
    stop = threading.Event()

    def neighbour_sends() -> None:
        while not stop.is_set():
            if infer(url, NEIGHBOUR, "busy", 1.0)[0] == 200:
                served.append(time.monotonic())

    with running_gateway(gateway_settings(triton, table)) as gateway:
        url = gateway.http_url
        tenants = gateway.gateway.tenants

        def neighbour_at_triton() -> bool:
            return any(t.caller.address == NEIGHBOUR and t.limiter.in_flight for t in tenants)

        senders = [threading.Thread(target=neighbour_sends, daemon=True)]
        for sender in senders:
            sender.start()
        try:
            async with kubelet_restarts(triton) as restarts:
                # The first crash finds both at Triton; the next ones find the attacker alone,
                # but for a rare exit the gateway's witness finds ambiguous: one more then.
                crash = 0
                while not callers()[ATTACKER].get("quarantined"):
                    crash += 1
                    assert crash <= 4, "the attacker was not quarantined"
                    await eventually(lambda: ready("killer"), limit=60, what="killer loaded")
                    await eventually(neighbour_at_triton, what="the neighbour at Triton")
                    status, _ = await asyncio.to_thread(infer, url, ATTACKER, "killer", MAGIC)
                    assert status in (0, 502), status  # Triton died under it
                    await eventually(lambda n=crash: len(restarts) == n, what=f"crash {crash}")
                    await eventually(running.agent.triton.live, limit=60, what="Triton back")
                    back = time.monotonic()
                    await eventually(lambda: ready("busy"), limit=60, what="busy reloaded")
                    assert not callers()[NEIGHBOUR].get("quarantined"), f"crash {crash}"
                    await eventually(
                        lambda b=back: bool(served) and served[-1] > b,
                        what=f"the neighbour served after restart {crash}",
                    )
                    if crash == 1:
                        assert not callers()[ATTACKER].get("quarantined"), "ambiguous"
            await eventually(
                lambda: bool(callers()[ATTACKER].get("quarantined")),
                what="the attacker quarantined in the table",
            )
            assert not callers()[NEIGHBOUR].get("quarantined")
            assert callers()[NEIGHBOUR].get("probation")

            def probation_pods() -> bool:
                with urllib.request.urlopen(gateway.metrics_url, timeout=10) as response:
                    return "tritonshare_gateway_probation_pods 1.0" in response.read().decode()

            await eventually(probation_pods, what="the neighbour alone on probation, in metrics")
        finally:
            stop.set()
            for sender in senders:
                await asyncio.to_thread(sender.join, 30)
