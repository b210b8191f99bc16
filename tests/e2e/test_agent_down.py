"""A node's agent killed for good (Triton and the gateway keep running): the pod it served keeps
being served, every model pod on the node gets ModelLoaded=Unknown and a NodeAgentDown Event once
the agent's Lease expires, a pod placed there just after the death fails its loader fast with
the reason instead of waiting out its 600 s timeout, and after --agent-down-grace the binder
deletes the controller-owned pods, whose replacements it places on a node with a live agent.

Short settings so it runs in about half a minute: agent Lease 8 s (renewed every 2 s), the
loader's --agent-unreachable-seconds 6 s (30 s by default), grace 14 s (above the loader's
budget, so its fast exit shows first).
The figures are printed: pytest tests/e2e/test_agent_down.py -s -q
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

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
LEASE_SECONDS = 8
LOADER_UNREACHABLE_SECONDS = 6
GRACE_SECONDS = 14
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
            "TRITONSHARE_LEASE_DURATION_SECONDS": str(LEASE_SECONDS),
            "TRITONSHARE_LEASE_RENEW_SECONDS": "2",
            "TRITONSHARE_AGENT_DOWN_GRACE": str(GRACE_SECONDS),
            # The pods' loaders read it from the environment the simulated kubelet gives them.
            "TRITONSHARE_AGENT_UNREACHABLE_SECONDS": str(LOADER_UNREACHABLE_SECONDS),
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
            "annotations": {"tritonshare.io/model-uri": uri, "tritonshare.io/gpu-mem": "1Gi"},
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


def _loader_ended(core: Any, name: str) -> Any:
    pod = core.read_namespaced_pod(name, NAMESPACE)
    for status in pod.status.init_container_statuses or []:
        if status.name != "loader":
            continue
        for state in (status.state, status.last_state):
            if state is not None and state.terminated is not None:
                return state.terminated
    return None


def _deleting(core: Any, name: str) -> bool:
    pods = {p.metadata.name: p for p in core.list_namespaced_pod(NAMESPACE).items}
    return name not in pods or pods[name].metadata.deletion_timestamp is not None


def _bound_to(core: Any, name: str) -> str:
    return str(core.read_namespaced_pod(name, NAMESPACE).spec.node_name or "")


@pytest.mark.slow
@pytest.mark.triton
def test_a_dead_agent_s_pods_are_served_marked_and_after_the_grace_replaced_elsewhere(
    cluster: SimCluster,
) -> None:
    assert cluster.model_store is not None
    core = cluster.core
    uri = cluster.model_store.publish("add_one", MODELS_DIR / "add_one")
    core.create_namespaced_pod(NAMESPACE, model_pod("served", uri, REAL.name))
    served = wait_until("pod served Ready", partial(_ready, core, "served"), 150)
    assert served.spec.node_name == REAL.name

    probe = Probe(served.status.pod_ip, "add_one", "INPUT0", [1, 3])
    stop = threading.Event()
    thread = threading.Thread(target=probe.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until("the probe answered", lambda: probe.answered, 30)
        killed_at = time.monotonic()
        cluster.kill_agent(REAL.name)
        # A pod created just after the death, while the agent's Lease still looks live.
        late_uri = cluster.model_store.publish("late_one", MODELS_DIR / "add_one")
        core.create_namespaced_pod(NAMESPACE, model_pod("late", late_uri, REAL.name))

        marked = {
            name: wait_until(f"{name} marked", partial(_condition, core, name), LEASE_SECONDS + 30)
            for name in ("served", "late")
        }
        marked_at = time.monotonic()
        late_node = _bound_to(core, "late")
        ended = wait_until("late's loader ended", partial(_loader_ended, core, "late"), 60)
        loader_failed_at = time.monotonic()
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
    for condition in marked.values():
        assert condition.reason == "AgentUnreachable"
        assert f"node {REAL.name} has not renewed its Lease" in condition.message
    events = [e for e in core.list_namespaced_event(NAMESPACE).items if e.reason == "NodeAgentDown"]
    assert {e.involved_object.name for e in events} >= {"served", "late"}
    assert late_node == REAL.name, "placed before the Lease expired"
    assert ended.exit_code == 7 and "unreachable" in (ended.message or ""), ended
    wait_until("late deleted", partial(_deleting, core, "late"), 30)

    # The controller's part: replacements, placed on the node whose agent lives.
    for name in ("served-2", "late-2"):
        core.create_namespaced_pod(
            NAMESPACE, model_pod(name, uri if name == "served-2" else late_uri, None)
        )

        def placed(name: str = name) -> str:
            return _bound_to(core, name)

        assert wait_until(f"{name} bound", placed, 30) == OTHER.name
    print(
        f"\nagent killed; its pods marked after {marked_at - killed_at:.1f} s (Lease "
        f"{LEASE_SECONDS} s); the late pod's loader failed (exit 7) "
        f"{loader_failed_at - killed_at:.1f} s after the death; pods deleted "
        f"{deleted_at - killed_at:.1f} s after it (grace {GRACE_SECONDS} s); served pod answered "
        f"{len(answered_while_down)} probes meanwhile, longest gap {probe.longest_gap():.1f} s"
    )
