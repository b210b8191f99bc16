"""What Triton's loaded models allocate on the simulated GPUs, for the mock NVML.

On a real node a model's CUDA allocations land on the GPU its instances are pinned to, so NVML's
used memory rises while it loads, falls once its unload has finished and grows when it grows.
Triton runs on the CPU here, so this module plays the GPU's part: a model LOADING, READY or
UNLOADING in Triton occupies the bytes its `config.pbtxt` declares in the parameter
`sim_gpu_memory` (a quantity such as `3Gi`; none: 0), plus `sim_gpu_memory_growth` (`2Gi@5`: 2Gi
more from 5 seconds after it was first seen READY), on the GPU of the pod whose model has that name
in Triton on this node (its private name, `common.tritonname`, or for a model installed before
private names its model id), by the pod's `tritonshare.io/gpu` annotation, or of the TritonModel
replica of that name, by its model's `status.placements`. A model keeps its GPU
and its footprint until Triton has unloaded it, as on a real GPU, whether its pod and its files are
gone meanwhile (the GPU and the config it was last seen with are remembered while Triton holds
it). Tests make a loaded
model allocate more at a moment of their choosing with `allocate(model, bytes)` (by its name in
Triton; a tenant's model growing on its first large request, say); like the rest of its
footprint, that is freed when its unload has finished. With `process_context`, a model whose
backend runs in a process of its own (`backend: "python"`, `common.backends`) also holds that
many bytes while it is in memory, as a stub process's CUDA context does on a real GPU (524 to 616
MiB, docs/results.md; one instance per model here). With `listed`, a model running in a process of
its own holds all of that in its process, as on a real GPU: its Python backend stub (found in
`/proc` by its command line, which names the model's directory in `repository`) is listed with
those bytes by the mock's per-process queries (`mock.set_workload(footprints,
footprints.processes)`), not counted in the GPU's other use; and each such process also costs
the GPU `driver_share` bytes that NVML's per-process figure leaves out, as the driver's part of a
CUDA context does on a real GPU (5.5-5.75 MiB a process on an H200, driver 580).
It reads Triton's repository index, the model's config file and the node's pods; it writes
nothing and knows nothing of the agent. `mock.set_workload(ModelFootprints(...))`.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import kubernetes.client
import urllib3

from common.backends import runs_in_own_process
from common.contract import Keys
from common.quantity import QuantityError, parse_quantity
from common.tritonname import private_triton_name
from sim.gpu.compute import replica_gpus

log = logging.getLogger(__name__)
_HOLDING = ("LOADING", "READY", "UNLOADING")
_PARAMETER_RE = r'key:\s*"{name}"\s*value:\s*\{{\s*string_value:\s*"([^"]*)"\s*\}}'


def declared(config_text: str, name: str) -> str:
    """The string value of parameter `name` in config.pbtxt text ("" when absent)."""
    match = re.search(_PARAMETER_RE.format(name=re.escape(name)), config_text)
    return match.group(1) if match else ""


class ModelFootprints:
    """Extra used bytes per GPU index, from the models READY in one Triton."""

    def __init__(
        self,
        triton_http_url: str,
        repository: Path,
        api: kubernetes.client.ApiClient,
        node_name: str,
        gpu_indexes: Mapping[str, int],
        *,
        keys: Keys | None = None,
        admin_header: tuple[str, str] | None = None,
        cache_seconds: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        process_context: int = 0,
        listed: bool = False,
        driver_share: int = 0,
    ) -> None:
        self._url = triton_http_url if "://" in triton_http_url else f"http://{triton_http_url}"
        self._repository = repository
        self._core: Any = kubernetes.client.CoreV1Api(api)
        self._custom: Any = kubernetes.client.CustomObjectsApi(api)
        self._node = node_name
        self._gpu_indexes = dict(gpu_indexes)
        self._keys = keys or Keys()
        self._headers = dict([admin_header]) if admin_header else {}
        """What Triton's restricted repository API asks of its callers (the agent's header)."""
        self._cache_seconds = cache_seconds
        self.process_context = process_context
        self.listed = listed
        """Own-process models' memory is their stub process's (`processes`), not the GPU's."""
        self.driver_share = driver_share
        """Bytes each listed stub process costs the GPU beyond its listed figure."""
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[float, dict[int, int]] = (-1e9, {})
        self._in_processes: dict[int, dict[int, int]] = {}
        self._first_ready: dict[str, float] = {}
        self._allocated: dict[str, int] = {}
        self._placed: dict[str, tuple[int, str]] = {}
        """Each model Triton holds: its GPU index and its config.pbtxt text, as last seen."""

    def allocate(self, model: str, size: int) -> None:
        """From now on `model` occupies `size` bytes more (until it is unloaded)."""
        with self._lock:
            self._allocated[model] = self._allocated.get(model, 0) + size
            self._cached = (-1e9, {})

    def processes(self) -> dict[int, dict[int, int]]:
        """Per GPU index, the stub processes of models running in processes of their own, each
        with what its model holds (read with `__call__`'s figures, at the same moment)."""
        self()
        with self._lock:
            return {index: dict(held) for index, held in self._in_processes.items()}

    def __call__(self) -> dict[int, int]:
        """Per GPU index, the bytes models hold outside their own processes."""
        with self._lock:
            now = self._clock()
            if now - self._cached[0] < self._cache_seconds:
                return self._cached[1]
            try:
                footprint = self._read(now)
            except (
                OSError,
                ValueError,
                kubernetes.client.exceptions.ApiException,
                urllib3.exceptions.HTTPError,  # the API server away: MaxRetryError
            ) as e:
                log.warning("Simulated model memory is unknown for now (%s): unchanged.", e)
                footprint = self._cached[1]  # Triton or the API away: the GPUs keep their state
            self._cached = (now, footprint)
            return footprint

    def _models_in_memory(self) -> tuple[set[str], set[str]]:
        """The models holding GPU memory (loading, ready or unloading: a GPU frees a model's
        memory only once its unload has finished), and those of them READY."""
        url = f"{self._url}/v2/repository/index"
        request = urllib.request.Request(  # noqa: S310 - http
            url, data=b"{}", method="POST", headers=self._headers
        )
        with urllib.request.urlopen(request, timeout=2) as response:  # noqa: S310 - loopback
            index = json.loads(response.read())
        held = {str(m["name"]) for m in index if m.get("state") in _HOLDING}
        return held, {str(m["name"]) for m in index if m.get("state") == "READY"}

    def _gpu_of_models(self) -> dict[str, int]:
        pods = self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self._node}", _preload_content=False
        )
        found: dict[str, int] = {}
        for pod in json.loads(pods.data).get("items", []):
            metadata = pod.get("metadata", {})
            annotations = metadata.get("annotations") or {}
            model, gpu = annotations.get(self._keys.model_id), annotations.get(self._keys.gpu)
            if model and gpu in self._gpu_indexes:
                index = self._gpu_indexes[gpu]
                found.setdefault(model, index)
                try:
                    private = private_triton_name(
                        str(metadata.get("namespace", "")), model, str(metadata.get("uid", ""))
                    )
                except ValueError:  # ContractError too: no private name for an invalid id
                    continue
                found[private] = index
        # TritonModel replicas: on the GPU their model's status places them.
        for private, uuid in replica_gpus(self._custom, self._node, self._gpu_indexes).items():
            found[private] = self._gpu_indexes[uuid]
        return found

    def _read(self, now: float) -> dict[int, int]:
        held, ready = self._models_in_memory()
        for gone in set(self._first_ready) - ready:
            del self._first_ready[gone]
        for gone in set(self._allocated) - held:
            del self._allocated[gone]
        for gone in set(self._placed) - held:
            del self._placed[gone]
        gpus = self._gpu_of_models()
        stubs = self._stubs() if self.listed else {}
        footprint: dict[int, int] = {}
        in_processes: dict[int, dict[int, int]] = {}
        for model in held:
            first = self._first_ready.setdefault(model, now) if model in ready else now
            seen = self._placed.get(model)
            try:
                text = (self._repository / model / "config.pbtxt").read_text()
            except OSError:
                if seen is None:
                    continue
                text = seen[1]  # its files removed while Triton still unloads it
            index = gpus.get(model, seen[0] if seen is not None else None)
            if index is None:
                continue
            self._placed[model] = (index, text)  # its pod may go before its unload ends
            try:
                size = _bytes(declared(text, "sim_gpu_memory"))
                growth, _, after = declared(text, "sim_gpu_memory_growth").partition("@")
                if growth and now - first >= float(after or 0):
                    size += _bytes(growth)
                size += self._allocated.get(model, 0)
                own = _own_process(text)
                if self.process_context and own:
                    size += self.process_context
            except QuantityError:
                continue
            if size:
                if own and model in stubs:
                    in_processes.setdefault(index, {})[stubs[model]] = size
                    footprint[index] = footprint.get(index, 0) + self.driver_share
                else:
                    footprint[index] = footprint.get(index, 0) + size
        self._in_processes = in_processes
        return footprint

    def _stubs(self) -> dict[str, int]:
        """Each model's first Python backend stub process of this repository's Triton, by the
        model's name."""
        found: dict[str, int] = {}
        root = self._repository.resolve()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue  # gone meanwhile
            if len(argv) < 2 or not argv[0].endswith(b"triton_python_backend_stub"):
                continue
            path = Path(argv[1].decode(errors="replace"))
            if path.parent.parent.parent != root:
                continue
            name, pid = path.parent.parent.name, int(entry.name)
            found[name] = min(found.get(name, pid), pid)
        return found


def _own_process(config_text: str) -> bool:
    """Whether the config's backend runs each instance in a process of its own."""
    backend = re.search(r'^\s*backend:\s*"([^"]*)"', config_text, re.MULTILINE)
    runtime = re.search(r'^\s*runtime:\s*"([^"]*)"', config_text, re.MULTILINE)
    if backend is None and re.search(r"^\s*platform:", config_text, re.MULTILINE):
        return False  # a framework platform (onnxruntime_onnx...) runs in Triton's process
    return runs_in_own_process(
        backend.group(1) if backend else "", runtime.group(1) if runtime else ""
    )


def _bytes(text: str) -> int:
    return parse_quantity(text, what="sim_gpu_memory") if text else 0
