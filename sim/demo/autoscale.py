"""The autoscaling step of `make demo` and `python -m benchmarks.autoscale`: KServe's concurrency
experiment, run on tritonshare; and its parts that tests/e2e/test_tritonmodel_two_nodes.py reuses.

A model Deployment (`scaler`, the short form tritonshare's webhook completes, on the node with the
real Triton) has a KEDA ScaledObject as deploy/example ships one: target concurrency 1 (the
trigger's threshold) on `sum(rate(tritonshare_proxy_concurrency_seconds_total[1m]))`, at most
`max_replicas`. A real Prometheus scrapes every pod's proxy as the PodMonitor would (its targets
follow the pods, through a file the step rewrites as pods come and go); the simulated KEDA and HPA
controller (`sim.controllers.hpa`) read it every `sync_period`. Then `clients` callers send
back-to-back requests through the Service's ready endpoints for `duration` seconds, and a light
client (one request every 100 ms) keeps sending while the Deployment scales back to its minimum,
so a pod that goes without draining shows as a failed request.

A watch of the Deployment's pods times each new replica's cold start by phase: created, bound,
its files fetched into the pod (the storage initializer done), its model loaded on the node (the
loader done, or the agent's ModelLoaded condition if it comes first), Ready, and its first
answer to a client.

With `target="tritonmodel"`, a TritonModel `scaler` takes the Deployment's place (`SCALED`): its
ScaledObject's `scaleTargetRef` names it, Prometheus scrapes the namespace's model hosts, and a
watch of the model and its hosts times each replica: asked for, placed, loaded on its node, Ready
in the Service's endpoints, first answer (`ReplicaWatch`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import statistics
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import kubernetes.client
import numpy as np
import tritonclient.http as httpclient
from kubernetes.client.exceptions import ApiException

from common.contract import DEFAULT_PROXY_HTTP_PORT, DEFAULT_PROXY_METRICS_PORT, Keys
from common.hosted import host_label, loaded_condition, serves_label
from sim.cluster import SimCluster
from sim.controllers.hpa import Autoscalers, Prometheus
from sim.demo import rollout
from sim.processes import wait_until
from sim.service import Endpoints
from sim.triton import free_port
from sim.watching import watch_events

KEYS = Keys()
NAME = "scaler"
SELECTOR = f"app={NAME}"
INPUT = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
PHASES = ("bound", "files in the pod", "loaded", "ready", "first answer")
"""A model pod's phases."""
REPLICA_PHASES = (
    "placed",
    "host started",
    "loaded",
    "labelled",
    "host ready",
    "ready",
    "first answer",
)
"""A TritonModel replica's phases (its host's pod starts once per node, not per replica): placed
on a node, its host there running (at once on a node whose host runs), loaded (the agent's
condition on the host), labelled `serves-<model>` by the binder, the host pod Ready, both (in the
Service's endpoints), its first answer."""
STEPS = ("asked", "placed", "host started", "loaded", "ready", "first answer")
"""The chain a replica's start is broken down by (`steps`), each step after the one before;
"ready" is the later of "labelled" and "host ready" (`READY_PARTS`)."""
READY_PARTS = (("loaded", "labelled"), ("loaded", "host ready"))
TRITONMODEL_API = ("tritonshare.io", "v1alpha1", "tritonmodels")
JsonObject = dict[str, Any]
KEPT_MESSAGE = "came from the node's kept copy"
"""What the loader's termination message says of an install from the node's kept copy."""


def slow_model(source: Path, directory: Path, seconds: float, padding: int = 0) -> Path:
    """A copy of the add_one model directory `source` that takes `seconds` per request, as a
    model whose inference keeps its GPU busy that long would: concurrency then builds up at a
    replica under load, as in the experiment, instead of every request ending at once."""
    shutil.copytree(source, directory, ignore=shutil.ignore_patterns("__pycache__"))
    code = directory / "1" / "model.py"
    text = code.read_text()
    text = text.replace(
        "import triton_python_backend_utils", "import time\n\nimport triton_python_backend_utils"
    )
    text = text.replace(
        "        for request in requests:\n",
        f"        for request in requests:\n            time.sleep({seconds!r})\n",
    )
    if "time.sleep(" not in text:
        raise ValueError(f"{code} is not the add_one model this step knows how to slow down")
    code.write_text(text)
    if padding:
        # Weights the model does not read: bytes to fetch, send and install, as a real model's.
        (directory / "1" / "weights.bin").write_bytes(os.urandom(padding))
    return directory


def query(namespace: str, signal: str = "irate", model: str = NAME) -> str:
    """The ScaledObject's PromQL on the proxies' concurrency integral of `model` (a host's
    proxy serves several models: each series has its `model` label): `irate` is the average
    concurrency over the last scrape interval (it follows a burst within one scrape); `rate`
    over 1m is smoother and takes a minute to reach a new level."""
    if signal not in ("irate", "rate"):
        raise ValueError(f"signal must be irate or rate, not {signal!r}")
    return (
        f"sum({signal}(tritonshare_proxy_concurrency_seconds_total"
        f'{{namespace="{namespace}", model="{model}"}}[1m]))'
    )


TRITONMODEL_REF = {"apiVersion": "/".join(TRITONMODEL_API[:2]), "kind": "TritonModel"}
"""A ScaledObject's `scaleTargetRef` for a TritonModel, less its name (a Deployment's is the
default: its name alone)."""


def scaled_object(
    namespace: str,
    max_replicas: int,
    scale_down_window: int,
    signal: str,
    *,
    name: str = NAME,
    ref: dict[str, str] | None = None,
) -> dict[str, Any]:
    """KEDA's ScaledObject for the model `name` (a Deployment, or the kind `ref` names)."""
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "scaleTargetRef": {**(ref or {}), "name": name},
            "minReplicaCount": 1,
            "maxReplicaCount": max_replicas,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        "scaleDown": {"stabilizationWindowSeconds": scale_down_window},
                    }
                }
            },
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {
                        "serverAddress": "http://prometheus-operated.monitoring.svc:9090",
                        "query": query(namespace, signal, name),
                        "threshold": "1",
                    },
                }
            ],
        },
    }


@dataclass
class PodTimes:
    """When the watch first saw each phase of one pod (time.monotonic())."""

    name: str
    created: float
    phases: dict[str, float] = field(default_factory=dict)
    address: str = ""
    kept: bool = False
    """Its loader installed the model from the node's kept copy (nothing sent)."""

    def since_created(self) -> dict[str, float]:
        return {phase: at - self.created for phase, at in self.phases.items()}


def write_targets(targets: Path, namespace: str, pods: dict[str, str]) -> None:
    """Prometheus's file of scrape targets: the proxy of each pod (name: address), labelled by
    namespace and pod as a PodMonitor labels them; replaced at once, never read half written."""
    groups = [
        {
            "targets": [f"{address}:{DEFAULT_PROXY_METRICS_PORT}"],
            "labels": {"namespace": namespace, "pod": name},
        }
        for name, address in sorted(pods.items())
    ]
    partial = targets.with_suffix(".partial")
    partial.write_text(json.dumps(groups))
    partial.replace(targets)


class PodWatch:
    """Times every pod of the Deployment by phase, and keeps Prometheus's file of scrape targets
    (every pod with an address that is not being deleted, as a PodMonitor selects them)."""

    def __init__(self, api: kubernetes.client.ApiClient, namespace: str, targets: Path) -> None:
        self.core = cast(Any, kubernetes.client.CoreV1Api(api))
        self.namespace = namespace
        self.targets = targets
        self.pods: dict[str, PodTimes] = {}
        self._scraped: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="autoscale-pod-watch")
        self._write_targets()

    def _write_targets(self) -> None:
        write_targets(self.targets, self.namespace, self._scraped)

    def _seen(self, event_type: str, pod: dict[str, Any]) -> None:
        now = time.monotonic()
        meta, status = pod["metadata"], pod.get("status") or {}
        name = meta["name"]
        with self._lock:
            times = self.pods.setdefault(name, PodTimes(name, now))
            if pod.get("spec", {}).get("nodeName"):
                times.phases.setdefault("bound", now)
            for init in status.get("initContainerStatuses") or []:
                ended = (init.get("state") or {}).get("terminated") or {}
                if init.get("name") == "storage-initializer" and ended.get("exitCode") == 0:
                    times.phases.setdefault("files in the pod", now)
                if init.get("name") == "loader" and ended.get("exitCode") == 0:
                    # The loader has seen the model READY (the agent's ModelLoaded condition
                    # follows, a condition write later).
                    times.phases.setdefault("loaded", now)
                    times.kept = KEPT_MESSAGE in (ended.get("message") or "")
            for c in status.get("conditions") or []:
                if c.get("status") != "True":
                    continue
                if c.get("type") == KEYS.prefix + "ModelLoaded":
                    times.phases.setdefault("loaded", now)
                elif c.get("type") == "Ready":
                    times.phases.setdefault("ready", now)
            address = status.get("podIP") or ""
            times.address = times.address or address
            scraped = dict(self._scraped)
            if event_type == "DELETED" or meta.get("deletionTimestamp") or not address:
                scraped.pop(name, None)
            else:
                scraped[name] = address
            if scraped != self._scraped:
                self._scraped = scraped
                self._write_targets()

    def answered(self, address: str, at: float) -> None:
        with self._lock:
            for times in self.pods.values():
                if times.address == address:
                    times.phases.setdefault("first answer", at)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                listed = json.loads(
                    self.core.list_namespaced_pod(
                        self.namespace, label_selector=SELECTOR, _preload_content=False
                    ).data
                )
                for pod in listed.get("items", []):
                    self._seen("ADDED", pod)
                for event_type, raw in watch_events(
                    self.core.list_namespaced_pod,
                    self._stop,
                    listed["metadata"]["resourceVersion"],
                    self.namespace,
                    label_selector=SELECTOR,
                ):
                    self._seen(event_type, raw)
            except Exception:
                if self._stop.wait(0.5):
                    return

    def __enter__(self) -> PodWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)


class ReplicaWatch:
    """Times every replica of the TritonModel `model` by phase, and keeps Prometheus's file of
    scrape targets (the namespace's model hosts with an address, not being deleted: their proxy
    serves every replica of the namespace on its node, each series labelled by `model`).

    A replica is its ordinal: created when the model's `spec.replicas` first asks for it, placed
    when `status.placements` names its node, loaded when the agent's `loaded-<model>_<ordinal>`
    condition on that node's host is True, ready when the host is in the model's Service (its
    `serves-<model>` label and Ready), and its first answer from the host's address after that.
    A replica asked for again after a scale-down is a new one (`replica N (2)`)."""

    def __init__(
        self, api: kubernetes.client.ApiClient, namespace: str, model: str, targets: Path
    ) -> None:
        self.core = cast(Any, kubernetes.client.CoreV1Api(api))
        self.custom = cast(Any, kubernetes.client.CustomObjectsApi(api))
        self.namespace = namespace
        self.model = model
        self.targets = targets
        self.pods: dict[str, PodTimes] = {}
        """Every replica seen, by `replica N` (the name of a pod's record in `PodWatch`)."""
        self._live: dict[int, str] = {}
        """The record of each ordinal asked for now."""
        self._nodes: dict[str, str] = {}
        """The node each record's replica was placed on."""
        self._hosts: dict[str, JsonObject] = {}
        """The live host pod of each node."""
        self._scraped: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._follow, args=(kind,), name=f"autoscale-{kind}-watch")
            for kind in ("model", "hosts")
        ]
        self._write_targets()

    def _write_targets(self) -> None:
        write_targets(self.targets, self.namespace, self._scraped)

    def _model_seen(self, obj: JsonObject) -> None:
        now = time.monotonic()
        asked = int((obj.get("spec") or {}).get("replicas") or 0)
        placements = (obj.get("status") or {}).get("placements") or []
        placed = {int(p["replica"]): str(p["node"]) for p in placements if p.get("node")}
        with self._lock:
            for ordinal in [o for o in self._live if o >= asked]:
                del self._live[ordinal]
            for ordinal in range(asked):
                if ordinal not in self._live:
                    name = f"replica {ordinal}"
                    again = sum(1 for n in self.pods if n.split(" (")[0] == name)
                    name = f"{name} ({again + 1})" if again else name
                    self.pods[name] = PodTimes(name, now)
                    self._live[ordinal] = name
                record = self._live[ordinal]
                if ordinal in placed and record not in self._nodes:
                    self._nodes[record] = placed[ordinal]
                    self.pods[record].phases.setdefault("placed", now)
            self._refresh(now)

    def _host_seen(self, event_type: str, pod: JsonObject) -> None:
        now = time.monotonic()
        meta, status = pod["metadata"], pod.get("status") or {}
        node = (pod.get("spec") or {}).get("nodeName") or ""
        address = status.get("podIP") or ""
        with self._lock:
            scraped = dict(self._scraped)
            if event_type == "DELETED" or meta.get("deletionTimestamp") or not node:
                if (self._hosts.get(node) or {}).get("metadata", {}).get("name") == meta["name"]:
                    del self._hosts[node]
                scraped.pop(meta["name"], None)
            else:
                self._hosts[node] = pod
                if address:
                    scraped[meta["name"]] = address
            if scraped != self._scraped:
                self._scraped = scraped
                self._write_targets()
            self._refresh(now)

    def _refresh(self, now: float) -> None:
        """Note what each live replica's host shows (lock held)."""
        serves = serves_label(KEYS, self.model)
        for ordinal, name in self._live.items():
            host = self._hosts.get(self._nodes.get(name, ""))
            if host is None:
                continue
            times = self.pods[name]
            true = {
                c.get("type")
                for c in (host.get("status") or {}).get("conditions") or []
                if c.get("status") == "True"
            }
            if (host.get("status") or {}).get("podIP"):
                times.phases.setdefault("host started", now)
            if loaded_condition(KEYS, self.model, ordinal) in true:
                times.phases.setdefault("loaded", now)
            labels = host["metadata"].get("labels") or {}
            if labels.get(serves) == "true":
                times.phases.setdefault("labelled", now)
            if "Ready" in true:
                times.phases.setdefault("host ready", now)
            if labels.get(serves) == "true" and "Ready" in true:
                times.phases.setdefault("ready", now)
                times.address = times.address or (host.get("status") or {}).get("podIP") or ""

    def answered(self, address: str, at: float) -> None:
        with self._lock:
            for name in self._live.values():
                times = self.pods[name]
                if times.address == address and "ready" in times.phases:
                    times.phases.setdefault("first answer", at)

    def _follow(self, kind: str) -> None:
        if kind == "model":
            call: Callable[..., Any] = self.custom.list_namespaced_custom_object
            args: tuple[str, ...] = (*TRITONMODEL_API[:2], self.namespace, TRITONMODEL_API[2])
            selectors = {"field_selector": f"metadata.name={self.model}"}
        else:
            call, args = self.core.list_namespaced_pod, (self.namespace,)
            selectors = {"label_selector": f"{host_label(KEYS)}=true"}
        while not self._stop.is_set():
            try:
                response = call(*args, **selectors, _preload_content=False)
                listed = json.loads(response.data)
                events = [("ADDED", item) for item in listed.get("items", [])]
                rv = listed["metadata"]["resourceVersion"]
                for event_type, raw in itertools.chain(
                    events, watch_events(call, self._stop, rv, *args, **selectors)
                ):
                    if kind == "model":
                        self._model_seen(raw)
                    else:
                        self._host_seen(event_type, raw)
            except Exception:
                if self._stop.wait(0.5):
                    return

    def __enter__(self) -> ReplicaWatch:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(15)


class Answers(Protocol):
    def answered(self, address: str, at: float) -> None: ...


@dataclass
class Load:
    """`clients` callers sending back to back (or every `interval` s) through the endpoints;
    each answer is told to `watch` (the first answer of a replica)."""

    endpoints: Endpoints
    watch: Answers
    clients: int
    interval: float = 0.0
    model: str = NAME
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _send(self) -> None:
        connections: dict[str, httpclient.InferenceServerClient] = {}
        tensor = httpclient.InferInput("INPUT0", list(INPUT.shape), "FP32")
        tensor.set_data_from_numpy(INPUT)
        try:
            while not self._stop.wait(self.interval):
                address = self.endpoints.pick()
                if address is None:
                    self.failures.append("no ready endpoint")
                    self._stop.wait(0.05)
                    continue
                started = time.monotonic()
                try:
                    http = connections.get(address)
                    if http is None:
                        http = connections[address] = httpclient.InferenceServerClient(
                            f"{address}:{DEFAULT_PROXY_HTTP_PORT}",
                            connection_timeout=30,
                            network_timeout=30,
                        )
                    http.infer(self.model, [tensor])
                except Exception as e:
                    self.failures.append(f"{address}: {type(e).__name__}: {e}")
                    with contextlib.suppress(Exception):
                        connections.pop(address).close()
                    continue
                done = time.monotonic()
                self.latencies.append(done - started)
                self.watch.answered(address, done)
        finally:
            for http in connections.values():
                with contextlib.suppress(Exception):
                    http.close()

    def start(self) -> None:
        for i in range(self.clients):
            thread = threading.Thread(target=self._send, name=f"autoscale-client-{i}")
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)


@dataclass
class AutoscaleResult:
    target: int = 1
    clients: int = 5
    peak_ready: int = 0
    ready_after: float | None = None
    """Seconds from the load's start until `max_replicas` pods were Ready, if they were."""
    timeline: list[tuple[float, int, int]] = field(default_factory=list)
    """(seconds since the load started, replicas asked, pods Ready) whenever either changed."""
    cold_starts: list[dict[str, float]] = field(default_factory=list)
    """Each new replica's phases, seconds after its creation."""
    kept_starts: list[dict[str, float]] = field(default_factory=list)
    """The same for the replicas of a second scale-up after the scale-down (`again`), started
    on a node that kept their model's files."""
    since_load: list[dict[str, float]] = field(default_factory=list)
    """The first scale-up's new replicas' phases, and when each was `asked` for, in seconds
    since the load started."""
    load_started: float = 0.0
    """When the load started, time.time() (to place the binder's log lines)."""
    requests: int = 0
    failed: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    scaled_down_to: int | None = None
    scale_down_requests: int = 0
    scale_down_failed: list[str] = field(default_factory=list)
    hpa_status: dict[str, Any] = field(default_factory=dict)
    """The HPA's last status, to tell why it did or did not scale."""

    def percentile(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    def cold_start(self, phase: str, *, kept: bool = False) -> tuple[float, float] | None:
        starts = self.kept_starts if kept else self.cold_starts
        values = [c[phase] for c in starts if phase in c]
        return (statistics.median(values), max(values)) if values else None

    def line(self) -> str:
        first = self.cold_start("first answer")
        cold = f"{first[0]:.1f}/{first[1]:.1f} s" if first else "none measured"
        again = self.cold_start("first answer", kept=True)
        if again is not None:
            cold = f"{again[0]:.1f}/{again[1]:.1f} s (files on the node) {cold}"
        ready = f"{self.ready_after:.1f} s" if self.ready_after is not None else "not reached"
        return (
            f"autoscale: target {self.target}, concurrency {self.clients} -> {self.peak_ready} "
            f"replicas Ready in {ready}; cold start p50/max {cold} (files sent); "
            f"requests {self.requests}, failed {len(self.failed)}, "
            f"p99 {self.percentile(0.99) * 1000:.0f} ms; scale-down to "
            f"{self.scaled_down_to if self.scaled_down_to is not None else '?'} replicas, "
            f"failed {len(self.scale_down_failed)}"
        )


@contextlib.contextmanager
def prometheus(binary: str, workdir: Path, targets: Path, interval: str) -> Iterator[str]:
    """A real Prometheus scraping the proxies listed in `targets` every `interval`."""
    config = workdir / "prometheus.yml"
    config.write_text(
        json.dumps(
            {
                "global": {"scrape_interval": interval, "evaluation_interval": interval},
                "scrape_configs": [
                    {
                        "job_name": "tritonshare-model-proxies",
                        "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
                    }
                ],
            }
        )
    )
    listen = f"127.0.0.1:{free_port()}"
    with (workdir / "prometheus.log").open("wb") as log:
        server = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address={listen}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until("Prometheus answering", lambda: _ready(listen), 60)
        yield listen
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _ready(listen: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{listen}/-/ready", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _replicas(apps: Any, namespace: str) -> tuple[int, int]:
    d = apps.read_namespaced_deployment(NAME, namespace)
    return int(d.spec.replicas or 0), int(d.status.ready_replicas or 0)


class Scaled(Protocol):
    """What the experiment scales, `scaler` in `namespace`: how it is made, counted and timed."""

    kind: str
    ref: dict[str, str] | None
    """The ScaledObject's `scaleTargetRef`, less the name."""
    selector: str
    """The label selector of its Service."""

    def create(self, uri: str) -> None: ...

    def replicas(self) -> tuple[int, int]:
        """(replicas asked for, replicas ready)."""
        ...

    def at_minimum(self) -> bool:
        """One replica asked for and ready, and nothing of the others left."""
        ...

    def watch(self, targets: Path) -> PodWatch | ReplicaWatch: ...

    def describe(self) -> str:
        """Its replicas and conditions, for a wait that timed out."""
        ...


def pods_state(cluster: SimCluster, namespace: str) -> str:
    """Each pod of `namespace` in a line (node, phase, the conditions not True, the containers
    not running): what a wait that timed out shows of the cluster."""
    lines = []
    for pod in cast(Any, cluster.core).list_namespaced_pod(namespace).items:
        status = pod.status
        off = [f"{c.type}={c.status}" for c in status.conditions or [] if c.status != "True"]
        stopped = [
            f"{c.name}:{(c.state.waiting or c.state.terminated).reason}"
            for c in [*(status.init_container_statuses or []), *(status.container_statuses or [])]
            if c.state is not None and (c.state.waiting or c.state.terminated)
        ]
        lines.append(
            f"{pod.metadata.name} on {pod.spec.node_name or '-'}: {status.phase} "
            f"{' '.join(off + stopped)}".rstrip()
        )
    return "Pods: " + ("; ".join(lines) or "none") + "."


class ScaledDeployment:
    """A model Deployment on the node with the real Triton (the short form, completed by the
    webhook); its pods are timed by phase."""

    kind: str = "Deployment"
    ref: dict[str, str] | None = None
    selector: str = SELECTOR

    def __init__(self, cluster: SimCluster, namespace: str) -> None:
        assert cluster.kube is not None
        self.cluster, self.namespace = cluster, namespace
        self.apps = cast(Any, kubernetes.client.AppsV1Api(cluster.kube))
        self.node = cluster.real_node.name if cluster.real_node is not None else ""

    def create(self, uri: str) -> None:
        manifest = rollout.deployment_manifest(uri, node=self.node, name=NAME)
        self.apps.create_namespaced_deployment(self.namespace, manifest)

    def replicas(self) -> tuple[int, int]:
        return _replicas(self.apps, self.namespace)

    def at_minimum(self) -> bool:
        pods = cast(Any, self.cluster.core).list_namespaced_pod(
            self.namespace, label_selector=SELECTOR
        )
        return self.replicas() == (1, 1) and len(pods.items) == 1

    def watch(self, targets: Path) -> PodWatch:
        assert self.cluster.kube is not None
        return PodWatch(self.cluster.kube, self.namespace, targets)

    def describe(self) -> str:
        asked, ready = self.replicas()
        return f"{asked} replicas asked for, {ready} ready."


class ScaledTritonModel:
    """A TritonModel (one replica per node at most, on the cluster's real nodes); its replicas
    are timed by phase, and its hosts' proxies scraped."""

    kind: str = "TritonModel"
    ref: dict[str, str] | None = TRITONMODEL_REF
    selector: str = f"{serves_label(KEYS, NAME)}=true"

    def __init__(self, cluster: SimCluster, namespace: str) -> None:
        assert cluster.kube is not None
        self.cluster, self.namespace = cluster, namespace
        self.custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
        self.autoscaling: JsonObject | None = None
        """spec.autoscaling (the built-in autoscaler's settings), None for none."""

    def create(self, uri: str) -> None:
        spec: JsonObject = {"storageUri": uri, "gpuMemory": "1Gi", "replicas": 1}
        if self.autoscaling is not None:
            spec["autoscaling"] = self.autoscaling
        body = {
            "apiVersion": "/".join(TRITONMODEL_API[:2]),
            "kind": "TritonModel",
            "metadata": {"name": NAME},
            "spec": spec,
        }
        self.custom.create_namespaced_custom_object(
            *TRITONMODEL_API[:2], self.namespace, TRITONMODEL_API[2], body
        )

    def _object(self) -> JsonObject:
        found: JsonObject = self.custom.get_namespaced_custom_object(
            *TRITONMODEL_API[:2], self.namespace, TRITONMODEL_API[2], NAME
        )
        return found

    def replicas(self) -> tuple[int, int]:
        obj = self._object()
        status = obj.get("status") or {}
        return int(obj["spec"].get("replicas") or 0), int(status.get("readyReplicas") or 0)

    def at_minimum(self) -> bool:
        obj = self._object()
        status = obj.get("status") or {}
        hosts = cast(Any, self.cluster.core).list_namespaced_pod(
            self.namespace, label_selector=f"{host_label(KEYS)}=true"
        )
        asked_ready = (obj["spec"].get("replicas"), status.get("readyReplicas"))
        return (
            asked_ready == (1, 1) and len(status.get("placements") or []) == len(hosts.items) == 1
        )

    def watch(self, targets: Path) -> ReplicaWatch:
        assert self.cluster.kube is not None
        return ReplicaWatch(self.cluster.kube, self.namespace, NAME, targets)

    def describe(self) -> str:
        obj = self._object()
        status = obj.get("status") or {}
        conditions = "; ".join(
            f"{c['type']}={c['status']} {c.get('reason', '')}: {c.get('message', '')}"
            for c in status.get("conditions") or []
        )
        return (
            f"{obj['spec'].get('replicas')} replicas asked for, placements "
            f"{status.get('placements')}, {status.get('readyReplicas') or 0} ready; {conditions}."
        )


SCALED: dict[str, Callable[[SimCluster, str], Scaled]] = {
    "deployment": ScaledDeployment,
    "tritonmodel": ScaledTritonModel,
}
"""What `run` scales, by its `target`."""


def run(
    cluster: SimCluster,
    source: Path,
    workdir: Path,
    namespace: str,
    prometheus_binary: str | None,
    *,
    clients: int = 5,
    duration: float = 30.0,
    max_replicas: int = 5,
    sync_period: float = 15.0,
    scrape_interval: str = "15s",
    scale_down_window: int = 30,
    deadline: float = 300.0,
    request_seconds: float = 0.1,
    signal: str = "irate",
    settle: float = 60.0,
    again: bool = False,
    padding: int = 0,
    target: str = "deployment",
    window: str | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> AutoscaleResult:
    """Deploy `source` (the add_one model, made to take `request_seconds` per request) as
    `scaler` with its ScaledObject, load it, idle, and report; with `again`, once scaled back
    to one replica, load it as long once more and time the new replicas of that second scale-up
    apart (`kept_starts`: their node kept the model's files when the first ones left).
    `padding`: bytes of weights added to the model. `target`: what is scaled (`SCALED`), a
    model Deployment or a TritonModel. Without `prometheus_binary`, the TritonModel has
    spec.autoscaling instead (the binder's built-in autoscaler: target 1, at most
    `max_replicas`, stable window `window`, Knative's 60s by default) and no ScaledObject,
    Prometheus or HPA runs."""
    assert cluster.model_store is not None and cluster.kube is not None
    assert cluster.apiserver is not None
    workdir.mkdir(parents=True, exist_ok=True)
    result = AutoscaleResult(clients=clients)
    scaled = SCALED[target](cluster, namespace)
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    model = slow_model(source, workdir / "model", request_seconds, padding)
    uri = cluster.model_store.publish(NAME, model)
    targets = workdir / "targets.json"
    builtin = prometheus_binary is None
    if builtin:
        if not isinstance(scaled, ScaledTritonModel):
            raise ValueError("the built-in autoscaler scales TritonModels: use target tritonmodel")
        scaled.autoscaling = {"target": 1, "maxReplicas": max_replicas, "window": window or "60s"}
    with contextlib.ExitStack() as stack:
        watch = scaled.watch(targets)
        stack.enter_context(watch)
        if prometheus_binary is not None:
            listen = stack.enter_context(
                prometheus(prometheus_binary, workdir, targets, scrape_interval)
            )
            autoscaler_api = stack.enter_context(contextlib.closing(cluster.apiserver.api_client()))
            stack.enter_context(
                Autoscalers(
                    autoscaler_api, Prometheus(listen), cluster.apiserver.clock.now, sync_period
                )
            )
        endpoints = stack.enter_context(Endpoints(cluster.kube, namespace, scaled.selector))
        scaled.create(uri)
        if not builtin:
            custom.create_namespaced_custom_object(
                "keda.sh",
                "v1alpha1",
                namespace,
                "scaledobjects",
                scaled_object(namespace, max_replicas, scale_down_window, signal, ref=scaled.ref),
            )
        wait_until(
            "the first replica Ready",
            lambda: scaled.replicas()[1] >= 1,
            180,
            lambda: (
                f"{scaled.kind} {NAME}: {scaled.describe()} {pods_state(cluster, namespace)}\n"
                f"{cluster.log_tails()}"
            ),
        )
        first = set(watch.pods)
        if builtin:
            say(
                f"{scaled.kind} {NAME}: 1 replica Ready; its spec.autoscaling asks for "
                f"concurrency 1 per replica (at most {max_replicas}, window {window or '60s'}); "
                "the binder reads its hosts every second."
            )
        else:
            say(
                f"{scaled.kind} {NAME}: 1 replica Ready; a ScaledObject asks for concurrency 1 "
                f"per replica (at most {max_replicas}); Prometheus scrapes every "
                f"{scrape_interval}, the HPA syncs every {sync_period:g} s."
            )
        load = Load(endpoints, watch, clients)
        started = time.monotonic()

        def sample() -> tuple[int, int]:
            """Note the replicas asked for and Ready when they change; return them."""
            now = scaled.replicas()
            if not result.timeline or result.timeline[-1][1:] != now:
                result.timeline.append((time.monotonic() - started, *now))
            if now[1] >= max_replicas and result.ready_after is None:
                result.ready_after = time.monotonic() - started
            return now

        result.load_started = time.time()
        load.start()
        try:
            while time.monotonic() - started < duration:
                sample()
                time.sleep(0.25)
        finally:
            load.stop()
        result.requests = len(load.latencies) + len(load.failures)
        result.failed = list(load.failures)
        result.latencies = list(load.latencies)
        say(
            f"  {clients} clients sent for {duration:g} s: {result.requests} requests, "
            f"{len(result.failed)} failed."
        )
        light = Load(endpoints, watch, 1, interval=0.1)
        light.start()
        try:
            # Replicas asked for late in the load become Ready after it: follow them for at
            # least `settle` seconds from the load's start, then until the minimum is back.
            limit = time.monotonic() + deadline
            while time.monotonic() < limit:
                sample()
                settled = time.monotonic() - started >= settle
                if settled and scaled.at_minimum():
                    result.scaled_down_to = 1
                    break
                time.sleep(0.25)
        finally:
            light.stop()
        result.scale_down_requests = len(light.latencies) + len(light.failures)
        result.scale_down_failed = list(light.failures)
        with contextlib.suppress(ApiException):
            result.hpa_status = (
                {}
                if builtin
                else custom.get_namespaced_custom_object_status(
                    "autoscaling", "v2", namespace, "horizontalpodautoscalers", f"keda-hpa-{NAME}"
                ).get("status", {})
            )
        result.peak_ready = max((ready for _, _, ready in result.timeline), default=0)
        result.cold_starts = [
            times.since_created() for name, times in watch.pods.items() if name not in first
        ]
        result.since_load = [
            {"asked": times.created - started}
            | {phase: at - started for phase, at in times.phases.items()}
            for name, times in watch.pods.items()
            if name not in first
        ]
        if again and result.scaled_down_to == 1:
            seen = set(watch.pods)
            load = Load(endpoints, watch, clients)
            load.start()
            try:
                time.sleep(duration)
            finally:
                load.stop()
            # Replicas asked for late in the load: followed, under a light load, until their
            # first answer.
            light = Load(endpoints, watch, 1, interval=0.1)
            light.start()
            try:
                late = time.monotonic() + settle
                while time.monotonic() < late:
                    fresh = [t for name, t in watch.pods.items() if name not in seen]
                    if fresh and all("first answer" in t.phases for t in fresh):
                        break
                    time.sleep(0.25)
            finally:
                light.stop()
            result.kept_starts = [
                times.since_created() for name, times in watch.pods.items() if name not in seen
            ]
            say(f"  a second scale-up started {len(result.kept_starts)} replicas.")
    retire(cluster, namespace)
    return result


def steps(starts: list[dict[str, float]]) -> list[tuple[str, float]]:
    """Each step of `STEPS` (the seconds from one phase to the next), the median over the
    replicas in `starts` (phases timed from one origin) that went through both ends of it."""
    medians = []
    for before, after in [*itertools.pairwise(STEPS), *READY_PARTS]:
        spans = [max(0.0, s[after] - s[before]) for s in starts if before in s and after in s]
        if spans:
            medians.append((f"{before} -> {after}", statistics.median(spans)))
    return medians


@dataclass
class ColdStartResult:
    """The phases of each replica of two scale-ups from one replica, without the autoscaler."""

    sent: list[dict[str, float]] = field(default_factory=list)
    """The first scale-up's new replicas: the model's files sent from the pod."""
    kept: list[dict[str, float]] = field(default_factory=list)
    """The second's, after the first's left: their node kept the model's files."""
    kept_installs: int = 0
    """Replicas of the second scale-up whose loader installed from the node's kept copy."""
    requests: int = 0
    failed: list[str] = field(default_factory=list)

    def line(self) -> str:
        def cold(starts: list[dict[str, float]]) -> str:
            values = [c["first answer"] for c in starts if "first answer" in c]
            if not values:
                return "none measured"
            return f"{statistics.median(values):.1f}/{max(values):.1f} s"

        return (
            f"cold start: {len(self.kept)} at once, p50/max {cold(self.kept)} (files on the "
            f"node, {self.kept_installs} from the kept copy) {cold(self.sent)} (files sent); "
            f"requests {self.requests}, failed {len(self.failed)}"
        )


def cold_starts(
    cluster: SimCluster,
    source: Path,
    workdir: Path,
    namespace: str,
    *,
    replicas: int = 1,
    clients: int = 2,
    request_seconds: float = 0.1,
    deadline: float = 120.0,
    say: Callable[[str], None] = lambda _: None,
) -> ColdStartResult:
    """Time single cold starts apart from the autoscaler: deploy `source` as `scaler` with one
    replica, then scale it to 1 + `replicas` (files sent), back to 1, and to 1 + `replicas` again
    (the node kept the files the first scale-up's replicas installed), while `clients` callers
    send back to back through the Service's ready endpoints."""
    assert cluster.model_store is not None and cluster.kube is not None
    workdir.mkdir(parents=True, exist_ok=True)
    result = ColdStartResult()
    apps = cast(Any, kubernetes.client.AppsV1Api(cluster.kube))
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    uri = cluster.model_store.publish(NAME, slow_model(source, workdir / "model", request_seconds))
    node = cluster.real_node.name if cluster.real_node is not None else ""

    def scale(count: int) -> None:
        apps.patch_namespaced_deployment_scale(NAME, namespace, {"spec": {"replicas": count}})

    def pods() -> int:
        return len(core.list_namespaced_pod(namespace, label_selector=SELECTOR).items)

    with (
        PodWatch(cluster.kube, namespace, workdir / "targets.json") as watch,
        Endpoints(cluster.kube, namespace, SELECTOR) as endpoints,
    ):
        apps.create_namespaced_deployment(
            namespace, rollout.deployment_manifest(uri, node=node, name=NAME)
        )
        wait_until("the first replica Ready", lambda: _replicas(apps, namespace)[1] >= 1, 180)
        load = Load(endpoints, watch, clients)
        load.start()
        try:
            for starts in (result.sent, result.kept):
                seen = set(watch.pods)
                scale(1 + replicas)

                def answered(seen: set[str] = seen) -> bool:
                    fresh = [t for name, t in watch.pods.items() if name not in seen]
                    return len(fresh) == replicas and all("first answer" in t.phases for t in fresh)

                wait_until(f"{replicas} new replicas answering", answered, deadline)
                fresh = [t for name, t in watch.pods.items() if name not in seen]
                starts.extend(t.since_created() for t in fresh)
                if starts is result.kept:
                    result.kept_installs = sum(t.kept for t in fresh)
                    break
                scale(1)
                wait_until("the scale-down to one replica", lambda: pods() == 1, deadline)
                say(f"  {replicas} replica(s) started with the files sent, and left.")
        finally:
            load.stop()
        result.requests = len(load.latencies) + len(load.failures)
        result.failed = list(load.failures)
    retire(cluster, namespace)
    return result


def retire(cluster: SimCluster, namespace: str) -> None:
    """Delete the ScaledObject (its HPA with it) and the Deployment or TritonModel."""
    assert cluster.kube is not None
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    apps = cast(Any, kubernetes.client.AppsV1Api(cluster.kube))
    with contextlib.suppress(ApiException):
        custom.delete_namespaced_custom_object(
            "keda.sh", "v1alpha1", namespace, "scaledobjects", NAME
        )
    with contextlib.suppress(ApiException):
        custom.delete_namespaced_custom_object(
            "autoscaling", "v2", namespace, "horizontalpodautoscalers", f"keda-hpa-{NAME}"
        )
    with contextlib.suppress(ApiException):
        apps.delete_namespaced_deployment(NAME, namespace)
    with contextlib.suppress(ApiException):
        custom.delete_namespaced_custom_object(
            *TRITONMODEL_API[:2], namespace, TRITONMODEL_API[2], NAME
        )
