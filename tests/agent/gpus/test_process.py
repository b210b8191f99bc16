"""The agent as others start it: `python -m sim.gpu.agent_node --gpus 2xT4 -- <agent flags>` (which
runs `python -m agent`'s main), found through its ports file, stopped by SIGTERM. Refusals to
start exit 2 with the reason (shown of the process for a missing key and a taken port); the rules
on where its directories may lie are checked by starting it in this process, with the same flags."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import kubernetes.client
import pytest

from agent.errors import AgentError
from agent.settings import parse_settings
from sim.gpu.nvml import MockNvml
from sim.triton import TritonServer
from tests.agent.conftest import NODE, start_agent
from tests.fixtures_sim import write_test_placement_key

pytestmark = pytest.mark.triton


def _wait_for(path: Path, process: subprocess.Popen[bytes], limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not path.exists():
        assert process.poll() is None, "the agent exited while starting"
        assert time.monotonic() < deadline, "the agent did not write its ports file"
        time.sleep(0.05)


def test_agent_process_publishes_gpus_serves_and_stops_on_sigterm(
    kubeconfig: Path,
    kube_api: kubernetes.client.ApiClient,
    node: str,
    triton: TritonServer,
    model_repository: Path,
    tmp_path: Path,
) -> None:
    ports = tmp_path / "ports.json"
    log_path = tmp_path / "agent.log"
    command = [
        sys.executable, "-m", "sim.gpu.agent_node", "--gpus", "2xT4", "--",
        "--node-name", NODE, "--kubeconfig", str(kubeconfig),
        "--triton-http-url", triton.http_url, "--triton-grpc-url", triton.grpc_url,
        "--model-repository", str(model_repository),
        "--listen-grpc", "127.0.0.1:0", "--listen-http", "127.0.0.1:0",
        "--ports-file", str(ports), "--cpu-only",
        "--placement-key-dir", str(write_test_placement_key(tmp_path / "key")),
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_for(ports, process)
        addresses = json.loads(ports.read_text())
        core = kubernetes.client.CoreV1Api(kube_api)
        deadline = time.monotonic() + 30
        while True:
            metadata = core.read_node(NODE).metadata
            annotations = (metadata.annotations if metadata else None) or {}
            if "tritonshare.io/gpus" in annotations:
                break
            assert time.monotonic() < deadline, "the agent never annotated its node"
            time.sleep(0.05)
        gpus = json.loads(annotations["tritonshare.io/gpus"])
        assert [g["product"] for g in gpus] == ["Tesla T4", "Tesla T4"]
        assert int(annotations["tritonshare.io/gpu-mem-total"]) == 2 * 15360 * 1024 * 1024
        # The Lease is renewed right after the annotations are written: poll for it too.
        leases = kubernetes.client.CoordinationV1Api(kube_api)
        deadline = time.monotonic() + 30
        while True:
            try:
                lease = leases.read_namespaced_lease(
                    f"tritonshare-agent-{NODE}", "tritonshare-system"
                )
                break
            except kubernetes.client.ApiException as e:
                assert e.status == 404 and time.monotonic() < deadline, "no agent Lease"
                time.sleep(0.05)
        assert lease.spec is not None and lease.spec.holder_identity
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{addresses['http']}/readyz") as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the agent never became ready"
            time.sleep(0.05)
        with urllib.request.urlopen(f"http://{addresses['http']}/metrics") as response:
            metrics = response.read().decode()
        assert re.search(
            r'tritonshare_agent_gpu_memory_total_bytes\{UUID="GPU-[^"]+",gpu="1"', metrics
        )
        text = log_path.read_text()
        assert f"Agent for node {NODE} is serving gRPC on {addresses['grpc']} " in text
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(30)
    assert code == 0, log_path.read_text()


def test_agent_refuses_missing_settings_with_a_clear_message(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "agent", "--model-repository", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert result.returncode == 2
    assert "--node-name is required" in result.stderr


def test_a_taken_port_is_reported_and_exits_2(kubeconfig: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [
            sys.executable, "-m", "agent", "--node-name", NODE,
            "--kubeconfig", str(kubeconfig), "--model-repository", str(tmp_path / "m"),
            "--listen-grpc", f"127.0.0.1:{port}", "--cpu-only",
            "--placement-key-dir", str(write_test_placement_key(tmp_path / "key")),
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    assert f"cannot listen for gRPC on 127.0.0.1:{port}" in result.stderr


def _agent_start(tmp_path: Path, kubeconfig: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, "-m", "agent", "--node-name", NODE, "--kubeconfig", str(kubeconfig),
        "--listen-grpc", "127.0.0.1:0", "--listen-http", "127.0.0.1:0", "--cpu-only", *flags,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_the_agent_does_not_start_without_placement_keys(kubeconfig: Path, tmp_path: Path) -> None:
    result = _agent_start(tmp_path, kubeconfig, "--model-repository", str(tmp_path / "m"))
    assert result.returncode == 2
    assert "--placement-key-dir is required" in result.stderr
    empty = tmp_path / "empty-key"
    empty.mkdir()
    result = _agent_start(
        tmp_path, kubeconfig, "--model-repository", str(tmp_path / "m"),
        "--placement-key-dir", str(empty),
    )  # fmt: skip
    assert result.returncode == 2
    assert f"cannot read the placement key {empty / 'current'}" in result.stderr


async def _refusal(kubeconfig: Path, mock_nvml: MockNvml, *flags: str) -> str:
    """Why the agent refuses to start with `flags` (and `_agent_start`'s), found by starting it in
    this process: the reason `python -m agent` logs before it exits 2, as the tests above show of
    the process itself for a missing key and a taken port."""
    settings = parse_settings(
        [
            "--node-name", NODE, "--kubeconfig", str(kubeconfig), "--listen-grpc", "127.0.0.1:0",
            "--listen-http", "127.0.0.1:0", "--cpu-only", *flags,
        ]
    )  # fmt: skip
    with pytest.raises(AgentError) as refused:
        await start_agent(settings, mock_nvml)
    return str(refused.value)


@pytest.mark.parametrize("where", ["parent", "same", "inside"])
async def test_staging_and_repository_apart_or_the_agent_refuses_to_start_and_deletes_nothing(
    kubeconfig: Path, tmp_path: Path, mock_nvml: MockNvml, where: str
) -> None:
    repository = tmp_path / "data" / "models"
    model = repository / "victim" / "1"
    model.mkdir(parents=True)
    (model / "model.onnx").write_bytes(b"weights")
    staging = {
        "parent": repository.parent,
        "same": repository,
        "inside": repository / ".staging",
    }[where]
    reason = await _refusal(
        kubeconfig, mock_nvml, "--model-repository", str(repository),
        "--staging-dir", str(staging),
        "--placement-key-dir", str(write_test_placement_key(tmp_path / "key")),
    )  # fmt: skip
    assert "--staging-dir" in reason and "repository" in reason, reason
    assert (model / "model.onnx").read_bytes() == b"weights"


@pytest.mark.parametrize("where", ["repository", "staging", "state"])
async def test_the_kept_files_directory_stays_apart_or_the_agent_refuses_to_start(
    kubeconfig: Path, tmp_path: Path, mock_nvml: MockNvml, where: str
) -> None:
    repository = tmp_path / "data" / "models"
    model = repository / "victim" / "1"
    model.mkdir(parents=True)
    (model / "model.onnx").write_bytes(b"weights")
    kept = {
        "repository": repository / ".kept",
        "staging": tmp_path / "data" / ".tritonshare-staging",
        "state": tmp_path / "data" / ".tritonshare-state",
    }[where]
    reason = await _refusal(
        kubeconfig, mock_nvml, "--model-repository", str(repository),
        "--model-cache-dir", str(kept),
        "--placement-key-dir", str(write_test_placement_key(tmp_path / "key")),
    )  # fmt: skip
    assert "--model-cache-dir" in reason, reason
    assert (model / "model.onnx").read_bytes() == b"weights"
