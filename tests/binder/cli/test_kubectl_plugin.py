"""The CLI as a kubectl plugin: real kubectl runs `kubectl-tritonshare` from PATH as
`kubectl tritonshare`, and the CLI finds the cluster as kubectl does (--kubeconfig, $KUBECONFIG
with ':'-merged files, ~/.kube/config, --context, -n and the context's namespace), against the
simulated API server."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml

from binder.cli.main import main as cli
from sim.triton import free_port
from tests.binder.objects import GI, pod_obj
from tests.binder.simcluster import add_node
from tests.conftest import require_executable

ROOT = Path(__file__).resolve().parents[3]


def _kubeconfig(path: Path, contexts: dict[str, tuple[str, str | None]], current: str) -> Path:
    """A kubeconfig with one cluster per context: name -> (server URL, namespace or None)."""
    document: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": n, "cluster": {"server": url}} for n, (url, _) in contexts.items()],
        "users": [{"name": "u", "user": {}}],
        "contexts": [
            {"name": n, "context": {"cluster": n, "user": "u", **({"namespace": ns} if ns else {})}}
            for n, (_, ns) in contexts.items()
        ],
        "current-context": current,
    }
    path.write_text(yaml.safe_dump(document))
    return path


def _model_pod(core: Any, namespace: str, name: str, mem: str) -> None:
    obj = pod_obj(name, mem=mem)
    del obj["metadata"]["uid"], obj["metadata"]["creationTimestamp"]
    obj["metadata"]["namespace"] = namespace
    core.create_namespaced_pod(namespace, obj)


@pytest.fixture
def cluster(kube_api: kubernetes.client.ApiClient, core: Any) -> str:
    """One GPU node; pod `big` (8Gi, fits nowhere) in namespace models and pod `small` (1Gi)
    in default. Returns the API server's URL."""
    add_node(kube_api, "gpu-1", [4 * GI])
    core.create_namespace({"metadata": {"name": "models"}})
    _model_pod(core, "models", "big", "8Gi")
    _model_pod(core, "default", "small", "1Gi")
    return str(kube_api.configuration.host)


def run(argv: list[str], monkeypatch: pytest.MonkeyPatch, **env: str) -> tuple[int, str, str]:
    """The CLI in process, with only `env` for KUBECONFIG and HOME."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    out = io.StringIO()
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    code = cli(argv, out=out)
    return code, out.getvalue(), err.getvalue()


def test_context_and_its_namespace_are_kubectls(
    cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    config = _kubeconfig(
        tmp_path / "config",
        {"elsewhere": (dead, "nowhere"), "sim": (cluster, "models")},
        "elsewhere",
    )
    # --context picks the cluster and, without -n, the context's namespace.
    code, text, err = run(
        ["--kubeconfig", str(config), "--context", "sim", "explain", "big"], monkeypatch
    )
    assert code == 0, err
    assert "Pod models/big asks for 8Gi" in text
    # Flags after the command, as `kubectl tritonshare explain POD -n NS --context C` passes them;
    # -n wins over the context's namespace, NAMESPACE/POD over both.
    code, text, err = run(
        ["explain", "small", "-n", "default", "--kubeconfig", str(config), "--context", "sim"],
        monkeypatch,
    )
    assert code == 0, err
    assert "Pod default/small asks for 1Gi" in text
    code, text, _ = run(
        [
            "explain",
            "default/small",
            "--namespace",
            "models",
            "--kubeconfig",
            str(config),
            "--context",
            "sim",
        ],
        monkeypatch,
    )
    assert code == 0 and "Pod default/small" in text
    # The current context is used when none is named: here it points nowhere.
    code, _, err = run(["--kubeconfig", str(config), "status"], monkeypatch)
    assert code == 1 and "could not be read" in err
    code, _, err = run(["status", "--kubeconfig", str(config), "--context", "prod"], monkeypatch)
    assert code == 2
    assert "context 'prod' is not in kubeconfig" in err and "elsewhere, sim" in err


def test_kubeconfig_comes_from_the_environment_or_home_as_for_kubectl(
    cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    first = _kubeconfig(tmp_path / "first", {"elsewhere": (dead, None)}, "elsewhere")
    second = _kubeconfig(tmp_path / "second", {"sim": (cluster, "models")}, "sim")
    home = tmp_path / "home"
    home.mkdir()
    # $KUBECONFIG lists files to merge; the first file's current context wins, as in kubectl,
    # and a context from the second file can be named.
    merged = f"{first}{os.pathsep}{second}"
    code, _, _ = run(["status"], monkeypatch, KUBECONFIG=merged, HOME=str(home))
    assert code == 1
    code, text, err = run(
        ["status", "--context", "sim"], monkeypatch, KUBECONFIG=merged, HOME=str(home)
    )
    assert code == 0, err
    assert text.startswith("NODE") and "gpu-1" in text
    # Without $KUBECONFIG: ~/.kube/config.
    (home / ".kube").mkdir()
    second.rename(home / ".kube" / "config")
    code, text, err = run(["explain", "big"], monkeypatch, HOME=str(home))
    assert code == 0, err
    assert "Pod models/big" in text
    # --kubeconfig wins over both.
    code, _, _ = run(["--kubeconfig", str(first), "status"], monkeypatch, HOME=str(home))
    assert code == 1


def test_kubectl_runs_the_cli_as_its_plugin(cluster: str, tmp_path: Path) -> None:
    """Real kubectl, finding `kubectl-tritonshare` on PATH as pip installs it."""
    kubectl = require_executable("kubectl")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    plugin = bin_dir / "kubectl-tritonshare"
    # What pip writes for the console script `kubectl-tritonshare = "binder.cli.main:main"`.
    plugin.write_text(
        f"#!{sys.executable}\nimport sys\nfrom binder.cli.main import main\nsys.exit(main())\n"
    )
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    config = _kubeconfig(tmp_path / "config", {"sim": (cluster, "models")}, "sim")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
        "KUBECONFIG": str(config),
        "HOME": str(tmp_path),
    }

    def kubectl_tritonshare(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [kubectl, "tritonshare", *args],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    listed = subprocess.run(
        [kubectl, "plugin", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert str(plugin) in listed.stdout, listed.stdout + listed.stderr
    status = kubectl_tritonshare("status")
    assert status.returncode == 0, status.stderr
    assert "gpu-1" in status.stdout and "0 pods pending" not in status.stdout
    explain = kubectl_tritonshare("explain", "small", "-n", "default")
    assert explain.returncode == 0, explain.stderr
    assert "Pod default/small asks for 1Gi" in explain.stdout
    explain = kubectl_tritonshare("explain", "big")
    assert explain.returncode == 0 and "Pod models/big" in explain.stdout
    helped = kubectl_tritonshare("--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: kubectl tritonshare")


def test_the_package_installs_both_commands() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["tritonshare"] == scripts["kubectl-tritonshare"] == "binder.cli.main:main"
