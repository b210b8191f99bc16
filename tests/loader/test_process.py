"""The loader as a process against the real thing: a real agent process (over a simulated 2xT4
node), a real Triton on the CPU, and sim/'s API server minting the pod's projected token.

A good model ends READY and answers an inference through tritonclient; a restarted pod re-uses
what is installed without sending a byte, or replaces it when its files changed; a model Triton
rejects exits 5 with Triton's reason; a model slower than the timeout exits 6; a refused token or
pod exits 4; an agent that starts late is waited for, and so is one that answers busy for longer
than the loader waits for an unreachable one.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import kubernetes.client
import numpy as np
import pytest
import tritonclient.http as triton_http

from common.contract import TENANT_CODE_NODE, Keys
from loader.errors import ExitCode
from protos import agent_pb2, agent_pb2_grpc
from sim.apiserver import RunningApiServer
from sim.triton import TritonServer, free_port
from tests.agent.conftest import name_in_triton
from tests.conftest import copy_model
from tests.fixtures_sim import core_v1, sign_placement, write_test_placement_key
from tests.loader.loaderprocess import ROOT, LoaderRun, run_loader

pytestmark = [pytest.mark.triton, pytest.mark.slow]

NODE = "gpu-node-1"
NAMESPACE = "default"
DEDICATED = {"name": NODE, "labels": {Keys().tenant_code: TENANT_CODE_NODE}}
"""The node's metadata: dedicated to tenant code, as an agent allowing it requires."""


@dataclass
class AgentProcess:
    """`python -m sim.gpu.agent_node --gpus 2xT4 -- <agent flags>`, stopped by SIGTERM."""

    process: subprocess.Popen[bytes]
    grpc_address: str
    http_address: str
    log: Path

    def metric(self, name: str) -> float:
        """The sum of one metric's samples on the agent's /metrics."""
        with urllib.request.urlopen(f"http://{self.http_address}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
        return sum(float(value) for value in pattern.findall(text))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_agent(
    tmp_path: Path,
    kubeconfig: Path,
    triton: TritonServer,
    repository: Path,
    grpc_port: int = 0,
    *extra: str,
) -> AgentProcess:
    ports = tmp_path / f"agent-ports-{grpc_port}.json"
    log = tmp_path / "agent.log"
    command = [
        sys.executable, "-m", "sim.gpu.agent_node", "--gpus", "2xT4", "--",
        "--node-name", NODE, "--kubeconfig", str(kubeconfig),
        "--triton-http-url", triton.http_url, "--triton-grpc-url", triton.grpc_url,
        "--model-repository", str(repository),
        "--listen-grpc", f"127.0.0.1:{grpc_port}", "--listen-http", "127.0.0.1:0",
        "--ports-file", str(ports), "--cpu-only",
        "--placement-key-dir", str(write_test_placement_key(tmp_path / "placement-key")),
        "--tenant-code-namespaces", NAMESPACE, *extra,
    ]  # fmt: skip
    with log.open("ab") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    agent = AgentProcess(process, "", "", log)
    deadline = time.monotonic() + 60
    try:
        while not ports.exists():
            assert process.poll() is None, f"the agent exited while starting:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"the agent never started:\n{log.read_text()}"
            time.sleep(0.05)
        addresses = json.loads(ports.read_text())
    except BaseException:
        agent.stop()
        raise
    agent.grpc_address = addresses["grpc"]
    agent.http_address = addresses["http"]
    return agent


def make_pod(
    api: kubernetes.client.ApiClient, name: str, model_id: str, *, proven: bool = True
) -> None:
    """A model pod bound to the node, scheduled by tritonshare, as the binder leaves it (with
    its placement proof)."""
    body: Any = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "annotations": {"tritonshare.io/model-id": model_id},
        },
        "spec": {
            "nodeName": NODE,
            "schedulerName": "tritonshare",
            "containers": [{"name": "proxy", "image": "tritonshare"}],
        },
    }
    core_v1(api).create_namespaced_pod(NAMESPACE, body)
    if proven:
        sign_placement(api, NAMESPACE, name)


@dataclass
class Node:
    """One simulated GPU node with its Triton and API server; the agent is started on demand."""

    tmp_path: Path
    apiserver: RunningApiServer
    api: kubernetes.client.ApiClient
    kubeconfig: Path
    triton: TritonServer
    repository: Path

    def pod_token(
        self,
        pod: str,
        model_id: str,
        audience: str = "tritonshare-agent",
        *,
        proven: bool = True,
    ) -> Path:
        make_pod(self.api, pod, model_id, proven=proven)
        path = self.tmp_path / f"token-{pod}"
        path.write_text(self.apiserver.mint_token(NAMESPACE, pod, audience))
        return path

    def load(self, model_dir: Path, model_id: str, address: str, token: Path, *extra: str) -> Any:
        return run_loader(
            self.tmp_path, model_dir, model_id, address, token, "--log-format", "json", *extra
        )


@pytest.fixture
def node(
    tmp_path: Path,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    kubeconfig: Path,
    triton: TritonServer,
    model_repository: Path,
) -> Node:
    # Dedicated to tenant code: the agent lets NAMESPACE run the Python backend.
    core_v1(kube_api).create_node({"apiVersion": "v1", "kind": "Node", "metadata": DEDICATED})
    return Node(tmp_path, apiserver, kube_api, kubeconfig, triton, model_repository)


@pytest.fixture
def agent(node: Node) -> Iterator[AgentProcess]:
    running = start_agent(node.tmp_path, node.kubeconfig, node.triton, node.repository)
    try:
        yield running
    finally:
        running.stop()


def infer_add_one(triton: TritonServer, rows: list[list[float]], name: str) -> Any:
    """OUTPUT0 of add_one for `rows`, asked of Triton through tritonclient."""
    client = triton_http.InferenceServerClient(triton.http_url)
    try:
        assert client.is_model_ready(name)
        data = np.array(rows, dtype=np.float32)
        infer_input = triton_http.InferInput("INPUT0", list(data.shape), "FP32")
        infer_input.set_data_from_numpy(data)
        answer = client.infer(name, [infer_input]).as_numpy("OUTPUT0")
    finally:
        client.close()
    assert answer is not None
    return answer.tolist()


def final_record(run: LoaderRun) -> dict[str, Any]:
    """The loader's last JSON log line."""
    lines = [line for line in run.logs.splitlines() if line.startswith("{")]
    assert lines, run.explain()
    record: dict[str, Any] = json.loads(lines[-1])
    return record


def test_a_good_model_ends_ready_and_restarts_reuse_or_replace_it(
    node: Node, agent: AgentProcess
) -> None:
    model = copy_model("add_one", node.tmp_path / "pod")
    (model / "1" / "weights.bin").write_bytes(bytes(range(256)) * 8192)  # 2 MiB: several chunks
    (model / "1" / "empty.txt").write_bytes(b"")  # created by the agent from the manifest alone
    token = node.pod_token("add-one-0", "add_one")

    first = node.load(model, "add_one", agent.grpc_address, token)
    assert first.returncode == ExitCode.OK, first.explain()
    done = final_record(first)
    size = sum(p.stat().st_size for p in model.rglob("*") if p.is_file())
    assert done["installed"] is True
    assert done["bytes_sent"] == done["model_bytes"] == size
    # Every JSON line of the loader names its model as a field, not only in the sentence.
    records = [json.loads(line) for line in first.logs.splitlines() if line.startswith("{")]
    assert {r.get("model") for r in records} == {"add_one"}
    assert "model add_one is READY on the CPU" in first.termination_message

    # The agent serves it under the pod's private name in Triton.
    name = name_in_triton(node.api, "add-one-0", "add_one", NAMESPACE)
    assert infer_add_one(node.triton, [[1.5, -2.0, 41.0]], name) == [[2.5, -1.0, 42.0]]

    written = agent.metric("tritonshare_agent_install_written_bytes_total")
    installs = agent.metric("tritonshare_agent_installs_total")
    assert written >= size

    # The pod restarts: same model, same files, the node already has them.
    again = node.load(model, "add_one", agent.grpc_address, token)
    assert again.returncode == ExitCode.OK, again.explain()
    record = final_record(again)
    assert record["installed"] is False
    assert record["bytes_sent"] == 0
    assert "nothing sent" in again.termination_message
    assert agent.metric("tritonshare_agent_install_written_bytes_total") == written
    assert agent.metric("tritonshare_agent_installs_total") == installs

    # The storage-initializer fetched a new version of the model before the pod restarted again.
    code = model / "1" / "model.py"
    code.write_text(code.read_text().replace("+ 1", "+ 100"))
    replaced = node.load(model, "add_one", agent.grpc_address, token)
    assert replaced.returncode == ExitCode.OK, replaced.explain()
    assert final_record(replaced)["installed"] is True
    assert "unloading it to install this pod's files" in replaced.logs
    assert infer_add_one(node.triton, [[1.0]], name) == [[101.0]]


def test_a_model_triton_rejects_exits_5_with_tritons_reason(
    node: Node, agent: AgentProcess
) -> None:
    model = copy_model("add_one", node.tmp_path / "pod", as_name="broken")
    (model / "1" / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        "        raise RuntimeError('weights are missing on purpose')\n"
    )
    token = node.pod_token("broken-0", "broken")
    run = node.load(model, "broken", agent.grpc_address, token)
    assert run.returncode == ExitCode.MODEL_REJECTED, run.explain()
    assert "weights are missing on purpose" in run.termination_message
    assert "retrying" not in run.logs, "a rejected model must fail at once"


def test_a_model_slower_than_the_timeout_exits_6(node: Node, agent: AgentProcess) -> None:
    model = copy_model("add_one", node.tmp_path / "pod", as_name="slow")
    code = model / "1" / "model.py"
    code.write_text(
        code.read_text().replace(
            "class TritonPythonModel:",
            "class TritonPythonModel:\n"
            "    def initialize(self, args):\n"
            "        import time\n"
            "        time.sleep(4)\n",
        )
    )
    token = node.pod_token("slow-0", "slow")
    run = node.load(model, "slow", agent.grpc_address, token, "--timeout", "2")
    assert run.returncode == ExitCode.TIMED_OUT, run.explain()
    assert "model slow was not READY after" in run.termination_message
    assert "raise --timeout" in run.termination_message


def test_a_refused_token_or_pod_exits_4_at_once(node: Node, agent: AgentProcess) -> None:
    model = copy_model("add_one", node.tmp_path / "pod")

    forged = node.tmp_path / "forged-token"
    forged.write_text("eyJhbGciOiJSUzI1NiJ9.e30.c2ln")
    refused = node.load(model, "add_one", agent.grpc_address, forged)
    assert refused.returncode == ExitCode.REFUSED, refused.explain()
    assert "the agent refused the token" in refused.termination_message

    # A real token, but from a pod annotated with another model.
    other = node.pod_token("other-0", "other_model")
    denied = node.load(model, "add_one", agent.grpc_address, other)
    assert denied.returncode == ExitCode.REFUSED, denied.explain()
    assert "the agent refused this pod" in denied.termination_message
    assert "other_model" in denied.termination_message

    # A pod created with spec.nodeName: the binder never placed it.
    unplaced = node.pod_token("squatter-0", "add_one", proven=False)
    not_placed = node.load(model, "add_one", agent.grpc_address, unplaced)
    assert not_placed.returncode == ExitCode.REFUSED, not_placed.explain()
    assert "not placed on this node by the tritonshare binder" in not_placed.termination_message

    wrong_audience = node.pod_token("add-one-0", "add_one", audience="someone-else")
    refused_audience = node.load(model, "add_one", agent.grpc_address, wrong_audience)
    assert refused_audience.returncode == ExitCode.REFUSED, refused_audience.explain()


def test_an_agent_that_starts_late_is_waited_for(node: Node) -> None:
    model = copy_model("add_one", node.tmp_path / "pod")
    token = node.pod_token("add-one-0", "add_one")
    port = free_port()
    log = node.tmp_path / "loader.log"
    termination_log = node.tmp_path / "late-termination-log"
    command = [
        sys.executable, "-m", "loader", "--model-dir", str(model), "--model-id", "add_one",
        "--agent-address", f"127.0.0.1:{port}", "--token-file", str(token),
        "--termination-log", str(termination_log), "--timeout", "120",
        # Reconnects at most a second apart (5 s by default): the agent is seen soon after it
        # starts, and the default 30 s without one still bounds the wait.
        "--backoff-max", "1",
    ]  # fmt: skip
    with log.open("w") as out:
        loader = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    agent: AgentProcess | None = None
    try:
        deadline = time.monotonic() + 60
        while log.read_text().count("retrying in") < 2:
            assert loader.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"the loader never retried:\n{log.read_text()}"
            time.sleep(0.05)
        agent = start_agent(node.tmp_path, node.kubeconfig, node.triton, node.repository, port)
        code = loader.wait(timeout=120)
    finally:
        if loader.poll() is None:
            loader.kill()
            loader.wait()
        if agent is not None:
            agent.stop()
    assert code == ExitCode.OK, log.read_text()
    assert "is READY on the CPU" in termination_log.read_text()


def test_an_agent_that_answers_busy_is_retried_past_the_unreachable_budget(node: Node) -> None:
    """Busy (UNAVAILABLE from the agent itself) is no lost agent: the loader keeps asking."""
    agent = start_agent(
        node.tmp_path, node.kubeconfig, node.triton, node.repository, 0,
        "--max-calls-per-namespace", "1",
    )  # fmt: skip
    release = threading.Event()

    def held_open() -> Iterator[agent_pb2.InstallModelRequest]:
        release.wait(120)
        yield from ()

    # Another pod of the namespace holds the namespace's one call open, as a slow install would.
    holder_token = node.pod_token("identity-0", "identity").read_text()
    channel = grpc.insecure_channel(agent.grpc_address)
    held = agent_pb2_grpc.AgentStub(channel).InstallModel.future(
        held_open(), metadata=(("authorization", f"Bearer {holder_token}"),), timeout=120
    )
    model = copy_model("add_one", node.tmp_path / "pod")
    token = node.pod_token("add-one-0", "add_one")
    log = node.tmp_path / "loader.log"
    termination_log = node.tmp_path / "busy-termination-log"
    command = [
        sys.executable, "-m", "loader", "--model-dir", str(model), "--model-id", "add_one",
        "--agent-address", agent.grpc_address, "--token-file", str(token),
        "--termination-log", str(termination_log), "--timeout", "120",
        "--agent-unreachable-seconds", "1", "--backoff-max", "0.3",
    ]  # fmt: skip
    try:
        with log.open("w") as out:
            loader = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        try:
            started = time.monotonic()
            deadline = started + 60
            # Busy for three times the unreachable budget, and still retrying.
            while time.monotonic() - started < 3 or "already has 1 calls" not in log.read_text():
                assert loader.poll() is None, log.read_text()
                assert time.monotonic() < deadline, (
                    f"the loader never met a busy agent:\n{log.read_text()}"
                )
                time.sleep(0.05)
            release.set()
            code = loader.wait(timeout=120)
        finally:
            if loader.poll() is None:
                loader.kill()
                loader.wait()
    finally:
        release.set()
        channel.close()
        agent.stop()
    assert not held.running()
    assert code == ExitCode.OK, log.read_text()
    assert "is READY on the CPU" in termination_log.read_text()
