"""A GPU node lost whole (every process of it SIGKILLed, its kubelet silent) on two real nodes of
the simulated cluster: the node lifecycle controller marks it Ready=Unknown and taints it
`unreachable` after its grace, the host serving a lone TritonModel replica there is evicted after
its toleration, the binder places the replica on the other node (not on the tainted one), and
the model answers there; booted again, the node is Ready and untainted.

The grace (4 s), the heartbeat (1 s) and the unreachable toleration (3 s) are short here; kube's
are 40-50 s, 10 s and 300 s.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import numpy as np
import pytest
import tritonclient.http as httpclient

from common.contract import Keys
from common.hosted import serves_label
from sim.cluster import NodeSpec, SimCluster
from sim.controllers.nodelifecycle import UNREACHABLE
from sim.demo.scenario import MODELS_DIR
from sim.processes import wait_until
from sim.triton import TritonInstall

NODES = (NodeSpec("gpu-a", "1xT4", real=True), NodeSpec("gpu-b", "1xT4", real=True))
NAMESPACE, MODEL = "team-a", "add-one"
GROUP, VERSION, PLURAL = "tritonshare.io", "v1alpha1", "tritonmodels"
KEYS = Keys()
GRACE, TOLERATION = 4.0, 3


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    with SimCluster(
        tmp_path / "cluster",
        NODES,
        binders=1,
        webhook=True,
        tenant_code_namespaces=(NAMESPACE,),
        node_monitor_grace=GRACE,
        node_heartbeat_seconds=1.0,
        default_unreachable_toleration=TOLERATION,
    ) as running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


def _ready_replicas(custom: Any) -> int:
    model = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, MODEL)
    return int((model.get("status") or {}).get("readyReplicas") or 0)


def _hosts(core: Any) -> list[Any]:
    """The model's serving hosts, not being deleted."""
    selector = f"{serves_label(KEYS, MODEL)}=true"
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
    return [p for p in pods if p.metadata.deletion_timestamp is None and p.status.pod_ip]


def _node(core: Any, name: str) -> tuple[str, set[tuple[str, str]]]:
    node = core.read_node(name)
    ready = next((c.status for c in node.status.conditions or [] if c.type == "Ready"), "")
    return str(ready), {(t.key, t.effect) for t in node.spec.taints or []}


def _infer(address: str) -> list[list[float]]:
    data = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    with httpclient.InferenceServerClient(f"{address}:9000", network_timeout=30) as http:
        tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        return cast(list[list[float]], http.infer(MODEL, [tensor]).as_numpy("OUTPUT0").tolist())


@pytest.mark.slow
@pytest.mark.triton
def test_a_lost_nodes_replica_is_placed_and_served_on_the_other_node(cluster: SimCluster) -> None:
    assert cluster.model_store is not None and cluster.kube is not None
    core = cluster.core
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    uri = cluster.model_store.publish(MODEL, MODELS_DIR / "add_one")
    body: dict[str, Any] = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TritonModel"}
    body |= {"metadata": {"name": MODEL}, "spec": {"storageUri": uri, "gpuMemory": "1Gi"}}
    custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)
    wait_until("the replica ready", lambda: _ready_replicas(custom) == 1 and _hosts(core), 150)
    (host,) = _hosts(core)
    lost, other = host.spec.node_name, next(n.name for n in NODES if n.name != host.spec.node_name)
    assert _infer(host.status.pod_ip) == [[2.0, 3.0, 4.0]]

    at = cluster.lose_node(lost)
    wait_until("the node Unknown", lambda: _node(core, lost)[0] == "Unknown", GRACE + 15)
    assert time.monotonic() - at >= GRACE - 1
    wait_until(
        "the unreachable taints",
        lambda: {(UNREACHABLE, "NoSchedule"), (UNREACHABLE, "NoExecute")} <= _node(core, lost)[1],
        10,
    )
    wait_until(
        "the lost host evicted",
        lambda: core.read_namespaced_pod(host.metadata.name, NAMESPACE).metadata.deletion_timestamp,
        TOLERATION + 15,
    )
    moved = wait_until(
        "the replica served on the other node",
        lambda: (
            _ready_replicas(custom) == 1 and [h for h in _hosts(core) if h.spec.node_name == other]
        ),
        150,
        # What the model's status says, and what its hosts list.
        lambda: (
            str(custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, MODEL))
            + str([p.metadata.annotations for p in core.list_namespaced_pod(NAMESPACE).items])
        ),
    )
    assert not [h for h in _hosts(core) if h.spec.node_name == lost]
    assert _infer(moved[0].status.pod_ip) == [[2.0, 3.0, 4.0]]

    cluster.restore_node(lost)
    wait_until(
        "the node Ready and untainted",
        lambda: (
            _node(core, lost)[0] == "True"
            and not any(key == UNREACHABLE for key, _ in _node(core, lost)[1])
        ),
        60,
    )
    # Its kubelet back, the evicted host's deletion is finished.
    wait_until(
        "the evicted host gone",
        lambda: (
            host.metadata.name
            not in {p.metadata.name for p in core.list_namespaced_pod(NAMESPACE).items}
        ),
        60,
    )
