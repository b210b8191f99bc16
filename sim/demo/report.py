"""What the demo found, and how it is printed for a newcomer.

Owns `DemoResult` (the facts of one run, which the end-to-end test asserts on), the introduction,
the table of nodes, GPUs and the models placed on them, the pending pods with their reasons, and
the metrics summary scraped from the parts' /metrics. It starts nothing and changes nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from common.contract import Keys
from common.quantity import format_bytes, parse_quantity
from sim.apiserver import AuditRecord
from sim.cluster import SimCluster
from sim.demo.scenario import GREEDY_POD, LATE_POD, NAMESPACE, PODS
from sim.processes import available

KEYS = Keys()
ALL_PODS = (*PODS, LATE_POD, GREEDY_POD)
Say = Callable[[str], None]


@dataclass
class DemoResult:
    """What happened, for the end-to-end test and the summary."""

    missing: list[str] = field(default_factory=list)
    placements: dict[str, tuple[str, str]] = field(default_factory=dict)
    """pod -> (node, GPU UUID) for every bound pod."""
    pending: dict[str, str] = field(default_factory=dict)
    """pod -> the PodScheduled condition's message."""
    short_form: dict[str, dict[str, Any]] = field(default_factory=dict)
    """pod -> what the webhook made of a pod created in the short form: its annotations, scheduler
    name, init containers (with the storage initializer's image and args) and containers."""
    served: list[str] = field(default_factory=list)
    """Pods that ran for real on the node with Triton and became Ready."""
    inferences: dict[str, list[float]] = field(default_factory=dict)
    isolation_refused: bool = False
    overuse: str = ""
    """The agent's Event on a pod whose model uses more GPU memory than it asked for."""
    overuse_measured: int = 0
    """That model's measured bytes as the binder reads them from the node."""
    squatter_refused: str = ""
    """The agent's Event on a pod created with spec.nodeName and another team's model id."""
    gateway_stranger: str = ""
    """What a pod that is no model pod (a forged model label) got from the node's gateway."""
    gateway_neighbour: str = ""
    """What a model pod asking the gateway for another pod's model got."""
    gateway_after_delete: str = ""
    """What a deleted model pod's address got from the gateway once the pod was gone."""
    leader: str = ""
    new_leader: str = ""
    """The binder leading after the first leader was crashed."""
    failover_seconds: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    loaded_after_shutdown: list[str] = field(default_factory=list)
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    """How each binder and agent process ended when stopped with SIGTERM."""
    explain: str = ""
    """What `tritonshare explain` printed for a pending pod."""
    audit: list[AuditRecord] = field(default_factory=list)
    """Every API call of the run, as the API server's audit log recorded it."""
    seconds: float = 0.0


def scrape(address: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        text = response.read().decode()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if not family.samples:
            # A labelled metric before its first observation: declared, worth 0.
            suffix = "_total" if family.type == "counter" else ""
            totals.setdefault(family.name + suffix, 0.0)
        for sample in family.samples:
            if sample.name.endswith(("_bucket", "_created")):
                continue
            key = sample.name
            if "result" in sample.labels:
                key += f"{{result={sample.labels['result']}}}"
            totals[key] = totals.get(key, 0.0) + float(sample.value)
    return totals


def print_tables(cluster: SimCluster, result: DemoResult, say: Say) -> None:
    pods_by_gpu: dict[str, list[tuple[str, int]]] = {}
    for name, (_, gpu) in result.placements.items():
        pod = next(p for p in ALL_PODS if p.name == name)
        pods_by_gpu.setdefault(gpu, []).append((pod.model_id, parse_quantity(pod.gpu_mem)))
    say("")
    say("NODE          POOL / TAINT                          GPU                        "
        "CAPACITY  ALLOCATED  FREE      MODELS")  # fmt: skip
    for spec in cluster.nodes:
        node = json.loads(cluster.core.read_node(spec.name, _preload_content=False).data)
        gpus = json.loads(node["metadata"].get("annotations", {}).get(KEYS.gpus, "[]"))
        pool = spec.labels.get("k8s.amazonaws.com/accelerator", "")
        taint = " +taint nvidia.com/gpu" if spec.taints else ""
        where = f"{pool}{taint}" + (" (real Triton)" if spec.real else "")
        for i, gpu in enumerate(gpus):
            placed = pods_by_gpu.get(gpu["uuid"], [])
            used = sum(size for _, size in placed)
            label = f"{gpu['index']}: {gpu['product']}"[:26]
            models = ", ".join(f"{m} ({format_bytes(s)})" for m, s in placed) or "-"
            say(
                f"{spec.name if i == 0 else '':<13} {where if i == 0 else '':<37} {label:<26} "
                f"{format_bytes(gpu['memory']):<9} {format_bytes(used):<10} "
                f"{format_bytes(gpu['memory'] - used):<9} {models}"
            )
    say("")
    for line in reading(cluster, result):
        say(line)
    say("")
    for name, message in result.pending.items():
        pod = next(p for p in PODS if p.name == name)
        say(f"PENDING {name} ({pod.gpu_mem}): {message}")
    if result.pending and available("binder.cli"):
        name = sorted(result.pending)[0]
        say("")
        say(f"Node by node, from the binder's CLI (tritonshare explain {NAMESPACE}/{name}):")
        explained = subprocess.run(
            [sys.executable, "-m", "binder.cli", "--kubeconfig", str(cluster.kubeconfig),
             "explain", f"{NAMESPACE}/{name}"],
            capture_output=True, text=True, timeout=60, check=False, env=cluster.env,
        )  # fmt: skip
        result.explain = explained.stdout
        for line in (explained.stdout or explained.stderr).splitlines():
            say(f"  {line}")


def reading(cluster: SimCluster, result: DemoResult) -> list[str]:
    """How to read the table, from what actually happened."""
    lines = ["How to read it:"]
    by_gpu: dict[tuple[str, str], list[str]] = {}
    for name, (node, gpu) in result.placements.items():
        by_gpu.setdefault((node, gpu), []).append(name)
    for (node, _), names in sorted(by_gpu.items()):
        if len(names) > 1:
            lines.append(
                f"  - {' and '.join(sorted(names))} share one GPU of {node}: binpack fills a GPU "
                "before starting an empty one, keeping whole GPUs free for big models."
            )
    tainted = {n.name for n in cluster.nodes if n.taints}
    on_tainted = sorted(p for p, (node, _) in result.placements.items() if node in tainted)
    if on_tainted:
        lines.append(
            f"  - Only pods that tolerate the nvidia.com/gpu taint reached the A100 pool: "
            f"{', '.join(on_tainted)}."
        )
    real = cluster.real_node
    lines.append(
        "  - A model id runs at most once per node. The binder wrote the chosen GPU's UUID on "
        "every pod it placed"
        + (f"; on {real.name} the agent loaded each model pinned to that GPU." if real else ".")
    )
    return lines


def summarize_metrics(result: DemoResult, say: Say) -> None:
    if not result.metrics:
        return
    m = result.metrics
    say("")
    say("Metrics (scraped from the leader binder, the real node's agent and the proxies):")
    attempts = "tritonshare_binder_schedule_attempts_total"
    rows = [
        ("binder: pods scheduled", f"{attempts}{{result=scheduled}}"),
        ("binder: unschedulable attempts", f"{attempts}{{result=unschedulable}}"),
        ("binder: pods pending now", "tritonshare_binder_pending_pods"),
        ("agent: models loaded", "tritonshare_agent_models_loaded"),
        ("agent: model loads (count)", "tritonshare_agent_load_duration_seconds_count"),
        ("agent: seconds spent loading", "tritonshare_agent_load_duration_seconds_sum"),
        ("proxies: requests answered", "tritonshare_proxy_requests_total"),
    ]  # fmt: skip
    for label, key in rows:
        if key in m:
            say(f"  {label:<32} {m[key]:g}")
    latency_sum = m.get("tritonshare_binder_scheduling_latency_seconds_sum")
    latency_count = m.get("tritonshare_binder_scheduling_latency_seconds_count")
    if latency_sum is not None and latency_count:
        say(f"  {'binder: mean creation-to-bind':<32} {latency_sum / latency_count * 1000:.0f} ms")


INTRO = (
    "tritonshare demo: many models share GPUs; one Triton per GPU node serves them all.",
    "",
    "What runs here, all on this machine:",
    "  - a simulated Kubernetes API server (the official client talks to it unchanged);",
    "  - four GPU nodes in three pools (mock NVML): T4, L4, and A100s tainted nvidia.com/gpu;",
    "  - on each node the tritonshare agent, publishing its GPUs on the Node and renewing a Lease;",
    "  - a real Triton (on the CPU) for the T4 node, whose pods run as real processes;",
    "  - two binders (one leader): the scheduler that places model pods by GPU memory;",
    "  - tritonshare's webhook, completing model pods written in the short form (a model URI and",
    "    its GPU memory), and an HTTPS model store their storage initializer fetches from.",
    "",
)
