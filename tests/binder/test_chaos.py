"""Chaos: `python -m binder` as a process, the simulated API server taken down (connection
refused) for longer than the leader lease while pods are being bound, then brought back with its
objects. The binder must stay up, say it is not ready and not leading during the outage, then
lead again and place every pod created before, during and after, with no double booking: no GPU
holds more than its memory, no model id twice on a node, every GPU named on its own node."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes.client

from sim.apiserver import RunningApiServer
from sim.triton import free_port
from tests.binder.objects import GI, KEYS
from tests.binder.simcluster import add_node, add_pod
from tests.fixtures_sim import PlacementKeys

ROOT = Path(__file__).resolve().parents[2]
LEASE_SECONDS = 3.0
OUTAGE_SECONDS = LEASE_SECONDS + 2.0
NODES, GPUS, GPU_BYTES, POD_GI = 3, 2, 16 * GI, 4
# Exactly full once every pod is placed: one double booking leaves a pod with nowhere to go.
PODS = NODES * GPUS * (GPU_BYTES // GI) // POD_GI


def wait_for(check: Callable[[], Any], what: str, within: float = 30.0) -> Any:
    deadline = time.monotonic() + within
    while not (result := check()):
        assert time.monotonic() < deadline, f"timed out after {within} s waiting for {what}"
        time.sleep(0.05)
    return result


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return int(r.status), r.read().decode().strip()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode().strip()
    except OSError:
        return 0, ""


def is_leader(port: int) -> float | None:
    _, text = get(port, "/metrics")
    for line in text.splitlines():
        if line.startswith("tritonshare_binder_is_leader "):
            return float(line.split()[1])
    return None


def placements(core: Any) -> dict[str, tuple[str, str, str]]:
    """Every pod: (node, GPU annotation, model id); node "" while pending."""
    found = {}
    for pod in core.list_namespaced_pod("default").items:
        annotations = pod.metadata.annotations or {}
        found[pod.metadata.name] = (
            pod.spec.node_name or "",
            annotations.get(KEYS.gpu, ""),
            annotations.get(KEYS.model_id, ""),
        )
    return found


def create(core: Any, prefix: str, count: int) -> None:
    for i in range(count):
        add_pod(core, f"{prefix}-{i}", mem=f"{POD_GI}Gi")


def test_a_binder_process_outlives_an_outage_longer_than_its_lease_without_double_booking(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    core: Any,
    kubeconfig: Path,
    tmp_path: Path,
    placement_keys: PlacementKeys,
) -> None:
    for n in range(NODES):
        add_node(kube_api, f"gpu-{n}", [GPU_BYTES] * GPUS)
    port = free_port()
    log_path = tmp_path / "binder.log"
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "binder", "--kubeconfig", str(kubeconfig),
                "--listen-http", f"127.0.0.1:{port}", "--identity", "chaos",
                "--lease-duration", str(LEASE_SECONDS), "--renew-deadline", "2",
                "--retry-period", "0.5", "--watch-failure-grace", "1",
                "--backoff-initial", "0.2", "--backoff-max", "1",
                "--gpu-mem-process-allowance", "0",  # the pods fill the GPUs by their requests
                "--placement-key-dir", str(placement_keys.directory),
            ],
            cwd=ROOT,
            stderr=log_file,
        )  # fmt: skip
    try:
        wait_for(lambda: get(port, "/readyz") == (200, "ready (leader)"), "a ready leader")
        before = PODS // 3
        create(core, "before", before)
        wait_for(
            lambda: all(node for node, _, _ in placements(core).values()),
            "the first pods to be bound",
        )
        during = PODS // 3
        create(core, "during", during)  # some are being bound when the server goes down
        apiserver.pause()
        down = time.monotonic()
        wait_for(lambda: get(port, "/readyz")[0] == 503, "/readyz to report the outage")
        wait_for(lambda: is_leader(port) == 0.0, "the leader to step down")
        # Stay down for longer than the lease, checking all along that the binder stays up.
        wait_for(
            lambda: process.poll() is None and time.monotonic() - down > OUTAGE_SECONDS,
            "the outage to last longer than the lease",
        )
        assert process.poll() is None
        apiserver.resume()
        create(core, "after", PODS - before - during)
        everything = wait_for(
            lambda: (p := placements(core)) and all(node for node, _, _ in p.values()) and p,
            "every pod to be bound after the outage",
            within=60,
        )
        wait_for(lambda: get(port, "/readyz") == (200, "ready (leader)"), "ready and leading")
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
    log = log_path.read_text()
    assert process.returncode == 0, log[-3000:]
    assert "Exception in thread" not in log, log[-3000:]
    assert len(everything) == PODS

    used: dict[str, int] = defaultdict(int)
    models: dict[str, list[str]] = defaultdict(list)
    for name, (node, gpu, model) in everything.items():
        assert gpu.startswith(f"GPU-{node}-"), f"pod {name} on {node} names GPU {gpu}"
        used[gpu] += POD_GI * GI
        models[node].append(model)
    assert max(used.values()) <= GPU_BYTES, json.dumps(used)
    for node, ids in models.items():
        assert len(ids) == len(set(ids)), f"a model id twice on {node}: {sorted(ids)}"
