"""The live half of `python -m benchmarks.residency`: on-demand models sleeping and waking on
the simulated cluster with a real Triton on the CPU.

One node (`sim.cluster.SimCluster` with the webhook): an `always` model pod and `--live-models`
small on-demand pods (the add_one Python model, its files on the node), each written in the short
form with `tritonshare.io/idle-seconds: --idle-seconds`. A client calls the always model back to
back through its proxy for the whole run. First `--alone-seconds` with every on-demand model
asleep (the always model's latency alone); then `--rounds` rounds: wait until every on-demand
model is asleep (its proxy's `tritonshare_proxy_model_state`), then send one request to each in
turn and time it from sending to the answer, the wake latency (a request arriving at an unloaded
model). The always model's p99 during the rounds is set beside its p99 alone, in the same run.

Goals (`check_goals`): a wake's p99 at most 1.5 s and at most 0.1 s over Triton's own load p99,
the always model's p99 during wakes at most 1.2x alone, and no request failed.
"""

from __future__ import annotations

import re
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

import kubernetes.client
from prometheus_client.parser import text_string_to_metric_families

from benchmarks import goals
from sim.cluster import SimCluster
from sim.demo.scenario import MODELS_DIR, NODES
from sim.processes import wait_until

NAMESPACE = "models"
BODY = b'{"inputs":[{"name":"INPUT0","shape":[1,3],"datatype":"FP32","data":[1,2,3]}]}'


@dataclass
class LiveResult:
    wakes: list[float] = field(default_factory=list)
    """Seconds from a request's sending to its answer, for a model found asleep."""
    alone: list[float] = field(default_factory=list)
    """The always model's latencies while nothing woke."""
    during: list[float] = field(default_factory=list)
    """The always model's latencies during the rounds of wakes."""
    failed: list[str] = field(default_factory=list)
    triton_loads: list[float] = field(default_factory=list)
    """Triton's own time to load the on-demand models in the rounds, from its log."""
    before_load: list[float] = field(default_factory=list)
    """Seconds from a wake's request to Triton's starting the load (the proxy and the agent)."""
    sent: list[tuple[str, float]] = field(default_factory=list)
    """Each wake's model (its name in Triton begins with it) and when its request was sent,
    in seconds since midnight UTC (as Triton's log writes times)."""


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile (0..1) of `values`, by the nearest rank; nan for none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


_LOG_TIME = r"[IWE]\d{4} (\d\d):(\d\d):(\d\d\.\d+) +\d+ \S+\] "
_LOADING = re.compile(_LOG_TIME + r'"loading: (lazy_[^:]+):\d+"')
_LOADED = re.compile(_LOG_TIME + r'"successfully loaded \'(lazy_[^\']+)\'')


def _clock_seconds(match: re.Match[str]) -> float:
    hours, minutes, seconds = match.group(1), match.group(2), match.group(3)
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def load_starts(log: str) -> list[tuple[str, float]]:
    """Each load Triton's log shows beginning: (name in Triton, seconds since midnight)."""
    return [
        (match.group(4), _clock_seconds(match))
        for match in (_LOADING.search(line) for line in log.splitlines())
        if match is not None
    ]


def before_load(sent: list[tuple[str, float]], starts: list[tuple[str, float]]) -> list[float]:
    """For each wake sent, the time until Triton began loading that model (the first load of
    it at or after the request)."""
    delays = []
    for model, at in sent:
        later = [t for name, t in starts if name.startswith(model + "-") and t >= at - 0.001]
        if later:
            delays.append(min(later) - at)
    return delays


def triton_load_seconds(log: str) -> list[float]:
    """Triton's own load times of the on-demand models (`lazy_*`) in its log, each model's
    first load (by its loader, before the rounds) left out."""
    started: dict[str, float] = {}
    seen: set[str] = set()
    loads = []
    for line in log.splitlines():
        for pattern, beginning in ((_LOADING, True), (_LOADED, False)):
            match = pattern.search(line)
            if match is None:
                continue
            hours, minutes, seconds, name = match.groups()
            at = int(hours) * 3600 + int(minutes) * 60 + float(seconds)
            if beginning:
                started[name] = at
            elif name in started:
                if name in seen:
                    loads.append(at - started.pop(name))
                seen.add(name)
    return loads


def _pod(name: str, uri: str, idle: float | None) -> kubernetes.client.V1Pod:
    annotations = {"tritonshare.io/model-uri": uri, "tritonshare.io/gpu-mem": "1Gi"}
    if idle is not None:
        annotations["tritonshare.io/residency"] = "on-demand"
        annotations["tritonshare.io/idle-seconds"] = f"{idle:g}"
    return kubernetes.client.V1Pod(
        metadata=kubernetes.client.V1ObjectMeta(
            name=name, labels={"tritonshare.io/role": "model"}, annotations=annotations
        ),
        spec=kubernetes.client.V1PodSpec(containers=[]),
    )


def _ready_ip(core: Any, name: str) -> str:
    pod = core.read_namespaced_pod(name, NAMESPACE)
    ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
    return str(pod.status.pod_ip) if ready else ""


def _asleep(address: str) -> bool:
    with urllib.request.urlopen(f"http://{address}:9002/metrics", timeout=5) as answer:
        text = answer.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "tritonshare_proxy_model_state" and sample.value == 1:
                return sample.labels["state"] == "idle-unloaded"
    return False


def _infer(address: str, model: str) -> float:
    """Seconds from sending one REST inference to its whole answer; raises on a failure."""
    request = urllib.request.Request(
        f"http://{address}:9000/v2/models/{model}/infer", data=BODY, method="POST"
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as answer:
        answer.read()
    return time.perf_counter() - started


class SteadyClient:
    """Calls the always model back to back on a thread; each latency goes to `sink`."""

    def __init__(self, address: str, model: str, result: LiveResult) -> None:
        self.sink: list[float] = result.alone
        self._result = result
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(address, model), daemon=True)

    def _run(self, address: str, model: str) -> None:
        while not self._stop.is_set():
            try:
                self.sink.append(_infer(address, model))
            except OSError as e:
                self._result.failed.append(f"always model: {e}")
                self._stop.wait(0.1)

    def __enter__(self) -> SteadyClient:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_live(
    work: Path,
    *,
    models: int,
    rounds: int,
    idle: float,
    alone_seconds: float,
    say: Any = None,
) -> LiveResult:
    """Run the live measurement on a fresh simulated cluster under `work`; its progress goes to
    `say` (default: standard error, as it is not figures)."""
    if say is None:
        say = partial(print, file=sys.stderr)
    result = LiveResult()
    with SimCluster(work / "cluster", [NODES[0]], binders=1, webhook=True) as cluster:
        if cluster.missing:
            raise RuntimeError(f"the simulated cluster is missing {cluster.missing}")
        assert cluster.model_store is not None
        core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
        core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        names = [f"lazy-{i}" for i in range(models)]
        core.create_namespaced_pod(
            NAMESPACE,
            _pod("steady", cluster.model_store.publish("steady", MODELS_DIR / "add_one"), None),
        )
        for name in names:
            uri = cluster.model_store.publish(name.replace("-", "_"), MODELS_DIR / "add_one")
            core.create_namespaced_pod(NAMESPACE, _pod(name, uri, idle))
        addresses = {
            name: wait_until(f"pod {name} Ready", partial(_ready_ip, core, name), 180)
            for name in ["steady", *names]
        }
        say(f"live: 1 always and {models} on-demand pods Ready (idle {idle:g} s)")
        steady = addresses["steady"]
        _infer(steady, "steady")
        with SteadyClient(steady, "steady", result) as client:
            for name in names:
                wait_until(f"{name} asleep", partial(_asleep, addresses[name]), 10 * idle + 30)
            time.sleep(alone_seconds)  # the always model's latency with nothing waking
            client.sink = result.during
            for number in range(rounds):
                for name in names:
                    wait_until(f"{name} asleep", partial(_asleep, addresses[name]), 10 * idle + 30)
                for name in names:
                    model = name.replace("-", "_")
                    result.sent.append((model, time.time() % 86400))
                    try:
                        result.wakes.append(_infer(addresses[name], model))
                    except OSError as e:
                        result.failed.append(f"{name} round {number}: {e}")
                say(
                    f"live: round {number + 1}/{rounds}: wakes "
                    + " ".join(f"{s:.2f}" for s in result.wakes[-models:])
                    + " s"
                )
        log = cluster.workdir / "logs" / "tritonserver.log"
        text = log.read_text(errors="replace")
        result.triton_loads = triton_load_seconds(text)
        result.before_load = before_load(result.sent, load_starts(text))
    return result


def report(result: LiveResult, say: Any = print) -> tuple[float, float, float]:
    """Print the live figures; (wake p50, wake p99, always p99 during wakes / alone)."""
    p50, p99 = percentile(result.wakes, 0.5), percentile(result.wakes, 0.99)
    alone, during = percentile(result.alone, 0.99), percentile(result.during, 0.99)
    ratio = during / alone if alone > 0 else float("nan")
    say(
        f"wakes: {len(result.wakes)}, p50 {p50:.2f} s, p99 {p99:.2f} s (target p99 1.5 s: "
        f"{'met' if p99 <= 1.5 else 'NOT met'}); Triton's own load p50 "
        f"{percentile(result.triton_loads, 0.5):.2f} s, p99 "
        f"{percentile(result.triton_loads, 0.99):.2f} s; before it (proxy, agent) p50 "
        f"{percentile(result.before_load, 0.5):.3f} s, p99 "
        f"{percentile(result.before_load, 0.99):.3f} s"
    )
    say(
        f"always model p99: alone {alone * 1000:.1f} ms ({len(result.alone)} requests), during "
        f"wakes {during * 1000:.1f} ms ({len(result.during)}): {ratio:.2f}x (target 1.2x: "
        f"{'met' if ratio <= 1.2 else 'NOT met'})"
    )
    say(f"failed requests: {len(result.failed)}")
    for failure in result.failed[:5]:
        say(f"  {failure}")
    return p50, p99, ratio


WAKE_P99_GOAL = 1.5
"""A wake's p99, seconds, at most."""
WAKE_OVER_LOAD_GOAL = 0.1
"""A wake's p99 over Triton's own load p99, seconds, at most."""
ALWAYS_GOAL = 1.2
"""The always model's p99 during wakes over its p99 alone, at most."""


def check_goals(result: LiveResult) -> list[bool]:
    """The live run's goals, each printed with met or NOT MET."""
    p99 = percentile(result.wakes, 0.99)
    load = percentile(result.triton_loads, 0.99)
    alone, during = percentile(result.alone, 0.99), percentile(result.during, 0.99)
    ratio = during / alone if alone > 0 else float("inf")
    return [
        goals.check("wake p99", p99, WAKE_P99_GOAL, unit=" s"),
        goals.check("wake p99 over Triton's load p99", p99 - load, WAKE_OVER_LOAD_GOAL, unit=" s"),
        goals.check("always p99 during wakes / alone", ratio, ALWAYS_GOAL, unit="x"),
        goals.check("failed requests", len(result.failed), 0),
    ]
