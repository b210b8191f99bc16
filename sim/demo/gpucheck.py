"""`python -m sim.demo --real-gpu` (`make demo GPU=real`): the product end to end on this machine's
GPU, printing the figures a GPU check needs.

One node on the machine's own GPUs (`sim.cluster.REAL_GPUS`: its agent reads the real NVML and pins
models to the GPUs, its Triton runs them there, the Python backend's stub environment checked), a
binder that places with the reserve and the per-process allowance a real cluster needs
(`agent.gpus.reserve.DEFAULT_RESERVE`, `common.backends.PROCESS_ALLOWANCE`), the node's gateway, and
model pods with the loader and the proxy as `make demo` writes them. One pod at a time (so each
model is alone on its GPU and measured exactly) it serves a model that holds a known amount of GPU
memory (`sim.gpu.cudamodel`), waits until the pod is Ready, asks it through its proxy, deletes it,
and prints: the agent's measured figure against the request and the booking, the agent's load and
unload times (its own histograms), the first answer's time, and the GPU's memory before the load
and after the unload (the agent's NVML gauges). Every figure is read from the agent's metrics.

`run_gpu_check(..., real=False)` runs the same with the mock NVML standing in for the GPU (an H200
whose Python models also hold a stub's CUDA context, `sim.gpu.load`) and Triton on the CPU: what
the tests run where no GPU is at hand.
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from agent.errors import NvmlUnavailableError
from agent.gpus.memory import TOLERANCE_FRACTION, TOLERANCE_MIN_BYTES, tolerance
from agent.gpus.nvml import GpuReader
from agent.gpus.reserve import DEFAULT_RESERVE
from common.backends import PROCESS_ALLOWANCE
from common.contract import Keys
from common.quantity import format_bytes, parse_quantity
from common.tritonname import private_triton_name
from sim.cluster import REAL_GPUS, NodeSpec, SimCluster
from sim.demo.report import Say
from sim.demo.scenario import NAMESPACE, ModelPod, PodPorts, model_pod_manifest
from sim.gpu.cudamodel import ANSWER, REQUEST, write_model
from sim.processes import ClusterError, wait_until
from sim.triton import free_port

KEYS = Keys()
MIB = 1024**2
NODE = "gpu-node-0"
MODELS = (("cuda-small", "256Mi"), ("cuda-large", "1Gi"))
"""(pod and model id, request): each model allocates exactly its request."""
STAND_IN_GPUS = "1xH200"
STAND_IN_CONTEXT = 600 * MIB
"""What each Python model's stub holds on the mock H200 (524 to 616 MiB on a real one)."""


@dataclass
class ModelFigures:
    """One model pod's load, answer and unload as the agent measured them; bytes, seconds."""

    name: str
    request: int
    allocated: int
    gpu: str = ""
    booked: int = 0
    """What the binder booked (the agent's request gauge): request plus the allowance."""
    measured: int = 0
    load_seconds: float = 0.0
    first_answer_seconds: float = 0.0
    answer: list[float] = field(default_factory=list)
    unload_seconds: float = 0.0
    used_before: int = 0
    used_after_unload: int = 0

    @property
    def beyond_allocation(self) -> int:
        return self.measured - self.allocated

    @property
    def over_booking(self) -> bool:
        """The agent's rule (`agent.gpus.memory`): over its booking by more than the tolerance."""
        allowed = tolerance(self.booked, TOLERANCE_FRACTION, TOLERANCE_MIN_BYTES)
        return self.measured > self.booked + allowed


@dataclass
class GpuCheckResult:
    real: bool
    reserve: int
    allowance: int
    gpus: list[str] = field(default_factory=list)
    models: list[ModelFigures] = field(default_factory=list)


def _metrics(address: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return samples


def _one(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    for found, value in samples.get(name, []):
        if all(found.get(k) == v for k, v in labels.items()):
            return value
    return 0.0


def _pod(cluster: SimCluster, name: str) -> dict[str, Any] | None:
    try:
        response = cluster.core.read_namespaced_pod(name, NAMESPACE, _preload_content=False)
    except Exception:
        return None
    pod: dict[str, Any] = json.loads(response.data)
    return pod


def _ready(cluster: SimCluster, name: str) -> bool:
    conditions = ((_pod(cluster, name) or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _ask(address: str, model: str) -> tuple[list[float], float]:
    request = urllib.request.Request(
        f"http://{address}/v2/models/{model}/infer",
        data=json.dumps(REQUEST).encode(),
        headers={"Content-Type": "application/json"},
    )
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
        answer = json.loads(response.read())
    took = time.monotonic() - started
    return [float(v) for v in answer["outputs"][0]["data"]], took


def _serve_one(
    cluster: SimCluster, agent: str, models_dir: Path, name: str, request: str, say: Say
) -> ModelFigures:
    figures = ModelFigures(name, parse_quantity(request), parse_quantity(request))
    write_model(models_dir / name, figures.allocated)
    before = _metrics(agent)
    used_before = {
        labels["UUID"]: value
        for labels, value in before.get("tritonshare_agent_gpu_memory_used_bytes", [])
    }
    gateway = cluster.gateway
    assert gateway is not None
    ports = PodPorts(free_port(), free_port(), free_port())
    pod = ModelPod(name, name, str(models_dir / name), request, "the GPU check's model")
    manifest = model_pod_manifest(
        pod,
        ports,
        agent_port=_agent_port(cluster),
        gateway_http_port=gateway.http,
        gateway_grpc_port=gateway.grpc,
    )
    cluster.core.create_namespaced_pod(NAMESPACE, manifest, _preload_content=False)
    wait_until(
        f"pod {name} Ready (its model loaded on the GPU)", lambda: _ready(cluster, name), 300
    )
    created = _pod(cluster, name) or {}
    figures.gpu = created["metadata"]["annotations"].get(KEYS.gpu, "")
    figures.used_before = int(used_before.get(figures.gpu, 0))
    triton_name = private_triton_name(NAMESPACE, name, created["metadata"]["uid"])
    loaded = _metrics(agent)
    figures.measured = int(
        _one(loaded, "tritonshare_agent_model_gpu_memory_bytes", model=triton_name)
    )
    figures.booked = int(
        _one(loaded, "tritonshare_agent_model_gpu_memory_request_bytes", model=triton_name)
    )
    figures.load_seconds = _one(loaded, "tritonshare_agent_load_duration_seconds_sum") - _one(
        before, "tritonshare_agent_load_duration_seconds_sum"
    )
    address = f"{created['status']['podIP']}:{ports.http}"
    figures.answer, figures.first_answer_seconds = _ask(address, name)
    if figures.answer != ANSWER:
        raise ClusterError(f"model {name} answered {figures.answer}, not {ANSWER}")
    unloads = _one(loaded, "tritonshare_agent_unload_duration_seconds_count")
    cluster.core.delete_namespaced_pod(name, NAMESPACE, _preload_content=False)

    def unloaded() -> dict[str, list[tuple[dict[str, str], float]]] | None:
        now = _metrics(agent)
        done = _one(now, "tritonshare_agent_unload_duration_seconds_count") > unloads
        return now if done and _pod(cluster, name) is None else None

    after = wait_until(f"pod {name} gone and its model unloaded", unloaded, 120)
    figures.unload_seconds = _one(after, "tritonshare_agent_unload_duration_seconds_sum") - _one(
        loaded, "tritonshare_agent_unload_duration_seconds_sum"
    )

    def settled() -> tuple[float] | None:
        # The agent's next GPU poll after the unload: what the GPU holds without the model.
        used = _one(_metrics(agent), "tritonshare_agent_gpu_memory_used_bytes", UUID=figures.gpu)
        return (used,) if used <= figures.used_before + 64 * MIB else None

    try:
        figures.used_after_unload = int(wait_until("the GPU's memory back", settled, 30)[0])
    except ClusterError:
        figures.used_after_unload = int(
            _one(_metrics(agent), "tritonshare_agent_gpu_memory_used_bytes", UUID=figures.gpu)
        )
    _say_figures(figures, say)
    return figures


def _agent_port(cluster: SimCluster) -> int:
    handle = cluster.agents[NODE]
    return int(handle.grpc.rpartition(":")[2])


def _say_figures(f: ModelFigures, say: Say) -> None:
    say(
        f"  {f.name}: asked {format_bytes(f.request)}, booked {format_bytes(f.booked)} (with the "
        f"per-process allowance); measured {f.measured} bytes ({format_bytes(f.measured)}), "
        f"{f.beyond_allocation / MIB:+.0f} MiB beyond its allocation; "
        f"{'OVER its booking' if f.over_booking else 'within its booking'}"
    )
    answer_ms, back = f.first_answer_seconds * 1000, (f.used_after_unload - f.used_before) / MIB
    say(
        f"    load to READY {f.load_seconds:.2f} s; first answer {answer_ms:.1f} ms {f.answer}; "
        f"unload {f.unload_seconds:.2f} s; GPU used before {f.used_before}, after the unload "
        f"{f.used_after_unload} ({back:+.0f} MiB)"
    )


def machine_gpus() -> list[str]:
    """This machine's GPUs as the agent's NVML code reads them, or ClusterError saying why
    they cannot be read (before anything starts)."""
    reader = GpuReader()
    try:
        snapshot = reader.read()
    except NvmlUnavailableError as e:
        raise ClusterError(f"this machine's GPUs cannot be read: {e}") from e
    finally:
        reader.close()
    if not snapshot.gpus:
        raise ClusterError("NVML lists no GPU on this machine: give it one")
    return [f"{g.index}: {g.product}" for g in snapshot.gpus]


def run_gpu_check(workdir: Path, say: Say = print, *, real: bool = True) -> GpuCheckResult:
    """The check in `workdir`: on this machine's GPUs, or (`real=False`) the mock's."""
    if real:
        say(f"This machine's GPUs: {machine_gpus()}")
    result = GpuCheckResult(real, DEFAULT_RESERVE, PROCESS_ALLOWANCE)
    node = NodeSpec(NODE, REAL_GPUS if real else STAND_IN_GPUS, real=True)
    with SimCluster(
        workdir,
        [node],
        binders=1,
        tenant_code_namespaces=(NAMESPACE,),
        gpu_mem_reserve=DEFAULT_RESERVE,
        process_allowance=PROCESS_ALLOWANCE,
        process_context=0 if real else STAND_IN_CONTEXT,
        say=say,
    ) as cluster:
        if cluster.missing:
            raise ClusterError(f"missing parts: {'; '.join(cluster.missing)}")
        gpus = json.loads(cluster.core.read_node(NODE).metadata.annotations[KEYS.gpus])
        result.gpus = [f"{g['index']}: {g['product']} ({format_bytes(g['memory'])})" for g in gpus]
        say(f"GPUs of {NODE} ({'this machine' if real else 'the mock NVML'}): {result.gpus}")
        say(
            f"The binder keeps {format_bytes(DEFAULT_RESERVE)} of every GPU (--gpu-mem-reserve) "
            f"and books {format_bytes(PROCESS_ALLOWANCE)} beyond a Python model's request "
            f"(--gpu-mem-process-allowance)."
        )
        cluster.core.create_namespace(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            _preload_content=False,
        )
        agent = cluster.agents[NODE].http
        for name, request in MODELS:
            result.models.append(
                _serve_one(cluster, agent, workdir / "gpucheck-models", name, request, say)
            )
    return result


def main(workdir: Path, say: Say) -> int:
    try:
        run_gpu_check(workdir, say, real=True)
    except ClusterError as e:
        say(f"\nThe GPU check failed: {e}\nEvery process's log is in {workdir / 'logs'}.")
        return 1
    say(f"\nDone. Logs of every process: {workdir / 'logs'}")
    return 0
