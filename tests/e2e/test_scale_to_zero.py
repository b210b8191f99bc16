"""Scale to zero end to end on the simulated cluster with the real processes (one real node):
a TritonModel at `minReplicas: 0` is scaled to zero by the built-in autoscaler after its 6 s
window without a request, its replica unloaded, and its model host stays behind its Service,
the model parked there; its next request, sent through the Service's endpoint, waits on the
host, is counted as demand, scales the model to one and is answered, with no failure. The time
that first answer took is printed beside Triton's own load of the model."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import numpy as np
import pytest
import tritonclient.http as httpclient

from binder.parking import parked_on
from common.contract import Keys
from common.hosted import serves_label
from sim.cluster import SimCluster
from sim.demo.scenario import MODELS_DIR, NODES
from sim.processes import wait_until
from sim.service import Endpoints
from sim.triton import TritonInstall
from tests.e2e.test_short_form import _loaded
from tests.e2e.test_tritonmodel_hosts import GROUP, PLURAL, VERSION, _host

NAMESPACE = "team-a"
MODEL = "add-one"
KEYS = Keys()
DATA = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
LOAD_METRIC = "tritonshare_agent_load_duration_seconds_sum"


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    with SimCluster(
        tmp_path / "cluster",
        [NODES[0]],
        binders=1,
        webhook=True,
        tenant_code_namespaces=(NAMESPACE,),
    ) as running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


def _model(custom: Any) -> dict[str, Any]:
    return cast(
        dict[str, Any],
        custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, MODEL),
    )


def infer(address: str, timeout: float = 60.0) -> list[float]:
    """[1, 2, 3] through REST at `address` (HTTP errors raised as tritonclient raises them)."""
    with httpclient.InferenceServerClient(
        f"{address}:9000", network_timeout=timeout, connection_timeout=timeout
    ) as http:
        tensor = httpclient.InferInput("INPUT0", list(DATA.shape), "FP32")
        tensor.set_data_from_numpy(DATA)
        answer: list[float] = http.infer(MODEL, [tensor]).as_numpy("OUTPUT0").reshape(-1).tolist()
        return answer


def load_seconds(cluster: SimCluster) -> float:
    """The agent's total of Triton's model loads, seconds."""
    agent = cluster.agents[NODES[0].name]
    with urllib.request.urlopen(f"http://{agent.http}/metrics", timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith(LOAD_METRIC):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def scale_to_zero_model(uri: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TritonModel",
        "metadata": {"name": MODEL},
        "spec": {
            "storageUri": uri,
            "gpuMemory": "1Gi",
            "replicas": 1,
            "autoscaling": {"target": 1, "minReplicas": 0, "maxReplicas": 1, "window": "6s"},
        },
    }


@pytest.mark.slow
@pytest.mark.triton
def test_a_tritonmodel_scaled_to_zero_serves_its_next_request_through_its_service(
    cluster: SimCluster,
) -> None:
    assert cluster.model_store is not None and cluster.kube is not None
    kube = cluster.kube
    core = cast(Any, kubernetes.client.CoreV1Api(kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(kube))
    uri = cluster.model_store.publish(MODEL, MODELS_DIR / "add_one")
    custom.create_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, scale_to_zero_model(uri)
    )

    # No request for a whole window (its first load may not even be over): scaled to zero,
    # unloaded, parked on its host, which stays behind the Service.
    wait_until("scaled to zero", lambda: _model(custom)["spec"]["replicas"] == 0, 120)
    wait_until("no replica", lambda: not _model(custom).get("status", {}).get("replicas"), 60)
    wait_until("parked", lambda: parked_on(_host(core, NAMESPACE).to_dict(), KEYS) == [MODEL], 60)
    host = _host(core, NAMESPACE)
    assert host.metadata.labels[serves_label(KEYS, MODEL)] == "true"
    service = Endpoints(kube, NAMESPACE, f"{serves_label(KEYS, MODEL)}=true")
    with service:
        address = wait_until("the Service's endpoint", service.pick, 60)
        assert address == host.status.pod_ip
        wait_until("unloaded", lambda: not any(MODEL in m for m in _loaded(cluster)), 90)

        # The next request waits on the host, wakes the model and is answered.
        before = load_seconds(cluster)
        started = time.monotonic()
        assert infer(address) == [2.0, 3.0, 4.0]
        first = time.monotonic() - started
        load = load_seconds(cluster) - before
        print(
            f"first answer from zero {first:.2f} s = Triton's load {load:.2f} s + "
            f"{first - load:.2f} s"
        )
        assert load > 0, "the model was loaded again for it"
        assert _model(custom)["spec"]["replicas"] >= 1
        assert service.addresses() == [address]
        wait_until("unparked", lambda: parked_on(_host(core, NAMESPACE).to_dict(), KEYS) == [], 30)
        assert infer(address) == [2.0, 3.0, 4.0]
