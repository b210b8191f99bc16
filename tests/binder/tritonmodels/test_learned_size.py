"""A TritonModel that declares no GPU memory, against the simulated API server through the
official client: its first replica is booked at the binder's first estimate (with the
per-process allowance); once the node's agent publishes what that replica measured (the Node's
gpu-usage annotation, as the agent writes it), its status says so and its next replica, and the
quota's use, is booked by it plus the margin, while the first keeps its booking; new files start
from the estimate again. A tenant's quota bounds what it may be booked at."""

from __future__ import annotations

import json
from typing import Any

import kubernetes.client

from binder.app import Binder
from common.contract import Keys
from common.proofs import pod_claim
from common.tritonname import private_triton_name
from tests.binder.objects import GI
from tests.binder.simcluster import MakeBinder, add_node, eventually
from tests.binder.tritonmodels import test_tritonmodels
from tests.fixtures_sim import PlacementKeys

GROUP, VERSION, PLURAL = "tritonshare.io", "v1alpha1", "tritonmodels"
MI = 1 << 20
KEYS = Keys()
URI, NEW_URI = "https://models.example.com/x.tar.gz", "https://models.example.com/x2.tar.gz"
ALLOWANCE = 640 * MI

# The API server serving the chart's CRD, and its custom objects client, as the TritonModel
# tests have them.
apiserver = test_tritonmodels.apiserver
custom = test_tritonmodels.custom


def unsized(name: str, replicas: int) -> dict[str, Any]:
    """A TritonModel without spec.gpuMemory."""
    spec = {"storageUri": URI, "replicas": replicas}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TritonModel",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


def booked(keys: PlacementKeys, obj: dict[str, Any], entry: dict[str, Any]) -> int:
    """What the replica's proof of placement booked (what its GPU and its quota are charged)."""
    meta = obj["metadata"]
    claim = pod_claim(
        f"{meta['uid']}/{entry['replica']}", "default", f"{meta['name']}/{entry['replica']}",
        entry["node"], entry["gpu"], meta["name"], "always",
    )  # fmt: skip
    return keys.ring.verify(claim, entry["proof"]).request


def status_of(custom: Any, name: str) -> dict[str, Any]:
    obj = test_tritonmodels.read(custom, name)
    found: dict[str, Any] = obj.get("status") or {}
    return found


async def test_a_model_without_gpu_memory_is_booked_by_what_it_measured(
    kube_api: kubernetes.client.ApiClient,
    make_binder: MakeBinder,
    custom: Any,
    core: Any,
    placement_keys: PlacementKeys,
) -> None:
    for node in ("n1", "n2"):
        add_node(kube_api, node, [16 * GI])
    # A quota of the first estimate (with the allowance) and what 3Gi measured is booked at.
    core.create_namespaced_resource_quota(
        "default",
        {
            "metadata": {"name": "gpu"},
            "spec": {"hard": {KEYS.gpu_mem: "5044Mi"}},
        },
    )
    binder: Binder = await make_binder(gpu_mem_process_allowance=ALLOWANCE)
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, unsized("bert", 1))
    obj = await eventually(
        lambda: test_tritonmodels.placed(custom, "bert", 1), what="its first replica placed"
    )
    (first,) = obj["status"]["placements"]
    assert booked(placement_keys, obj, first) == GI + ALLOWANCE, "the estimate, and the allowance"
    assert obj["status"]["gpuMemory"] == {"source": "Estimated", "booked": "1Gi", "estimate": "1Gi"}

    # The node's agent measures the replica at its load (3Gi: its process included) and
    # publishes it on the Node, by the replica's name in Triton.
    uid = obj["metadata"]["uid"]
    name = private_triton_name("default", "bert", f"{uid}/0")
    usage = {first["gpu"]: {"used": 4 * GI, "models": {name: 3 * GI}}}
    core.patch_node(
        first["node"], {"metadata": {"annotations": {KEYS.gpu_usage: json.dumps(usage)}}}
    )
    learned = {"source": "Measured", "booked": "3380Mi", "estimate": "1Gi", "measured": "3Gi",
               "storageUri": URI}  # fmt: skip
    await eventually(
        lambda: status_of(custom, "bert").get("gpuMemory") == learned,
        what="its status to show what it measured",
    )

    # The next replica is booked by it: 3Gi and 10% (more than 128Mi), rounded up to a MiB,
    # without the allowance (the measured figure holds the model's process); the first keeps
    # the booking its proof names. The quota counts both and has room for no more.
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "bert", {"spec": {"replicas": 2}}
    )
    obj = await eventually(
        lambda: test_tritonmodels.placed(custom, "bert", 2), what="its second replica placed"
    )
    by_replica = {e["replica"]: e for e in obj["status"]["placements"]}
    assert booked(placement_keys, obj, by_replica[0]) == GI + ALLOWANCE
    assert booked(placement_keys, obj, by_replica[1]) == 3380 * MI
    charged = binder.ledger.state.charged_pod(f"{uid}/1")
    assert charged is not None and charged.request == 3380 * MI
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "bert", {"spec": {"replicas": 3}}
    )

    def refused() -> str:
        conditions = status_of(custom, "bert").get("conditions") or []
        said: dict[str, Any] = next((c for c in conditions if c["type"] == "Placed"), {})
        return str(said.get("message") or "") if said.get("status") == "False" else ""

    message = await eventually(refused, what="a third replica refused by the quota")
    gpu_mem = KEYS.gpu_mem
    said = f"requested: {gpu_mem}=3380Mi, used: {gpu_mem}=5044Mi, limited: {gpu_mem}=5044Mi"
    assert said in message, message

    # New files: booked at the estimate again until a replica of them is measured.
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "bert", {"spec": {"replicas": 2, "storageUri": NEW_URI}}
    )
    await eventually(
        lambda: (
            status_of(custom, "bert").get("gpuMemory")
            == {"source": "Estimated", "booked": "1Gi", "estimate": "1Gi"}
        ),
        what=f"new files booked at the estimate {status_of(custom, 'bert')}",
    )
    model = binder.ledger.models[uid]
    assert (model.size_source, model.template.request) == ("Estimated", GI + ALLOWANCE)
