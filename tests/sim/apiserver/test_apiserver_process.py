"""`python -m sim.apiserver` as a process: announces its URL, writes a kubeconfig, stops on
SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import kubernetes
from kubernetes import client

from sim.apiserver import RunningApiServer
from tests.conftest import require_executable
from tests.fixtures_sim import core_v1


def test_process_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sim.apiserver",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--kubeconfig-out",
            str(kubeconfig),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("sim-apiserver listening on http://127.0.0.1:"), line
        url = line.rsplit(" ", 1)[1].strip()
        configuration = client.Configuration()
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig), client_configuration=configuration
        )
        assert configuration.host == url
        with client.ApiClient(configuration) as api:
            v1 = core_v1(api)
            v1.create_node({"metadata": {"name": "n1"}})
            assert [n.metadata.name for n in v1.list_node().items] == ["n1"]
            names = {n.metadata.name for n in v1.list_namespace().items}
            assert "tritonshare-system" in names
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def test_bad_flags_exit_with_a_usage_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sim.apiserver", "--history-size", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--history-size: '0' must be a whole number of 1 or more" in result.stderr


def test_kubectl_works_against_it(apiserver: RunningApiServer, kubeconfig: Path) -> None:
    kubectl = require_executable("kubectl")
    with apiserver.api_client() as api:
        v1 = core_v1(api)
        v1.create_node({"metadata": {"name": "gpu-1"}})
        v1.create_namespaced_pod(
            "default",
            {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
        )

    def run(*args: str) -> str:
        result = subprocess.run(
            [kubectl, "--kubeconfig", str(kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert "tritonshare-system" in run("get", "ns")
    assert "gpu-1" in run("get", "nodes")
    assert json.loads(run("get", "pod", "p", "-o", "json"))["metadata"]["name"] == "p"
    assert 'pod "p" deleted' in run("delete", "pod", "p")
    assert run("get", "pods", "-n", "default", "-o", "name") == ""
