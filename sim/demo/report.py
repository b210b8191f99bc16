"""What the demo found, and how it is printed for a newcomer.

Owns `DemoResult` (the facts of one run, which the end-to-end test asserts on), the introduction,
the closing table of nodes, GPUs and the models placed on them (printed by the binder's CLI,
the source of truth a user queries), the pending pods with their reasons, and
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
from sim.demo.autoscale import AutoscaleResult
from sim.demo.rollout import RolloutResult
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
    rollout: RolloutResult | None = None
    """The rollout step: a Deployment rolled to new model files while a client sent steadily."""
    autoscale: AutoscaleResult | None = None
    """The autoscaling step, when Prometheus is installed."""
    hosted: dict[str, list[float]] = field(default_factory=dict)
    """TritonModel -> its answer to [1, 2, 3] through its namespace's model host."""
    host: str = ""
    """The model host's pod that served them."""
    host_pods_on_node: int = 0
    """Model hosts of the demo's namespace on the real node while they were served."""
    status_text: str = ""
    """What `tritonshare status` printed at the end (the closing table)."""
    status: dict[str, Any] = field(default_factory=dict)
    """`tritonshare status -o json` at the end, read just before `pods_in_api`."""
    pods_in_api: list[dict[str, Any]] = field(default_factory=list)
    """The demo namespace's pods as the API server listed them right after `status`."""
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


def _cli(cluster: SimCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """The binder's CLI as a user runs it against the cluster."""
    return subprocess.run(
        [sys.executable, "-m", "binder.cli.main", "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True, text=True, timeout=60, check=False, env=cluster.env,
    )  # fmt: skip


def pods_in_api(cluster: SimCluster) -> list[dict[str, Any]]:
    """The demo's pods as the API server has them now: where each is bound, to which GPU, and
    what it asks for; what the test holds the CLI's table to."""
    response = cluster.core.list_namespaced_pod(NAMESPACE, _preload_content=False)
    pods = []
    for pod in json.loads(response.data).get("items", []):
        meta, spec = pod["metadata"], pod.get("spec", {})
        limits = [c.get("resources", {}).get("limits", {}) for c in spec.get("containers", [])]
        pods.append(
            {
                "pod": f"{meta['namespace']}/{meta['name']}",
                "node": spec.get("nodeName") or "",
                "gpu": (meta.get("annotations") or {}).get(KEYS.gpu, ""),
                "request": sum(parse_quantity(str(lim.get(KEYS.gpu_mem, 0))) for lim in limits),
                "phase": pod.get("status", {}).get("phase", ""),
                "deleting": bool(meta.get("deletionTimestamp")),
            }
        )
    return pods


def print_tables(cluster: SimCluster, result: DemoResult, say: Say) -> None:
    """The closing tables, from the binder's CLI: what a user would query, not what the demo
    remembers doing."""
    say("")
    if not available("binder.cli.main"):
        say("The binder's CLI is missing from this tree: no table of nodes and GPUs.")
        return
    say("Nodes, GPUs and the models on each, as the binder sees them (tritonshare status):")
    shown = _cli(cluster, "status")
    result.status_text = shown.stdout
    for line in (shown.stdout or shown.stderr).splitlines():
        say(f"  {line}")
    document = _cli(cluster, "status", "-o", "json")
    if document.returncode == 0:
        result.status = json.loads(document.stdout)
    result.pods_in_api = pods_in_api(cluster)
    say("")
    for spec in cluster.nodes:
        pool = spec.labels.get("k8s.amazonaws.com/accelerator", "")
        taint = ", tainted nvidia.com/gpu" if spec.taints else ""
        real = ", served by the real Triton" if spec.real else ""
        say(f"  {spec.name}: pool {pool}{taint}{real}")
    say("")
    for line in reading(cluster, result.status):
        say(line)
    say("")
    for name, message in result.pending.items():
        pod = next(p for p in PODS if p.name == name)
        say(f"PENDING {name} ({pod.gpu_mem}): {message}")
    if result.pending:
        name = sorted(result.pending)[0]
        say("")
        say(f"Node by node, from the binder's CLI (tritonshare explain {NAMESPACE}/{name}):")
        explained = _cli(cluster, "explain", f"{NAMESPACE}/{name}")
        result.explain = explained.stdout
        for line in (explained.stdout or explained.stderr).splitlines():
            say(f"  {line}")


def reading(cluster: SimCluster, status: dict[str, Any]) -> list[str]:
    """How to read the table, from what the CLI reported."""
    lines = ["How to read it:"]
    tainted = {n.name for n in cluster.nodes if n.taints}
    on_tainted: list[str] = []
    for node in status.get("nodes", []):
        for gpu in node["gpus"]:
            names = sorted(p["pod"].partition("/")[2] for p in gpu["pods"])
            if node["name"] in tainted:
                on_tainted += names
            if len(names) > 1:
                lines.append(
                    f"  - {' and '.join(names)} share GPU {gpu['index']} of {node['name']}: "
                    "binpack fills a GPU before starting an empty one, keeping whole GPUs free "
                    "for big models."
                )
            measured = [p for p in gpu["pods"] if (p["measured"] or 0) > p["request"]]
            for pod in measured:
                lines.append(
                    f"  - {pod['pod'].partition('/')[2]} asks for {format_bytes(pod['request'])} "
                    f"but its model is measured at {format_bytes(pod['measured'])}: the binder "
                    "counts the larger."
                )
    if on_tainted:
        lines.append(
            "  - Only pods that tolerate the nvidia.com/gpu taint reached the A100 pool: "
            f"{', '.join(sorted(on_tainted))}."
        )
    real = cluster.real_node
    lines.append(
        "  - Replicas of one model may share a node (each pod's model has its own name in "
        "Triton); the binder spreads them over nodes unless they say otherwise. It wrote the "
        "chosen GPU's UUID on every pod it placed"
        + (f"; on {real.name} the agent loaded each model pinned to that GPU." if real else ".")
    )
    return lines


def summarize_metrics(result: DemoResult, say: Say) -> None:
    if not result.metrics:
        return
    m = result.metrics
    say("")
    say(
        "Metrics at this point, after the first inferences (scraped now from the leader binder, "
        "the real node's agent and the proxies):"
    )
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
