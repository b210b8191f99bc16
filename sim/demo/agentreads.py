"""What the GPU check reads of the simulated cluster: the agent's metrics, the model pods, and a
model's answer through its proxy (`sim.demo.gpucheck`, `sim.demo.gpuburst`)."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from sim.cluster import SimCluster
from sim.demo.scenario import NAMESPACE
from sim.gpu.cudamodel import REQUEST

Samples = dict[str, list[tuple[dict[str, str], float]]]
"""The agent's metrics: each sample's labels and value, by the sample's name."""


def agent_metrics(address: str) -> Samples:
    """Every sample the agent at `address` exports, by name."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for one in family.samples:
            samples.setdefault(one.name, []).append((dict(one.labels), float(one.value)))
    return samples


def sample(samples: Samples, name: str, **labels: str) -> float:
    """The first sample of `name` with `labels` (0 when there is none)."""
    for found, value in samples.get(name, []):
        if all(found.get(k) == v for k, v in labels.items()):
            return value
    return 0.0


def read_pod(cluster: SimCluster, name: str) -> dict[str, Any] | None:
    """The model pod `name` as the API server has it, None when it is not there."""
    try:
        response = cluster.core.read_namespaced_pod(name, NAMESPACE, _preload_content=False)
    except Exception:
        return None
    pod: dict[str, Any] = json.loads(response.data)
    return pod


def pod_ready(cluster: SimCluster, name: str) -> bool:
    """Whether the model pod `name` is Ready."""
    conditions = ((read_pod(cluster, name) or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def ask(address: str, model: str) -> tuple[list[float], float]:
    """`model`'s answer to the check's request through the proxy at `address`, and seconds."""
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


def agent_port(cluster: SimCluster, node: str) -> int:
    """The port of `node`'s agent's gRPC API, which model pods' loaders call."""
    handle = cluster.agents[node]
    return int(handle.grpc.rpartition(":")[2])
