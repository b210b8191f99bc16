"""The per-process allowance in the binder's arithmetic: a model that may run in a process of
its own (Python backend: its own CUDA context) is booked its request plus
--gpu-mem-process-allowance, unless its pod or TritonModel declares an in-process backend."""

from __future__ import annotations

import io
import json
from functools import partial
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from binder.cli.main import main as cli
from binder.cluster.modelviews import model_from_api
from binder.cluster.objects import pod_from_api
from binder.framework.placement import Placement, place
from binder.settings import parse_settings
from common.backends import IN_PROCESS_BACKENDS, PROCESS_ALLOWANCE, runs_in_own_process
from tests.binder.framework.test_placement import NOW, cluster
from tests.binder.objects import GI, KEYS, node_obj, pod_obj
from tests.binder.simcluster import (
    MakeBinder,
    add_node,
    add_pod,
    eventually,
    failure,
    node_of,
    scheduled_condition,
)

MIB = 1024**2
ALLOWANCE = 640 * MIB


def with_backend(name: str, backend: str | None, mem: str = "4Gi", **kw: Any) -> dict[str, Any]:
    annotations = {} if backend is None else {KEYS.backend: backend}
    return pod_obj(name, mem=mem, annotations=annotations, **kw)


def test_the_flag_defaults_to_the_largest_context_measured_rounded_up() -> None:
    assert PROCESS_ALLOWANCE == ALLOWANCE
    settings = parse_settings(["--placement-key-dir", "/k"], {})
    assert settings.gpu_mem_process_allowance == ALLOWANCE
    given = parse_settings(["--placement-key-dir", "/k", "--gpu-mem-process-allowance", "1Gi"], {})
    assert given.gpu_mem_process_allowance == GI


@pytest.mark.parametrize(
    ("backend", "booked"),
    [
        (None, 4 * GI + ALLOWANCE),  # undeclared: it may be a Python model
        ("python", 4 * GI + ALLOWANCE),
        ("my_custom_backend", 4 * GI + ALLOWANCE),
        ("onnxruntime", 4 * GI),
        ("tensorrt", 4 * GI),
    ],
)
def test_a_pod_is_booked_its_request_plus_the_allowance_unless_it_runs_in_triton(
    backend: str | None, booked: int
) -> None:
    pod = pod_from_api(with_backend("m", backend), KEYS, allowance=ALLOWANCE)
    assert (pod.request, pod.problem) == (booked, "")


def test_a_declared_backend_that_is_no_backend_name_is_a_problem_of_the_pod() -> None:
    pod = pod_from_api(with_backend("m", "onnx runtime!"), KEYS, allowance=ALLOWANCE)
    assert "is not a Triton backend's name" in pod.problem
    assert f"{KEYS.backend}: onnxruntime" in pod.problem


def test_a_pod_without_gpu_memory_books_no_allowance() -> None:
    pod = pod_from_api(pod_obj("m", mem=None), KEYS, allowance=ALLOWANCE)
    assert pod.request == 0


def test_which_backends_run_in_their_own_process() -> None:
    assert not any(runs_in_own_process(b) for b in IN_PROCESS_BACKENDS)
    assert runs_in_own_process("python") and runs_in_own_process("")
    # A Python-based backend replaces an in-process one's library with its own stub.
    assert runs_in_own_process("pytorch", runtime="model.py")


def test_a_tritonmodel_declares_its_backend_as_a_pod_does() -> None:
    def model(annotations: dict[str, str]) -> dict[str, Any]:
        return {
            "metadata": {
                "name": "m",
                "namespace": "models",
                "uid": "u1",
                "annotations": annotations,
            },
            "spec": {"gpuMemory": "2Gi", "replicas": 1},
        }

    python = model_from_api(model({}), KEYS, "tritonshare", allowance=ALLOWANCE)
    onnx = model_from_api(
        model({KEYS.backend: "onnxruntime"}), KEYS, "tritonshare", allowance=ALLOWANCE
    )
    assert python.replica(0).request == 2 * GI + ALLOWANCE
    assert onnx.replica(0).request == 2 * GI


def test_placement_counts_the_allowance_on_the_gpu() -> None:
    """Four 4Gi Python models do not fit a 16Gi GPU once their contexts are counted; four
    ONNX Runtime models do, and a GPU's last 4Gi takes an ONNX model, not a Python one."""
    state = cluster(node_obj("gpu-1", [16 * GI]))
    for i in range(3):
        pod = pod_from_api(with_backend(f"py-{i}", None), KEYS, allowance=ALLOWANCE)
        result = place(state, pod, now=NOW)
        assert isinstance(result, Placement), result
        state.set_pod(pod.bound(result.node, result.gpu.uuid, "proof"))
    assert state.memory.free("gpu-1") == [16 * GI - 3 * (4 * GI + ALLOWANCE)]
    python = pod_from_api(with_backend("py-3", "python"), KEYS, allowance=ALLOWANCE)
    assert not isinstance(place(state, python, now=NOW), Placement)
    onnx = pod_from_api(with_backend("onnx", "onnxruntime", mem="2Gi"), KEYS, allowance=ALLOWANCE)
    assert isinstance(place(state, onnx, now=NOW), Placement)


async def test_the_binder_books_and_signs_the_allowance(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    """End to end: the booked figure (request plus allowance) is what the proof of placement
    carries to the agent, which charges and enforces the pod by it."""
    add_node(kube_api, "gpu-1", [16 * GI])
    binder = await make_binder(gpu_mem_process_allowance=ALLOWANCE)
    for i in range(3):
        add_pod(core, f"py-{i}", mem="4Gi")
    for name in ("py-0", "py-1", "py-2"):
        await eventually(partial(node_of, core, name), what=f"{name} bound")
    proof = core.read_namespaced_pod("py-0", "default").metadata.annotations[KEYS.placement]
    assert proof.split(".")[2] == str(4 * GI + ALLOWANCE)
    add_pod(core, "py-3", mem="4Gi", annotations={KEYS.backend: "python"})
    condition = await eventually(lambda: scheduled_condition(core, "py-3"), what="py-3's reason")
    assert "Insufficient GPU memory" in condition.message
    add_pod(core, "onnx", mem="2Gi", annotations={KEYS.backend: "onnxruntime"})
    assert await eventually(lambda: node_of(core, "onnx"), what="onnx bound") == "gpu-1"
    assert binder.cache.state.memory.free("gpu-1") == [16 * GI - 3 * (4 * GI + ALLOWANCE) - 2 * GI]


async def test_explain_books_the_allowance_the_binder_leader_publishes(
    kubeconfig: Path, kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    """`tritonshare explain` judges a pending pod as the binder does: at its request plus the
    allowance the leader publishes on its Lease (a 2Gi Python model does not fit in 2.125Gi)."""
    add_node(kube_api, "gpu-1", [16 * GI])
    await make_binder(leader_elect=True, gpu_mem_process_allowance=ALLOWANCE)
    for name in ("py-0", "py-1", "py-2"):
        add_pod(core, name, mem="4Gi")
    for name in ("py-0", "py-1", "py-2"):
        await eventually(partial(node_of, core, name), what=f"{name} bound")
    add_pod(core, "late", mem="2Gi")
    await eventually(partial(scheduled_condition, core, "late"), what="late's reason")

    def explained() -> dict[str, Any] | None:
        out = io.StringIO()
        cli(["--kubeconfig", str(kubeconfig), "explain", "default/late", "-o", "json"], out=out)
        document: dict[str, Any] = json.loads(out.getvalue())
        return document if document["request"] == 2 * GI + ALLOWANCE else None

    document = await eventually(explained, what="the published allowance in explain")
    (verdict,) = document["nodes"]
    assert document["decision"] is None and not verdict["fits"]
    assert verdict["free"] == [16 * GI - 3 * (4 * GI + ALLOWANCE)]


async def test_a_quota_counts_the_allowance_as_kubernetes_counts_a_pods_overhead(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    """A ResourceQuota counts what the binder books, the allowance included, as the API server
    counts a pod's RuntimeClass overhead: 5Gi of quota, which the API server fills with two 2Gi
    pods' requests, holds one 2Gi Python model (2Gi + 640Mi), not two; the other stays pending
    and says how much of its charge is the allowance."""
    add_node(kube_api, "gpu-1", [16 * GI])
    key = f"requests.{KEYS.gpu_mem}"
    core.create_namespaced_resource_quota(
        "default",
        {
            "metadata": {"name": "gpu"},
            "spec": {"hard": {key: "5Gi"}},
            "status": {"hard": {key: "5Gi"}},
        },
    )
    binder = await make_binder(gpu_mem_process_allowance=ALLOWANCE)
    add_pod(core, "py-0", mem="2Gi")
    await eventually(partial(node_of, core, "py-0"), what="py-0 bound")
    add_pod(core, "py-1", mem="2Gi")
    message = await eventually(partial(failure, core, "py-1"), what="py-1's refusal")
    assert message.startswith(f"exceeded quota: gpu, requested: {key}=2688Mi, used: {key}=")
    assert "640Mi of the 2688Mi requested is the process allowance" in message
    assert f"in the annotation {KEYS.backend} (onnxruntime," in message
    assert not node_of(core, "py-1")
    assert binder.cache.state.memory.free("gpu-1") == [16 * GI - (2 * GI + ALLOWANCE)]
