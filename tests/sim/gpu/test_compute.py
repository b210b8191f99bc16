"""The simulated GPUs' compute (sim/gpu/compute.py): a GPU runs one request at a time, so two
instances on one GPU take turns and two on two GPUs run together; each node's models are told
their GPU by name in Triton, from model pods and TritonModel placements."""

from __future__ import annotations

import json
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import kubernetes.client
import numpy as np
import pytest

from common.contract import Keys
from common.hosted import replica_uid
from common.tritonname import private_triton_name
from sim.gpu.compute import MODEL_PY, GpuAssignments, model_files, node_dir, publish
from tests.binder.tritonmodels import test_tritonmodels
from tests.binder.tritonmodels.test_tritonmodels import GROUP, PLURAL, VERSION, model

apiserver = test_tritonmodels.apiserver
KEYS = Keys()
COMPUTE_MS = 100


class _Tensor:
    def __init__(self, name: str, data: Any) -> None:
        self.name, self.data = name, data

    def as_numpy(self) -> Any:
        return self.data


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The model's code over a stand-in for the Python backend's utilities."""
    utils = types.ModuleType("triton_python_backend_utils")
    utils.Tensor = _Tensor  # type: ignore[attr-defined]
    utils.InferenceResponse = lambda output_tensors: output_tensors  # type: ignore[attr-defined]
    utils.TritonModelException = RuntimeError  # type: ignore[attr-defined]
    utils.get_input_tensor_by_name = lambda request, name: request  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", utils)
    code = types.ModuleType("busy_model")
    exec(compile(MODEL_PY, "model.py", "exec"), code.__dict__)  # noqa: S102 - our own model
    return code


def _instance(backend: types.ModuleType, repository: Path, name: str) -> Any:
    files = model_files(repository / name, COMPUTE_MS)
    instance = backend.TritonPythonModel()
    config = (files / "config.pbtxt").read_text()
    assert f'string_value: "{COMPUTE_MS}"' in config
    parameters = {"sim_compute_ms": {"string_value": str(COMPUTE_MS)}}
    instance.initialize(
        {
            "model_config": json.dumps({"parameters": parameters}),
            "model_name": name,
            "model_repository": str(files),
        }
    )
    return instance


def _together(instances: list[Any]) -> float:
    """Seconds for one request to each instance, sent at once."""
    data = _Tensor("INPUT0", np.zeros(1, np.float32))
    threads = [threading.Thread(target=i.execute, args=([data],)) for i in instances]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.monotonic() - began


def test_two_instances_take_turns_on_one_gpu_and_run_together_on_two(
    tmp_path: Path, backend: types.ModuleType
) -> None:
    repository = tmp_path / "triton" / "models"
    root = node_dir(repository)
    assert root == (tmp_path / "triton" / "gpu-compute").resolve()
    written = publish(root, {"a": "GPU-0", "b": "GPU-0", "c": "GPU-1"}, ())
    a, b, c = (_instance(backend, repository, name) for name in ("a", "b", "c"))
    try:
        _together([a, b, c])  # opens the locks
        one_gpu = _together([a, b])
        two_gpus = _together([a, c])
    finally:
        for instance in (a, b, c):
            instance.finalize()
    assert one_gpu >= 2 * COMPUTE_MS / 1000
    assert two_gpus < 1.5 * COMPUTE_MS / 1000, (one_gpu, two_gpus)
    # An unassigned model is dropped; a moved one is rewritten.
    assert publish(root, {"a": "GPU-1"}, written) == {"a"}
    assert (root / "models" / "a").read_text() == "GPU-1"
    assert not (root / "models" / "b").exists()


def test_assignments_name_model_pods_and_replicas_on_the_node(
    kube_api: kubernetes.client.ApiClient, tmp_path: Path
) -> None:
    core: Any = kubernetes.client.CoreV1Api(kube_api)
    custom: Any = kubernetes.client.CustomObjectsApi(kube_api)
    for name, node, gpu in (("p1", "node-a", "GPU-a0"), ("p2", "node-b", "GPU-b0")):
        annotations = {KEYS.model_id: "resnet", KEYS.gpu: gpu}
        core.create_namespaced_pod(
            "default",
            {
                "metadata": {"name": name, "annotations": annotations},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
            },
        )
    created = custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, model("bert", 2)
    )
    placements = [
        {"replica": 0, "node": "node-a", "gpu": "GPU-a1", "proof": "p"},
        {"replica": 1, "node": "node-b", "gpu": "GPU-b0", "proof": "p"},
    ]
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, "default", PLURAL, "bert", {"status": {"placements": placements}}
    )
    pod_uid = core.read_namespaced_pod("p1", "default").metadata.uid
    model_uid = created["metadata"]["uid"]
    assignments = GpuAssignments(kube_api, "node-a", ["GPU-a0", "GPU-a1"], tmp_path)
    assert assignments.read() == {
        private_triton_name("default", "resnet", pod_uid): "GPU-a0",
        private_triton_name("default", "bert", replica_uid(model_uid, 0)): "GPU-a1",
    }
    assignments.refresh()
    assert {p.name for p in (tmp_path / "gpus").iterdir()} == {"GPU-a0.lock", "GPU-a1.lock"}
