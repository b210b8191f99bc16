"""`tritonshare status|explain` against the simulated API server, and `python -m binder` as a
process (serves, schedules, stops cleanly on SIGTERM; refuses bad flags with exit code 2)."""

from __future__ import annotations

import io
import json
import platform
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes.client

from binder.cli.main import main as cli
from common.tritonname import private_triton_name
from common.version import VERSION
from sim.triton import free_port
from tests.binder.objects import GI, KEYS
from tests.binder.simcluster import MakeBinder, add_node, add_pod, eventually, node_of
from tests.fixtures_sim import PlacementKeys

ROOT = Path(__file__).resolve().parents[3]


def run_cli(kubeconfig: Path, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = cli(["--kubeconfig", str(kubeconfig), *args], out=out)
    return code, out.getvalue()


async def test_status_lists_gpus_with_capacity_allocation_and_models(
    kubeconfig: Path, kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI, 16 * GI])
    core.create_node({"metadata": {"name": "cpu-only"}})
    await make_binder()
    add_pod(core, "resnet", mem="4Gi")
    add_pod(core, "bert", mem="6Gi")
    await eventually(lambda: node_of(core, "resnet") and node_of(core, "bert"))
    code, text = run_cli(kubeconfig, "status")
    assert code == 0
    lines = text.splitlines()
    assert re.split(r"\s{2,}", lines[0]) == [
        "NODE", "AGENT", "GPU", "UUID", "PRODUCT", "CAPACITY", "ALLOCATED", "LOADED", "SLEEPING",
        "FREE", "USED", "PODS: MODEL (REQUEST, MEASURED)",
    ]  # fmt: skip
    gpu_rows = [re.split(r"\s{2,}", line) for line in lines if line.startswith("gpu-1")]
    # binpack put both models on one GPU, keeping the other whole.
    assert sorted(row[11] for row in gpu_rows) == [
        "-",
        "default/bert: bert (asks 6Gi), default/resnet: resnet (asks 4Gi)",
    ]
    full = next(row for row in gpu_rows if row[11] != "-")
    assert full[5:11] == ["16Gi", "10Gi", "0", "0", "6Gi", "-"]
    # The agent's measurements (by the model's private name in Triton) show beside the requests,
    # and the binder counts the larger.
    resnet = private_triton_name(
        "default", "resnet", core.read_namespaced_pod("resnet", "default").metadata.uid
    )
    usage = {full[3]: {"used": 9 * GI, "models": {resnet: 7 * GI}}}
    core.patch_node("gpu-1", {"metadata": {"annotations": {KEYS.gpu_usage: json.dumps(usage)}}})

    def measured_row() -> list[str] | None:
        _, text = run_cli(kubeconfig, "status")
        rows = [re.split(r"\s{2,}", line) for line in text.splitlines()]
        return next(
            (r for r in rows if r[0] == "gpu-1" and r[3] == full[3] and "uses" in r[11]), None
        )

    row = await eventually(measured_row, what="the measured figure in the status")
    assert row[6:12] == [
        "13Gi",
        "7Gi",
        "0",
        "3Gi",
        "9Gi",
        "default/bert: bert (asks 6Gi), default/resnet: resnet (asks 4Gi, uses 7Gi)",
    ]
    assert any(line.startswith("cpu-only") and "no GPUs published" in line for line in lines)
    assert "GPU memory allocated 10Gi of 32Gi; 0 pods pending." in text
    _, explained = run_cli(kubeconfig, "explain", "default/resnet")
    assert "Its model is measured to use 7Gi (it asked for 4Gi); the binder counts 7Gi." in (
        explained
    )
    assert f"Its model's name in Triton (Triton's log and nv_* series) is {resnet}" in explained


async def test_explain_gives_each_node_its_reasons(
    kubeconfig: Path, kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    taint = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
    add_node(kube_api, "small", [4 * GI])
    add_node(kube_api, "tainted", [16 * GI], taints=[taint])
    add_pod(core, "big", mem="8Gi")
    code, text = run_cli(kubeconfig, "explain", "default/big")
    assert code == 0
    assert "Pod default/big asks for 8Gi of GPU memory for model big." in text
    assert (
        "It fits nowhere now: 0/2 nodes are available: 1 Insufficient GPU memory (largest free "
        "block 4Gi), 1 node(s) had untolerated taint {dedicated: ml}." in text
    )
    rows = {line.split()[0]: line for line in text.splitlines()[3:]}
    assert "Insufficient GPU memory: needs 8Gi, the largest free block is 4Gi" in rows["small"]
    assert "node(s) had untolerated taint {dedicated: ml}" in rows["tainted"]
    code, _ = run_cli(kubeconfig, "explain", "-n", "default", "missing")
    assert code == 1


def wait_for(check: Callable[[], Any], what: str, within: float = 30.0) -> Any:
    deadline = time.monotonic() + within
    while not (result := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return result


def test_python_m_binder_serves_schedules_and_stops_on_sigterm(
    kubeconfig: Path,
    kube_api: kubernetes.client.ApiClient,
    core: Any,
    placement_keys: PlacementKeys,
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable, "-m", "binder", "--kubeconfig", str(kubeconfig),
            "--listen-http", f"127.0.0.1:{port}", "--identity", "proc",
            "--placement-key-dir", str(placement_keys.directory),
            "--lease-duration", "3", "--renew-deadline", "2", "--retry-period", "0.5",
        ],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                    return bool(r.status == 200 and b"leader" in r.read())
            except OSError:
                return False

        wait_for(ready, "/readyz to say leader")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        build = f'python="{platform.python_version()}",version="{VERSION}"'
        assert f"tritonshare_build_info{{{build}}} 1.0" in metrics
        add_pod(core, "m", mem="1Gi")
        assert wait_for(lambda: node_of(core, "m"), "the pod to be bound") == "gpu-1"
        process.send_signal(signal.SIGTERM)
        _, errors = process.communicate(timeout=30)
        assert process.returncode == 0, errors
        assert "Released the leader lease" in errors
        assert f"The binder of tritonshare {VERSION} is starting." in errors
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def test_a_binder_without_an_api_server_is_alive_not_ready_and_stops_on_sigterm(
    tmp_path: Path, placement_keys: PlacementKeys
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        f"apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: "
        f"'http://127.0.0.1:{free_port()}'}}}}]\nusers: [{{name: u, user: {{}}}}]\n"
        f"contexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n"
    )
    port = free_port()
    argv = [sys.executable, "-m", "binder", "--kubeconfig", str(kubeconfig)]
    argv += ["--listen-http", f"127.0.0.1:{port}"]
    argv += ["--placement-key-dir", str(placement_keys.directory)]
    process = subprocess.Popen(argv, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:

        def status(path: str) -> int:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                    return int(r.status)
            except urllib.error.HTTPError as e:
                return int(e.code)
            except OSError:
                return 0

        wait_for(lambda: status("/healthz") == 200, "/healthz")
        assert status("/readyz") == 503
        process.send_signal(signal.SIGTERM)
        _, errors = process.communicate(timeout=30)
        assert process.returncode == 0, errors
        assert "Connection refused" in errors  # it kept trying instead of exiting
        assert "Exception in thread" not in errors  # and no cache thread died of it
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def test_bad_flags_exit_2_with_the_reason() -> None:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "binder", "--policy", "random"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--policy: 'random' is neither 'binpack' nor 'spread'" in result.stderr
    assert time.monotonic() - started < 60
