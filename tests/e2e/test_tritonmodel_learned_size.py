"""A TritonModel that declares no GPU memory, on a one-node cluster of simulated GPUs with a real
Triton, agent, loader, kubelet and binder: its model holds 3Gi on its GPU once loaded (its
config's `sim_gpu_memory`, more than the binder's 1Gi first estimate). Its first replica is
placed on the estimate; the node's agent measures it at its load; the model's status then shows
the measured footprint, and its second replica is booked by it plus the margin, as its proof of
placement (what the binder, the quota and the agent charge) says."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import pytest

from binder.cluster.modelsizes import Sizing
from common.proofs import parse_proof
from common.quantity import format_quantity, parse_quantity
from sim.cluster import NodeSpec, SimCluster
from sim.demo.scenario import MODELS_DIR
from sim.processes import wait_until
from sim.triton import TritonInstall

NODE = NodeSpec("gpu-a", "4xT4", real=True)
NAMESPACE = "team-a"
MODEL = "add-one"
GROUP, VERSION, PLURAL = "tritonshare.io", "v1alpha1", "tritonmodels"
FOOTPRINT = 3 << 30
GI = 1 << 30


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    # The model is Python (tenant code): the team is let run it.
    with SimCluster(
        tmp_path / "cluster", (NODE,), binders=1, webhook=True, tenant_code_namespaces=(NAMESPACE,)
    ) as running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


def _status(custom: Any) -> dict[str, Any]:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, MODEL)
    found: dict[str, Any] = obj.get("status") or {}
    return found


def _booked(status: dict[str, Any]) -> dict[int, int]:
    """Replica -> the GPU memory its proof of placement booked."""
    return {e["replica"]: parse_proof(e["proof"]).request for e in status.get("placements") or []}


@pytest.mark.slow
@pytest.mark.triton
def test_a_model_without_gpu_memory_is_measured_at_its_first_load_and_booked_by_it(
    cluster: SimCluster, tmp_path: Path
) -> None:
    assert cluster.model_store is not None and cluster.kube is not None
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    files = tmp_path / "add_one"
    shutil.copytree(MODELS_DIR / "add_one", files)
    with (files / "config.pbtxt").open("a") as config:
        config.write('parameters { key: "sim_gpu_memory" value: { string_value: "3Gi" } }\n')
    uri = cluster.model_store.publish(MODEL, files)
    body: dict[str, Any] = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TritonModel"}
    body |= {"metadata": {"name": MODEL}, "spec": {"storageUri": uri, "replicas": 1}}
    custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)

    wait_until("its first replica placed", lambda: len(_booked(_status(custom))) == 1, 120)
    first = _booked(_status(custom))[0]
    assert GI <= first < FOOTPRINT, "placed on the first estimate (1Gi, and any allowance)"

    def measured() -> bool:
        return (_status(custom).get("gpuMemory") or {}).get("source") == "Measured"

    wait_until("its status to show what it measured", measured, 180)
    sized = _status(custom)["gpuMemory"]
    figure = parse_quantity(sized["measured"])
    # The agent's figure of its model alone: its 3Gi, rounded up by at most the agent's granule.
    assert FOOTPRINT <= figure <= FOOTPRINT + (64 << 20), sized
    booking = Sizing().booking(figure)
    assert sized == {
        "source": "Measured",
        "booked": format_quantity(booking),
        "estimate": "1Gi",
        "measured": sized["measured"],
        "storageUri": uri,
    }

    custom.patch_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, MODEL, {"spec": {"replicas": 2}}
    )
    wait_until("its second replica placed", lambda: len(_booked(_status(custom))) == 2, 120)
    assert _booked(_status(custom)) == {0: first, 1: booking}, "the next replica: as measured"
    wait_until("both replicas ready", lambda: _status(custom).get("readyReplicas") == 2, 180)
