"""Benchmark: what a TritonModel's second replica adds, on another GPU against on the same GPU.

On the simulated cluster with the real processes and a real Triton on the CPU (one node of two
GPUs), where each simulated GPU runs one request at a time (`sim.gpu.compute`: a GPU as a
serial executor), two TritonModels of one model taking `--work-ms` of its GPU per request:
`spread` (spec.replicaSpread GPU, the default) and `packed` (replicaSpread None). `spread` is
measured at 1 replica, then both are scaled to 2: the binder puts `spread`'s second replica on
the other GPU and `packed`'s beside its first. At each, `--clients` threads send requests
through the model's Service (its host's address) for `--seconds`, each waiting for its answer
before the next. Prints the answers a second and the ratios to 1 replica; the goal (checked
unless `--no-goal`): a second replica on another GPU answers at least `SPREAD_GOAL` times one
replica's, one on the same GPU at most `PACKED_GOAL` times (it adds no GPU time).

Run: .venv/bin/python -m benchmarks.replica_spread [--clients 8] [--seconds 10] [--work-ms 20]
[--no-goal]
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import numpy as np
import tritonclient.http as httpclient

from benchmarks import command_line, goals
from common.contract import Keys
from common.hosted import serves_label
from sim.cluster import NodeSpec, SimCluster
from sim.gpu.compute import model_files
from sim.processes import wait_until
from sim.service import Endpoints

KEYS = Keys()
NAMESPACE = "bench"
SPREAD, PACKED = "spread", "packed"
GROUP, VERSION, PLURAL = "tritonshare.io", "v1alpha1", "tritonmodels"
NODE = NodeSpec("gpu-a", "2xT4", real=True)
DATA = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
SPREAD_GOAL = 1.6
"""A second replica on another GPU: at least this many times one replica's answers."""
PACKED_GOAL = 1.2
"""A second replica on the same GPU: at most this many times one replica's answers."""


def _throughput(service: Endpoints, model: str, clients: int, seconds: float) -> float:
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
                    http.infer(model, [tensor])
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


def run(clients: int, seconds: float, work_ms: float) -> dict[str, float]:
    """The answers a second: `spread` at 1 and 2 replicas, `packed` at 2."""
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
        kube = cluster.kube
        core = cast(Any, kubernetes.client.CoreV1Api(kube))
        custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
        core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        files = model_files(Path(workdir) / "busy", work_ms)
        uri = cluster.model_store.publish("busy", files)
        for name, spread in ((SPREAD, "GPU"), (PACKED, "None")):
            body: dict[str, Any] = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TritonModel"}
            body |= {
                "metadata": {"name": name},
                "spec": {
                    "storageUri": uri,
                    "gpuMemory": "1Gi",
                    "replicas": 1,
                    "replicaSpread": spread,
                },
            }
            custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)

        def status(name: str) -> dict[str, Any]:
            obj = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
            return cast(dict[str, Any], obj.get("status") or {})

        def measure(name: str, replicas: int) -> float:
            if replicas > 1:
                custom.patch_namespaced_custom_object_scale(
                    GROUP, VERSION, NAMESPACE, PLURAL, name, {"spec": {"replicas": replicas}}
                )
            wait_until(
                f"{name}: {replicas} replicas ready",
                lambda: status(name).get("readyReplicas") == replicas,
                180,
            )
            gpus = [p["gpu"][-6:] for p in status(name).get("placements") or []]
            selector = f"{serves_label(KEYS, name)}=true"
            with Endpoints(kube, NAMESPACE, selector) as service:
                wait_until("the Service's endpoint", service.pick, 30)
                _throughput(service, name, clients, 2.0)  # warm: connections, GPU assignments
                figure = _throughput(service, name, clients, seconds)
            print(f"{name}, {replicas} replica(s) on GPUs {gpus}: {figure:.1f} answers/s")
            return figure

        return {
            "one": measure(SPREAD, 1),
            "spread": measure(SPREAD, 2),
            "packed": measure(PACKED, 2),
        }


def check_goals(figures: dict[str, float]) -> list[bool]:
    """Answers a second at 1 replica (`one`) and at 2 (`spread`, `packed`) against the goals: the
    second replica on another GPU at least `SPREAD_GOAL` times one's, on the same GPU at most
    `PACKED_GOAL` times."""
    return [
        goals.check(
            "2 replicas on two GPUs / 1 replica",
            figures["spread"] / figures["one"],
            SPREAD_GOAL,
            ">=",
            "x",
        ),
        goals.check(
            "2 replicas on one GPU / 1 replica",
            figures["packed"] / figures["one"],
            PACKED_GOAL,
            unit="x",
        ),
    ]


def main() -> int:
    parser = command_line(
        "replica_spread",
        (
            "Measures a TritonModel's answers a second through its Service at 1 replica, and at "
            "2 with the second on the other GPU (replicaSpread GPU) and on the same GPU "
            "(replicaSpread None), on one node of two simulated GPUs that each run one request "
            "at a time; --clients threads for --seconds each, a request taking --work-ms of its "
            "GPU."
        ),
    )
    parser.add_argument("--clients", type=int, default=8, help="client threads (8)")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds at each (10)")
    parser.add_argument("--work-ms", type=float, default=20.0, help="a request's GPU time (20 ms)")
    goals.add_flag(parser)
    args = parser.parse_args()
    figures = run(args.clients, args.seconds, args.work_ms)
    spread, packed = figures["spread"] / figures["one"], figures["packed"] / figures["one"]
    print(
        f"one node of 2 GPUs, {args.clients} clients, {args.work_ms:g} ms a request, "
        f"{args.seconds:g} s each: 1 replica {figures['one']:.1f}/s; 2 on two GPUs "
        f"{figures['spread']:.1f}/s (x{spread:.2f}); 2 on one GPU {figures['packed']:.1f}/s "
        f"(x{packed:.2f})"
    )
    return goals.exit_code(check_goals(figures), args.no_goal)


if __name__ == "__main__":
    sys.exit(main())
