"""The simulated kubelet prepares a container's process as a kubelet would: Downward API, $(VAR)
expansion, mount paths rewritten to the directories standing in for the volumes, the pod's
stand-in network namespace, and the entrypoints of the images it has stand-ins for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sim.node.podnetwork import PodNetwork, pod_network
from sim.node.podspec import (
    PodSpecError,
    expand,
    field_value,
    image_repository,
    plan,
    rewrite_paths,
)

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

    with pytest.raises(PodSpecError, match="has no command"):
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


def test_the_any_address_becomes_the_pods_own_and_connections_leave_from_it(
    tmp_path: Path,
) -> None:
    container = {
        "name": "proxy",
        "command": ["python", "-m", "proxy"],
        "args": ["--listen-http=0.0.0.0:9000", "--upstream=10.0.0.0:80", "--x=0.0.0.01"],
        "env": [
            {"name": "LISTEN", "value": "0.0.0.0:9001"},
            {"name": "OWN_SOURCE", "value": "192.0.2.1"},
        ],
    }
    network = PodNetwork("127.1.0.7", ("SOURCE", "OWN_SOURCE"))
    launch = plan(
        POD,
        container,
        mounts={},
        termination_log=tmp_path / "t",
        base_env={"SOURCE": "inherited"},
        network=network,
    )
    assert launch.argv[3:] == (
        "--listen-http=127.1.0.7:9000",
        "--upstream=10.0.0.0:80",
        "--x=0.0.0.01",
    ), "only the any-address, as a whole address"
    assert launch.env["LISTEN"] == "127.1.0.7:9001"
    assert launch.env["SOURCE"] == "127.1.0.7"
    assert launch.env["OWN_SOURCE"] == "192.0.2.1", "a container's own setting wins"
    # On the host network (no stand-in) the process sees the host's network as written.
    plain = plan(POD, container, mounts={}, termination_log=tmp_path / "t", base_env={})
    assert plain.argv[3] == "--listen-http=0.0.0.0:9000" and "SOURCE" not in plain.env
    assert pod_network("127.0.0.1", "127.0.0.1", ("SOURCE",)) is None
    assert pod_network("127.1.0.7", "127.0.0.1", ("SOURCE",)) == PodNetwork(
        "127.1.0.7", ("SOURCE",)
    )
    # Under a masquerading CNI its connections leave from the node's address; it still listens
    # on its own.
    masqueraded = pod_network("127.1.0.7", "127.0.0.2", ("SOURCE",), masquerade=True)
    assert masqueraded is not None
    assert masqueraded.environment({}) == {"SOURCE": "127.0.0.2"}
    assert masqueraded.rewrite("--listen-http=0.0.0.0:9000") == "--listen-http=127.1.0.7:9000"


@pytest.mark.parametrize(
    ("image", "repository"),
    [
        ("kserve/storage-initializer:v0.14.1", "kserve/storage-initializer"),
        ("docker.io/kserve/storage-initializer:v0.14.1", "kserve/storage-initializer"),
        ("registry.local:5000/kserve/storage-initializer@sha256:ab", "kserve/storage-initializer"),
        ("localhost/kserve/storage-initializer", "kserve/storage-initializer"),
        ("python:3.11", "python"),
    ],
)
def test_image_repositories(image: str, repository: str) -> None:
    assert image_repository(image) == repository


def test_an_image_with_a_stand_in_runs_it_when_the_container_gives_no_command(
    tmp_path: Path,
) -> None:
    container = {
        "name": "storage-initializer",
        "image": "kserve/storage-initializer:v0.14.1",
        "args": ["https://models.example.com/add_one.tar.gz", "/mnt/models"],
        "volumeMounts": [{"name": "model", "mountPath": "/mnt/models"}],
    }
    launch = plan(
        POD,
        container,
        mounts={"model": tmp_path / "model"},
        termination_log=tmp_path / "t",
        base_env={},
        python="/opt/py",
    )
    assert launch.argv == (
        "/opt/py",
        "-m",
        "sim.node.storage_initializer",
        "https://models.example.com/add_one.tar.gz",
        str(tmp_path / "model"),
    )
    with pytest.raises(PodSpecError, match="knows the entrypoints of kserve/storage-initializer"):
        plan(
            POD,
            {**container, "image": "busybox"},
            mounts={"model": tmp_path / "model"},
            termination_log=tmp_path / "t",
            base_env={},
        )


def test_a_local_directory_under_a_mount_path_is_not_rewritten_again() -> None:
    # The webhook mounts an emptyDir at /tmp, and the kubelet's volumes live under /tmp.
    volumes = Path("/tmp/kubelet/pod/volumes")
    mounts = [("/mnt/models", volumes / "model"), ("/tmp", volumes / "tmp")]
    assert rewrite_paths("/mnt/models", mounts) == "/tmp/kubelet/pod/volumes/model"
    assert rewrite_paths("--scratch=/tmp/x", mounts) == "--scratch=/tmp/kubelet/pod/volumes/tmp/x"


def test_a_program_s_own_paths_land_in_the_pod_s_directory(tmp_path: Path) -> None:
    """Paths a program picks itself (the loader's default termination log, the temporary
    directory) come from variables pointing into the pod's directory; a container's own value
    wins, and a volume mounted at /tmp is its temporary directory."""
    container = {"name": "c", "image": "tritonshare", "command": ["python", "-m", "loader"]}
    launch = plan(
        POD, container, mounts={}, termination_log=tmp_path / "term", base_env={},
        scratch=tmp_path / "scratch",
    )  # fmt: skip
    assert launch.env["TRITONSHARE_TERMINATION_LOG"] == str(tmp_path / "term")
    assert launch.env["TMPDIR"] == str(tmp_path / "scratch" / "tmp")
    mounted = {
        **container,
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "env": [{"name": "TRITONSHARE_TERMINATION_LOG", "value": "/var/log/outcome"}],
    }
    launch = plan(
        POD, mounted, mounts={"tmp": tmp_path / "vol"}, termination_log=tmp_path / "term",
        base_env={}, scratch=tmp_path / "scratch",
    )  # fmt: skip
    assert launch.env["TMPDIR"] == str(tmp_path / "vol")
    assert launch.env["TRITONSHARE_TERMINATION_LOG"] == "/var/log/outcome"
