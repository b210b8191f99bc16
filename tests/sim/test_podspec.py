"""The simulated kubelet prepares a container's process as a kubelet would: Downward API, $(VAR)
expansion, and mount paths rewritten to the directories standing in for the volumes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sim.podspec import PodSpecError, expand, field_value, plan, rewrite_paths

POD: dict[str, Any] = {
    "metadata": {
        "name": "m-1",
        "namespace": "models",
        "uid": "u-1",
        "annotations": {"tritonshare.io/model-id": "add_one"},
        "labels": {"app": "m"},
    },
    "spec": {"nodeName": "gpu-1", "serviceAccountName": "sa"},
    "status": {"hostIP": "10.0.0.5", "podIP": "10.1.0.9"},
}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("metadata.name", "m-1"),
        ("metadata.namespace", "models"),
        ("metadata.uid", "u-1"),
        ("metadata.annotations['tritonshare.io/model-id']", "add_one"),
        ("metadata.labels['app']", "m"),
        ("metadata.labels['absent']", ""),
        ("spec.nodeName", "gpu-1"),
        ("spec.serviceAccountName", "sa"),
        ("status.hostIP", "10.0.0.5"),
        ("status.podIP", "10.1.0.9"),
    ],
)
def test_downward_api_fields(path: str, value: str) -> None:
    assert field_value(POD, path) == value


def test_an_unsupported_field_is_refused_with_its_name() -> None:
    with pytest.raises(PodSpecError, match=r"status\.podIPs"):
        field_value(POD, "status.podIPs")


def test_expansion_follows_kubernetes_rules() -> None:
    variables = {"A": "1", "B": "two"}
    assert expand("$(A)-$(B)", variables) == "1-two"
    assert expand("$$(A)", variables) == "$(A)", "$$ escapes a reference"
    assert expand("$(UNKNOWN) $A", variables) == "$(UNKNOWN) $A", "unknown references stay"


def test_mount_paths_are_rewritten_as_whole_path_components(tmp_path: Path) -> None:
    mounts = [("/mnt/models", tmp_path / "m"), ("/mnt", tmp_path / "root")]
    assert rewrite_paths("--model-dir=/mnt/models", mounts) == f"--model-dir={tmp_path}/m"
    assert rewrite_paths("/mnt/models/1/model.py", mounts) == f"{tmp_path}/m/1/model.py"
    assert rewrite_paths("/mnt/modelsx", mounts) == f"{tmp_path}/root/modelsx"
    assert rewrite_paths("/srv/mnt/models", mounts) == "/srv/mnt/models", "not a prefix elsewhere"


def test_plan_builds_argv_and_env(tmp_path: Path) -> None:
    container = {
        "name": "loader",
        "command": ["python", "-m", "loader"],
        "args": ["--agent-address=$(HOST_IP):9100", "--token-file=/var/run/t/token"],
        "env": [
            {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
            {"name": "ADDRESS", "value": "$(HOST_IP):9100"},
            {"name": "TOKEN", "value": "/var/run/t/token"},
        ],
        "volumeMounts": [{"name": "token", "mountPath": "/var/run/t"}],
    }
    launch = plan(
        POD,
        container,
        mounts={"token": tmp_path / "token"},
        termination_log=tmp_path / "term",
        base_env={"PATH": "/bin"},
        python="/opt/py",
    )
    assert launch.argv == (
        "/opt/py",
        "-m",
        "loader",
        "--agent-address=10.0.0.5:9100",
        f"--token-file={tmp_path}/token/token",
    )
    assert launch.env["ADDRESS"] == "10.0.0.5:9100"
    assert launch.env["TOKEN"] == f"{tmp_path}/token/token"
    assert launch.env["PATH"] == "/bin"


def test_plan_refuses_what_it_cannot_provide(tmp_path: Path) -> None:
    def attempt(container: dict[str, Any]) -> None:
        plan(POD, container, mounts={}, termination_log=tmp_path / "t", base_env={})

    with pytest.raises(PodSpecError, match="no command"):
        attempt({"name": "c"})
    with pytest.raises(PodSpecError, match="secretKeyRef"):
        attempt(
            {
                "name": "c",
                "command": ["x"],
                "env": [{"name": "S", "valueFrom": {"secretKeyRef": {}}}],
            }
        )
    with pytest.raises(PodSpecError, match="names no volume"):
        attempt({"name": "c", "command": ["x"], "volumeMounts": [{"name": "v", "mountPath": "/v"}]})
