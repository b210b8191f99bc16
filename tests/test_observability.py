"""Observability, for real: Prometheus scrapes the agent, the binder and a model pod's proxy.

A small simulated cluster (the node with a real Triton, its agent, one binder, the kubelet) runs
one model pod; after an inference through its proxy, a real Prometheus (Debian's `prometheus`)
scrapes the three /metrics endpoints and the test reads the results through Prometheus' HTTP API,
as a dashboard or an autoscaler would. `promtool check metrics` must accept each exposition.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
import yaml

from sim.cluster import SimCluster
from sim.demo.scenario import NAMESPACE, NODES, PODS, PodPorts, model_pod_manifest
from sim.processes import wait_until
from sim.triton import TritonInstall, free_port
from tests.conftest import require_executable
from tests.deploy.test_dashboard import SCALED_OBJECT, queries

POD = next(p for p in PODS if p.name == "add-one")


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[tuple[SimCluster, PodPorts]]:
    with SimCluster(tmp_path / "cluster", [NODES[0]], binders=1) as running:
        assert running.missing == [], running.missing
        assert running.triton is not None and running.gateway is not None
        ports = PodPorts(free_port(), free_port(), free_port())
        agent_port = int(running.agents[NODES[0].name].grpc.rpartition(":")[2])
        running.core.create_namespace(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            _preload_content=False,
        )
        manifest = model_pod_manifest(
            POD,
            ports,
            agent_port=agent_port,
            gateway_http_port=running.gateway.http,
            gateway_grpc_port=running.gateway.grpc,
        )
        running.core.create_namespaced_pod(NAMESPACE, manifest, _preload_content=False)
        try:
            yield running, ports
        finally:
            running.core.delete_namespaced_pod(POD.name, NAMESPACE, _preload_content=False)
            assert running.kubelet is not None
            running.kubelet.wait_idle(60)


def _ready(cluster: SimCluster) -> str:
    """The pod's IP (where its proxy listens) once it is Ready, else ""."""
    pod = json.loads(
        cluster.core.read_namespaced_pod(POD.name, NAMESPACE, _preload_content=False).data
    )
    ready = any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )
    return str(pod["status"]["podIP"]) if ready else ""


def _query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    url = f"http://{prometheus}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=5) as response:
        answer = json.loads(response.read())
    assert answer["status"] == "success", answer
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


@pytest.mark.slow
@pytest.mark.triton
def test_prometheus_scrapes_every_part_and_promtool_accepts_each_exposition(
    cluster: tuple[SimCluster, PodPorts], tmp_path: Path
) -> None:
    prometheus_bin = require_executable("prometheus")
    promtool = require_executable("promtool")
    sim, ports = cluster
    address = wait_until("the model pod becoming Ready", lambda: _ready(sim), 120)
    with httpclient.InferenceServerClient(f"{address}:{ports.http}") as client:
        tensor = httpclient.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.array([[1.0, 5.0]], dtype=np.float32))
        assert client.infer(POD.model_id, [tensor]).as_numpy("OUTPUT0").tolist() == [[2.0, 6.0]]

    targets = {
        "agent": sim.agents[NODES[0].name].http,
        "binder": sim.binders[0].http,
        "proxy": f"{address}:{ports.metrics}",
    }
    for job, address in targets.items():
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
            exposition = response.read()
        check = subprocess.run(
            [promtool, "check", "metrics"], input=exposition, capture_output=True, timeout=60
        )
        problems = check.stdout.decode() + check.stderr.decode()
        assert check.returncode == 0, f"promtool rejects the {job}'s /metrics:\n{problems}"

    config = tmp_path / "prometheus.yml"
    # The target labels deploy/monitoring's PodMonitors give (namespace, and model_id for proxies).
    target_labels = {
        "agent": {"namespace": "tritonshare-system"},
        "binder": {"namespace": "tritonshare-system"},
        "proxy": {"namespace": NAMESPACE, "model_id": POD.model_id},
    }
    scrape_configs = [
        {
            "job_name": job,
            "scrape_interval": "1s",
            "static_configs": [{"targets": [address], "labels": target_labels[job]}],
        }
        for job, address in targets.items()
    ]
    config.write_text(
        json.dumps({"global": {"scrape_interval": "1s"}, "scrape_configs": scrape_configs})
    )
    listen = f"127.0.0.1:{free_port()}"
    log_path = tmp_path / "prometheus.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [
                prometheus_bin,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address={listen}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def all_up() -> bool:
            try:
                up = _query(listen, "up == 1")
            except OSError:
                return False
            return {r["metric"]["job"] for r in up} == set(targets)

        try:
            wait_until("Prometheus scraping all three parts", all_up, 60)
        except Exception:
            pytest.fail(f"Prometheus did not scrape every part; its log:\n{log_path.read_text()}")

        def value(expr: str) -> float:
            found = _query(listen, expr)
            assert found, f"Prometheus has no result for {expr}"
            return float(found[0]["value"][1])

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not _query(
            listen, 'tritonshare_proxy_requests_total{route="infer"}'
        ):
            time.sleep(0.5)
        assert value('sum(tritonshare_proxy_requests_total{job="proxy",route="infer"})') >= 1
        assert value(f'tritonshare_proxy_concurrency_limit{{model="{POD.model_id}"}}') == 0
        assert value('tritonshare_binder_schedule_attempts_total{result="scheduled"}') == 1
        assert value("tritonshare_binder_is_leader") == 1
        assert value("sum(tritonshare_agent_models_loaded)") == 1
        assert value("count(tritonshare_agent_gpu_memory_total_bytes)") == 2

        # The example's autoscaler query, verbatim, has data to scale on once rate() has two
        # scrapes; every dashboard query is one Prometheus evaluates.
        autoscaler = yaml.safe_load(SCALED_OBJECT.read_text())["spec"]["triggers"][0]
        query = autoscaler["metadata"]["query"].replace(
            'model="add_one"', f'model="{POD.model_id}"'
        )
        wait_until("the autoscaler's query to have data", lambda: _query(listen, query), 30)
        assert value(query) >= 0
        for expr in queries():
            _query(listen, expr)
    finally:
        server.terminate()
        server.wait(30)
