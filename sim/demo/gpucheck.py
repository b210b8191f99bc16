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
and after the unload (the agent's NVML gauges). Then a burst of pods created at once
(`sim.demo.gpuburst`). Every figure is read from the agent's metrics.

`run_gpu_check(..., real=False)` runs the same with the mock NVML standing in for the GPU (an H200
whose Python models also hold a stub's CUDA context and the driver's share of it, `sim.gpu.load`)
and Triton on the CPU: what the tests run where no GPU is at hand.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent.errors import NvmlUnavailableError
from agent.gpus.memory import TOLERANCE_FRACTION, TOLERANCE_MIN_BYTES, tolerance
from agent.gpus.nvml import PYNVML, GpuReader
from agent.gpus.reserve import DEFAULT_RESERVE
from common.backends import PROCESS_ALLOWANCE
from common.contract import Keys
from common.quantity import format_bytes, parse_quantity
from common.tritonname import private_triton_name
from sim.cluster import DAEMONSETS_PART, REAL_GPUS, NodeSpec, SimCluster
from sim.demo.agentreads import Samples, agent_metrics, agent_port, ask, pod_ready, read_pod, sample
from sim.demo.gpuburst import BURST, BurstResult, burst_of, run_burst
from sim.demo.report import Say
from sim.demo.scenario import NAMESPACE, ModelPod, PodPorts, model_pod_manifest
from sim.gpu.cudamodel import ANSWER, write_model
from sim.processes import ClusterError, wait_until
from sim.triton import PARALLEL_LOADS, free_port

KEYS = Keys()
MIB = 1024**2
NODE = "gpu-node-0"
MODELS = (("cuda-small", "256Mi"), ("cuda-large", "1Gi"))
"""(pod and model id, request): each model allocates exactly its request."""
GPU_POLL_SECONDS = 1.0
"""The agent reads NVML this often (10 s by default): the check waits for a fresh reading."""
STAND_IN_GPUS = "1xH200"
STAND_IN_CONTEXT = 600 * MIB
"""What each Python model's stub holds on the mock H200 (518 MiB listed for it on a real one)."""
STAND_IN_DRIVER_SHARE = 6 * MIB
"""What each stub also costs the mock H200 outside NVML's per-process figure (5.5-5.75 MiB on a
real one: the driver's part of its CUDA context)."""


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
    ready_seconds: float = 0.0
    """From the pod's creation until it was seen Ready: placement, the loader, the load."""
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
    burst: BurstResult | None = None


def _serve_one(
    cluster: SimCluster, agent: str, models_dir: Path, name: str, request: str, say: Say
) -> ModelFigures:
    figures = ModelFigures(name, parse_quantity(request), parse_quantity(request))
    write_model(models_dir / name, figures.allocated)
    before = agent_metrics(agent)
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
        agent_port=agent_port(cluster, NODE),
        gateway_http_port=gateway.http,
        gateway_grpc_port=gateway.grpc,
    )
    created_at = time.monotonic()
    cluster.core.create_namespaced_pod(NAMESPACE, manifest, _preload_content=False)
    wait_until(
        f"pod {name} Ready (its model loaded on the GPU)", lambda: pod_ready(cluster, name), 300
    )
    figures.ready_seconds = time.monotonic() - created_at
    created = read_pod(cluster, name) or {}
    figures.gpu = created["metadata"]["annotations"].get(KEYS.gpu, "")
    figures.used_before = int(used_before.get(figures.gpu, 0))
    triton_name = private_triton_name(NAMESPACE, name, created["metadata"]["uid"])
    loaded = agent_metrics(agent)
    figures.measured = int(
        sample(loaded, "tritonshare_agent_model_gpu_memory_bytes", model=triton_name)
    )
    figures.booked = int(
        sample(loaded, "tritonshare_agent_model_gpu_memory_request_bytes", model=triton_name)
    )
    figures.load_seconds = sample(loaded, "tritonshare_agent_load_duration_seconds_sum") - sample(
        before, "tritonshare_agent_load_duration_seconds_sum"
    )
    address = f"{created['status']['podIP']}:{ports.http}"
    figures.answer, figures.first_answer_seconds = ask(address, name)
    if figures.answer != ANSWER:
        raise ClusterError(f"model {name} answered {figures.answer}, not {ANSWER}")
    unloads = sample(loaded, "tritonshare_agent_unload_duration_seconds_count")
    cluster.core.delete_namespaced_pod(name, NAMESPACE, _preload_content=False)

    def unloaded() -> Samples | None:
        now = agent_metrics(agent)
        done = sample(now, "tritonshare_agent_unload_duration_seconds_count") > unloads
        return now if done and read_pod(cluster, name) is None else None

    after = wait_until(f"pod {name} gone and its model unloaded", unloaded, 120)
    figures.unload_seconds = sample(
        after, "tritonshare_agent_unload_duration_seconds_sum"
    ) - sample(loaded, "tritonshare_agent_unload_duration_seconds_sum")

    def settled() -> tuple[float] | None:
        # The agent's next GPU poll after the unload: what the GPU holds without the model.
        used = sample(
            agent_metrics(agent), "tritonshare_agent_gpu_memory_used_bytes", UUID=figures.gpu
        )
        return (used,) if used <= figures.used_before + 64 * MIB else None

    try:
        figures.used_after_unload = int(wait_until("the GPU's memory back", settled, 30)[0])
    except ClusterError:
        figures.used_after_unload = int(
            sample(
                agent_metrics(agent), "tritonshare_agent_gpu_memory_used_bytes", UUID=figures.gpu
            )
        )
    _say_figures(figures, say)
    return figures


def _say_figures(f: ModelFigures, say: Say) -> None:
    say(
        f"  {f.name}: asked {format_bytes(f.request)}, booked {format_bytes(f.booked)} (with the "
        f"per-process allowance); measured {f.measured} bytes ({format_bytes(f.measured)}), "
        f"{f.beyond_allocation / MIB:+.0f} MiB beyond its allocation; "
        f"{'OVER its booking' if f.over_booking else 'within its booking'}"
    )
    answer_ms, back = f.first_answer_seconds * 1000, (f.used_after_unload - f.used_before) / MIB
    say(
        f"    load to READY {f.load_seconds:.2f} s (pod Ready {f.ready_seconds:.2f} s after its "
        f"creation); first answer {answer_ms:.1f} ms {f.answer}; "
        f"unload {f.unload_seconds:.2f} s; GPU used before {f.used_before}, after the unload "
        f"{f.used_after_unload} ({back:+.0f} MiB)"
    )


def machine_gpus() -> list[str]:
    """This machine's GPUs as the agent's NVML code reads them, or ClusterError saying why
    they cannot be read (before anything starts)."""
    reader = GpuReader(nvml=PYNVML)
    try:
        snapshot = reader.read()
    except NvmlUnavailableError as e:
        raise ClusterError(f"this machine's GPUs cannot be read: {e}") from e
    finally:
        reader.close()
    if not snapshot.gpus:
        raise ClusterError("NVML lists no GPU on this machine: give it one")
    return [f"{g.index}: {g.product}" for g in snapshot.gpus]


def run_gpu_check(
    workdir: Path,
    say: Say = print,
    *,
    real: bool = True,
    burst: tuple[str, ...] = BURST,
    parallel_loads: int = PARALLEL_LOADS,
) -> GpuCheckResult:
    """The check in `workdir`: on this machine's GPUs, or (`real=False`) the mock's; then a
    burst of model pods of `burst`'s requests created at once (none when empty), with
    `parallel_loads` loads at once on a GPU."""
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
        process_driver_share=0 if real else STAND_IN_DRIVER_SHARE,
        parallel_loads=parallel_loads,
        gpu_poll_seconds=GPU_POLL_SECONDS,
        say=say,
    ) as cluster:
        # The node DaemonSets stored in the API server are not used here (the node runs as
        # processes): the check runs on a GPU machine without kubectl.
        missing = [m for m in cluster.missing if not m.startswith(DAEMONSETS_PART)]
        if missing:
            raise ClusterError(f"missing parts: {'; '.join(missing)}")
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
        if burst:
            alone = min(m.ready_seconds for m in result.models)
            result.burst = run_burst(
                cluster, NODE, workdir / "gpucheck-models", alone, say, requests=burst
            )
    return result


def main(
    workdir: Path, say: Say, *, burst: int = len(BURST), parallel_loads: int = PARALLEL_LOADS
) -> int:
    try:
        run_gpu_check(workdir, say, real=True, burst=burst_of(burst), parallel_loads=parallel_loads)
    except ClusterError as e:
        say(f"\nThe GPU check failed: {e}\nEvery process's log is in {workdir / 'logs'}.")
        return 1
    say(f"\nDone. Logs of every process: {workdir / 'logs'}")
    return 0
