"""A TritonModel its host's loader cannot serve says why on the TritonModel, end to end on the
simulated cluster with the real processes and a real Triton, within seconds of the loader's
own log line: a spec.modelName that is not the name in its files' config.pbtxt reads ModelInvalid
naming both names; a config.pbtxt Triton refuses reads ModelInvalid with Triton's message; a
storageUri that is a 404 reads FetchFailed (`test_tritonmodel_hosts`). Each is the Ready
condition's reason with the node and the cause, the replica's message in status.placements, a
Warning Event on the TritonModel, a line of `kubectl get tm`, of `tritonshare status`
and of `tritonshare explain tm/NAME`."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import pytest

from binder.cli.main import main as cli
from common.hosted import host_name
from sim.cluster import SimCluster
from sim.demo.scenario import MODELS_DIR, NODES
from sim.triton import TritonInstall
from tests.conftest import require_executable

NODE = NODES[0]
NAMESPACE = "team-a"
GROUP, VERSION, PLURAL = "tritonshare.io", "v1alpha1", "tritonmodels"
SAID_WITHIN_SECONDS = 10.0
"""From the loader's log line to the TritonModel's Ready condition, at most."""


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    with SimCluster(
        tmp_path / "cluster", [NODE], binders=1, webhook=True, tenant_code_namespaces=(NAMESPACE,)
    ) as running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


def _model(name: str, uri: str, model_name: str = "") -> dict[str, Any]:
    spec = {"storageUri": uri, "gpuMemory": "1Gi", "replicas": 1}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TritonModel",
        "metadata": {"name": name},
        "spec": spec | ({"modelName": model_name} if model_name else {}),
    }


def _refused_by_triton(directory: Path) -> Path:
    """add_one's files with a config.pbtxt that parses, names no model, and that Triton refuses
    (an input without dims)."""
    shutil.copytree(MODELS_DIR / "add_one", directory, ignore=shutil.ignore_patterns("__pycache__"))
    config = directory / "config.pbtxt"
    text = config.read_text().replace('name: "add_one"\n', "")
    config.write_text(
        text.replace("data_type: TYPE_FP32 dims: [ -1 ] }", "data_type: TYPE_FP32 }", 1)
    )
    return directory


def _ready(custom: Any, name: str) -> dict[str, Any]:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
    conditions = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}
    found: dict[str, Any] = conditions.get("Ready") or {}
    return found


def _said(
    cluster: SimCluster, custom: Any, name: str, model_id: str, reason: str
) -> tuple[dict[str, Any], float]:
    """`name`'s Ready condition once it reads `reason`, and the seconds from the host's loader's
    log line about its replica (of model `model_id`) to then."""
    logs = cluster.workdir.rglob(f"{NAMESPACE}_{host_name(NODE.name)}_*/logs/loader.log")
    line = f"Model {model_id}.0 is not served by this host"
    seen = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if seen is None and any(line in log.read_text() for log in logs):
            seen = time.monotonic()
        logs = cluster.workdir.rglob(f"{NAMESPACE}_{host_name(NODE.name)}_*/logs/loader.log")
        ready = _ready(custom, name)
        if ready.get("reason") == reason:
            assert seen is not None or any(line in log.read_text() for log in logs), ready
            return ready, time.monotonic() - (seen or time.monotonic())
        if seen is not None and time.monotonic() - seen > SAID_WITHIN_SECONDS:
            raise AssertionError(
                f"{name}: the loader said why {SAID_WITHIN_SECONDS:g} s ago, but Ready reads "
                f"{ready.get('reason')}: {ready.get('message')}"
            )
        time.sleep(0.1)
    raise AssertionError(f"{name}: the host's loader never said why it does not serve it")


def _cli(cluster: SimCluster, *args: str) -> str:
    out = io.StringIO()
    assert cli(["--kubeconfig", str(cluster.kubeconfig), *args], out=out) == 0, out.getvalue()
    return out.getvalue()


@pytest.mark.slow
@pytest.mark.triton
def test_a_replica_its_host_cannot_load_says_why_on_its_tritonmodel_at_once(
    cluster: SimCluster, tmp_path: Path
) -> None:
    assert cluster.model_store is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    add_one = cluster.model_store.publish("add_one", MODELS_DIR / "add_one", release="a")
    refused = cluster.model_store.publish(
        "refused", _refused_by_triton(tmp_path / "refused"), release="a"
    )
    # add_one's config.pbtxt names the model add_one: served as other_name, it cannot be.
    custom.create_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, _model("wrongname", add_one, "other_name")
    )
    custom.create_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, _model("refused", refused)
    )

    mismatch, seconds = _said(cluster, custom, "wrongname", "other_name", "ModelInvalid")
    print(f"wrongname: ModelInvalid {seconds:.1f} s after the loader's log line")
    message = mismatch["message"]
    assert mismatch["status"] == "False", mismatch
    assert f"replica 0 on {NODE.name}: ModelInvalid: " in message, message
    assert "'add_one'" in message and "'other_name'" in message, message
    rejected, seconds = _said(cluster, custom, "refused", "refused", "ModelInvalid")
    print(f"refused: ModelInvalid {seconds:.1f} s after the loader's log line")
    assert "Triton" in rejected["message"] and "dims" in rejected["message"], rejected

    for name, words in (("wrongname", "'other_name'"), ("refused", "dims")):
        said = core.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={name}")
        found = [e for e in said.items if e.reason == "ReplicaNotServed" and words in e.message]
        assert [e.type for e in found] == ["Warning"], said.items
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
        [placement] = obj["status"]["placements"]
        assert placement["ready"] is False and words in placement["message"], placement

    table = subprocess.run(
        [require_executable("kubectl"), "get", "tm", "-n", NAMESPACE],
        env=dict(os.environ, KUBECONFIG=str(cluster.kubeconfig)),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    [row] = [line for line in table.splitlines() if line.startswith("wrongname ")]
    assert "ModelInvalid" in row and "'add_one'" in row and "'other_name'" in row, table

    status = _cli(cluster, "status", "-n", NAMESPACE)
    assert "team-a/wrongname replica 0" in status and "'other_name'" in status, status
    explained = _cli(cluster, "explain", "tm/wrongname", "-n", NAMESPACE)
    assert "ModelInvalid" in explained and "'other_name'" in explained, explained
    assert "'add_one'" in explained, explained
