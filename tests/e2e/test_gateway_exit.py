"""The node gateway's process, then Triton's, killed with calls in flight, on the simulated
cluster with the real processes (one real node; the gateway and Triton each run by a keeper,
which starts it again at once): the calls of a TritonModel marked `idempotent` are answered,
over REST and gRPC, sent again by its host's proxy (after Triton's exit, once the gateway has
the model back); those of a neighbour on the same host without it fail once (502, UNAVAILABLE),
as Triton may have run them. Both models are `sleepy` (Python: tenant code, which the namespace is
let run), so the calls are still at Triton when the gateway goes."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from common.hosted import host_name
from sim.cluster import SimCluster
from sim.processes import process_stats, wait_until
from sim.triton import TritonInstall
from tests.e2e.test_node_pod_drain import _listening, _ready
from tests.e2e.test_tritonmodel_one_node import NAMESPACE, NODE
from tests.e2e.test_tritonmodel_two_nodes import GROUP, PLURAL, VERSION

SLEEPY = Path(__file__).resolve().parents[1] / "proxy" / "models" / "sleepy"
DELAY_MS = 4000
"""Each call's time at Triton: both calls of a model are at the gateway for that long."""


@pytest.fixture
def cluster(
    tmp_path: Path, triton_install: TritonInstall, monkeypatch: pytest.MonkeyPatch
) -> Iterator[SimCluster]:
    """One real node of four T4s and the namespace, as the one-node test's. Its agent counts a
    Triton exit against no model loaded just before it (`--crash-settle-seconds 0`), so that
    the test's models, loaded seconds before, load again at once after the exit, not last and
    alone as suspects; its gateway lets all four calls to Triton at once
    (`--max-in-flight-node 8`, the default being the machine's CPUs), so that each is at Triton
    when it exits, whatever the machine."""
    monkeypatch.setenv("TRITONSHARE_CRASH_SETTLE_SECONDS", "0")
    monkeypatch.setenv("TRITONSHARE_MAX_IN_FLIGHT_NODE", "8")
    with SimCluster(
        tmp_path / "cluster",
        (NODE,),
        binders=1,
        webhook=True,
        tenant_code_namespaces=(NAMESPACE,),
        keep_pod_logs=True,
    ) as running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


def _files(root: Path, name: str) -> Path:
    """The sleepy model's files under the model id `name`."""
    directory = root / name
    shutil.copytree(SLEEPY, directory)
    config = directory / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "sleepy"', f'name: "{name}"'))
    return directory


def _rest(address: str, model: str) -> str:
    connection = http.client.HTTPConnection(address, 9000, timeout=60)
    body = {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [DELAY_MS]}]}
    try:
        connection.request("POST", f"/v2/models/{model}/infer", json.dumps(body).encode())
        answer = connection.getresponse()
        answer.read()
        return str(answer.status)
    finally:
        connection.close()


def _grpc(address: str, model: str) -> str:
    client = grpcclient.InferenceServerClient(f"{address}:9001")
    tensor = grpcclient.InferInput("DELAY_MS", [1], "INT32")
    tensor.set_data_from_numpy(np.array([DELAY_MS], dtype=np.int32))
    try:
        client.infer(model, [tensor], client_timeout=60)
        return "OK"
    except grpcclient.InferenceServerException as e:
        return str(e.status())
    finally:
        client.close()


def _at_gateway(url: str) -> dict[str, tuple[float, float]]:
    """The requests the gateway holds now by model: at Triton, and queued for a slot there."""
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    held: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            kind = {
                "tritonshare_gateway_requests_in_flight": 0,
                "tritonshare_gateway_requests_queued": 1,
            }.get(sample.name)
            if kind is not None and "pod" in sample.labels:
                held.setdefault(sample.labels["model"], [0.0, 0.0])[kind] += sample.value
    return {model: (counts[0], counts[1]) for model, counts in held.items()}


@pytest.mark.slow
@pytest.mark.triton
def test_an_idempotent_models_calls_are_answered_through_a_gateway_or_triton_exit(
    cluster: SimCluster, tmp_path: Path
) -> None:
    assert cluster.model_store is not None and cluster.kube is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    for name, idempotent in (("idem", True), ("plain", False)):
        uri = cluster.model_store.publish(name, _files(tmp_path, name))
        spec = {"storageUri": uri, "gpuMemory": "1Gi", "replicas": 1, "maxConcurrency": 4}
        spec["idempotent"] = idempotent
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TritonModel"}
        custom.create_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, {**body, "metadata": {"name": name}, "spec": spec}
        )
    wait_until("both ready", lambda: _ready(custom, "idem") == _ready(custom, "plain") == 1, 180)
    address = core.read_namespaced_pod(host_name(NODE.name), NAMESPACE).status.pod_ip
    wait_until("the host listening", lambda: _listening(address), 30)
    gateway = cluster.gateways[NODE.name]
    metrics = f"http://{gateway.address}:{gateway.metrics}/metrics"

    # The gateway's process ends: the host's proxy loses its connections to the gateway.
    killed = _calls_lost_by(address, metrics, gateway.serving_pid, cluster.workdir)
    wait_until("a new gateway process", lambda: gateway.serving_pid() not in (None, killed), 30)
    wait_until("the gateway serving", lambda: _rest(address, "plain") == "200", 30)
    # Triton's process ends (as a crash): the gateway loses its connections to Triton, holds the
    # calls sent again until the models are loaded again, and the host's proxy sends them.
    triton = cluster.tritons[NODE.name]
    _calls_lost_by(address, metrics, lambda: _kept_pid(triton.process), cluster.workdir)


def _kept_pid(keeper: subprocess.Popen[bytes] | None) -> int | None:
    """The process a keeper runs now (Triton's server under its container's keeper)."""
    assert keeper is not None
    return next((p.pid for p in process_stats() if p.parent == keeper.pid and p.state != "Z"), None)


def _calls_lost_by(
    address: str, metrics: str, victim: Callable[[], int | None], workdir: Path
) -> int:
    """Two calls of each model over each protocol at Triton through the gateway, then the
    process `victim` names SIGKILLed (its pid returned): the idempotent model's calls are
    answered; the other's fail once (REST 502, gRPC UNAVAILABLE). A failure shows what the
    proxies (the host's, the gateway) logged at WARNING and above in `workdir`."""
    with ThreadPoolExecutor(4) as pool:
        calls = {
            (model, protocol): pool.submit(call, address, model)
            for model in ("idem", "plain")
            for protocol, call in (("rest", _rest), ("grpc", _grpc))
        }
        seen: list[dict[str, tuple[float, float]]] = []

        def held() -> bool:
            seen.append(_at_gateway(metrics))
            return seen[-1] == {"idem": (2.0, 0.0), "plain": (2.0, 0.0)}

        wait_until("every call at the gateway", held, 30, lambda: f"the gateway held {seen}")
        killed = victim()
        assert killed is not None
        os.kill(killed, signal.SIGKILL)
        outcomes = {key: call.result(90) for key, call in calls.items()}
    expected = {
        ("idem", "rest"): "200",
        ("idem", "grpc"): "OK",
        ("plain", "rest"): "502",
        ("plain", "grpc"): "StatusCode.UNAVAILABLE",
    }
    assert outcomes == expected, f"{outcomes}\n{_warnings(workdir)}"
    return killed


def _warnings(workdir: Path) -> str:
    """The proxies' and the gateway's log lines at WARNING and above, for a failure's message."""
    lines = []
    for path in sorted(workdir.rglob("*.log")):
        if path.name == "proxy.log" or path.name.startswith("gateway"):
            text = path.read_text(errors="replace").splitlines()
            lines += [
                f"{path.name}: {line}" for line in text if " WARNING " in line or " ERROR " in line
            ]
    return "\n".join(lines[-40:])
