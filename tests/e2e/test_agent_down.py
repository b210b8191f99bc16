"""A node's agent killed for good (Triton and the gateway keep running): the pod it served keeps
being served, every model pod on the node gets ModelLoaded=Unknown and a NodeAgentDown Event once
the agent's Lease expires, a ReplicaSet's pod placed there just after the death (while the Lease
still looks live) is failed with the reason within 30 s and replaced on the node whose agent
lives, and after --agent-down-grace the binder deletes the controller-owned pods, whose
replacements it places on a node with a live agent.

The agent's Lease and the loader's budget are the defaults (15 s, renewed every 5 s; 15 s); the
grace is 14 s, so it runs in under a minute.
The figures are printed: pytest tests/e2e/test_agent_down.py -s -q
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import pytest

from common.contract import Keys
from sim.cluster import SimCluster
from sim.demo.scenario import MODELS_DIR, NODES
from sim.processes import wait_until
from sim.triton import TritonInstall
from tests.e2e.test_node_pod_replacement import Probe
from tests.e2e.test_short_form import NAMESPACE, _ready

KEYS = Keys()
REAL, OTHER = NODES[0], NODES[1]
LEASE_SECONDS = 15
GRACE_SECONDS = 14
PROMISED_SECONDS = 30
CONTROLLER = {
    "apiVersion": "apps/v1",
    "kind": "ReplicaSet",
    "name": "add-one-7d9f",
    "uid": "0b7e6a8e-1b1c-4c55-9a55-3f0d2f1e9c01",
    "controller": True,
}


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    running = SimCluster(tmp_path / "cluster", [REAL, OTHER], binders=1, webhook=True)
    running.env.update(
        {
            "TRITONSHARE_AGENT_DOWN_GRACE": str(GRACE_SECONDS),
            "TRITONSHARE_AGENT_DOWN_DELETIONS_PER_SECOND": "10",
        }
    )
    with running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


def model_pod(name: str, uri: str, node: str | None) -> dict[str, Any]:
    """A short-form pod owned by a (stand-in) ReplicaSet, pinned to `node` when given."""
    spec: dict[str, Any] = {"containers": []}
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"tritonshare.io/role": "model"},
            "annotations": {
                "tritonshare.io/model-uri": uri,
                "tritonshare.io/model-id": "add_one",
                "tritonshare.io/gpu-mem": "1Gi",
            },
            "ownerReferences": [CONTROLLER],
        },
        "spec": spec,
    }


def _condition(core: Any, name: str) -> Any:
    pod = core.read_namespaced_pod(name, NAMESPACE)
    for condition in pod.status.conditions or []:
        if condition.type == KEYS.model_loaded and condition.status == "Unknown":
            return condition
    return None


def replica_set(name: str, uri: str, model_id: str) -> dict[str, Any]:
    """A ReplicaSet of one short-form model pod, placed wherever the binder finds room."""
    labels = {"tritonshare.io/role": "model", "app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "tritonshare.io/model-uri": uri,
                        "tritonshare.io/model-id": model_id,
                        "tritonshare.io/gpu-mem": "1Gi",
                    },
                },
                # A template needs a container: the webhook fills this one in.
                "spec": {
                    "containers": [{"name": "proxy", "image": "ghcr.io/tritonshare/tritonshare"}]
                },
            },
        },
    }


def _pods_of(core: Any, app: str) -> list[Any]:
    return list(core.list_namespaced_pod(NAMESPACE, label_selector=f"app={app}").items)


def _failed(core: Any, name: str) -> Any:
    pod = core.read_namespaced_pod(name, NAMESPACE)
    return pod if pod.status and pod.status.phase == "Failed" else None


def _cordon(core: Any, node: str, unschedulable: bool) -> None:
    core.patch_node(node, {"spec": {"unschedulable": unschedulable}})


def _deleting(core: Any, name: str) -> bool:
    pods = {p.metadata.name: p for p in core.list_namespaced_pod(NAMESPACE).items}
    return name not in pods or pods[name].metadata.deletion_timestamp is not None


def _bound_to(core: Any, name: str) -> str:
    return str(core.read_namespaced_pod(name, NAMESPACE).spec.node_name or "")


@pytest.mark.slow
@pytest.mark.triton
def test_a_dead_agent_s_pods_are_served_marked_and_failed_or_after_the_grace_replaced(
    cluster: SimCluster,
) -> None:
    assert cluster.model_store is not None
    core = cluster.core
    apps = cast(Any, kubernetes.client.AppsV1Api(cluster.kube))
    uri = cluster.model_store.publish("add_one", MODELS_DIR / "add_one")
    core.create_namespaced_pod(NAMESPACE, model_pod("served", uri, REAL.name))
    served = wait_until("pod served Ready", partial(_ready, core, "served"), 150)
    assert served.spec.node_name == REAL.name
    late_uri = cluster.model_store.publish("late_one", MODELS_DIR / "add_one")

    probe = Probe(served.status.pod_ip, "add_one", "INPUT0", [1, 3])
    stop = threading.Event()
    thread = threading.Thread(target=probe.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until("the probe answered", lambda: probe.answered, 30)
        # The other node is cordoned, so the ReplicaSet's first pod goes to the dying one.
        _cordon(core, OTHER.name, True)
        killed_at = time.monotonic()
        cluster.kill_agent(REAL.name)
        # Created just after the death, while the agent's Lease still looks live.
        apps.create_namespaced_replica_set(NAMESPACE, replica_set("late", late_uri, "late_one"))
        first = wait_until(
            "late's pod bound", lambda: [p for p in _pods_of(core, "late") if p.spec.node_name], 30
        )[0]
        _cordon(core, OTHER.name, False)
        failed = wait_until(
            "late's pod failed", partial(_failed, core, first.metadata.name), LEASE_SECONDS + 30
        )
        failed_at = time.monotonic()
        replacement = wait_until(
            "late's replacement bound",
            lambda: [
                p
                for p in _pods_of(core, "late")
                if p.metadata.name != first.metadata.name and p.spec.node_name
            ],
            30,
        )[0]
        replaced_at = time.monotonic()
        marked = wait_until(
            "served marked", partial(_condition, core, "served"), LEASE_SECONDS + 30
        )
        marked_at = time.monotonic()
        wait_until("served deleted", partial(_deleting, core, "served"), GRACE_SECONDS + 30)
        deleted_at = time.monotonic()
    finally:
        stop.set()
        thread.join(10)

    # Served throughout, up to its deletion (the gateway keeps its last caller table).
    answered_while_down = [t for t in probe.answered if killed_at < t < deleted_at]
    assert answered_while_down and deleted_at - answered_while_down[-1] < 10, (
        probe.longest_gap(),
        probe.failed,
    )
    assert marked.reason == "AgentUnreachable"
    assert f"node {REAL.name} has not renewed its Lease" in marked.message

    # The pod placed on the dead node: failed with the reason, for its ReplicaSet to replace.
    assert first.spec.node_name == REAL.name, "placed before the Lease expired"
    pod = failed
    assert pod.status.reason == "AgentUnreachable", pod.status
    assert f"node {REAL.name} has not renewed its Lease" in (pod.status.message or "")
    loaded = [c for c in pod.status.conditions or [] if c.type == KEYS.model_loaded]
    assert [(c.status, c.reason) for c in loaded] == [("False", "AgentUnreachable")]
    events = [e for e in core.list_namespaced_event(NAMESPACE).items if e.reason == "NodeAgentDown"]
    assert {e.involved_object.name for e in events} >= {"served", first.metadata.name}
    assert replacement.spec.node_name == OTHER.name
    assert failed_at - killed_at < PROMISED_SECONDS
    assert replaced_at - killed_at < PROMISED_SECONDS

    # The served pod's controller's part: a replacement, placed on the node whose agent lives.
    core.create_namespaced_pod(NAMESPACE, model_pod("served-2", uri, None))
    assert wait_until("served-2 bound", partial(_bound_to, core, "served-2"), 30) == OTHER.name
    print(
        f"\nagent killed (Lease {LEASE_SECONDS} s); a ReplicaSet's pod placed there after the "
        f"death failed {failed_at - killed_at:.1f} s after it and was replaced on {OTHER.name} "
        f"{replaced_at - killed_at:.1f} s after it; the served pod marked after "
        f"{marked_at - killed_at:.1f} s, deleted after {deleted_at - killed_at:.1f} s (grace "
        f"{GRACE_SECONDS} s); it answered {len(answered_while_down)} probes meanwhile, longest "
        f"gap {probe.longest_gap():.1f} s"
    )
