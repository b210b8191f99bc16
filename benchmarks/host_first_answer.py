"""Benchmark: how soon a new replica answers, as a TritonModel on a running host or as a pod.

On the simulated cluster with the real processes and a real Triton on the CPU (one node), a
TritonModel `warm` makes the namespace's model host run first. Then, `--rounds` times, in turn:

- a new TritonModel (add_one, its files on the sim's HTTPS model store) is created and requests
  are sent to the host's address every 20 ms until one is answered: the time from the create to
  that answer, beside Triton's own load of the model (as Triton reports it: from its log's
  "loading" line for the model's name in Triton to its "successfully loaded" line);
- a model pod of the same model in the short form (the webhook completes it; its storage
  initializer fetches the same archive) is created and asked the same way through its own
  address: the baseline, a pod start.

Each is deleted before the next round. Prints each round and the medians: the TritonModel's
first answer, Triton's load within it and what tritonshare adds (target: the median of the
rounds' first answer over Triton's load at most 0.3 s), and the pod's first answer.

With `--from-zero`, instead: one TritonModel with `autoscaling` `minReplicas: 0` and a 6 s
window, `--rounds` times scaled to zero by the built-in autoscaler, unloaded (its host kept,
the model parked there), then sent one request through its host: the time to that answer beside
Triton's own load of the model (target: the p95 of the rounds' first answer over Triton's load at
most 1 s). Percentiles are by the nearest rank, and a percentile is judged only over the rounds
it needs (`rounds_for`: 20 for a p95, 100 for a p99); fewer rounds do not meet the goal.

Each target is printed as a goal, met or NOT MET; the run exits 1 when it is not met (`--no-goal`:
0 anyway).

Run: .venv/bin/python -m benchmarks.host_first_answer [--rounds 3] [--from-zero [--rounds 20]]
[--no-goal]
"""

from __future__ import annotations

import math
import re
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import numpy as np
import tritonclient.http as httpclient

from benchmarks import command_line, goals
from common.contract import Keys
from common.hosted import decode_parked
from common.tritonname import DIGEST_HEX
from sim.cluster import SimCluster
from sim.demo.scenario import MODELS_DIR, NODES
from sim.processes import wait_until

KEYS = Keys()
NAMESPACE = "models"
GROUP, VERSION, PLURAL = "tritonshare.io", "v1alpha1", "tritonmodels"
DATA = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
HOSTED_GOAL = 0.3
"""Seconds: a new replica's first answer on a running host over Triton's load, the median."""
FROM_ZERO_GOAL = 0.95, 1.0
"""The quantile and its seconds: a first answer from zero over Triton's load, the p95."""
_LOG_LINE = re.compile(
    r"^[IWE]\d{4} (\d\d):(\d\d):(\d\d\.\d+) +\d+ \S+\] "
    r"\"(?:loading: (?P<loading>[^\"]+):\d+|successfully loaded '(?P<loaded>[^']+)')"
)


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile (0..1) of `values` by the nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def rounds_for(q: float) -> int:
    """The fewest rounds whose nearest-rank `q` quantile is not their maximum: 20 for a p95,
    100 for a p99 (with fewer, the "p99" is the largest round)."""
    return math.ceil(round(1 / (1 - q), 6))


def triton_loads(log: str) -> list[tuple[str, float]]:
    """Each load Triton's log shows complete, in the order they completed: (name in Triton,
    seconds from its "loading" line to its "successfully loaded" line)."""
    started: dict[str, float] = {}
    loads = []
    for line in log.splitlines():
        match = _LOG_LINE.search(line)
        if match is None:
            continue
        hours, minutes, seconds = match.group(1, 2, 3)
        at = int(hours) * 3600 + int(minutes) * 60 + float(seconds)
        if match["loading"] is not None:
            started[match["loading"]] = at
        elif match["loaded"] in started:
            loads.append((match["loaded"], (at - started.pop(match["loaded"])) % 86400))
    return loads


def load_of(loads: list[tuple[str, float]], model: str) -> float:
    """Triton's last complete load of the model whose public id is `model` (its private names:
    the id, a dash and a digest)."""
    private = re.compile(re.escape(model) + f"-[0-9a-f]{{{DIGEST_HEX}}}")
    times = [seconds for name, seconds in loads if private.fullmatch(name)]
    if not times:
        raise LookupError(f"Triton's log shows no load of {model}")
    return times[-1]


def check_goals(over: list[float], from_zero: bool) -> list[bool]:
    """Each round's first answer over Triton's load against the goal: its median on a running
    host; from zero, its p95, judged only over the rounds a p95 needs."""
    if not from_zero:
        figure = statistics.median(over)
        return [
            goals.check("first answer over Triton's load, median", figure, HOSTED_GOAL, unit=" s")
        ]
    q, goal = FROM_ZERO_GOAL
    name = f"first answer from zero over Triton's load, p{q * 100:g}"
    return [
        goals.require(
            f"{len(over)} rounds, at least the {rounds_for(q)} a p{q * 100:g} needs",
            len(over) >= rounds_for(q),
        ),
        goals.check(name, percentile(over, q), goal, unit=" s"),
    ]


def _model(name: str, uri: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TritonModel",
        "metadata": {"name": name},
        "spec": {
            "storageUri": uri,
            "gpuMemory": "512Mi",
            "nodeSelector": {"kubernetes.io/hostname": node},
        },
    }


def _pod(name: str, uri: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"tritonshare.io/role": "model"},
            "annotations": {
                f"{KEYS.prefix}model-uri": uri,
                f"{KEYS.prefix}gpu-mem": "512Mi",
                f"{KEYS.prefix}model-id": name,
            },
        },
        "spec": {"containers": [{"name": "proxy", "image": "tritonshare"}]},
    }


def _answers(address: str, model: str) -> bool:
    try:
        with httpclient.InferenceServerClient(f"{address}:9000", network_timeout=5) as http:
            tensor = httpclient.InferInput("INPUT0", list(DATA.shape), "FP32")
            tensor.set_data_from_numpy(DATA)
            answer = http.infer(model, [tensor]).as_numpy("OUTPUT0")
    except Exception:
        return False
    return bool(answer.reshape(-1).tolist() == [2.0, 3.0, 4.0])


def _first_answer(address: Any, model: str, limit: float) -> float:
    """Seconds until `model` answers at `address()` (None while it has none yet)."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        where = address()
        if where and _answers(where, model):
            return time.monotonic() - started
        time.sleep(0.02)
    raise TimeoutError(f"{model} did not answer within {limit:.0f} s")


def _agent_metric(cluster: SimCluster, name: str) -> float:
    """The node's agent's series `name` (unlabelled) as it reads now; 0 before its first."""
    agent = cluster.agents[NODES[0].name]
    with urllib.request.urlopen(f"http://{agent.http}/metrics", timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith(f"{name} "):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _triton_load(cluster: SimCluster, model: str) -> float:
    """Triton's own time for its last load of `model`, read from its log."""
    triton = cluster.triton
    assert triton is not None and triton.log_path is not None
    return load_of(triton_loads(triton.log_path.read_text(errors="replace")), model)


def run(rounds: int) -> list[bool]:
    node = NODES[0]
    with (
        tempfile.TemporaryDirectory() as workdir,
        SimCluster(Path(workdir), [node], binders=1, webhook=True) as cluster,
    ):
        assert cluster.model_store is not None
        core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
        custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
        core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        store = cluster.model_store
        warm = store.publish("warm", MODELS_DIR / "add_one", release="bench")
        custom.create_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, _model("warm", warm, node.name)
        )

        def host_address() -> str | None:
            hosts = core.list_namespaced_pod(
                NAMESPACE, label_selector=f"{KEYS.prefix}model-host=true"
            ).items
            return hosts[0].status.pod_ip if hosts and hosts[0].status.pod_ip else None

        host = wait_until("the model host", host_address, 120)
        _first_answer(lambda: host, "warm", 120)
        hosted, loads, pods = [], [], []
        for i in range(rounds):
            name = f"tm-{i}"
            uri = store.publish(name, MODELS_DIR / "add_one", release="bench")
            custom.create_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, PLURAL, _model(name, uri, node.name)
            )
            hosted.append(_first_answer(lambda: host, name, 120))
            loads.append(_triton_load(cluster, name))
            custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)

            pod = f"pod-{i}"
            uri = store.publish(pod, MODELS_DIR / "add_one", release="bench")
            core.create_namespaced_pod(NAMESPACE, _pod(pod, uri))

            def pod_address(pod: str = pod) -> str | None:
                read = core.read_namespaced_pod(pod, NAMESPACE)
                return str(read.status.pod_ip) if read.status.pod_ip else None

            pods.append(_first_answer(pod_address, pod, 180))
            core.delete_namespaced_pod(pod, NAMESPACE)
            print(
                f"round {i + 1}: TritonModel on its host {hosted[-1]:.2f} s (Triton's load "
                f"{loads[-1]:.2f} s, tritonshare {hosted[-1] - loads[-1]:.2f} s); model pod "
                f"{pods[-1]:.2f} s",
                flush=True,
            )
        h, load, p = (statistics.median(v) for v in (hosted, loads, pods))
        over = [first - load for first, load in zip(hosted, loads, strict=True)]
        print(
            f"first answer of a new replica, median of {rounds}: TritonModel on a running host "
            f"{h:.2f} s, Triton's load {load:.2f} s, over it {statistics.median(over):.2f} s; as "
            f"a model pod {p:.2f} s"
        )
        return check_goals(over, from_zero=False)


def _unloads(cluster: SimCluster) -> float:
    """Unloads the node's agent has done."""
    return _agent_metric(cluster, "tritonshare_agent_unload_duration_seconds_count")


def run_from_zero(rounds: int) -> list[bool]:
    """The first answer of a TritonModel scaled to zero, `rounds` times."""
    node = NODES[0]
    with (
        tempfile.TemporaryDirectory() as workdir,
        SimCluster(Path(workdir), [node], binders=1, webhook=True) as cluster,
    ):
        assert cluster.model_store is not None
        core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
        custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
        core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        uri = cluster.model_store.publish("zero", MODELS_DIR / "add_one", release="bench")
        body = _model("zero", uri, node.name)
        body["spec"]["autoscaling"] = {"target": 1, "minReplicas": 0, "window": "6s"}
        custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)
        parked = f"{KEYS.prefix}parked-models"

        def parked_host() -> str | None:
            hosts = core.list_namespaced_pod(
                NAMESPACE, label_selector=f"{KEYS.prefix}model-host=true"
            ).items
            for host in hosts:
                value = (host.metadata.annotations or {}).get(parked, "")
                if "zero" in [p.model for p in decode_parked(value, 100)[0]]:
                    return str(host.status.pod_ip) if host.status.pod_ip else None
            return None

        firsts, loads = [], []
        for i in range(rounds):
            unloads = _unloads(cluster)
            host = wait_until("the model parked at zero", parked_host, 180)

            def unloaded(before: float = unloads) -> bool:
                return _unloads(cluster) > before

            wait_until("unloaded", unloaded, 120)

            def drained() -> bool:
                """The agent's condition on the host no longer says the model is loaded."""
                [host_pod] = core.list_namespaced_pod(
                    NAMESPACE, label_selector=f"{KEYS.prefix}model-host=true"
                ).items
                return not any(
                    c.type == f"{KEYS.prefix}loaded-zero" and c.status == "True"
                    for c in host_pod.status.conditions or []
                )

            wait_until("no longer loaded on the host", drained, 60)
            firsts.append(_first_answer(lambda at=host: at, "zero", 120))
            loads.append(_triton_load(cluster, "zero"))
            print(
                f"round {i + 1}: first answer from zero {firsts[-1]:.2f} s (Triton's load "
                f"{loads[-1]:.2f} s, tritonshare {firsts[-1] - loads[-1]:.2f} s)",
                flush=True,
            )
        over = [f - load for f, load in zip(firsts, loads, strict=True)]
        said = ", ".join(
            f"p{q * 100:g} {percentile(over, q):.2f} s"
            for q in (0.5, 0.95, 0.99)
            if rounds >= rounds_for(q)
        )
        print(
            f"first answer from zero, {rounds} rounds: median {statistics.median(firsts):.2f} s, "
            f"Triton's load median {statistics.median(loads):.2f} s; over the load {said}, "
            f"largest {max(over):.2f} s"
        )
        return check_goals(over, from_zero=True)


def main(argv: list[str] | None = None) -> int:
    parser = command_line(
        "host_first_answer",
        (
            "Measures how soon a new replica answers: a TritonModel placed where its namespace's "
            "model host runs (against Triton's own load of the model), and a model pod of the "
            "same model (the baseline), --rounds of each, in turn."
        ),
    )
    parser.add_argument(
        "--rounds", type=int, help="replicas of each kind (3); with --from-zero, wakes (20)"
    )
    parser.add_argument(
        "--from-zero",
        action="store_true",
        help="time a TritonModel's first answer after it was scaled to zero, --rounds times",
    )
    goals.add_flag(parser)
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds: give 1 or more")
    if args.from_zero:
        met = run_from_zero(args.rounds or rounds_for(FROM_ZERO_GOAL[0]))
    else:
        met = run(args.rounds or 3)
    return goals.exit_code(met, args.no_goal)


if __name__ == "__main__":
    raise SystemExit(main())
