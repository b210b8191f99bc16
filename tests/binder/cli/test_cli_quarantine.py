"""`tritonshare status` and `tritonshare quarantine list` show what a node quarantined;
`tritonshare quarantine clear NODE MODEL` asks that node's agent to lift one, and refuses a node or
a model that is not there, and files a pod still wants unless --force."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from binder.cli.main import main as cli

SHOWN = json.dumps(
    [{"model": "team-a/resnet", "pod": "team-a/resnet-0", "digest": "ab" * 32, "crashes": 3}]
)


def run_cli(kubeconfig: Path, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = cli(["--kubeconfig", str(kubeconfig), *args], out=out)
    return code, out.getvalue()


@pytest.fixture
def node(kube_api: kubernetes.client.ApiClient) -> Any:
    core: Any = kubernetes.client.CoreV1Api(kube_api)
    annotations = {"tritonshare.io/quarantined": SHOWN}
    core.create_node({"metadata": {"name": "gpu-1", "annotations": annotations}})
    return core


def clear_asked(core: Any) -> str | None:
    annotations = core.read_node("gpu-1").metadata.annotations or {}
    value: str | None = annotations.get("tritonshare.io/quarantine-clear")
    return value


def test_status_lists_the_quarantined_models(kubeconfig: Path, node: Any) -> None:
    code, out = run_cli(kubeconfig, "status")
    assert code == 0
    assert "team-a/resnet on gpu-1: 3 crashes in a row, last for pod team-a/resnet-0" in out
    code, out = run_cli(kubeconfig, "status", "-o", "json")
    assert json.loads(out)["quarantined"] == [
        {
            "node": "gpu-1",
            "kind": "files",
            "namespace": "team-a",
            "model": "team-a/resnet",
            "pod": "team-a/resnet-0",
            "crashes": 3,
            "digest": "ab" * 32,
            "since": "",
            "reason": "Triton exited while loading these files 3 times in a row",
            "wanted_by": [],
        }
    ]


@pytest.mark.parametrize("model", ["team-a/resnet", "resnet", "team-a/resnet-0", "ab" * 6])
def test_clear_asks_the_nodes_agent(kubeconfig: Path, node: Any, model: str) -> None:
    code, out = run_cli(kubeconfig, "quarantine", "clear", "gpu-1", model)
    assert code == 0, out
    assert clear_asked(node) == model


def test_clear_refuses_what_is_not_quarantined(
    kubeconfig: Path, node: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(kubeconfig, "quarantine", "clear", "gpu-1", "team-b/resnet")[0] == 1
    assert "quarantines no model team-b/resnet (it quarantines: team-a/resnet)" in (
        capsys.readouterr().err
    )
    assert run_cli(kubeconfig, "quarantine", "clear", "gpu-9", "resnet")[0] == 1
    assert "node gpu-9 does not exist" in capsys.readouterr().err
    assert run_cli(kubeconfig, "quarantine", "clear", "gpu-1", "ab" * 5)[0] == 1, "too short"
    assert clear_asked(node) is None


LISTED = json.dumps(
    [
        {
            "model": "team-a/resnet",
            "pod": "team-a/resnet-0",
            "digest": "cd" * 32,
            "crashes": 3,
            "since": "2026-11-25T10:00:00Z",
            "wanted_by": ["team-a/resnet-1"],
        },
        {
            "model": "team-b/bert",
            "pod": "team-b/bert-0",
            "uid": "u-1",
            "digest": "",
            "crashes": 2,
            "cause": "requests",
            "since": "2026-11-25T11:00:00Z",
        },
    ]
)


@pytest.fixture
def wanted(kube_api: kubernetes.client.ApiClient) -> Any:
    """Node gpu-2 quarantines files pod team-a/resnet-1 still wants, and a pod's requests."""
    core: Any = kubernetes.client.CoreV1Api(kube_api)
    core.create_node({"metadata": {"name": "gpu-2", "annotations": {QUARANTINED: LISTED}}})
    for namespace in ("team-a", "team-b"):
        core.create_namespace({"metadata": {"name": namespace}})
    core.create_namespaced_pod(
        "team-a",
        {
            "metadata": {"name": "resnet-1"},
            "spec": {"nodeName": "gpu-2", "containers": [{"name": "proxy", "image": "p"}]},
        },
    )
    return core


QUARANTINED = "tritonshare.io/quarantined"


def test_list_prints_every_quarantine(kubeconfig: Path, node: Any, wanted: Any) -> None:
    code, out = run_cli(kubeconfig, "quarantine", "list")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].split() == [
        "NODE", "KIND", "NAMESPACE", "POD/DIGEST", "SINCE", "CRASHES", "REASON"
    ]  # fmt: skip
    assert lines[1].split()[:7] == [
        "gpu-1", "files", "team-a", "abababababab", "(resnet)", "-", "3"
    ]  # fmt: skip
    assert "Triton exited while loading these files 3 times in a row" in lines[1]
    assert lines[2].split()[:7] == [
        "gpu-2", "files", "team-a", "cdcdcdcdcdcd", "(resnet)", "2026-11-25T10:00:00Z", "3"
    ]  # fmt: skip
    assert lines[2].endswith("3 times in a row; still wanted by team-a/resnet-1")
    assert lines[3].split()[:6] == [
        "gpu-2", "pod", "team-b", "team-b/bert-0", "2026-11-25T11:00:00Z", "2"
    ]  # fmt: skip
    assert "its requests were at Triton at 2 of its exits in a row" in lines[3]
    assert len(lines) == 4

    code, out = run_cli(kubeconfig, "quarantine", "list", "gpu-2", "-o", "json")
    rows = json.loads(out)["quarantined"]
    assert [(r["node"], r["kind"], r["wanted_by"]) for r in rows] == [
        ("gpu-2", "files", ["team-a/resnet-1"]),
        ("gpu-2", "pod", []),
    ]
    assert run_cli(kubeconfig, "quarantine", "list", "gpu-9")[0] == 1


def test_list_says_when_nothing_is_quarantined(kubeconfig: Path, kube_api: Any) -> None:
    core: Any = kubernetes.client.CoreV1Api(kube_api)
    core.create_node({"metadata": {"name": "gpu-3"}})
    assert run_cli(kubeconfig, "quarantine", "list") == (0, "Nothing is quarantined.\n")


def test_clear_refuses_files_a_pod_still_wants_unless_forced(
    kubeconfig: Path, wanted: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    def asked() -> str | None:
        value: str | None = (wanted.read_node("gpu-2").metadata.annotations or {}).get(
            "tritonshare.io/quarantine-clear"
        )
        return value

    assert run_cli(kubeconfig, "quarantine", "clear", "gpu-2", "team-a/resnet")[0] == 1
    err = capsys.readouterr().err
    assert "pod team-a/resnet-1 on node gpu-2 still wants the files of team-a/resnet" in err
    assert "--force" in err
    assert asked() is None
    # A pod's own request quarantine names no files: cleared at once.
    assert run_cli(kubeconfig, "quarantine", "clear", "gpu-2", "team-b/bert-0")[0] == 0
    code, out = run_cli(kubeconfig, "quarantine", "clear", "gpu-2", "team-a/resnet", "--force")
    assert code == 0, out
    assert asked() == "team-a/resnet"


def test_clear_goes_ahead_once_the_wanting_pod_has_failed(kubeconfig: Path, wanted: Any) -> None:
    """The agent's list may be a renewal period old: a pod since Failed (or gone) wants
    nothing."""
    wanted.patch_namespaced_pod_status("resnet-1", "team-a", {"status": {"phase": "Failed"}})
    assert run_cli(kubeconfig, "quarantine", "clear", "gpu-2", "team-a/resnet")[0] == 0
    wanted.delete_namespaced_pod("resnet-1", "team-a", grace_period_seconds=0)
    assert run_cli(kubeconfig, "quarantine", "clear", "gpu-2", "cd" * 6)[0] == 0
