"""The CLI at the edges a shell user meets: a reader that goes away (`| head`), an API server
that cannot be reached, and counts that read as sentences."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml

from binder.cli.main import main as cli
from sim.triton import free_port
from tests.binder.objects import GI
from tests.binder.simcluster import add_node

ROOT = Path(__file__).resolve().parents[3]


def _cli_process(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "binder.cli.main", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )


@pytest.mark.parametrize("output", ["json", "text"])
def test_a_closed_pipe_ends_the_cli_quietly(
    kubeconfig: Path, kube_api: kubernetes.client.ApiClient, output: str
) -> None:
    """`tritonshare -o json status | head`: the reader closes its end before the CLI writes.
    Before, Python printed a BrokenPipeError traceback (or "Exception ignored ... BrokenPipeError"
    at exit) and exited 1 or 120."""
    for i in range(3):
        add_node(kube_api, f"gpu-{i}", [16 * GI])
    process = _cli_process("--kubeconfig", str(kubeconfig), "-o", output, "status")
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before the CLI has listed the cluster
    try:
        err = process.stderr.read().decode()
        code = process.wait(timeout=60)
    finally:
        process.stderr.close()
        if process.poll() is None:
            process.kill()
            process.wait()
    assert err == ""
    assert code == 141  # 128 + SIGPIPE, as a shell reports a command SIGPIPE ended


def test_a_reader_that_takes_a_little_gets_it_and_the_cli_ends_quietly(
    kubeconfig: Path, kube_api: kubernetes.client.ApiClient
) -> None:
    """`| head -c 64` with output larger than the pipe holds: the first bytes arrive, then the
    pipe closes mid-write."""
    for i in range(400):
        add_node(kube_api, f"gpu-{i:03d}", [16 * GI, 16 * GI])
    process = _cli_process("--kubeconfig", str(kubeconfig), "-o", "json", "status")
    assert process.stdout is not None and process.stderr is not None
    try:
        head = process.stdout.read(64)
        process.stdout.close()
        err = process.stderr.read().decode()
        code = process.wait(timeout=60)
    finally:
        process.stderr.close()
        if process.poll() is None:
            process.kill()
            process.wait()
    assert head.startswith(b"{")
    assert err == ""
    assert code == 141


def _dead_kubeconfig(path: Path) -> tuple[Path, str]:
    server = f"http://127.0.0.1:{free_port()}"
    document: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "gone", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "u"}}],
        "current-context": "gone",
    }
    path.write_text(yaml.safe_dump(document))
    return path, server


@pytest.mark.parametrize("output", ["text", "json"])
def test_an_unreachable_api_server_is_named_and_exits_1(
    tmp_path: Path, output: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, server = _dead_kubeconfig(tmp_path / "config")
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    out = io.StringIO()
    code = cli(["--kubeconfig", str(config), "-o", output, "status"], out=out)
    assert code == 1
    assert out.getvalue() == ""  # no table, no "0 nodes" that reads as an empty cluster
    message = err.getvalue()
    assert f"the API server {server} cannot be reached" in message
    assert "Connection refused" in message and "check --kubeconfig and --context" in message


def test_counts_read_as_sentences(
    kubeconfig: Path, kube_api: kubernetes.client.ApiClient, core: Any
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    out = io.StringIO()
    assert cli(["--kubeconfig", str(kubeconfig), "status"], out=out) == 0
    assert "\n1 node; GPU memory allocated 0 of 16Gi; 0 pods pending.\n" in out.getvalue()
