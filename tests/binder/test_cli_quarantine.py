"""`tritonshare status` lists the models a node quarantined; `tritonshare quarantine clear NODE
MODEL` asks that node's agent to lift one, and refuses a node or a model that is not there."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from binder.cli import main as cli

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
            "model": "team-a/resnet",
            "pod": "team-a/resnet-0",
            "crashes": 3,
            "digest": "ab" * 32,
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
