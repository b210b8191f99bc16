"""A load's plan (`agent.models.loadplan.plan_load`): pinned to its pod's GPU or the CPU, its
batchers' queue bounded and said, measured apart only where its backend runs it in processes of
its own and the node can measure them, and refused by the policy before anything reaches
Triton."""

from __future__ import annotations

import json

import pytest

from agent.errors import InvalidRequestError, TenantCodeNotAllowedError
from agent.installs.limits import ModelLimits
from agent.installs.modelconfig import ModelPolicy
from agent.models.loadplan import plan_load
from agent.pods.modelpods import pod_from_dict
from agent.pods.provenpods import Proven
from common.contract import Keys
from common.manifest import Manifest, ManifestEntry

GPU = "GPU-00000000-0000-0000-0000-000000000002"
ONNX = """name: "m"
backend: "onnxruntime"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 60000000 }
"""
PYTHON = 'name: "m"\nbackend: "python"\n'
FILES = Manifest((ManifestEntry("1/model.onnx", 1000, "ab" * 32),))


def owner(namespace: str = "team-a", backend: str = "") -> Proven:
    annotations = {"tritonshare.io/model-id": "m"}
    if backend:
        annotations["tritonshare.io/backend"] = backend
    pod = {
        "metadata": {
            "name": "m-0",
            "namespace": namespace,
            "uid": "u1",
            "annotations": annotations,
        },
        "spec": {"nodeName": "n1", "schedulerName": "tritonshare"},
        "status": {"phase": "Running"},
    }
    return Proven(pod_from_dict(pod, Keys()), 1024)


def limits(*, cpu_only: bool = False, tenant_code: frozenset[str] = frozenset()) -> ModelLimits:
    return ModelLimits(ModelPolicy(tenant_code_namespaces=tenant_code), cpu_only=cpu_only)


def test_a_gpu_load_is_pinned_to_its_gpu_with_its_queue_bounded() -> None:
    plan = plan_load(
        "m.private", owner(), FILES, ONNX, ["1"], limits(), (GPU, 2), measures_apart=True
    )
    request = plan.request
    config = json.loads(request.override)
    assert config["name"] == "m.private", "Triton's name for it is its directory's"
    assert config["instance_group"][0]["gpus"] == [2]
    assert (request.uuid, request.index, request.size) == (GPU, 2, 1000)
    assert not request.apart and not request.waking
    assert plan.pin == 2 and plan.where == f"GPU 2 ({GPU})"
    assert [line.split(":")[0] for line in plan.lowered] == [
        "dynamic_batching.max_queue_delay_microseconds"
    ]


def test_own_processes_are_measured_apart_only_where_the_node_can() -> None:
    python = owner("team-a", backend="python")
    allowed = limits(tenant_code=frozenset({"team-a"}))
    files = Manifest((ManifestEntry("1/model.py", 10, "cd" * 32),))
    for can in (True, False):
        plan = plan_load("m", python, files, PYTHON, ["1"], allowed, (GPU, 0), measures_apart=can)
        assert plan.request.apart is can
    on_cpu = plan_load("m", python, files, PYTHON, ["1"], allowed, ("", -1), measures_apart=True)
    assert on_cpu.pin is None and on_cpu.where == "the CPU"


def test_the_policy_refuses_before_anything_is_planned() -> None:
    files = Manifest((ManifestEntry("1/model.py", 10, "cd" * 32),))
    with pytest.raises(TenantCodeNotAllowedError):
        plan_load(
            "m",
            owner(backend="python"),
            files,
            PYTHON,
            ["1"],
            limits(),
            (GPU, 0),
            measures_apart=True,
        )
    with pytest.raises(InvalidRequestError, match="not a valid Triton model configuration"):
        plan_load(
            "m", owner(), FILES, "not a config {", ["1"], limits(), (GPU, 0), measures_apart=True
        )
