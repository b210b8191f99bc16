"""A Deployment whose model kills Triton on its first load, through the simulated cluster with the
real Triton (restarted after each exit, as the kubelet restarts a crashed container), the real
loader, kubelet, controller manager, binder and agent: after `--crash-quarantine-after` (3) exits
its pod, still in its loader, is marked Failed and says why; the ReplicaSet's replacement, with
the same files, is refused at install with the quarantine's reason (its loader's termination
message) and never reaches Triton; the Failed pod's GPU memory is no longer charged."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import pytest
from kubernetes import watch

from binder.cli.main import main as cli
from sim.cluster import SimCluster
from sim.demo.rollout import deployment_manifest
from sim.demo.scenario import NODES
from sim.processes import wait_until
from sim.triton import TritonInstall
from tests.agent.quarantine.test_quarantine import KILLER
from tests.conftest import copy_model

NAMESPACE = "models"
NODE = NODES[0]
CONDITION = "tritonshare.io/ModelLoaded"


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    with SimCluster(tmp_path / "cluster", [NODE], binders=1, webhook=True) as running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


def supervise(cluster: SimCluster, stop: threading.Event, exits: list[int]) -> None:
    """Count Triton's exits, after each of which its keeper starts it again in its container
    (the node pod's)."""
    triton = cluster.triton
    assert triton is not None
    while not stop.wait(0.05):
        exits[:] = [1] * triton.kept_exits()


def watch_failed(core: Any, stop: threading.Event, seen: list[Any]) -> None:
    """Keep the first pod seen Failed, as the watch showed it (the pod may go soon after)."""
    while not stop.is_set() and not seen:
        watcher: Any = watch.Watch()  # type: ignore[no-untyped-call]
        for event in watcher.stream(core.list_namespaced_pod, NAMESPACE, timeout_seconds=2):
            if event["object"].status.phase == "Failed":
                seen.append(event["object"])
            if seen or stop.is_set():
                watcher.stop()


def condition(pod: Any) -> tuple[str, str, str]:
    for c in pod.status.conditions or []:
        if c.type == CONDITION:
            return c.status, c.reason, c.message
    return "", "", ""


def loader_message(pod: Any) -> str:
    """The termination message of the pod's loader's last failed run."""
    for status in pod.status.init_container_statuses or []:
        for state in (status.state, status.last_state):
            ended = state.terminated if state is not None else None
            if ended is not None and ended.message:
                return str(ended.message)
    return ""


@pytest.mark.slow
@pytest.mark.triton
def test_a_deployments_first_load_crasher_is_failed_and_its_replacement_refused(
    cluster: SimCluster, tmp_path: Path
) -> None:
    assert cluster.model_store is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    apps = cast(Any, kubernetes.client.AppsV1Api(cluster.kube))
    source = copy_model("add_one", tmp_path / "src", as_name="killer")
    (source / "1" / "model.py").write_text(KILLER)
    uri = cluster.model_store.publish("killer", source)
    stop, exits, seen = threading.Event(), list[int](), list[Any]()
    supervisor = threading.Thread(target=supervise, args=(cluster, stop, exits), daemon=True)
    supervisor.start()
    watcher = threading.Thread(target=watch_failed, args=(core, stop, seen), daemon=True)
    watcher.start()
    try:
        apps.create_namespaced_deployment(
            NAMESPACE, deployment_manifest(uri, node=NODE.name, name="killer")
        )

        def pods() -> list[Any]:
            return list(core.list_namespaced_pod(NAMESPACE).items)

        first = wait_until("the crasher's pod marked Failed", lambda: seen and seen[0], 240)
        assert first.status.reason == "ModelCrashedTriton"
        assert "quarantined on this node" in first.status.message
        assert len(exits) == 3, "--crash-quarantine-after 3"
        assert condition(first)[:2] == ("False", "ModelCrashedTriton")
        events = core.list_namespaced_event(
            NAMESPACE, field_selector=f"involvedObject.name={first.metadata.name}"
        ).items
        assert any("quarantined" in (e.message or "") for e in events)

        def refused() -> Any:
            for pod in pods():
                if pod.metadata.name != first.metadata.name and "quarantined" in loader_message(
                    pod
                ):
                    return pod
            return None

        replacement = wait_until("the replacement refused at install", refused, 120)
        message = loader_message(replacement)
        assert "the agent cannot install the model" in message, message
        assert "exited unexpectedly 3 times in a row" in message, message
        wait_until(
            "the replacement's condition",
            lambda: (
                condition(core.read_namespaced_pod(replacement.metadata.name, NAMESPACE))[:2]
                == ("False", "ModelCrashedTriton")
            ),
            60,
        )
        assert len(exits) == 3, "the replacement never reached Triton"
        pod = core.read_namespaced_pod(replacement.metadata.name, NAMESPACE)
        assert pod.status.phase == "Pending", "refused, not failed: it is not replaced in a loop"

        out = io.StringIO()
        assert cli(["--kubeconfig", str(cluster.kubeconfig), "status", "-o", "json"], out=out) == 0
        charged = {
            p["pod"]
            for node in json.loads(out.getvalue())["nodes"]
            for gpu in node["gpus"]
            for p in gpu["pods"]
        }
        kept = core.read_namespaced_pod(first.metadata.name, NAMESPACE)
        assert kept.status.phase == "Failed", "kept, as the kubelet keeps a Failed pod"
        assert f"{NAMESPACE}/{first.metadata.name}" not in charged, "Failed: no GPU memory"
        assert f"{NAMESPACE}/{replacement.metadata.name}" in charged
    finally:
        stop.set()
        supervisor.join()
        watcher.join()
