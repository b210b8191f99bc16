"""Benchmark: every failed request while the fleet changes shape (churn).

On the simulated cluster with the real processes (two real nodes of two T4s, each with its own
Triton on the CPU, agent and gateway; two binders; the webhook), models in two namespaces answer
full load through their Services (`sim.service.ServiceProxy` stands in for kube-proxy):

- `team-a`, TritonModels: `steady` (2 replicas, `always`), `lazy` (`on-demand`), `scaled`
  (1 replica, the scale change's model) and `zero` (the built-in autoscaler, `minReplicas: 0`,
  `maxReplicas: 2`, a 6 s window);
- `team-b`, a Deployment `pods` of 2 model pods in the short form, behind a Service of its own.

Every model is `add_one` taking `MODEL_SECONDS` per request (a sleep, as a model's work keeps
its GPU busy: requests queue at Triton under load, and the load costs the 2-core machine little
CPU), marked idempotent (`spec.idempotent`, the `idempotent` annotation): a call lost with a node
gateway's process before its answer began is sent again by its proxy.

The load (`benchmarks.churnload`, a process of its own) keeps every model under closed-loop load
over every way clients connect (REST keep-alive, REST with a new connection per request, gRPC
unary on a long-lived channel, a ModelStreamInfer stream), 8 callers a model, plus an open-loop
Poisson caller per namespace; `zero`'s callers never pause. Meanwhile a schedule drawn from
`--seed` applies one change at a time:

- scale: `scaled` 1 -> 3 -> 1 replicas; zero: `zero` set to 0 replicas under its load (as
  `kubectl scale` would): parked on a host that holds its requests, it is asked for again by the
  autoscaler that reads them (the binder may keep the draining replicas it wants again);
- neighbour: a TritonModel created beside `steady` and deleted; secret: a TritonModel with a
  `storageSecret` joins `team-a` (its hosts are replaced) and leaves; rollout: `pods` rolled to
  new files;
- node-pod: a node's node pod replaced (`SimCluster.replace_node_pod`); agent: that process of a
  node SIGKILLed; gateway: the gateway's serving process SIGKILLed (as the OOM killer would; its
  keeper, the container's main process, starts it again); binder: the leader binder SIGKILLed;
  apiserver: the API server down 20 s (`RunningApiServer.pause`); crasher: a model pod in
  namespace `crash` whose model kills its node's Triton as it loads; host-image: both binders
  restarted with another `--host-image` (an upgrade of the model hosts), the non-leader first,
  so `team-a`'s hosts are replaced (its lone models served meanwhile by a stand-in replica);
  every other one with `zero` set to 0 just before the leader stops, so it waits parked for the
  next leader's autoscaler.
- hang: a node pod's gateway, agent or Triton, in turn, stopped (SIGSTOP to its container's
  processes) for 20 s, then continued; a restart by its liveness probe meanwhile is expected.
- oom: a model host's (`team-a`) or model pod's (`team-b`) container, in turn, killed as the OOM
  killer does (SIGKILL to its processes, `ContainerRun.oom_kill`): the node's kubelet reports it
  `OOMKilled` and starts it again; that exit is expected.
- slow-apiserver: the API server answers every call 2 s late for 30 s
  (`RunningApiServer.slow`), as an overloaded one does.
- webhook-down: the webhook's process stopped for 20 s while `pods` is scaled 2 -> 3 (its new
  pod refused meanwhile: `failurePolicy: Fail`), then started again; `pods` back at 2 after.
- store-down: the model store answers every request 503 for 20 s (`ModelStore.refuse`) while
  models wake: `zero` set to 0 under its load and `pods` scaled 2 -> 3 (its new pod fetches its
  files then); `pods` back at 2 after.
- spike: one model (each in turn) sent 10 times its closed-loop callers for 20 s
  (`LoadProcess.spike`).
- drain: `kubectl drain` of a GPU node (the real binary: evictions honouring the model hosts'
  PodDisruptionBudget the binder keeps and one of `pods`, `minAvailable: 1`), then uncordoned.
- two: two changes at once, one of a node's or a pod's process or the load (gateway, agent,
  hang, oom, node-pod, spike) with one of the control plane, the store or the replicas
  (apiserver, slow-apiserver, binder, scale, zero, webhook-down, store-down), drawn from
  `--seed`; its limit the longer of theirs.

- node-lost: a GPU node lost whole (`SimCluster.lose_node`): its Triton, agent, gateway and
  every pod's processes SIGKILLed at once, its kubelet silent; the node lifecycle controller
  marks it Ready=Unknown after `NODE_GRACE` s (kube's --node-monitor-grace-period is 40-50 s:
  shortened so a change fits a minute), taints it `unreachable` and evicts its pods after their
  default toleration (`UNREACHABLE_TOLERATION` s here, kube's 300 s); complete once its pods are
  evicted and every model is back at its replicas on the other node; then the node boots again
  (`restore_node`) and is Ready and untainted. Its processes' exits are expected.

The simulated cluster restarts the node pods' containers (Triton's keeper, agent, gateway) as the
kubelet restarts those of a `restartPolicy: Always` pod (`sim.node.nodepods`: at once, then with its
back-off of 10 s doubling to 5 minutes; also on a failed liveness probe), and the keepers of Triton
and the gateway start them again inside their containers (`common/keeper.py`; each such exit is
read from its log).
The binders run without a kubelet: this script restarts one that exits the same way. Every exit is
recorded. A change that does not complete within its stated time (`LIMITS`) is noted beside it,
with the TritonModel's conditions where one is waited for, and the run goes on.

Printed: the seed and the schedule; each change as it completes, with the time it took against
its limit and the requests in flight at its moment, per model; per kind of change the requests
sent and failed during it and the worst latency; every failed request counted by model, protocol
and answer; the requests a documented bound refused, with the bound; every process exit with its
cause and the change that expected it; the load's CPU beside the machine's; and one last line
`churn: ...`. It exits 1 unless the pass rule holds (`benchmarks.churnrule`): no failed request
(but the crasher's own and a documented bound's refusals), every change completed in its time,
every process exit expected, no answer slower than the documented hold bound, and at least
`MIN_PER_MINUTE` requests a model a minute.

`--slow-lazy SECONDS` makes `lazy`'s model take that long per request instead, so that its
callers have requests at Triton nearly always: a crasher's first exit then finds them there, and
its host goes on probation (the agent cannot tell the load from the request), the hardest case for
a neighbour.

`--keep DIR` runs the cluster in DIR (new or empty) and leaves it there: the node pods' logs
(`cluster/logs/`), each Triton's (`cluster/triton*/`) and every pod's container logs
(`cluster/pod-logs/<namespace>_<pod>_<uid>/`), to trace a failed request afterwards.

Run: .venv/bin/python -m benchmarks.churn [--minutes 10] [--seed 1] [--changes scale,zero,...]
    [--slow-lazy 0.3] [--keep DIR]
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import kubernetes.client

from benchmarks import command_line, goals
from benchmarks.churnload import (
    PER_WAY,
    POISSON_RATE,
    WAYS,
    Load,
    LoadProcess,
    Request,
    Target,
    in_flight_at,
    machine_busy,
)
from benchmarks.churnrule import (
    HOLD_BOUND,
    MIN_PER_MINUTE,
    Change,
    Exit,
    Verdict,
    check_goals,
    judge,
    why_expected,
)
from common.contract import DEFAULT_SYSTEM_NAMESPACE, Keys
from common.hosted import decode_parked, parked_models_annotation
from sim import admission_webhook
from sim.cluster import BinderHandle, NodeSpec, SimCluster
from sim.crashers import load_killer
from sim.demo.autoscale import slow_model
from sim.demo.rollout import deployment_manifest, new_release
from sim.demo.scenario import MODELS_DIR
from sim.node.nodepods import ContainerExit, restart_delay
from sim.processes import ClusterError, http_ok, wait_until
from sim.service import ServiceProxy

KEYS = Keys()
GROUP, VERSION, PLURAL = "tritonshare.io", "v1alpha1", "tritonmodels"
TEAM_A, TEAM_B, CRASH = "team-a", "team-b", "crash"
NODES = (NodeSpec("gpu-a", "2xT4", real=True), NodeSpec("gpu-b", "2xT4", real=True))
MODEL_SECONDS = 0.05
"""Seconds each model takes per request."""
SETTLE = 10.0
"""Seconds a change's window lasts after the change is complete."""
LOG_LINES_PER_LOGGER = 5

KEEPER_EXIT = re.compile(
    r"(?:tritonshare-keeper: \S+|the gateway's process) exited "
    r"\((signal \w+|exit code -?\d+)\) after [0-9.]+ s[;,]"
)
"""A line of a keeper (Triton's, the gateway's): the process it keeps exited and the keeper
starts it again (or gives up)."""

OUTAGE = 20.0
"""Seconds the API server is down."""
SLOW_CALLS = 2.0
"""Seconds late the slow API server answers each call."""
SLOW_FOR = 30.0
"""Seconds the API server is slow."""
WEBHOOK_DOWN = 20.0
"""Seconds the webhook is stopped while `pods` is scaled up."""
STORE_DOWN = 20.0
"""Seconds the model store refuses while models wake."""
SPIKE = 10
"""How many times its load a spike sends to one model."""
SPIKE_FOR = 20.0
"""Seconds a spike lasts."""
DRAIN_TIMEOUT = 150
"""Seconds `kubectl drain` may take (its `--timeout`)."""
HANG = 20.0
"""Seconds a hung process stays stopped."""
NODE_GRACE = 10.0
"""The node lifecycle controller's --node-monitor-grace-period in the churn's cluster."""
NODE_HEARTBEAT = 2.0
"""Seconds between a kubelet's renewals of its node's Lease in the churn's cluster."""
UNREACHABLE_TOLERATION = 10
"""The API server's --default-unreachable-toleration-seconds in the churn's cluster."""
HANGS = ("gateway", "agent", "triton")
"""The node pod's containers the hang change stops, in turn."""
KINDS = (
    "scale",
    "zero",
    "neighbour",
    "secret",
    "rollout",
    "node-pod",
    "agent",
    "gateway",
    "binder",
    "apiserver",
    "crasher",
    "host-image",
    "hang",
    "oom",
    "slow-apiserver",
    "webhook-down",
    "store-down",
    "spike",
    "drain",
    "node-lost",
    "two",
)
MODELS = {TEAM_A: ("steady", "lazy", "scaled", "zero"), TEAM_B: ("pods",)}
"""The models under load, by namespace."""
LIMITS = {
    "scale": 300.0,
    "zero": 90.0,
    "neighbour": 300.0,
    "secret": 270.0,
    "rollout": 300.0,
    "node-pod": 120.0,
    "agent": 120.0,
    "gateway": 120.0,
    "binder": 90.0,
    "apiserver": 60.0,
    "crasher": 150.0,
    "host-image": 600.0,
    "hang": 120.0,
    "oom": 150.0,
    "slow-apiserver": 90.0,
    "webhook-down": 240.0,
    "store-down": 270.0,
    "spike": 40.0,
    "drain": 330.0,
    "node-lost": 360.0,
}
"""Seconds each kind of change is stated to complete in (the sum of its own waits' limits)."""
PAIRS = (
    ("gateway", "agent", "hang", "oom", "node-pod", "spike"),
    ("apiserver", "slow-apiserver", "binder", "scale", "zero", "webhook-down", "store-down"),
)
"""The kinds `two` applies at once: one of the first row (a node's or a pod's process, the load)
with one of the second (the control plane, the store, a change of replicas); no two of one row,
which act on the same things."""
WARM_UP = 180.0
"""Seconds the load may take until each of its callers has had an answer; the requests sent
until then are not counted."""
MIN_IN_FLIGHT = 4
"""Requests each model has in flight at every moment (said beside each change)."""
SERVES = f"{KEYS.prefix}serves-"
HEADERS = json.dumps({"Authorization": "Bearer churn"})
"""The storageSecret's headers: the loader wants at least one; the sim's store asks for none."""


class Kubelet:
    """The binders' restarts, as a kubelet would do them (the cluster restarts the node pods'
    containers itself); every exit of theirs, of the node pods' containers and of the pods'
    containers recorded."""

    def __init__(self, cluster: SimCluster, began: float) -> None:
        self.cluster = cluster
        self.began = began
        self.exits: list[Exit] = []
        self.causes: dict[str, str] = {}
        """What the benchmark did to a process it killed, by its name."""
        self._seen: set[tuple[str, str, str]] = set()
        self.list_failures = 0
        self._restarts: dict[str, tuple[int, float]] = {}
        """Each binder's restarts (the count is kept for the whole run: none runs the 10
        minutes that reset it) and when it last started."""
        self._down: set[str] = set()
        self._node_pod_exits = 0
        """The cluster's node pod container exits already recorded."""
        self._kept: dict[Path, int] = {}
        """Lines of each Triton log already read for its keeper's restarts."""
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._watch_processes, name="churn-kubelet"),
            threading.Thread(target=self._watch_pods, name="churn-pod-exits"),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(90)

    def record(
        self,
        name: str,
        returncode: int | None,
        last_lines: str,
        cause: str = "",
        at: float | None = None,
    ) -> None:
        if returncode is not None and returncode < 0:
            code = f"signal {signal.Signals(-returncode).name}"
        else:
            code = f"exit code {returncode}"
        cause = cause or self.causes.pop(name, "") or "unknown (see its last lines)"
        lines = " | ".join(
            line.strip()[:160] for line in last_lines.splitlines()[-3:] if line.strip()
        )
        when = time.monotonic() if at is None else at
        self.exits.append(Exit(when, name, code, cause, lines))

    def _watch_processes(self) -> None:
        while not self._stop.wait(0.5):
            self._record_node_pod_exits()
            for node in self.cluster.real_nodes:
                triton = self.cluster.tritons.get(node.name)
                if triton is not None and triton.kept and triton.log_path is not None:
                    self._kept_exits("triton", node.name, triton.log_path)
                gateway = self.cluster.gateways.get(node.name)
                if gateway is not None:
                    self._kept_exits("gateway", node.name, gateway.process.log_path)
            self._restart_binders()

    def _may_restart(self, name: str) -> bool:
        """Whether the kubelet's back-off lets `name` start again now (`restart_delay`)."""
        restarts, last = self._restarts.get(name, (0, 0.0))
        if time.monotonic() - last < restart_delay(restarts):
            return False
        self._restarts[name] = (restarts + 1, time.monotonic())
        return True

    def _exited(self, name: str, returncode: int | None, last_lines: str) -> bool:
        """Record an exit once; whether the process may be started again now."""
        if name not in self._down:
            self._down.add(name)
            self.record(name, returncode, last_lines)
        if not self._may_restart(name):
            return False
        self._down.discard(name)
        return True

    def _kept_exits(self, process: str, node: str, log: Path) -> None:
        """Record the exits of Triton's server or the gateway's process that their keeper
        (`common/keeper.py`, the container's main process) restarted itself, from the lines it
        wrote to the log since the last look."""
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            return
        start = self._kept.get(log, 0)
        start = 0 if start > len(lines) else start  # a new server's log, started afresh
        self._kept[log] = len(lines)
        for i in range(start, len(lines)):
            found = KEEPER_EXIT.search(lines[i])
            if found is None:
                continue
            words = found.group(1)
            code = -signal.Signals[words.split()[1]] if words.startswith("signal") else None
            if code is None:
                code = int(words.rpartition(" ")[2])
            before = lines[max(0, i - 40) : i]
            cause = last_loaded(before) if process == "triton" else ""
            self.record(f"{process}/{node}", code, "\n".join(before[-3:]), cause)

    def _record_node_pod_exits(self) -> None:
        """Record the node pods' containers' exits the cluster's kubelet has seen since the last
        look (it starts them again itself)."""
        exits = self.cluster.container_exits()
        for ended in exits[self._node_pod_exits :]:
            self.record(
                f"{ended.container}/{ended.node}",
                ended.returncode,
                ended.last_lines,
                self._cause(ended),
                ended.at,
            )
        self._node_pod_exits = len(exits)

    def _cause(self, ended: ContainerExit) -> str:
        name = f"{ended.container}/{ended.node}"
        if name in self.causes:
            return self.causes.pop(name)
        if ended.reason:
            return f"the kubelet killed it: its {ended.reason}"
        if ended.container == "triton":
            return last_loaded(ended.last_lines.splitlines())
        return ""

    def _restart_binders(self) -> None:
        cluster = self.cluster
        for binder in cluster.binders:
            if not binder.process.alive():
                assert binder.process.process is not None
                code = binder.process.process.returncode
                if self._exited(binder.process.name, code, binder.process.log_tail(5)):
                    binder.process.start(cluster.env)

    def _watch_pods(self) -> None:
        while not self._stop.wait(2.0):
            try:
                listed = json.loads(
                    self.cluster.core.list_pod_for_all_namespaces(
                        _preload_content=False, _request_timeout=5
                    ).data
                )
            except Exception:  # the API server may be down: the next list sees the rest
                self.list_failures += 1
                continue
            for pod in listed.get("items", []):
                self._pod_exits(pod)

    def _pod_exits(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        deleting = bool(meta.get("deletionTimestamp"))
        status_of = pod.get("status") or {}
        statuses = (status_of.get("initContainerStatuses") or []) + (
            status_of.get("containerStatuses") or []
        )
        inits = {c["name"] for c in pod["spec"].get("initContainers") or []}
        for status in statuses:
            for state in (status.get("lastState") or {}, status.get("state") or {}):
                ended = state.get("terminated")
                if not ended:
                    continue
                # One exit, whether read as the state or (once restarted) as the last state:
                # the restart count has moved on by then, its run's start and end have not.
                key = (
                    f"{meta['namespace']}/{meta['name']}/{status['name']}",
                    str(ended.get("startedAt")),
                    str(ended.get("finishedAt")),
                )
                if key in self._seen:
                    continue
                self._seen.add(key)
                code = int(ended.get("exitCode") or 0)
                if code == 0 and status["name"] in inits:
                    continue  # an init container's normal end
                cause = f"{ended.get('reason') or 'terminated'}" + (
                    " (pod deleted)" if deleting else ""
                )
                self.exits.append(
                    Exit(
                        time.monotonic(),
                        f"pod {key[0]}",
                        f"exit code {code}",
                        cause,
                        " | ".join(
                            line[:160] for line in str(ended.get("message") or "").splitlines()[-3:]
                        ),
                    )
                )


def last_loaded(lines: list[str]) -> str:
    """The cause of Triton's exit when it was loading a model other than this benchmark's (a
    crasher's): the last model its log says it loaded; empty when it says none."""
    loading = [line for line in lines if "loading: " in line]
    if not loading:
        return ""
    model = loading[-1].rpartition("loading: ")[2].strip('" ')
    return f"not this benchmark; it last loaded {model}"


class Churn:
    """The cluster's workloads, their load, and the changes applied to them."""

    def __init__(
        self, cluster: SimCluster, workdir: Path, kubelet: Kubelet, slow_lazy: float = 0.0
    ) -> None:
        assert cluster.kube is not None and cluster.model_store is not None
        self.cluster = cluster
        self.workdir = workdir
        self.kubelet = kubelet
        self.store = cluster.model_store
        self.core = cluster.core
        self.apps = cast(Any, kubernetes.client.AppsV1Api(cluster.kube))
        self.custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
        self.load: LoadProcess | None = None
        self.releases = 0
        self.host_images = 0
        self.hangs = 0
        self.ooms = 0
        self.spikes = 0
        self.slow_lazy = slow_lazy
        """Seconds `lazy`'s model takes per request (0: `MODEL_SECONDS`, as every model)."""

    # ---- workloads -----------------------------------------------------------------------------

    def files(self, name: str) -> Path:
        """The model's files: add_one taking `MODEL_SECONDS` per request (`lazy`: --slow-lazy
        when given)."""
        seconds = self.slow_lazy if name == "lazy" and self.slow_lazy > 0 else MODEL_SECONDS
        files = self.workdir / f"add_one-{seconds:g}s"
        if not files.exists():
            slow_model(MODELS_DIR / "add_one", files, seconds)
        return files

    def tritonmodel(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        uri = self.store.publish(name, self.files(name))
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TritonModel",
            "metadata": {"name": name},
            "spec": {"storageUri": uri, "gpuMemory": "256Mi", "idempotent": True, **spec},
        }

    def create_workloads(self) -> None:
        for namespace in (TEAM_A, TEAM_B, CRASH):
            self.core.create_namespace({"metadata": {"name": namespace}}, _preload_content=False)
        models: dict[str, dict[str, Any]] = {
            "steady": {"replicas": 2},
            "lazy": {"residency": "on-demand"},
            "scaled": {"replicas": 1},
            "zero": {
                "autoscaling": {"target": 1, "minReplicas": 0, "maxReplicas": 2, "window": "6s"}
            },
        }
        for name, spec in models.items():
            self.custom.create_namespaced_custom_object(
                GROUP, VERSION, TEAM_A, PLURAL, self.tritonmodel(name, spec)
            )
        uri = self.store.publish("pods", self.files("pods"))
        deployment = deployment_manifest(uri, replicas=2, name="pods")
        deployment["spec"]["template"]["metadata"]["annotations"][KEYS.idempotent] = "true"
        self.apps.create_namespaced_deployment(TEAM_B, deployment)
        ports = [
            {"name": "http", "port": 9000, "targetPort": "http"},
            {"name": "grpc", "port": 9001, "targetPort": "grpc"},
        ]
        service: dict[str, Any] = {
            "metadata": {"name": "pods"},
            "spec": {"selector": {"app": "pods"}},
        }
        service["spec"]["ports"] = ports
        self.core.create_namespaced_service(TEAM_B, service, _preload_content=False)

    def service_address(self, namespace: str, name: str) -> str | None:
        try:
            service = self.core.read_namespaced_service(name, namespace)
        except kubernetes.client.ApiException:
            return None
        return str(service.spec.cluster_ip) if service.spec.cluster_ip else None

    def start_load(self, seed: int, ways: tuple[str, ...]) -> list[str]:
        """The load on every model (`benchmarks.churnload`), once each of its callers has had an
        answer, or `WARM_UP` seconds; the callers still not answered then, with their last
        answers (the churn goes on: their failures count)."""
        targets = []
        for namespace, models in MODELS.items():
            for model in models:
                address = wait_until(
                    f"the Service of {namespace}/{model}",
                    partial(self.service_address, namespace, model),
                    300,
                )
                targets.append(Target(model, namespace, address))
        self.load = LoadProcess(targets, self.workdir, seed, ways)
        self.load.start()
        if self.load.answered.wait(WARM_UP):
            return []
        return self.load.unanswered()

    def stop_load(self) -> Load:
        return self.load.stop() if self.load is not None else Load()

    def tm(self, name: str) -> dict[str, Any] | None:
        try:
            return cast(
                dict[str, Any],
                self.custom.get_namespaced_custom_object(GROUP, VERSION, TEAM_A, PLURAL, name),
            )
        except kubernetes.client.ApiException as e:
            if e.status == 404:
                return None
            raise

    def ready(self, name: str, count: int) -> bool:
        model = self.tm(name) or {}
        return bool((model.get("status") or {}).get("readyReplicas", 0) == count)

    def conditions(self, name: str) -> str:
        """The TritonModel's conditions that are not True, as its status says them."""
        status = (self.tm(name) or {}).get("status") or {}
        said = [
            f"{c.get('type')}={c.get('status')} {c.get('reason')}: {c.get('message')}"
            for c in status.get("conditions") or []
            if c.get("status") != "True"
        ]
        return "; ".join(said) or "no condition is False"

    def wait_ready(self, name: str, count: int, timeout: float) -> None:
        """Until `count` replicas of TritonModel `name` are ready; ClusterError with its
        conditions after `timeout` seconds."""
        wait_until(
            f"{name} at {count} ready",
            partial(self.ready, name, count),
            timeout,
            partial(self.conditions, name),
        )

    def scale(self, name: str, replicas: int) -> None:
        patch = {"spec": {"replicas": replicas}}
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, TEAM_A, PLURAL, name, patch)

    # ---- changes: each sets its moment (when its disruptive step happens) and a note -----------

    def apply(self, change: Change) -> None:
        handler: Callable[[Change], None] = getattr(self, "do_" + change.kind.replace("-", "_"))
        handler(change)

    def do_two(self, change: Change) -> None:
        """Its two parts at once, each on a thread of its own; complete once both are, its moment
        the earlier of theirs."""
        errors: list[str] = []

        def part(each: Change) -> None:
            each.start = each.moment = change.start
            try:
                self.apply(each)
                each.took = time.monotonic() - each.start
            except Exception as e:  # any failure of a part is the change's, said beside it
                first = (str(e).splitlines() or [type(e).__name__])[0][:300]
                each.note = f"did not complete: {first}"
                errors.append(f"{each.kind}: {each.note}")

        threads = [
            threading.Thread(target=part, args=(p,), name=f"churn-{p.kind}") for p in change.parts
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        change.moment = min(p.moment for p in change.parts)
        change.note = "; ".join(
            f"{p.kind} (node {p.node}) "
            + ("did not complete" if p.took is None else f"{p.took:.0f} s of {p.limit:.0f} s")
            + (f": {p.note}" if p.note else "")
            for p in change.parts
        )
        if errors or not all(p.completed for p in change.parts):
            raise ClusterError("; ".join(errors) or "a part took longer than its own limit")

    def do_scale(self, change: Change) -> None:
        self.scale("scaled", 3)
        self.wait_ready("scaled", 3, 180)
        time.sleep(5)
        self.scale("scaled", 1)
        change.moment = time.monotonic()
        self.wait_ready("scaled", 1, 120)

    def do_zero(self, change: Change) -> None:
        """`zero` set to 0 replicas under its load (as `kubectl scale` would): parked on a host
        that holds its requests, which the autoscaler reads as concurrency and wakes it by."""
        self.scale("zero", 0)
        change.moment = time.monotonic()
        change.note = self.watch_zero(change.moment, LIMITS["zero"] - 15)
        time.sleep(5)

    def watch_zero(self, since: float, timeout: float) -> str:
        """Until `zero`, set to 0 replicas at `since`, is asked for again (its autoscaler woke
        it from the requests its parking host holds) and served by a ready replica, no longer
        parked; ClusterError after `timeout` seconds. Says when, and what was seen meanwhile:
        the binder may keep a draining replica it wants again, so the model may never show 0
        ready replicas, and its parking may last less than a look here."""
        deadline = time.monotonic() + timeout
        parked_seen, fewest = False, None
        woken: float | None = None
        while True:
            model = self.tm("zero") or {}
            asked = int((model.get("spec") or {}).get("replicas") or 0)
            ready = int((model.get("status") or {}).get("readyReplicas") or 0)
            parked = self.parked("zero")
            parked_seen = parked_seen or parked
            fewest = ready if fewest is None else min(fewest, ready)
            if woken is None and asked >= 1:
                woken = time.monotonic()
            if woken is not None and ready >= 1 and not parked:
                served = time.monotonic() - since
                return (
                    f"asked for again {woken - since:.1f} s on, served {served:.1f} s on; parked "
                    f"seen {'yes' if parked_seen else 'no'}, fewest ready {fewest}"
                )
            if time.monotonic() > deadline:
                state = "served again" if woken is not None else "asked for again"
                raise ClusterError(
                    f"zero not {state} within {timeout:g} s; {self.conditions('zero')}"
                )
            time.sleep(0.1)

    def ready_count(self, name: str) -> int:
        return int(((self.tm(name) or {}).get("status") or {}).get("readyReplicas") or 0)

    def parked(self, model: str) -> bool:
        """Whether a `team-a` host's parked-models annotation names `model`."""
        key = parked_models_annotation(KEYS)
        for pod in self.core.list_namespaced_pod(TEAM_A).items:
            value = (pod.metadata.annotations or {}).get(key, "")
            if model in {p.model for p in decode_parked(value, 100)[0]}:
                return True
        return False

    def do_neighbour(self, change: Change) -> None:
        body = self.tritonmodel("neighbour", {"replicas": 2})
        self.custom.create_namespaced_custom_object(GROUP, VERSION, TEAM_A, PLURAL, body)
        self.wait_ready("neighbour", 2, 180)
        time.sleep(5)
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, TEAM_A, PLURAL, "neighbour")
        wait_until("the neighbour gone", lambda: self.tm("neighbour") is None, 120)

    def do_secret(self, change: Change) -> None:
        host = self.store.base_url.split("//", 1)[1].split("/", 1)[0]
        secret = {
            "metadata": {"name": "store-credentials"},
            "stringData": {"https-host": host.split(":")[0], "headers": HEADERS},
        }
        with contextlib.suppress(kubernetes.client.ApiException):
            self.core.create_namespaced_secret(TEAM_A, secret, _preload_content=False)
        body = self.tritonmodel("private", {"storageSecret": "store-credentials"})
        self.custom.create_namespaced_custom_object(GROUP, VERSION, TEAM_A, PLURAL, body)
        try:
            self.wait_ready("private", 1, 150)
            time.sleep(5)
        finally:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, TEAM_A, PLURAL, "private")
        wait_until("the model with a storageSecret gone", lambda: self.tm("private") is None, 120)

    def do_rollout(self, change: Change) -> None:
        self.releases += 1
        release = f"r{self.releases}"
        files = new_release(self.files("pods"), self.workdir / f"pods-{release}")
        uri = self.store.publish("pods", files, release=release)
        patch = {
            "spec": {"template": {"metadata": {"annotations": {f"{KEYS.prefix}model-uri": uri}}}}
        }
        self.apps.patch_namespaced_deployment("pods", TEAM_B, patch)

        def rolled() -> bool:
            d = self.apps.read_namespaced_deployment("pods", TEAM_B)
            s = d.status
            progressing = next((c for c in s.conditions or [] if c.type == "Progressing"), None)
            return bool(
                s.observed_generation == d.metadata.generation
                and (s.replicas, s.updated_replicas, s.available_replicas) == (2, 2, 2)
                and progressing is not None
                and progressing.reason == "NewReplicaSetAvailable"
            )

        wait_until("the rollout of pods complete", rolled, 300)

    def do_node_pod(self, change: Change) -> None:
        # No crash: the cluster's kubelet leaves a replaced node pod's containers to it.
        self.cluster.replace_node_pod(change.node)
        for process in ("agent", "gateway"):
            name = f"{process}/{change.node}"
            code = self.cluster.exit_codes.get(name)
            self.kubelet.record(name, code, "", "node pod replaced (SIGTERM)")

    def _kill(self, name: str, pid: int, why: str, *, group: bool = True) -> None:
        """SIGKILL `pid`'s process group (a container), or with `group` False the process alone,
        recording why as the cause of `name`'s exit."""
        self.kubelet.causes[name] = why
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)

    def _restarted(self, alive: Callable[[], bool], what: str) -> None:
        time.sleep(1)
        wait_until(f"{what} running again", alive, 120)

    def do_agent(self, change: Change) -> None:
        agent = self.cluster.agents[change.node]
        assert agent.process.process is not None
        self._kill(agent.process.name, agent.process.process.pid, "SIGKILL by the churn (agent)")
        self._restarted(lambda: self.cluster.agents[change.node].process.alive(), "the agent")

    def do_gateway(self, change: Change) -> None:
        gateway = self.cluster.gateways[change.node]
        killed = gateway.serving_pid()
        assert killed is not None, "the node's gateway runs no process under its keeper"
        # The gateway's process, as the OOM killer or a crash ends it; its keeper (the
        # container's main process) starts it again.
        self._kill(f"gateway/{change.node}", killed, "SIGKILL by the churn", group=False)

        def running() -> bool:
            handle = self.cluster.gateways.get(change.node)
            return (
                handle is not None
                and handle.serving_pid() not in (None, killed)
                and http_ok(f"http://{handle.address}:{handle.metrics}/healthz")
            )

        self._restarted(running, "the gateway")

    def do_hang(self, change: Change) -> None:
        """One of the node pod's containers (gateway, agent, Triton in turn) hung: every process
        of it stopped (SIGSTOP to its process group, as a frozen cgroup) for `HANG` seconds,
        then continued; the change completes once it serves again."""
        process = change.process = HANGS[self.hangs % len(HANGS)]
        self.hangs += 1
        node = change.node
        if process == "agent":
            pid = self.cluster.agents[node].process.process
        elif process == "gateway":
            pid = self.cluster.gateways[node].process.process
        else:
            pid = self.cluster.tritons[node].process
        assert pid is not None, f"the {process} of {node} runs no process"
        change.moment = time.monotonic()
        os.killpg(pid.pid, signal.SIGSTOP)
        try:
            time.sleep(HANG)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid.pid, signal.SIGCONT)
        change.note = f"{process} stopped {HANG:g} s"

        def serving() -> bool:
            if process == "agent":
                return self.cluster.agents[node].process.alive()
            if process == "gateway":
                handle = self.cluster.gateways.get(node)
                return handle is not None and http_ok(
                    f"http://{handle.address}:{handle.metrics}/healthz"
                )
            triton = self.cluster.tritons.get(node)
            return triton is not None and http_ok(f"http://{triton.http_url}/v2/health/ready")

        self._restarted(serving, f"the {process} of {node}")

    def oom_target(self, node: str) -> tuple[str, str, str]:
        """The pod the OOM change kills a container of, by turns a `team-a` model host and a
        `team-b` model pod, on `node` if one runs there (else on the other node): its namespace,
        name and its serving container (`proxy`)."""
        host = (TEAM_A, f"{KEYS.prefix}model-host=true")
        pod = (TEAM_B, "app=pods")
        choices = (host, pod) if self.ooms % 2 == 0 else (pod, host)
        self.ooms += 1
        for namespace, selector in choices:
            listed = self.core.list_namespaced_pod(namespace, label_selector=selector).items
            running = [
                p
                for p in listed
                if not p.metadata.deletion_timestamp and p.status.phase == "Running"
            ]
            running.sort(key=lambda p: p.spec.node_name != node)
            if running:
                chosen = running[0]
                names = [c.name for c in chosen.spec.containers]
                return namespace, chosen.metadata.name, "proxy" if "proxy" in names else names[0]
        raise ClusterError("no running model host or model pod to OOM-kill")

    def restarts_of(self, namespace: str, pod: str, container: str) -> tuple[int, bool]:
        """The container's restart count and whether it is ready, as its pod's status says."""
        status = self.core.read_namespaced_pod(pod, namespace).status
        for c in status.container_statuses or []:
            if c.name == container:
                return int(c.restart_count or 0), bool(c.ready)
        return 0, False

    def do_oom(self, change: Change) -> None:
        """A model host's or model pod's serving container killed as the OOM killer does (SIGKILL
        to its processes; the kubelet reports it `OOMKilled` and starts it again); the change
        completes once the container runs ready again and its model is back at its replicas."""
        namespace, pod, container = self.oom_target(change.node)
        read = self.core.read_namespaced_pod(pod, namespace)
        node = read.spec.node_name
        change.node = node
        change.process = f"{namespace}/{pod}/{container}"
        before, _ = self.restarts_of(namespace, pod, container)
        kubelet = self.cluster.kubelets.get(node)
        runs = kubelet.containers(namespace, pod) if kubelet is not None else None
        run = next((r for r in runs or [] if r.name == container), None)
        if run is None:
            raise ClusterError(f"the kubelet of {node} runs no container {change.process}")
        change.moment = time.monotonic()
        if not run.oom_kill():
            raise ClusterError(f"{change.process} runs no process to OOM-kill")

        def back() -> bool:
            restarts, ready = self.restarts_of(namespace, pod, container)
            return restarts > before and ready

        wait_until(f"{change.process} restarted and ready", back, 90)
        if namespace == TEAM_A:
            self.wait_ready("steady", 2, 60)
        else:
            wait_until("pods at 2 available", partial(self.pods_at, 2), 60)
        change.note = f"{change.process} OOM-killed"

    def binder_lease(self) -> tuple[str, datetime.datetime | None]:
        """The binder leader lease's holder and last renewal."""
        coordination = cast(Any, kubernetes.client.CoordinationV1Api(self.cluster.kube))
        lease = coordination.read_namespaced_lease("tritonshare-binder", DEFAULT_SYSTEM_NAMESPACE)
        return str(lease.spec.holder_identity or ""), lease.spec.renew_time

    def do_binder(self, change: Change) -> None:
        leader, _ = self.binder_lease()
        binder = next(b for b in self.cluster.binders if b.identity == leader)
        assert binder.process.process is not None
        killed = binder.process.process.pid
        self._kill(binder.process.name, killed, "SIGKILL by the churn (leader)")
        at = datetime.datetime.now(datetime.UTC)

        def led_again() -> bool:
            """A live binder renewed the lease since the kill (the killed one once restarted,
            under its own identity, may take it back)."""
            holder, renewed = self.binder_lease()
            by = next((b for b in self.cluster.binders if b.identity == holder), None)
            if by is None or by.process.process is None or not by.process.alive():
                return False
            return renewed is not None and renewed > at and by.process.process.pid != killed

        wait_until("the leader lease renewed by a live binder", led_again, 90)
        change.note = f"{leader} killed; {self.binder_lease()[0]} leads"

    def do_host_image(self, change: Change) -> None:
        self.host_images += 1
        image = f"tritonshare:churn-{self.host_images}"
        # Every other one (the first too) sets `zero` to 0 just before the leader stops: its
        # requests wait parked on a host until the next leader's autoscaler wakes it, while the
        # hosts are replaced.
        parked = self.host_images % 2 == 1
        leader, _ = self.binder_lease()
        change.moment = time.monotonic()
        for binder in sorted(self.cluster.binders, key=lambda b: b.identity == leader):
            if parked and binder.identity == leader:
                self.scale("zero", 0)
                change.moment = time.monotonic()
            argv = list(binder.process.argv)
            if "--host-image" in argv:
                del argv[argv.index("--host-image") : argv.index("--host-image") + 2]
            binder.process.argv = [*argv, "--host-image", image]
            assert binder.process.process is not None
            pid = binder.process.process.pid
            self.kubelet.causes[binder.process.name] = (
                f"SIGTERM by the churn (--host-image {image})"
            )
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)

            def restarted(binder: BinderHandle = binder, pid: int = pid) -> bool:
                process = binder.process.process
                return process is not None and process.pid != pid and binder.process.alive()

            wait_until(f"{binder.identity} running with {image}", restarted, 180)
        zero = self.watch_zero(change.moment, 120) if parked else ""

        def replaced() -> bool:
            hosts = self.core.list_namespaced_pod(
                TEAM_A, label_selector=f"{KEYS.prefix}model-host=true"
            )
            return bool(hosts.items) and all(
                not pod.metadata.deletion_timestamp
                and {c.image for c in pod.spec.containers} == {image}
                for pod in hosts.items
            )

        wait_until(f"team-a's hosts on {image}", replaced, 300)
        self.wait_ready("steady", 2, 120)
        self.wait_ready("scaled", 1, 120)  # its stand-in gone
        change.note = f"hosts on {image}" + (f"; zero set to 0: {zero}" if parked else "")

    def do_apiserver(self, change: Change) -> None:
        assert self.cluster.apiserver is not None
        self.cluster.apiserver.pause()
        time.sleep(OUTAGE)
        self.cluster.apiserver.resume()

    def do_slow_apiserver(self, change: Change) -> None:
        """The API server answers every call `SLOW_CALLS` late for `SLOW_FOR` seconds
        (`RunningApiServer.slow`); complete once `steady` reads its replicas ready again."""
        assert self.cluster.apiserver is not None
        self.cluster.apiserver.slow(SLOW_CALLS)
        try:
            time.sleep(SLOW_FOR)
        finally:
            self.cluster.apiserver.slow(0)
        self.wait_ready("steady", 2, 30)
        change.note = f"every call {SLOW_CALLS:g} s late for {SLOW_FOR:g} s"

    def pods_at(self, replicas: int) -> bool:
        """Whether the Deployment `pods` has `replicas` pods, each updated and available."""
        d = self.apps.read_namespaced_deployment("pods", TEAM_B)
        s = d.status
        return bool(
            s.observed_generation == d.metadata.generation
            and (s.replicas, s.updated_replicas, s.available_replicas)
            == (replicas, replicas, replicas)
        )

    def scale_pods(self, replicas: int) -> None:
        self.apps.patch_namespaced_deployment("pods", TEAM_B, {"spec": {"replicas": replicas}})

    def do_webhook_down(self, change: Change) -> None:
        """The webhook's process stopped (SIGTERM) while `pods` is scaled 2 -> 3 (its new model
        pod is refused while no webhook answers: `failurePolicy: Fail`), started again after
        `WEBHOOK_DOWN` seconds; complete once the third pod is available and `pods` is back at 2."""
        webhook = self.cluster.webhook
        if webhook is None:
            raise ClusterError("the cluster runs no webhook")
        change.moment = time.monotonic()
        code = webhook.process.stop()
        self.kubelet.record(
            webhook.process.name, code, webhook.process.log_tail(3), "SIGTERM by the churn"
        )
        try:
            self.scale_pods(3)
            time.sleep(WEBHOOK_DOWN)
        finally:
            webhook.process.start({**self.cluster.env, **admission_webhook.environment()})
        wait_until("the third pod of pods available", partial(self.pods_at, 3), 120)
        self.scale_pods(2)
        wait_until("pods back at 2", partial(self.pods_at, 2), 90)
        change.note = f"webhook stopped {WEBHOOK_DOWN:g} s while pods scaled 2 -> 3"

    def do_store_down(self, change: Change) -> None:
        """The model store answers every request 503 (`ModelStore.refuse`) for `STORE_DOWN`
        seconds while models wake: `zero` set to 0 under its load (woken by its autoscaler) and
        `pods` scaled 2 -> 3 (its new pod's storage initializer fetches from the store); complete
        once `zero` is served again, the third pod is available and `pods` is back at 2."""
        self.store.refuse()
        change.moment = time.monotonic()
        # The store serves again after its outage's time, whether `zero` woke meanwhile or not.
        back = threading.Timer(STORE_DOWN, self.store.refuse, args=(False,))
        back.start()
        try:
            self.scale("zero", 0)
            self.scale_pods(3)
            zero = self.watch_zero(change.moment, 90)
            back.join()
        finally:
            back.cancel()
            self.store.refuse(False)
        wait_until("the third pod of pods available", partial(self.pods_at, 3), 120)
        self.scale_pods(2)
        wait_until("pods back at 2", partial(self.pods_at, 2), 60)
        change.note = f"store refused {STORE_DOWN:g} s; zero set to 0: {zero}"

    def do_spike(self, change: Change) -> None:
        """`SPIKE` times one model's closed-loop callers for `SPIKE_FOR` seconds
        (`LoadProcess.spike`), each model in turn."""
        if self.load is None:
            raise ClusterError("no load to spike")
        models = [m for ms in MODELS.values() for m in ms]
        model = change.process = models[self.spikes % len(models)]
        self.spikes += 1
        change.moment = time.monotonic()
        self.load.spike(model, SPIKE, SPIKE_FOR)
        time.sleep(SPIKE_FOR)
        change.note = f"{model} at {SPIKE}x its callers for {SPIKE_FOR:g} s"

    def pods_budget(self) -> None:
        """A PodDisruptionBudget keeping one of `pods` available (as its team would write it);
        the binder keeps the model hosts' own."""
        policy = cast(Any, kubernetes.client.PolicyV1Api(self.cluster.kube))
        budget = {
            "metadata": {"name": "pods"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "pods"}}},
        }
        with contextlib.suppress(kubernetes.client.ApiException):  # made by an earlier drain
            policy.create_namespaced_pod_disruption_budget(TEAM_B, budget, _preload_content=False)

    def do_drain(self, change: Change) -> None:
        """`kubectl drain` of a GPU node (the real binary: cordon, then evictions through the
        API server's eviction subresource, each honouring the PodDisruptionBudgets: the model
        hosts' that the binder keeps, and `pods`'), then `kubectl uncordon`; complete once
        every model is back at its replicas."""
        self.pods_budget()
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            raise ClusterError("kubectl is not installed: the drain needs it")
        base = [kubectl, f"--kubeconfig={self.cluster.kubeconfig}"]
        change.moment = time.monotonic()
        try:
            drained = subprocess.run(
                [
                    *base,
                    "drain",
                    change.node,
                    "--ignore-daemonsets",
                    "--delete-emptydir-data",
                    f"--timeout={DRAIN_TIMEOUT}s",
                ],
                capture_output=True,
                text=True,
                timeout=DRAIN_TIMEOUT + 30,
                check=False,
            )
        finally:
            subprocess.run([*base, "uncordon", change.node], capture_output=True, check=False)
        said = (drained.stdout + drained.stderr).splitlines()
        evicted = sum(1 for line in said if line.endswith(" evicted"))
        if drained.returncode != 0:
            raise ClusterError(
                f"kubectl drain {change.node} exited {drained.returncode}: " + " | ".join(said[-3:])
            )
        self.wait_ready("steady", 2, 90)
        self.wait_ready("scaled", 1, 30)
        wait_until("pods back at 2", partial(self.pods_at, 2), 60)
        change.note = f"{evicted} pods evicted; the node uncordoned"

    def node_pods(self, node: str) -> list[Any]:
        """The pods of the churn's namespaces bound to `node` and not being deleted."""
        return [
            p
            for namespace in MODELS
            for p in self.core.list_namespaced_pod(
                namespace, field_selector=f"spec.nodeName={node}"
            ).items
            if p.metadata.deletion_timestamp is None
        ]

    def node_state(self, node: str) -> tuple[str, set[str]]:
        """The node's Ready status and its taints' keys."""
        read = self.core.read_node(node)
        ready = next((c.status for c in read.status.conditions or [] if c.type == "Ready"), "")
        return str(ready), {t.key for t in read.spec.taints or []}

    def do_node_lost(self, change: Change) -> None:
        """A GPU node lost whole; complete once its pods are evicted, every model is back at its
        replicas elsewhere, and the node, booted again, is Ready and untainted."""
        node, unreachable = change.node, "node.kubernetes.io/unreachable"
        bound = len(self.node_pods(node))
        change.moment = self.cluster.lose_node(node)
        for process in ("agent", "gateway", "triton"):
            name = f"{process}/{node}"
            self.kubelet.record(name, -9, "", "SIGKILL by the churn (node lost)")

        def judged(ready: str, tainted: bool) -> bool:
            status, taints = self.node_state(node)
            return status == ready and (unreachable in taints) == tainted

        wait_until(
            "the lost node Unknown and tainted", partial(judged, "Unknown", True), NODE_GRACE + 30
        )
        unknown = time.monotonic() - change.moment
        wait_until(
            "the lost node's pods evicted",
            lambda: not self.node_pods(node),
            UNREACHABLE_TOLERATION + 30,
        )
        evicted = time.monotonic() - change.moment
        self.wait_ready("steady", 2, 120)
        self.wait_ready("scaled", 1, 60)
        wait_until("pods back at 2", partial(self.pods_at, 2), 90)
        served = time.monotonic() - change.moment
        self.cluster.restore_node(node)
        wait_until("the node Ready and untainted", partial(judged, "True", False), 60)
        change.note = (
            f"{bound} pods on it; Unknown after {unknown:.0f} s, its pods evicted after "
            f"{evicted:.0f} s, every model back at its replicas after {served:.0f} s; booted again"
        )

    def do_crasher(self, change: Change) -> None:
        model = self.workdir / "crasher"
        if not model.exists():
            shutil.copytree(MODELS_DIR / "add_one", model)
            (model / "1" / "model.py").write_text(load_killer())
        uri = self.store.publish("crasher", model)
        pod = {
            "metadata": {
                "name": "crasher",
                "labels": {"tritonshare.io/role": "model"},
                "annotations": {
                    f"{KEYS.prefix}model-uri": uri,
                    KEYS.gpu_mem: "256Mi",
                    KEYS.model_id: "crasher",
                },
            },
            "spec": {
                "containers": [{"name": "proxy", "image": "tritonshare"}],
                "nodeSelector": {"kubernetes.io/hostname": change.node},
            },
        }
        self.core.create_namespaced_pod(CRASH, pod, _preload_content=False)
        time.sleep(30)
        self.core.delete_namespaced_pod("crasher", CRASH, _preload_content=False)

        def gone() -> bool:
            return not self.core.list_namespaced_pod(CRASH).items

        wait_until("the crasher gone", gone, 120)


def schedule(kinds: list[str], seed: int, rounds: int) -> list[Change]:
    """`rounds` rounds of every kind once, each in an order drawn from `seed`, each node-level
    change on a node drawn too."""
    rng = random.Random(seed)
    changes = []
    for _ in range(rounds):
        for kind in rng.sample(kinds, len(kinds)):
            if kind == "two":
                parts = [Change(k, rng.choice(NODES).name, LIMITS[k]) for k in pair(rng)]
                limit = max(p.limit for p in parts)
                changes.append(Change(kind, parts[0].node, limit, parts=parts))
                continue
            changes.append(Change(kind, rng.choice(NODES).name, LIMITS[kind]))
    return changes


def pair(rng: random.Random) -> tuple[str, str]:
    """The two kinds a `two` change applies at once: one of each row of `PAIRS`."""
    return rng.choice(PAIRS[0]), rng.choice(PAIRS[1])


@dataclass
class Row:
    changes: int = 0
    requests: int = 0
    failed: int = 0
    worst: float = 0.0
    slowest: Request | None = None


def tally(requests: list[Request], done: list[Change], failed: set[int]) -> dict[str, Row]:
    """Each request by the change it was sent during (by kind), or `between` changes; `failed`:
    the ids of the requests the rule counts as failed."""
    rows: dict[str, Row] = {}
    for change in done:
        rows.setdefault(change.kind, Row()).changes += 1
    rows["between"] = Row()
    for request in requests:
        row = rows[during(request, done)]
        row.requests += 1
        if request.end - request.start > row.worst:
            row.worst, row.slowest = request.end - request.start, request
        if id(request) in failed:
            row.failed += 1
    return rows


def during(request: Request, done: list[Change]) -> str:
    """The kind of change `request` was sent during, or `between`."""
    change = next((c for c in done if c.start <= request.start < c.end), None)
    return "between" if change is None else change.kind


CAUSES_SHOWN = 12
"""The most distinct failures listed."""


def causes(
    failed: list[Request], done: list[Change]
) -> list[tuple[tuple[str, str, str, str], tuple[int, float, float]]]:
    """Failed requests counted by the change they were sent during, model, protocol and answer
    (addresses and numbers in the answer made alike), most frequent first, with the slowest of
    each and when the first of them was sent (`time.monotonic`)."""
    counted: dict[tuple[str, str, str, str], tuple[int, float, float]] = {}
    for r in failed:
        detail = re.sub(r"[0-9]+(\.[0-9]+)*", "N", r.detail)[:160]
        key = (during(r, done), r.model, r.protocol, detail)
        count, slowest, first = counted.get(key, (0, 0.0, r.start))
        counted[key] = (count + 1, max(slowest, r.end - r.start), min(first, r.start))
    return sorted(counted.items(), key=lambda item: -item[1][0])


def in_flight_line(requests: list[Request], moment: float) -> tuple[str, int]:
    """The requests in flight at `moment`, per model, and the fewest of any model."""
    counts = in_flight_at(requests, moment)
    models = [m for ms in MODELS.values() for m in ms]
    fewest = min(counts[m] for m in models)
    return ", ".join(f"{m} {counts[m]}" for m in models), fewest


def report(
    load: Load,
    counted: list[Request],
    done: list[Change],
    exits: list[Exit],
    seed: int,
    minutes: float,
    origin: float,
    busy: float,
    no_goal: bool = False,
) -> int:
    """Print what the run saw and the rule's verdict on it, each part beside its goal; the exit
    code (`churnrule`, 0 anyway with `no_goal`).
    `counted`: the requests sent since `origin` (the churn's start), over `minutes`; `busy`: the
    machine's busy share of its CPUs meanwhile."""
    models = [m for ms in MODELS.values() for m in ms]
    verdict = judge(counted, done, exits, models, minutes)
    print("\nchanges (time to complete against its stated limit; requests in flight at its")
    print("moment, per model):")
    fewest = None
    for i, c in enumerate(done):
        flight, least = in_flight_line(load.requests, c.moment)
        fewest = least if fewest is None else min(fewest, least)
        took = "did not complete" if c.took is None else f"{c.took:.1f} s"
        mark = "" if c.completed else "  NOT COMPLETED"
        under = f"  (under {MIN_IN_FLIGHT})" if least < MIN_IN_FLIGHT else ""
        print(
            f"  {i + 1:3}. {c.moment - origin:7.1f} s  {c.kind} (node {c.node}): {took} of "
            f"{c.limit:.0f} s{mark}; in flight {flight}{under}" + (f"; {c.note}" if c.note else "")
        )
    rows = tally(counted, done, {id(r) for r in verdict.failed})
    print("\nper kind of change (requests sent during it, failed, worst latency):")
    print(f"  {'change':<10} {'n':>3} {'sent':>7} {'failed':>6}  worst")
    for kind, row in rows.items():
        print(f"  {kind:<10} {row.changes:>3} {row.requests:>7} {row.failed:>6}  {row.worst:.2f} s")
    wall = time.time() - time.monotonic()  # the logs' clock, to find a request in them
    for kind, row in rows.items():
        r = row.slowest
        if r is not None:
            at = datetime.datetime.fromtimestamp(wall + r.start).strftime("%H:%M:%S.%f")[:-3]
            print(
                f"slowest during {kind}: {r.model} {r.protocol} sent at {r.start - origin:.1f} s "
                f"({at}), {'answered' if r.ok else 'failed'} in {r.end - r.start:.2f} s"
            )
    if verdict.failed:
        print("failed requests, by change, model, protocol and answer:")
        for (kind, model, protocol, detail), (count, slowest, first) in causes(
            verdict.failed, done
        )[:CAUSES_SHOWN]:
            at = datetime.datetime.fromtimestamp(wall + first).strftime("%H:%M:%S.%f")[:-3]
            print(
                f"  {count:>4} x {kind}: {model} {protocol} (first sent at {first - origin:.1f} s, "
                f"{at}; slowest {slowest:.2f} s): {detail}"
            )
    if verdict.refused:
        print("refused by a documented bound (not counted as failed):")
        bounds = Counter(
            (r.model, r.protocol, bound, reason) for r, bound, reason in verdict.refused
        )
        for (model, protocol, bound, reason), count in bounds.items():
            print(f"  {count:>4} x {model} {protocol}: {bound}: {reason}")
    if verdict.crasher:
        print(f"the crasher's own failed requests (not counted): {verdict.crasher}")
    print(f"process exits ({len(exits)}):")
    for e in exits:
        lines = f"; last lines: {e.last_lines}" if e.last_lines else ""
        why = why_expected(e, done) or "UNEXPECTED"
        print(f"  {e.at - origin:7.1f} s  {e.name}: {e.code}, {e.cause} [{why}]{lines}")
    print_load(load, counted, verdict, minutes, busy)
    for reason in verdict.reasons():
        print(f"fails the rule: {reason}")
    unfinished, unexpected = len(verdict.unfinished), len(verdict.unexpected)
    verdicts = check_goals(verdict)
    print(
        f"churn: seed {seed}, {len(done)} changes in {minutes:.1f} min, {len(counted)} requests "
        f"(fewest a model a minute {min(verdict.rates.values(), default=0):.0f}; at least "
        f"{fewest if fewest is not None else 0} a model in flight at each change), "
        f"{len(verdict.failed)} failed, {len(verdict.refused)} refused by a bound; "
        f"{unfinished} changes unfinished; {len(exits)} process exits, {unexpected} unexpected; "
        f"{len(verdict.slow)} answers past {HOLD_BOUND:g} s -> "
        f"{'pass' if verdict.passed else 'FAIL'}"
    )
    return goals.exit_code(verdicts, no_goal)


def print_load(
    load: Load, counted: list[Request], verdict: Verdict, minutes: float, busy: float
) -> None:
    rates = ", ".join(f"{m} {rate:.0f}" for m, rate in verdict.rates.items())
    print(f"requests a model a minute (at least {MIN_PER_MINUTE}): {rates}")
    ways = Counter(r.protocol for r in counted)
    print(
        f"requests by way ({PER_WAY} closed-loop callers a model each; open loop "
        f"{POISSON_RATE:g}/s a namespace): "
        + ", ".join(f"{w} {ways[w]}" for w in (*WAYS, "poisson"))
    )
    latencies = sorted(r.end - r.start for r in counted if r.ok)
    if latencies:
        p50, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]
        print(
            f"answers: p50 {1000 * p50:.0f} ms, p99 {1000 * p99:.0f} ms, max {latencies[-1]:.2f} s"
        )
    print(
        f"the load's process: {load.cpu.line(len(load.requests))}; the machine's {os.cpu_count()} "
        f"CPUs {100 * busy:.0f} % busy meanwhile; streams that ended idle {load.idle_stream_ends}; "
        f"open-loop requests sent 100 ms late or more {load.late}"
    )


class FirstOnly(logging.Filter):
    """The first `LOG_LINES_PER_LOGGER` warnings of each logger of this process (the API server's
    outage makes every watch say so, once a second)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        seen = self.counts[record.name] = self.counts.get(record.name, 0) + 1
        return seen <= LOG_LINES_PER_LOGGER


@contextlib.contextmanager
def _workdir(keep: Path | None) -> Iterator[Path]:
    """`keep`, left in place afterwards; or a temporary directory."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="tritonshare-churn-") as tmp:
        yield Path(tmp)


def run(
    minutes: float,
    seed: int,
    kinds: list[str],
    keep: Path | None = None,
    slow_lazy: float = 0.0,
    ways: tuple[str, ...] = WAYS,
    no_goal: bool = False,
) -> int:
    handler = logging.StreamHandler()
    handler.addFilter(FirstOnly())
    logging.basicConfig(
        level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", handlers=[handler]
    )
    # Enough rounds for --minutes of the shortest changes (each lasts SETTLE at least): the run
    # stops drawing from the plan once the time is up, never before.
    plan = schedule(kinds, seed, rounds=int(minutes * 60 // (SETTLE * len(kinds))) + 1)
    command = shlex.join(["python", "-m", "benchmarks.churn", *sys.argv[1:]])
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, `{command}`")
    print(f"seed {seed}; schedule (taken in order while --minutes {minutes:g} last; every kind at")
    print("least once):")
    for i, change in enumerate(plan):
        print(f"  {i + 1:3}. {change.kind} (node {change.node})")
    sys.stdout.flush()
    with (
        _workdir(keep) as workdir,
        SimCluster(
            workdir / "cluster",
            NODES,
            binders=2,
            webhook=True,
            tenant_code_namespaces=(TEAM_A, TEAM_B, CRASH),
            keep_pod_logs=keep is not None,
            node_monitor_grace=NODE_GRACE,
            node_heartbeat_seconds=NODE_HEARTBEAT,
            default_unreachable_toleration=UNREACHABLE_TOLERATION,
        ) as cluster,
    ):
        if cluster.missing or cluster.kube is None:
            print(f"the simulated cluster is missing {cluster.missing}", file=sys.stderr)
            return 2
        proxy = ServiceProxy(cluster.kube)
        proxy.start()
        kubelet = Kubelet(cluster, time.monotonic())
        churn = Churn(cluster, workdir, kubelet, slow_lazy)
        busy = machine_busy()
        try:
            churn.create_workloads()
            kubelet.start()
            next(busy)
            unanswered = churn.start_load(seed, ways)
            if unanswered:
                print(f"not answered within {WARM_UP:g} s (the churn starts; they count):")
                for line in unanswered:
                    print(f"  {line[:300]}")
            else:
                print("every model answers by every way; the churn starts", flush=True)
            began = time.monotonic()
            done = apply_plan(churn, plan, minutes, kinds)
        finally:
            load = churn.stop_load()
            ended = time.monotonic()
            kubelet.stop()
            proxy.stop()
        # The warm-up's requests, before every model had answered by every way, are not counted.
        counted = [r for r in load.requests if r.start >= began]
        if keep is not None:
            print(f"the cluster's and the pods' logs are kept in {keep}")
        return report(
            load,
            counted,
            done,
            kubelet.exits,
            seed,
            (ended - began) / 60,
            began,
            next(busy),
            no_goal,
        )


def apply_plan(churn: Churn, plan: list[Change], minutes: float, kinds: list[str]) -> list[Change]:
    began = time.monotonic()
    done: list[Change] = []
    for change in plan:
        over = time.monotonic() - began > minutes * 60
        if over and {c.kind for c in done} >= set(kinds):
            break
        change.start = change.moment = time.monotonic()
        try:
            churn.apply(change)
            change.took = time.monotonic() - change.start
        except (ClusterError, kubernetes.client.ApiException) as e:
            change.note = f"did not complete: {str(e).splitlines()[0][:500]}"
        time.sleep(SETTLE)
        change.end = time.monotonic()
        for part in change.parts:
            part.end = change.end
        done.append(change)
        took = "did not complete" if change.took is None else f"{change.took:.0f} s"
        note = f"; {change.note}" if change.note else ""
        print(
            f"  {change.start - began:7.1f} s  {change.kind} (node {change.node}) {took} of "
            f"{change.limit:.0f} s{note}",
            flush=True,
        )
        if churn.load is not None and not churn.load.alive():
            print("the load's process has ended: the run stops", flush=True)
            break
    return done


def main() -> None:
    parser = command_line(
        "churn",
        "Counts the failed requests of models in two namespaces under steady load through "
        "their Services while a schedule drawn from --seed changes the fleet for --minutes "
        "(scale, scale to zero, neighbours, a host's secret, a rollout, a node pod replaced, "
        "the agent, gateway and leader binder killed, an API server outage, a crasher, a "
        "node pod's container hung, a model pod's container OOM-killed, a slow API server, "
        "the webhook and the model store down, a load spike, a node drained, a node lost, two "
        "at once), "
        "or only the kinds --changes names.",
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="minutes of churn (10)")
    parser.add_argument("--seed", type=int, default=1, help="the schedule's seed (1)")
    parser.add_argument(
        "--changes",
        default=",".join(KINDS),
        help=f"the kinds of change to apply, comma-separated (all: {','.join(KINDS)})",
    )
    parser.add_argument(
        "--slow-lazy",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="lazy's model takes this long per request, so that a crasher's first exit finds "
        "its request at Triton and puts its host on probation (0: add_one as it is)",
    )
    parser.add_argument(
        "--ways",
        default=",".join(WAYS),
        help=f"the ways the closed-loop callers connect, comma-separated (all: {','.join(WAYS)})",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="run the cluster in DIR (new or empty) and keep its and every pod's logs there",
    )
    goals.add_flag(parser)
    args = parser.parse_args()
    if args.keep is not None and args.keep.exists() and any(args.keep.iterdir()):
        parser.error(f"--keep: {args.keep} is not empty; name a new or empty directory")
    kinds = [k.strip() for k in args.changes.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        parser.error(f"--changes: unknown kinds {unknown}; choose from {','.join(KINDS)}")
    ways = tuple(w.strip() for w in args.ways.split(",") if w.strip())
    if not ways or set(ways) - set(WAYS):
        parser.error(f"--ways: choose among {','.join(WAYS)}")
    if args.slow_lazy < 0:
        parser.error("--slow-lazy: give 0 or more seconds")
    sys.exit(run(args.minutes, args.seed, kinds, args.keep, args.slow_lazy, ways, args.no_goal))


if __name__ == "__main__":
    main()
