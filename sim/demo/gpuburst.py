"""The GPU check's burst: many model pods created at once on one GPU, each measured apart.

Part of `python -m sim.demo --real-gpu` (`sim.demo.gpucheck`), after its one-at-a-time models:
`BURST` model pods (`sim.gpu.cudamodel`, each allocating its request on the GPU) are created at
once, pinned to one GPU by the node's selector. A Python model runs in stub processes of its own,
which NVML lists with their memory, so the agent loads up to `--parallel-loads` of them at once
and bills each its own processes' memory (`agent.gpus.apart`). Printed: each pod's seconds from
its creation to Ready beside one model's alone, each model's measured figure against its
allocation (what it holds beyond it is its stub's CUDA context), the GPU's growth against the sum
of the figures (what no model accounts for), and how much the loads overlapped (the sum of the
agent's load times over the burst's span). Every figure is read from the agent's metrics.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from common.contract import Keys
from common.quantity import format_bytes, parse_quantity
from common.tritonname import private_triton_name
from sim.cluster import SimCluster
from sim.demo.agentreads import Samples, agent_metrics, agent_port, ask, read_pod, sample
from sim.demo.report import Say
from sim.demo.scenario import NAMESPACE, ModelPod, PodPorts, model_pod_manifest
from sim.gpu.cudamodel import ANSWER, write_model
from sim.processes import ClusterError, wait_until
from sim.triton import free_port

KEYS = Keys()
MIB = 1024**2
SIZES = ("256Mi", "512Mi", "1Gi", "2Gi", "4Gi", "8Gi")


def burst_of(count: int) -> tuple[str, ...]:
    """`count` requests, `SIZES` in turn: each pod's model allocates exactly its request."""
    return tuple(SIZES[i % len(SIZES)] for i in range(count))


BURST = burst_of(12)
"""The check's burst: twelve pods, 31.5Gi in all."""


@dataclass
class BurstModel:
    name: str
    allocated: int
    ready_seconds: float = 0.0
    """From the pod's creation until it was seen Ready."""
    measured: int = 0

    @property
    def beyond_allocation(self) -> int:
        """What the model holds beyond its allocation: its stub's CUDA context."""
        return self.measured - self.allocated


@dataclass
class BurstResult:
    parallel_loads: int
    alone_seconds: float
    """One model's pod alone: from its creation until Ready."""
    models: list[BurstModel] = field(default_factory=list)
    used_before: int = 0
    used_after: int = 0
    unattributed: int = 0
    """The agent's own figure for the GPU after the burst: used bytes no model or baseline
    accounts for."""
    load_seconds: float = 0.0
    """The agent's load times, summed over the burst's loads."""
    unload_seconds: float = 0.0
    used_after_unload: int = 0

    @property
    def last_ready(self) -> float:
        return max(m.ready_seconds for m in self.models)

    @property
    def grown(self) -> int:
        return self.used_after - self.used_before

    @property
    def measured(self) -> int:
        return sum(m.measured for m in self.models)


def _used(samples: Samples, gpu: str) -> int:
    return int(sample(samples, "tritonshare_agent_gpu_memory_used_bytes", UUID=gpu))


def _settled(agent: str, gpu: str, poll: float, wanted: int = 3) -> Samples:
    """The agent's metrics once its GPU figure has stayed the same over `wanted` reads spanning
    two of its NVML polls (`poll` seconds apart): what the GPU holds now, steady."""
    seen: list[int] = []

    def steady() -> Samples | None:
        now = agent_metrics(agent)
        seen.append(_used(now, gpu))
        if len(seen) >= wanted and len(set(seen[-wanted:])) == 1:
            return now
        time.sleep(2 * poll / (wanted - 1))
        return None

    result: Samples = wait_until(f"GPU {gpu}'s memory steady in the agent's figures", steady, 60)
    return result


def run_burst(
    cluster: SimCluster,
    node: str,
    models_dir: Path,
    alone_seconds: float,
    say: Say,
    *,
    requests: tuple[str, ...] = BURST,
) -> BurstResult:
    """Creates a pod for each of `requests` at once on `node` (one GPU), waits until all are
    Ready, asks each once, deletes them and waits until the GPU is back."""
    poll = cluster.gpu_poll_seconds
    if poll is None:
        raise ValueError("the burst needs a cluster whose agents poll NVML at a known interval")
    result = BurstResult(cluster.parallel_loads, alone_seconds)
    agent = cluster.agents[node].http
    gateway = cluster.gateway
    assert gateway is not None
    gpus = cluster.core.read_node(node).metadata.annotations[KEYS.gpus]
    gpu = json.loads(gpus)[0]["uuid"]
    before = _settled(agent, gpu, poll)
    result.used_before = _used(before, gpu)
    manifests, ports = [], {}
    for i, request in enumerate(requests):
        model = BurstModel(f"burst-{i:02d}", parse_quantity(request))
        result.models.append(model)
        write_model(models_dir / model.name, model.allocated)
        ports[model.name] = PodPorts(free_port(), free_port(), free_port())
        spec = ModelPod(
            model.name,
            model.name,
            str(models_dir / model.name),
            request,
            "one of a burst created at once",
        )
        manifests.append(
            model_pod_manifest(
                spec,
                ports[model.name],
                agent_port=agent_port(cluster, node),
                gateway_http_port=gateway.http,
                gateway_grpc_port=gateway.grpc,
            )
        )
    say(
        f"\nA burst: {len(requests)} model pods created at once ({', '.join(requests)}), up to "
        f"{result.parallel_loads} loads at once on a GPU (--parallel-loads)."
    )
    created: dict[str, float] = {}

    def create(manifest: dict[str, object]) -> None:
        name = str(manifest["metadata"]["name"])  # type: ignore[index]
        created[name] = time.monotonic()
        cluster.core.create_namespaced_pod(NAMESPACE, manifest, _preload_content=False)

    with ThreadPoolExecutor(len(manifests)) as pool:
        list(pool.map(create, manifests))
    ready: dict[str, float] = {}

    def all_ready() -> bool:
        listed = cluster.core.list_namespaced_pod(NAMESPACE)
        now = time.monotonic()
        for pod in listed.items:
            name = pod.metadata.name
            conditions = pod.status.conditions or []
            is_ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
            if name in created and name not in ready and is_ready:
                ready[name] = now - created[name]
        return len(ready) == len(created)

    wait_until(
        f"the burst's {len(created)} pods Ready",
        all_ready,
        600,
        lambda: f"Ready: {sorted(ready)}; the agent's log: {cluster.log_tails()}",
    )
    after = _settled(agent, gpu, poll)
    result.used_after = _used(after, gpu)
    result.unattributed = int(
        sample(after, "tritonshare_agent_gpu_unattributed_memory_bytes", UUID=gpu)
    )
    result.load_seconds = sample(after, "tritonshare_agent_load_duration_seconds_sum") - sample(
        before, "tritonshare_agent_load_duration_seconds_sum"
    )
    for model in result.models:
        pod = read_pod(cluster, model.name)
        if pod is None:
            raise ClusterError(f"pod {model.name} is gone before it was asked")
        model.ready_seconds = ready[model.name]
        triton_name = private_triton_name(NAMESPACE, model.name, pod["metadata"]["uid"])
        model.measured = int(
            sample(after, "tritonshare_agent_model_gpu_memory_bytes", model=triton_name)
        )
        answer, _ = ask(f"{pod['status']['podIP']}:{ports[model.name].http}", model.name)
        if answer != ANSWER:
            raise ClusterError(f"model {model.name} answered {answer}, not {ANSWER}")
    unloads = sample(after, "tritonshare_agent_unload_duration_seconds_count")
    for model in result.models:
        cluster.core.delete_namespaced_pod(model.name, NAMESPACE, _preload_content=False)

    def unloaded() -> Samples | None:
        now = agent_metrics(agent)
        done = sample(now, "tritonshare_agent_unload_duration_seconds_count") - unloads
        gone = all(read_pod(cluster, m.name) is None for m in result.models)
        return now if gone and done >= len(result.models) else None

    emptied = wait_until("the burst's pods gone and their models unloaded", unloaded, 300)
    result.unload_seconds = sample(
        emptied, "tritonshare_agent_unload_duration_seconds_sum"
    ) - sample(after, "tritonshare_agent_unload_duration_seconds_sum")
    result.used_after_unload = _used(_settled(agent, gpu, poll), gpu)
    say_burst(result, say)
    return result


def say_burst(r: BurstResult, say: Say) -> None:
    for m in sorted(r.models, key=lambda m: m.ready_seconds):
        say(
            f"  {m.name}: {format_bytes(m.allocated)} allocated, measured {m.measured} bytes "
            f"({m.beyond_allocation / MIB:+.1f} MiB beyond), Ready {m.ready_seconds:.2f} s after "
            f"its creation"
        )
    span = r.last_ready
    say(
        f"  The last Ready {span:.2f} s after its creation: {span / r.alone_seconds:.2f}x one "
        f"model's pod alone ({r.alone_seconds:.2f} s); the loads took {r.load_seconds:.1f} s in "
        f"all ({r.load_seconds / span:.1f} at once on average over the burst)"
    )
    say(
        f"  The GPU grew {r.grown} bytes ({format_bytes(r.grown)}); the models measured "
        f"{r.measured} bytes: {r.grown - r.measured} bytes no model accounts for (the agent's "
        f"own figure: {r.unattributed})"
    )
    back = (r.used_after_unload - r.used_before) / MIB
    say(
        f"  All deleted: unloads {r.unload_seconds:.1f} s in all; the GPU back at "
        f"{r.used_after_unload} bytes ({back:+.0f} MiB)"
    )
