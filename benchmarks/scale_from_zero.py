"""Benchmark: many models woken from zero at once, in the shape of Knative's scale-from-zero.

Knative's benchmark (`test/performance/benchmarks/scale-from-zero` in knative/serving) wakes 1,
5, 25 and 100 services at once and holds the 25-service case to a p95 of 2 s. Here, on the
simulated cluster with the real processes and a real Triton on the CPU (one node, mock GPUs),
for each count in `--models`: that many TritonModels (add_one, Python backend) with
`autoscaling.minReplicas: 0` and a 6 s window are created and each asked once, then scaled to
zero by the built-in autoscaler and every replica unloaded (their model host kept, the models
parked there), then sent one request each, all at once, through the host. Printed for each
count: p50, p95 and max seconds from the requests' start to each model's first answer; what the
node's agent measured meanwhile (its wakes, Triton's load calls, installs); for TritonModels, where
the time went, phase by phase from the held request to the first answer (autoscaler decision,
placement and the host's load slot, install, queue for Triton's load, load, ready, answer:
`benchmarks.wakephases`, from the processes' logs); and the floor (`benchmarks.loadfloor`), a
Triton of the node's build and flags, in the same run, loading the same model files with the
configs the product loaded them with, over gRPC as the agent does, `--parallel-loads` at a time
and all at once, after a warm-up load, over `--rounds` rounds. The floor runs just before the
wake, when every model is parked and unloaded and the node is quiet (after it, the models'
deletion and their host's teardown would share its cores).

Goal, for 25 TritonModels: the product's p95 within 1.3x the better floor's p95, and its max
within 1.5x the better floor's max (like with like). Printed as met or NOT MET; the run exits 1
when one is not met (`--no-goal`: 0 anyway).

With `--during-scale-down`, as many other TritonModels of the namespace (one replica each, loaded
on the node) are deleted the moment the requests go: a burst of wakes beside a burst of unloads,
which must not wait for them one by one.

With `--as pods`, Deployments of model pods (the short form, completed by the webhook) take the
TritonModels' place: scaled from one replica to zero, then all back to one at once (a Deployment
has no request to wake it here: the scale-up is its request), each timed to its first answer at
its new pod's address.

The closing line, for the largest count run:

    scale_from_zero: 25 TritonModels: p95 4.1 s, max 5.2 s; floor p95 3.5 s, max 4.0 s (1.2x, 1.3x)

Run: .venv/bin/python -m benchmarks.scale_from_zero [--models 1 5 25] [--as tritonmodels|pods]
[--during-scale-down] [--rounds 3] [--no-goal]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import numpy as np
import tritonclient.http as httpclient

from benchmarks import command_line, goals, loadfloor, wakephases
from benchmarks.loadfloor import Floor, FloorModel, percentile
from common.contract import Keys
from common.hosted import decode_parked, loaded_condition
from sim.cluster import SimCluster
from sim.demo.scenario import MODELS_DIR, NODES
from sim.processes import wait_until
from sim.triton import PARALLEL_LOADS

KEYS = Keys()
NAMESPACE = "models"
GROUP, VERSION, PLURAL = "tritonshare.io", "v1alpha1", "tritonmodels"
DATA = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
COUNTS = (1, 5, 25)
"""Knative's counts but its 100 (`--models 100` runs it)."""
UNLOADS = "tritonshare_agent_unload_duration_seconds_count"
GPU_MEMORY = "256Mi"
"""Each model's request: 100 of them fit the node's two simulated T4s."""


GOAL_MODELS = 25
"""The count the goal holds (Knative's 25 services), for TritonModels."""
P95_GOAL = 1.3
"""The product's p95 at most this times the better floor's p95."""
MAX_GOAL = 1.5
"""The product's max at most this times the better floor's max."""
PHASES = (
    ("tritonshare_agent_wake_duration_seconds", "wakes", "start to READY"),
    ("tritonshare_agent_load_duration_seconds", "loads", "Triton's load call"),
    ("tritonshare_agent_install_duration_seconds", "installs", "install"),
)
"""The agent's histograms over a wake: (series, what it counts, what one measures)."""


@dataclass(frozen=True)
class Wake:
    """One count's wake: every model's seconds to its first answer, what the agent measured
    meanwhile, and the floors."""

    kind: str
    models: int
    firsts: tuple[float, ...]
    floors: tuple[Floor, ...] = ()
    phases: str = ""
    breakdown: tuple[str, ...] = ()

    @property
    def p95(self) -> float:
        return percentile(list(self.firsts), 0.95)

    @property
    def top(self) -> float:
        return max(self.firsts)

    @property
    def floor_p95(self) -> float:
        """The better floor's p95."""
        return min(f.p95 for f in self.floors)

    @property
    def floor_top(self) -> float:
        """The better floor's max."""
        return min(f.top for f in self.floors)

    def lines(self) -> list[str]:
        p50 = percentile(list(self.firsts), 0.5)
        said = [
            f"{self.models} {self.kind} woken at once: first answer p50 {p50:.2f} s, p95 "
            f"{self.p95:.2f} s, max {self.top:.2f} s"
        ]
        if self.phases:
            said.append(f"  the agent meanwhile: {self.phases}")
        return [*said, *self.breakdown]

    def floor_lines(self) -> list[str]:
        return [f"  floor: {f.line()}" for f in self.floors]

    @property
    def has_goal(self) -> bool:
        return self.kind == "TritonModels" and self.models == GOAL_MODELS

    def goals(self) -> list[bool]:
        """Each goal printed with met or NOT MET; empty when this wake has none."""
        if not self.has_goal:
            return []
        where = f"{self.models} {self.kind}"
        return [
            goals.check(f"{where}: p95 / the floor's p95", self.p95 / self.floor_p95, P95_GOAL,
                        unit="x"),
            goals.check(f"{where}: max / the floor's max", self.top / self.floor_top, MAX_GOAL,
                        unit="x"),
        ]  # fmt: skip


def closing(wakes: Sequence[Wake]) -> str:
    """The last line: the largest count's p95 and max beside the better floor's."""
    w = max(wakes, key=lambda w: w.models)
    return (
        f"scale_from_zero: {w.models} {w.kind}: p95 {w.p95:.1f} s, max {w.top:.1f} s; floor p95 "
        f"{w.floor_p95:.1f} s, max {w.floor_top:.1f} s ({w.p95 / w.floor_p95:.2f}x, "
        f"{w.top / w.floor_top:.2f}x)"
    )


def verdict(wakes: Sequence[Wake], no_goal: bool = False) -> int:
    """Every wake's goals checked; the exit status (`benchmarks.goals.exit_code`)."""
    results = [met for wake in wakes for met in wake.goals()]
    if not any(wake.has_goal for wake in wakes):
        print(f"goal: none checked (it is for {GOAL_MODELS} TritonModels)", flush=True)
    return goals.exit_code(results, no_goal)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = command_line(
        "scale_from_zero",
        (
            "Measures how soon models scaled to zero answer when each gets one request, all at "
            "once (--models counts, 1 5 25 by default), beside Triton's own time to load as many "
            "at once; --as pods wakes Deployments of model pods instead of TritonModels."
        ),
    )
    parser.add_argument(
        "--models",
        type=int,
        nargs="+",
        default=list(COUNTS),
        metavar="N",
        help="how many models wake at once, one run per count (1 5 25; Knative adds 100)",
    )
    parser.add_argument(
        "--as",
        dest="kind",
        choices=("tritonmodels", "pods"),
        default="tritonmodels",
        help="TritonModels at minReplicas 0 (the default) or Deployments of model pods",
    )
    parser.add_argument(
        "--parallel-loads",
        type=int,
        default=PARALLEL_LOADS,
        metavar="N",
        help=f"the node agent's --parallel-loads ({PARALLEL_LOADS}, the chart's); its Triton and "
        f"the floor's load N a GPU at once",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        metavar="N",
        help="rounds of each floor, medians printed (3)",
    )
    goals.add_flag(parser)
    parser.add_argument(
        "--during-scale-down",
        action="store_true",
        help="TritonModels: delete as many other loaded TritonModels of the namespace as the "
        "requests go (wakes beside unloads)",
    )
    args = parser.parse_args(argv)
    if args.during_scale_down and args.kind == "pods":
        parser.error("--during-scale-down is for TritonModels (a Deployment's scale-up wakes it)")
    if args.parallel_loads < 1:
        parser.error(f"--parallel-loads {args.parallel_loads}: give 1 or more")
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: give 1 or more")
    if any(n < 1 or n > 100 for n in args.models):
        parser.error("--models: each count is 1 to 100 (the node's GPUs hold 100 of 256Mi)")
    return args


def _answers(address: str, model: str) -> bool:
    try:
        with httpclient.InferenceServerClient(
            f"{address}:9000", network_timeout=120, connection_timeout=120
        ) as http:
            tensor = httpclient.InferInput("INPUT0", list(DATA.shape), "FP32")
            tensor.set_data_from_numpy(DATA)
            answer = http.infer(model, [tensor]).as_numpy("OUTPUT0")
    except Exception:
        return False
    return bool(answer.reshape(-1).tolist() == [2.0, 3.0, 4.0])


def _first_answer(address: Callable[[], str | None], model: str, started: float) -> float:
    """Seconds from `started` until `model` answers at `address()`, asking until it does."""
    while time.monotonic() - started < 300:
        where = address()
        if where and _answers(where, model):
            return time.monotonic() - started
        time.sleep(0.02)
    raise TimeoutError(f"{model} did not answer within 300 s")


def _all_at_once(
    names: Sequence[str], address: Callable[[str], Callable[[], str | None]]
) -> tuple[float, ...]:
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        futures = [pool.submit(_first_answer, address(n), n, started) for n in names]
        return tuple(f.result() for f in futures)


def _agent_metrics(cluster: SimCluster) -> dict[str, float]:
    """The node's agent's unlabelled series as they read now."""
    agent = cluster.agents[NODES[0].name]
    with urllib.request.urlopen(f"http://{agent.http}/metrics", timeout=5) as answer:
        found = {}
        for line in answer.read().decode().splitlines():
            name, _, value = line.partition(" ")
            if line and not line.startswith("#") and "{" not in name:
                found[name] = float(value)
        return found


def _agent_metric(cluster: SimCluster, name: str) -> float:
    """The node's agent's series `name` (unlabelled) as it reads now; 0 before its first."""
    return _agent_metrics(cluster).get(name, 0.0)


def phases(before: dict[str, float], after: dict[str, float]) -> str:
    """What the agent's histograms gained between two readings: count and mean of each."""
    said = []
    for series, counted, what in PHASES:
        count = after.get(f"{series}_count", 0.0) - before.get(f"{series}_count", 0.0)
        total = after.get(f"{series}_sum", 0.0) - before.get(f"{series}_sum", 0.0)
        mean = f", {what} mean {total / count:.2f} s" if count else ""
        said.append(f"{count:.0f} {counted}{mean}")
    return "; ".join(said)


def in_triton(cluster: SimCluster) -> int:
    """The models the node's Triton holds now (loaded, loading or unloading), by its index."""
    states = cluster.triton_states(NODES[0].name, timeout=10).values()
    return sum(1 for state in states if state in ("READY", "LOADING", "UNLOADING"))


def capture_floor(cluster: SimCluster, names: Sequence[str], workdir: Path) -> list[FloorModel]:
    """The floor's models: each of `names`' files and config as the node's Triton holds them."""
    node = NODES[0].name
    states = cluster.triton_states(node, timeout=10)
    return loadfloor.capture(cluster.tritons[node], states, names, workdir / "models")


def floors(
    cluster: SimCluster, models: Sequence[FloorModel], workdir: Path, rounds: int
) -> tuple[Floor, ...]:
    """The floors of a wake, in a Triton of the node's settings: the node must be quiet."""
    asked = loadfloor.ways(cluster.parallel_loads)
    node = cluster.tritons[NODES[0].name]
    return tuple(loadfloor.run_floor(node, models, workdir / "models", asked, rounds))


def _tritonmodel(name: str, uri: str, node: str, autoscaled: bool = True) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "storageUri": uri,
        "gpuMemory": GPU_MEMORY,
        "nodeSelector": {"kubernetes.io/hostname": node},
    }
    if autoscaled:
        spec["autoscaling"] = {"target": 1, "minReplicas": 0, "window": "6s"}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TritonModel",
        "metadata": {"name": name},
        "spec": spec,
    }


def _deployment(name: str, uri: str, node: str) -> dict[str, Any]:
    labels = {"tritonshare.io/role": "model", "app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        f"{KEYS.prefix}model-uri": uri,
                        f"{KEYS.prefix}gpu-mem": GPU_MEMORY,
                        f"{KEYS.prefix}model-id": name,
                    },
                },
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "containers": [{"name": "proxy", "image": "tritonshare"}],
                },
            },
        },
    }


def wake_tritonmodels(
    cluster: SimCluster,
    count: int,
    workdir: Path,
    during_scale_down: bool = False,
    rounds: int = 3,
) -> Wake:
    assert cluster.model_store is not None
    node = NODES[0].name
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    names = [f"zero-{count}-{i}" for i in range(count)]
    leaving = [f"leaving-{count}-{i}" for i in range(count)] if during_scale_down else []
    for name in names + leaving:
        uri = cluster.model_store.publish(name, MODELS_DIR / "add_one", release="bench")
        custom.create_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, _tritonmodel(name, uri, node, name in names)
        )
    parked_key = f"{KEYS.prefix}parked-models"

    def host() -> Any:
        hosts = core.list_namespaced_pod(
            NAMESPACE, label_selector=f"{KEYS.prefix}model-host=true"
        ).items
        return hosts[0] if hosts else None

    def host_ip() -> str | None:
        found = host()
        return str(found.status.pod_ip) if found is not None and found.status.pod_ip else None

    # As Knative's services are Ready first: each model answers once, then is scaled to zero
    # (each unloaded at least once since).
    unloads_before = _agent_metric(cluster, UNLOADS)
    address = wait_until("the model host", host_ip, 300)
    _all_at_once(names, lambda _: lambda: address)
    models = capture_floor(cluster, names, workdir)
    conditions = [loaded_condition(KEYS, n, 0).removesuffix("0") for n in names]

    def all_parked() -> str | None:
        found = host()
        if found is None or not found.status.pod_ip:
            return None
        value = (found.metadata.annotations or {}).get(parked_key, "")
        parked = {p.model for p in decode_parked(value, 100)[0]}
        loaded = [
            c.type
            for c in found.status.conditions or []
            if c.status == "True" and any(c.type.startswith(p) for p in conditions)
        ]
        # Every replica unloaded, not `count` of them: one request each takes a model to two
        # replicas at target 1 (70 % of it per replica, as Knative's default), and a wake that
        # began while the second ones still unloaded would wait for those unloads.
        unloaded = _agent_metric(cluster, UNLOADS) - unloads_before >= count
        # Quiet but for the models to delete, each loaded once.
        unloaded = unloaded and in_triton(cluster) == len(leaving)
        waiting = set(names) - parked
        return None if waiting or loaded or not unloaded else str(found.status.pod_ip)

    address = wait_until(f"{count} TritonModels parked at zero, unloaded", all_parked, 600)
    # The floor first, on the quiet node (see the module docstring).
    floored = floors(cluster, models, workdir, rounds)
    for name in leaving:
        custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
    before = _agent_metrics(cluster)
    started = time.time()
    firsts = _all_at_once(names, lambda _: lambda: address)
    agent = phases(before, _agent_metrics(cluster))
    logs = wakephases.read_logs(cluster.workdir, node)
    spent = wakephases.breakdown(names, started, firsts, logs).lines()
    for name in names:
        custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
    wait_until(f"{count} TritonModels unloaded", lambda: in_triton(cluster) == 0, 600)
    kind = f"TritonModels ({len(leaving)} others unloading)" if leaving else "TritonModels"
    return Wake(kind, count, firsts, floored, agent, tuple(spent))


def wake_pods(cluster: SimCluster, count: int, workdir: Path, rounds: int = 3) -> Wake:
    assert cluster.model_store is not None
    node = NODES[0].name
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    apps = cast(Any, kubernetes.client.AppsV1Api(cluster.kube))
    names = [f"pods-{count}-{i}" for i in range(count)]
    for name in names:
        uri = cluster.model_store.publish(name, MODELS_DIR / "add_one", release="bench")
        apps.create_namespaced_deployment(NAMESPACE, _deployment(name, uri, node))

    def pod_address(name: str) -> Callable[[], str | None]:
        def address() -> str | None:
            pods = core.list_namespaced_pod(NAMESPACE, label_selector=f"app={name}").items
            live = [p for p in pods if p.status.pod_ip and not p.metadata.deletion_timestamp]
            return str(live[0].status.pod_ip) if live else None

        return address

    _all_at_once(names, pod_address)  # each answers once before it is scaled to zero
    models = capture_floor(cluster, names, workdir)

    def scale(replicas: int) -> None:
        for name in names:
            apps.patch_namespaced_deployment_scale(
                name, NAMESPACE, {"spec": {"replicas": replicas}}
            )

    scale(0)

    def gone() -> bool:
        pods = core.list_namespaced_pod(NAMESPACE, label_selector="tritonshare.io/role=model")
        return not [p for p in pods.items if p.metadata.labels.get("app") in names]

    wait_until(f"{count} Deployments' pods gone", gone, 300)
    wait_until(f"{count} models unloaded", lambda: in_triton(cluster) == 0, 600)
    floored = floors(cluster, models, workdir, rounds)  # on the quiet node, as above
    before = _agent_metrics(cluster)
    scale(1)
    firsts = _all_at_once(names, pod_address)
    agent = phases(before, _agent_metrics(cluster))
    for name in names:
        apps.delete_namespaced_deployment(name, NAMESPACE)
    wait_until(f"{count} Deployments' pods gone", gone, 300)
    wait_until(f"{count} models unloaded", lambda: in_triton(cluster) == 0, 600)
    return Wake("model pods", count, firsts, floored, agent)


def run(
    counts: Sequence[int],
    kind: str,
    parallel_loads: int = PARALLEL_LOADS,
    during_scale_down: bool = False,
    rounds: int = 3,
) -> list[Wake]:
    wakes = []
    with (
        tempfile.TemporaryDirectory(prefix="tritonshare-scale-from-zero-") as workdir,
        SimCluster(
            Path(workdir) / "cluster",
            [NODES[0]],
            binders=1,
            webhook=True,
            parallel_loads=parallel_loads,
        ) as cluster,
    ):
        assert cluster.missing == [], cluster.missing
        core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
        core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        for count in counts:
            floor_dir = Path(workdir) / f"floor-{count}"
            if kind == "pods":
                wake = wake_pods(cluster, count, floor_dir, rounds)
            else:
                wake = wake_tritonmodels(cluster, count, floor_dir, during_scale_down, rounds)
            print("\n".join([*wake.lines(), *wake.floor_lines()]), flush=True)
            wakes.append(wake)
    return wakes


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    wakes = run(args.models, args.kind, args.parallel_loads, args.during_scale_down, args.rounds)
    print(closing(wakes), flush=True)
    return verdict(wakes, args.no_goal)


if __name__ == "__main__":
    raise SystemExit(main())
