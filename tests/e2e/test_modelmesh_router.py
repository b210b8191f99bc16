"""ModelMesh's address on the simulated cluster with the real processes (two real nodes, each its
own Triton, agent, gateway and kubelet; the binder; the simulated kube-proxy): two TritonModels
made as `binder.inferenceservices` makes them (labelled with their InferenceService), one per node,
each in a host of its own. The namespace's `modelmesh-serving` Service (gRPC 8033, REST 8008)
reaches either host; through it tritonclient gets each model's own answer whichever host a
connection lands on (its own model served there, the other relayed to that model's Service), and
a name the namespace does not have gets NOT_FOUND / 404."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from sim.cluster import NodeSpec, SimCluster
from sim.demo.scenario import MODELS_DIR
from sim.processes import wait_until
from sim.service import ServiceProxy
from sim.triton import TritonInstall

NODES = (NodeSpec("gpu-a", "1xT4", real=True), NodeSpec("gpu-b", "1xT4", real=True))
NAMESPACE = "team-a"
GROUP, VERSION, PLURAL = "tritonshare.io", "v1alpha1", "tritonmodels"
ISVC_LABEL = "serving.kserve.io/inferenceservice"
DATA = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
FLAT = np.array([4.0, 5.0], dtype=np.float32)
MODELS = {"add-one": ("add_one", "gpu-a"), "identity": ("identity", "gpu-b")}
"""Each TritonModel's files and node."""


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    # The test's models are Python (tenant code): the team is let run it.
    with SimCluster(
        tmp_path / "cluster", NODES, binders=1, webhook=True, tenant_code_namespaces=(NAMESPACE,)
    ) as running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


def _ready(custom: Any, name: str) -> bool:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
    return bool((obj.get("status") or {}).get("readyReplicas") == 1)


def _listening(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1):
            return True
    except OSError:
        return False


def _answers(module: Any, url: str) -> tuple[list[list[float]], list[float]]:
    """add-one's and identity's answers through one new connection."""
    client = module.InferenceServerClient(url)
    try:
        tensor = module.InferInput("INPUT0", list(DATA.shape), "FP32")
        tensor.set_data_from_numpy(DATA)
        added = client.infer("add-one", [tensor]).as_numpy("OUTPUT0").tolist()
        flat = module.InferInput("INPUT_FP32", list(FLAT.shape), "FP32")
        flat.set_data_from_numpy(FLAT)
        same = client.infer("identity", [flat]).as_numpy("OUTPUT_FP32").tolist()
        with pytest.raises(InferenceServerException) as refused:
            client.infer("team-b-model", [tensor])
        assert "unknown model: 'team-b-model'" in str(refused.value)
        assert refused.value.status() in ("404", "StatusCode.NOT_FOUND")
        return added, same
    finally:
        client.close()


@pytest.mark.slow
@pytest.mark.triton
def test_modelmesh_serving_routes_each_model_by_name(cluster: SimCluster) -> None:
    assert cluster.model_store is not None and cluster.kube is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    for name, (files, node) in MODELS.items():
        uri = cluster.model_store.publish(name, MODELS_DIR / files)
        spec = {"storageUri": uri, "gpuMemory": "1Gi", "replicas": 1}
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
        meta = {"name": name, "labels": {ISVC_LABEL: name}}
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TritonModel"}
        custom.create_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, body | {"metadata": meta, "spec": spec}
        )
    for name in MODELS:
        wait_until(f"{name} ready", partial(_ready, custom, name), 150)
    hosts = core.list_namespaced_pod(NAMESPACE, label_selector="tritonshare.io/model-host=true")
    assert sorted(p.spec.node_name for p in hosts.items) == ["gpu-a", "gpu-b"]

    services = ServiceProxy(cluster.kube, period=0.2)
    services.start()
    try:
        address = wait_until(
            "the modelmesh-serving Service",
            lambda: core.read_namespaced_service("modelmesh-serving", NAMESPACE).spec.cluster_ip,
            30,
        )
        wait_until("its ports listening", lambda: _listening(address, 8033), 30)

        def both_ways() -> bool:
            try:
                _answers(grpcclient, f"{address}:8033")
                return True
            except InferenceServerException:
                return False  # a host has not read its routes yet

        wait_until("every model routed", both_ways, 60)
        # Each new connection lands on a host in turn: both hosts serve both models.
        for _ in range(4):
            for module, port in ((grpcclient, 8033), (httpclient, 8008)):
                added, same = _answers(module, f"{address}:{port}")
                assert added == [[2.0, 3.0, 4.0]]
                assert same == FLAT.tolist()
    finally:
        services.stop()
