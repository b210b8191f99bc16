"""Benchmark: a TritonModel's throughput through its Service at 1 and at 2 replicas on one node.

On the simulated cluster with the real processes and a real Triton on the CPU (one node of two
GPUs), a TritonModel of add_one made to take `--work-ms` per request (a model that keeps its one
instance busy, as a GPU-bound one does) is served at 1 replica, then scaled to 2 on the same node
(the binder places the second beside the first, on the other GPU; the namespace's one model host
serves both). At each, `--clients` threads send requests through the Service (the host's address)
for `--seconds`, each waiting for its answer before the next. Prints the answers a second at each
side by side, and their ratio: with the node gateway spreading the host's requests over both
replicas, 2 replicas answer about twice as many.

Run: .venv/bin/python -m benchmarks.replica_spread [--clients 8] [--seconds 10] [--work-ms 20]
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import numpy as np
import tritonclient.http as httpclient

from benchmarks import command_line
from common.contract import Keys
from common.hosted import serves_label
from sim.cluster import NodeSpec, SimCluster
from sim.demo.scenario import MODELS_DIR
from sim.processes import wait_until
from sim.service import Endpoints

KEYS = Keys()
NAMESPACE = "bench"
MODEL = "busy"
GROUP, VERSION, PLURAL = "tritonshare.io", "v1alpha1", "tritonmodels"
NODE = NodeSpec("gpu-a", "2xT4", real=True)
DATA = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)


def _busy_model(workdir: Path, work_ms: float) -> Path:
    """add_one, holding its instance `work_ms` per request."""
    model = workdir / "busy"
    shutil.copytree(MODELS_DIR / "add_one", model)
    code = model / "1" / "model.py"
    text = code.read_text().replace(
        "        for request in requests:\n",
        f"        for request in requests:\n            time.sleep({work_ms / 1000!r})\n",
    )
    code.write_text("import time\n" + text)
    return model


def _throughput(service: Endpoints, clients: int, seconds: float) -> float:
    """Answers a second of `clients` threads, each one request at a time, for `seconds`."""
    answers = [0] * clients
    failures: list[str] = []
    start = threading.Barrier(clients + 1)
    deadline = 0.0

    def client(index: int) -> None:
        address = service.pick()
        assert address is not None
        with httpclient.InferenceServerClient(f"{address}:9000", network_timeout=30) as http:
            tensor = httpclient.InferInput("INPUT0", list(DATA.shape), "FP32")
            tensor.set_data_from_numpy(DATA)
            start.wait()
            while time.monotonic() < deadline:
                try:
                    http.infer(MODEL, [tensor])
                    answers[index] += 1
                except Exception as e:  # counted, not fatal: the figure says how many failed
                    failures.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + seconds
    start.wait()
    began = time.monotonic()
    for thread in threads:
        thread.join()
    if failures:
        print(f"  {len(failures)} requests failed, the first: {failures[0]}")
    return sum(answers) / (time.monotonic() - began)


def run(clients: int, seconds: float, work_ms: float) -> None:
    with (
        tempfile.TemporaryDirectory() as workdir,
        SimCluster(
            Path(workdir) / "cluster",
            (NODE,),
            binders=1,
            webhook=True,
            tenant_code_namespaces=(NAMESPACE,),
        ) as cluster,
    ):
        assert cluster.model_store is not None and cluster.kube is not None, cluster.missing
        core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
        custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
        core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        uri = cluster.model_store.publish(MODEL, _busy_model(Path(workdir), work_ms))
        body: dict[str, Any] = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TritonModel"}
        body |= {
            "metadata": {"name": MODEL},
            "spec": {"storageUri": uri, "gpuMemory": "1Gi", "replicas": 1},
        }
        custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)

        def ready(count: int) -> bool:
            obj = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, MODEL)
            return bool((obj.get("status") or {}).get("readyReplicas") == count)

        figures: dict[int, float] = {}
        with Endpoints(cluster.kube, NAMESPACE, f"{serves_label(KEYS, MODEL)}=true") as service:
            for replicas in (1, 2):
                if replicas > 1:
                    custom.patch_namespaced_custom_object(
                        GROUP, VERSION, NAMESPACE, PLURAL, MODEL, {"spec": {"replicas": replicas}}
                    )
                wait_until(f"{replicas} replicas ready", partial(ready, replicas), 180)
                wait_until("the Service's endpoint", service.pick, 30)
                _throughput(service, clients, 2.0)  # warm: connections, the gateway's table
                figures[replicas] = _throughput(service, clients, seconds)
                print(f"{replicas} replica(s): {figures[replicas]:.1f} answers/s", flush=True)
        print(
            f"one node, {clients} clients, {work_ms:g} ms a request, {seconds:g} s each: "
            f"1 replica {figures[1]:.1f}/s, 2 replicas {figures[2]:.1f}/s "
            f"(x{figures[2] / figures[1]:.2f})"
        )


def main() -> None:
    parser = command_line(
        "replica_spread",
        (
            "Measures a TritonModel's answers a second through its Service at 1 and at 2 "
            "replicas on one node of two GPUs, --clients threads for --seconds each, its model "
            "taking --work-ms a request."
        ),
    )
    parser.add_argument("--clients", type=int, default=8, help="client threads (8)")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds at each (10)")
    parser.add_argument("--work-ms", type=float, default=20.0, help="a request's work (20 ms)")
    args = parser.parse_args()
    run(args.clients, args.seconds, args.work_ms)


if __name__ == "__main__":
    main()
