"""Simulated GPU compute: each simulated GPU a serial executor, so replicas on two GPUs answer
twice what two on one GPU answer.

On the simulated cluster Triton runs on the CPU, where two model instances run side by side
whatever GPU they are pinned to. A GPU busy with one compute-bound model's kernels runs another's
only in its turn, so here a GPU is modelled as a serial executor: a model made by `model_files`
holds its GPU's lock (`fcntl.flock` on `gpus/<uuid>.lock` in its node's compute directory,
`gpu-compute` beside the node's model repository) for its stated compute time
(`sim_compute_ms`) per request, while any other request on that GPU waits. That is all it
models: no batching gain, no overlap of copies and kernels, no MPS or MIG, no GPU speed (the
compute time is stated, not derived).

Which GPU a model's instance is on: the agent runs instances on the CPU here (`--cpu-only`), so
its config does not name the GPU. `GpuAssignments`, run beside each real node's agent
(`sim.gpu.agent_node --gpu-compute`), writes `models/<name in Triton>` with the GPU's uuid,
from the node's model pods (`tritonshare.io/gpu`) and the TritonModels' status.placements on
the node; the model reads it before its first request (waiting up to `ASSIGNMENT_WAIT_S`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import kubernetes.client

from common.contract import ContractError, Keys
from common.hosted import replica_uid
from common.tritonname import private_triton_name

log = logging.getLogger(__name__)

ASSIGNMENT_WAIT_S = 30
"""How long a model waits for its GPU's assignment file before failing a request."""
TRITONMODELS = ("tritonshare.io", "v1alpha1", "tritonmodels")

MODEL_PY = r'''
import fcntl
import json
import os
import time

import triton_python_backend_utils as pb_utils


def compute_dir(model_repository):
    here = os.path.abspath(model_repository)
    for _ in range(3):
        here = os.path.dirname(here)
        if os.path.isdir(os.path.join(here, "gpu-compute")):
            return os.path.join(here, "gpu-compute")
    raise pb_utils.TritonModelException(f"no simulated GPUs beside {model_repository}")


class TritonPythonModel:
    """Adds one to INPUT0, holding its GPU's lock for `sim_compute_ms` per request
    (sim.gpu.compute: a GPU runs one model's request at a time)."""

    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.compute_s = float(parameters["sim_compute_ms"]["string_value"]) / 1000
        # The agent refuses host paths in a tenant's config: the node's directory is found
        # beside the repository the model was installed in.
        self.root = compute_dir(args["model_repository"])
        self.name = args["model_name"]
        self.lock = None

    def gpu_lock(self):
        if self.lock is None:
            path = os.path.join(self.root, "models", self.name)
            deadline = time.monotonic() + {wait}
            uuid = ""
            while not uuid:
                try:
                    with open(path) as f:
                        uuid = f.read().strip()
                except OSError:
                    pass
                if not uuid and time.monotonic() > deadline:
                    raise pb_utils.TritonModelException(f"no simulated GPU assigned at {path}")
                if not uuid:
                    time.sleep(0.05)
            self.lock = open(os.path.join(self.root, "gpus", uuid + ".lock"), "a")
        return self.lock

    def execute(self, requests):
        lock = self.gpu_lock()
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                time.sleep(self.compute_s)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
            out = pb_utils.Tensor("OUTPUT0", (data + 1).astype(data.dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses

    def finalize(self):
        if self.lock is not None:
            self.lock.close()
'''.replace("{wait}", str(ASSIGNMENT_WAIT_S))

CONFIG = """backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters {{ key: "sim_compute_ms" value: {{ string_value: "{compute_ms}" }} }}
"""


def model_files(directory: Path, compute_ms: float) -> Path:
    """Write a model that takes `compute_ms` of its GPU per request (add_one's inputs and
    outputs) into `directory`; its config names no model, so it serves under any model id."""
    (directory / "1").mkdir(parents=True, exist_ok=True)
    config = CONFIG.format(compute_ms=f"{compute_ms:g}")
    (directory / "config.pbtxt").write_text(config)
    (directory / "1" / "model.py").write_text(MODEL_PY)
    return directory


def node_dir(model_repository: Path) -> Path:
    """A node's compute directory: `gpu-compute` beside its Triton's model repository."""
    return model_repository.resolve().parent / "gpu-compute"


def publish(root: Path, assignments: Mapping[str, str], written: Collection[str]) -> set[str]:
    """Write each model's GPU uuid under `root/models` (atomically, only where it changed),
    remove the files of `written` no longer assigned, and make each GPU's lock file."""
    models, gpus = root / "models", root / "gpus"
    models.mkdir(parents=True, exist_ok=True)
    gpus.mkdir(parents=True, exist_ok=True)
    for name, uuid in assignments.items():
        (gpus / f"{uuid}.lock").touch(exist_ok=True)
        path = models / name
        try:
            if path.read_text() == uuid:
                continue
        except OSError:
            pass
        staged = models / f".{name}.{os.getpid()}"
        staged.write_text(uuid)
        staged.rename(path)
    for name in set(written) - set(assignments):
        (models / name).unlink(missing_ok=True)
    return set(assignments)


class GpuAssignments:
    """Keeps `root/models` up to date with the GPUs of the models placed on one node."""

    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        node: str,
        gpus: Collection[str],
        root: Path,
        keys: Keys | None = None,
    ) -> None:
        self._core: Any = kubernetes.client.CoreV1Api(api)
        self._custom: Any = kubernetes.client.CustomObjectsApi(api)
        self._node = node
        self._gpus = frozenset(gpus)
        self._root = root
        self._keys = keys or Keys()
        self._written: set[str] = set()

    def read(self) -> dict[str, str]:
        """Name in Triton -> GPU uuid, of the node's model pods and TritonModel replicas."""
        found: dict[str, str] = {}
        pods = self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self._node}", _preload_content=False
        )
        for pod in json.loads(pods.data).get("items", []):
            meta = pod.get("metadata") or {}
            annotations = meta.get("annotations") or {}
            model, gpu = annotations.get(self._keys.model_id), annotations.get(self._keys.gpu)
            if model and gpu in self._gpus:
                _name(found, meta.get("namespace"), model, meta.get("uid"), gpu)
        return found | replica_gpus(self._custom, self._node, self._gpus)

    def refresh(self) -> None:
        self._written = publish(self._root, self.read(), self._written)

    def run(self, stop: threading.Event, period: float = 0.5) -> None:
        """Refresh every `period` seconds until `stop` is set (a daemon thread's body)."""
        while not stop.is_set():
            try:
                self.refresh()
            except Exception as e:  # the API server away: the files keep their state
                log.warning("Simulated GPU assignments are unchanged for now (%s).", e)
            stop.wait(period)


def replica_gpus(custom: Any, node: str, gpus: Collection[str]) -> dict[str, str]:
    """Name in Triton -> GPU uuid, of the TritonModel replicas placed on `node`'s `gpus`
    (their status.placements), read with `custom`, a CustomObjectsApi."""
    found: dict[str, str] = {}
    try:
        models = custom.list_cluster_custom_object(*TRITONMODELS)
    except kubernetes.client.exceptions.ApiException as e:
        if e.status != 404:  # no TritonModels served: model pods only
            raise
        models = {}
    for obj in models.get("items", []):
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        model = spec.get("modelName") or meta.get("name")
        for entry in (obj.get("status") or {}).get("placements") or []:
            if entry.get("node") == node and entry.get("gpu") in gpus:
                uid = replica_uid(str(meta.get("uid", "")), int(entry.get("replica", 0)))
                _name(found, meta.get("namespace"), model, uid, entry["gpu"])
    return found


def _name(found: dict[str, str], namespace: Any, model: Any, uid: Any, gpu: str) -> None:
    # No private name for an invalid id: such a model is never loaded.
    with contextlib.suppress(ContractError, ValueError):
        found[private_triton_name(str(namespace or ""), str(model), str(uid or ""))] = gpu
