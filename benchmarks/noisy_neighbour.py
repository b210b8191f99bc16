"""Benchmark: can one tenant starve another on a shared node?

Two tenants' models on one node of the simulated cluster (`sim.cluster.SimCluster`: API server,
binder, agent over a mock NVML, the node gateway, a real Triton on the CPU, the kubelet running
the pods as processes), plus a hollow second node where the victim's new replicas can go. The
victim (namespace `victim`) is called through its own proxy at a steady rate, REST and gRPC in
turn, by a process of its own (`benchmarks.noisy_traffic`); every request's latency is
counted from when it was due. Meanwhile the attacker (namespace `attacker`, full rights there)
runs each attack in turn, the network ones from its own pod's address in a process of its own:

  1 unproven-gpu-mem  pods with spec.nodeName, schedulerName default-scheduler and a big
                      gpu-mem limit on every node; victim outcome: is its new replica placed?
  2 squat-model-id    a 1-byte such pod per node annotated with the victim's model id; the same
  3 grpc-bomb         gzip gRPC ModelInfer at the gateway, small on the wire, --bomb-mib inflated
  4 rest-bomb         gzip REST infer (Content-Encoding: gzip) through the gateway, for Triton
  5 install-streams   header-only InstallModel streams from --hog-pods attacker pods, declaring
                      as much disk as the agent grants; victim outcome: can a new victim model
                      still be installed and loaded?
  6 gpu-growth        the attacker's loaded model grows by --growth on the victim's GPU while a
                      victim model loads (mock NVML); victim outcome: is it warned, evicted or
                      billed for the attacker's memory?
  7 agent-messages    --agent-calls concurrent --agent-mib MiB messages to the agent, no token
  flood               --flood-concurrency keep-alive connections of back-to-back infers for the
                      attacker's own model, straight at the gateway (bypassing its own proxy)
  stream-flood        one ModelStreamInfer stream of up to --stream-requests back-to-back requests
                      for the attacker's own model, straight at the gateway, answers left unread
  slow-senders        --slow-senders connections trickling a request a byte every 0.5 s
  connections         --connections idle connections to the gateway's REST and gRPC ports
  many-pods           --crowd-pods model pods of the attacker's namespace (made and Ready
                      before the phase), each flooding its own model straight at the gateway
                      with --crowd-concurrency connections (`benchmarks.namespace_share`'s
                      senders): a namespace's many pods against the victim's one
  load-hog            --hog-loads attacker pods whose loads take --load-seconds each, queued
                      at the GPU; victim outcome: is its new model installed, loaded and Ready?
  disk-filler         --disk-pods attacker pods of --disk-model-mib of weights each, past the
                      agent's --max-installed-bytes-per-namespace (--disk-per-namespace); the same
  crash               an attacker pod whose model's load kills Triton (`benchmarks
                      .crash_quarantine`'s); victim outcome: is the crasher quarantined?

The phases run alone first, then "control" (the victim's probes of 1, 2, 5, load-hog and
disk-filler with no attacker: a replica placed, a new model installed and loaded), the attacks
(those that can leave a process's memory grown late, the crash last), and "alone again". Triton's
keeper restarts it inside its container, the simulated cluster restarts the container when the
keeper gives up (as the kubelet does), and each phase counts both kinds of restart. Each phase
prints its restarts, peaks and outcomes as it ends; the table at the end has, per phase, the
victim's p50/p99 latency and error count, the p99 as a multiple of alone's (the better p99 of
"alone" and "alone again", so a stall of a shared box while alone flatters no attack), Triton's
restarts, the victim's outcome beside the same probe alone, what the attacker saw, and the peak
RSS of the gateway, the agent, Triton (its whole process tree: the server and its Python backend
stubs) and the victim's proxy against their container memory limits
(deploy/base/node/node-daemonset.yaml, and the proxy's in deploy/example/model-deployment.yaml).
Peaks are psutil samples every --sample-ms, and for the single processes also the kernel's
high-water mark (VmHWM, reset at each phase's start).
Then, per phase after alone and control, the target: the victim's p99 within 2x of alone, no victim
error, no Triton restart, every process under its limit (a process still over it from an earlier
phase is marked "already before"), and the victim's outcome as alone; for the crash, instead: at
most --quarantine-after restarts, the crasher quarantined, and the victim served again (its first
answer after which none of its requests failed) within --served-within seconds of Triton's last
restart. "met" or "NOT met" with the reasons, and an overall line; the exit status is 1 when a
phase missed it. The "others" column is the CPU (cores) that processes outside this benchmark
used meanwhile: on a shared box, read a p99 beside it.

Sizes: the issue's attacks inflate 1 GiB and send 8 x 60 MiB to the agent; the defaults here are
smaller (--bomb-mib 256, --agent-mib 32) so a shared 2-core box can afford them, and still show the
effect as growth of the process; `--full-size` runs the issue's sizes (on today's main: the gateway
to 2.1 GiB, Triton to 4.2 GiB, the agent to 1.5 GiB, one after the other). The attacker's client
shares the machine's cores with everything else, as a pod on the same node shares its CPUs; with
`--pin-attacker` it runs alone on the last CPU and everything else on the others, as a tenant whose
client runs in a pod of its own under its own CPU limit (on 2 cores the unpinned flood measures as
much the attacker's client taking a core from the node as the gateway serving it). With
`--kubelet-cpu` every process is weighted as a kubelet weights pods (`SimCluster(cpu_shares=True)`,
sim/node/cpushares.py): the node pod by deploy/base's CPU requests, the model pods by theirs, the
attacker's client as a container of its pod requesting `--attacker-cpu` and limited to
`--attacker-cpu-limit` (a namespace's LimitRange default), the victim's callers, which stand for
clients off the node, `--victim-client-cpu`. Every
address used is in 127.0.0.0/8, and every part stops by itself (each loop is bounded in count and
time) and is stopped at the end.

    .venv/bin/python -m benchmarks.noisy_neighbour [--attacks all] [--seconds 8] [--rate 50]
        [--full-size] [--gpu-mem-enforcement evict] [--admission-policies]
        [--crowd-pods 7] [--quarantine-after 2] [--disk-per-namespace 192Mi]
        [--pin-attacker | --kubelet-cpu [--attacker-cpu 1] [--attacker-cpu-limit 0]]
        [--workdir DIR]

About 5 minutes with the defaults on a 2-core box (15 to 20 s of it starting the cluster).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import yaml
from kubernetes.client.exceptions import ApiException

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agent.models.loadquarantine import CRASHED_REASON  # noqa: E402
from benchmarks import goals  # noqa: E402
from benchmarks.crash_quarantine import KILLER  # noqa: E402
from benchmarks.crash_quarantine import model_dir as crashing_model  # noqa: E402
from benchmarks.namespace_share import Sender  # noqa: E402
from benchmarks.noisy_traffic import (  # noqa: E402
    AttackPlan,
    Record,
    VictimPlan,
    raise_open_files,
)
from common.contract import DEFAULT_AGENT_AUDIENCE, Keys  # noqa: E402
from common.quantity import parse_quantity  # noqa: E402
from sim.cluster import NodeSpec, SimCluster  # noqa: E402
from sim.demo.scenario import SERVICE_ACCOUNT, ModelPod, PodPorts, model_pod_manifest  # noqa: E402
from sim.node.cpushares import millicpu  # noqa: E402
from sim.processes import http_ok  # noqa: E402
from sim.triton import free_port  # noqa: E402

KEYS = Keys()
MIB = 1024 * 1024
GIB = 1024 * MIB
NODE, SPARE = "node-a", "node-b"
VICTIM, ATTACKER = "victim", "attacker"
VICTIM_MODEL, ATTACKER_MODEL = "victim_model", "attacker_model"
DAEMONSET = ROOT / "deploy" / "base" / "node" / "node-daemonset.yaml"
MODEL_DEPLOYMENT = ROOT / "deploy" / "example" / "model-deployment.yaml"
NODE_PARTS = ("gateway", "agent", "triton")
PARTS = (*NODE_PARTS, "proxy")
"""The processes whose memory is watched: the node pod's, and the victim's proxy."""
PLACEMENT_ATTACKS = ("unproven-gpu-mem", "squat-model-id")
INSTALL_PROBED = ("install-streams", "load-hog", "disk-filler")
"""The phases whose victim probe is a new model of its own installed, loaded and Ready."""
PROBED = (*PLACEMENT_ATTACKS, *INSTALL_PROBED)
"""The phases whose victim probe also runs in the control phase, the victim alone."""
ATTACKS = (
    "unproven-gpu-mem", "squat-model-id", "grpc-bomb", "rest-bomb", "install-streams",
    "gpu-growth", "agent-messages", "flood", "stream-flood", "slow-senders", "connections",
    "many-pods", "load-hog", "disk-filler", "crash",
)  # fmt: skip
"""The issue's seven attacks in its order (their numbers in the table), then the others."""
NUMBERS = {name: str(i + 1) for i, name in enumerate(ATTACKS[:7])}
ORDER = (
    "unproven-gpu-mem", "squat-model-id", "install-streams", "load-hog", "disk-filler",
    "gpu-growth", "many-pods", "flood", "stream-flood", "slow-senders", "connections",
    "grpc-bomb", "rest-bomb", "agent-messages", "crash",
)  # fmt: skip
"""The order they run in: those that may leave a process's memory grown (glibc keeps what it
once held) late, so they do not colour the phases after them, and the crash last (Triton
restarts, every model is loaded again)."""
ADD_ONE_BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
).encode()
"""A REST infer request for add_one."""
IDLE = "import time; time.sleep(600)"
"""What an attacker's placeholder container runs: nothing, for at most 10 minutes."""


def deploy_limits(path: Path = DAEMONSET, model: Path = MODEL_DEPLOYMENT) -> dict[str, int]:
    """Memory limit in bytes of the triton, agent and gateway containers of the node pod, and
    of the proxy container of the example model Deployment."""
    limits: dict[str, int] = {}
    for source, kind, names in ((path, "DaemonSet", NODE_PARTS), (model, "Deployment", ("proxy",))):
        docs = [d for d in yaml.safe_load_all(source.read_text()) if d and d.get("kind") == kind]
        if not docs:
            raise ValueError(f"{source} has no {kind}")
        limits |= {
            c["name"]: parse_quantity(c["resources"]["limits"]["memory"], what=c["name"])
            for c in docs[0]["spec"]["template"]["spec"]["containers"]
            if c["name"] in names
        }
    return limits


# ---- models ----------------------------------------------------------------------------------

_SLOW_MODEL = '''"""add_one that takes {seconds} s to load, as a model reading its weights does."""

import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep({seconds})

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (data + 1).astype(data.dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
'''


def _parameter(name: str, value: str) -> str:
    return f'parameters {{ key: "{name}" value: {{ string_value: "{value}" }} }}\n'


def write_models(directory: Path, args: argparse.Namespace) -> dict[str, Path]:
    """The benchmark's model sources: add_one; `grower`, which occupies 512Mi of GPU memory
    and `--growth` more from `--growth-after` seconds after it is READY; `slow`, which occupies
    512Mi and takes `--load-seconds` to load; `crasher`, whose load kills Triton
    (`benchmarks.crash_quarantine`'s); `big`, add_one with `--disk-model-mib` of weights. Each
    config's name is its directory's, which the storage initializer renames to the pod's model
    id."""
    source = ROOT / "tests" / "models" / "add_one"
    made = {}
    for name in ("add_one", "grower", "slow"):
        target = directory / name
        shutil.copytree(source, target)
        config = (source / "config.pbtxt").read_text().replace('name: "add_one"', f'name: "{name}"')
        if name != "add_one":
            config += _parameter("sim_gpu_memory", "512Mi")
        if name == "grower":
            config += _parameter("sim_gpu_memory_growth", f"{args.growth}@{args.growth_after:g}")
        if name == "slow":
            (target / "1" / "model.py").write_text(_SLOW_MODEL.format(seconds=args.load_seconds))
        (target / "config.pbtxt").write_text(config)
        made[name] = target
    made["crasher"] = crashing_model(directory, "crasher", killer=KILLER)
    made["big"] = target = directory / "big"
    shutil.copytree(source, target)
    config = (source / "config.pbtxt").read_text().replace('name: "add_one"', 'name: "big"')
    (target / "config.pbtxt").write_text(config)
    with (target / "1" / "weights.bin").open("wb") as weights:
        for _ in range(args.disk_model_mib):
            weights.write(os.urandom(MIB))  # incompressible, as weights are
    return made


# ---- the cluster, as each tenant sees it -----------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What became of one of the victim's own operations (placing, installing, loading)."""

    ok: bool | None
    """None: the probe could not tell (the attack did not land as planned)."""
    text: str


@dataclass
class Bench:
    """The running cluster with the two tenants on it, and what each tenant can do there."""

    cluster: SimCluster
    args: argparse.Namespace
    models: dict[str, Path]
    victim_ip: str = ""
    attacker_ip: str = ""
    victim_ports: PodPorts = field(default_factory=lambda: PodPorts(0, 0, 0))
    controls: dict[str, Outcome] = field(default_factory=dict)
    """The victim's probes without an attacker ("placement", "install"), to read beside."""
    keeper: Keeper | None = None

    @property
    def core(self) -> Any:
        return self.cluster.core

    @property
    def attacker_cpus(self) -> set[int] | None:
        """The CPUs the attacker's processes run on (--pin-attacker), None: any."""
        cpus: set[int] | None = getattr(self.args, "attacker_cpus", None)
        return cpus

    def weigh(self, role: str) -> Callable[[int], None] | None:
        """With --kubelet-cpu, what puts a process of `role` ("attacker": a container of its
        pod, requesting --attacker-cpu; "victim": its callers, off the node in a real cluster,
        given --victim-client-cpu) in a CPU group of its own; None: nothing to do."""
        cpu = self.cluster.cpu
        if cpu is None:
            return None
        attacker = role == "attacker"
        wanted = self.args.attacker_cpu if attacker else self.args.victim_client_cpu
        group, request = f"{role}-client", millicpu(wanted)
        limit = millicpu(self.args.attacker_cpu_limit) if attacker else 0
        return lambda pid: cpu.place(group, request, [pid], limit=limit)

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            response = self.core.read_namespaced_pod(name, namespace, _preload_content=False)
        except ApiException:
            return None
        pod: dict[str, Any] = json.loads(response.data)
        return pod

    def model_pod(
        self, namespace: str, name: str, model_id: str, source: str, gpu_mem: str, node: str = ""
    ) -> PodPorts:
        """Create a model pod as the platform writes it (storage initializer, loader, proxy),
        serving `source` (a name in `models`) as `model_id`; pinned to `node` if given."""
        assert self.cluster.gateway is not None
        ports = PodPorts(free_port(), free_port(), free_port())
        manifest = model_pod_manifest(
            ModelPod(name, model_id, "add_one", gpu_mem, ""),
            ports,
            agent_port=int(self.cluster.agents[NODE].grpc.rpartition(":")[2]),
            gateway_http_port=self.cluster.gateway.http,
            gateway_grpc_port=self.cluster.gateway.grpc,
        )
        manifest["metadata"]["namespace"] = namespace
        manifest["spec"]["initContainers"][0]["args"][0] = str(self.models[source])
        if node:
            manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        self.core.create_namespaced_pod(namespace, manifest, _preload_content=False)
        return ports

    def placeholder_pod(
        self, name: str, node: str, gpu_mem: str, model_id: str = "", scheduler: str = ""
    ) -> None:
        """An attacker pod that loads nothing: given `node` (spec.nodeName) unless `scheduler`
        names the scheduler that is to place it."""
        spec: dict[str, Any] = {
            "schedulerName": scheduler or "default-scheduler",
            "serviceAccountName": SERVICE_ACCOUNT,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "idle",
                    "image": "tritonshare:demo",
                    "command": ["python", "-c", IDLE],
                    "resources": {"limits": {KEYS.gpu_mem: gpu_mem}},
                }
            ],
        }
        if scheduler:
            spec["nodeSelector"] = {"kubernetes.io/hostname": node}
        else:
            spec["nodeName"] = node
        # The attack as the simulated cluster can run it (no admission policies): the kubelet
        # admits a pod on a GPU node only with the GPU-node taint's toleration.
        spec["tolerations"] = [KEYS.gpu_node_toleration()]
        manifest = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": ATTACKER,
                "annotations": {KEYS.model_id: model_id} if model_id else {},
            },
            "spec": spec,
        }
        self.core.create_namespaced_pod(ATTACKER, manifest, _preload_content=False)

    def refused(self, create: Callable[[], None]) -> str:
        """Run a create as the attacker; why the API server refused it ('' if it did not)."""
        try:
            create()
        except ApiException as e:
            with contextlib.suppress(ValueError, TypeError):
                return str(json.loads(e.body or "{}").get("message", ""))[:200] or str(e.reason)
            return str(e.reason)
        return ""

    def delete(self, namespace: str, *names: str) -> None:
        """Delete pods at once (grace 0) and wait, up to 60 s, until they are gone."""
        for name in names:
            with contextlib.suppress(ApiException):
                self.core.delete_namespaced_pod(
                    name, namespace, grace_period_seconds=0, _preload_content=False
                )
        poll(lambda: all(self.pod(namespace, n) is None for n in names), 60)

    def token(self, name: str) -> str:
        """A token bound to the attacker's pod `name`, for the agent: what the pod's own
        projected token is, asked for by its owner (TokenRequest)."""
        pod = self.pod(ATTACKER, name) or {}
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [DEFAULT_AGENT_AUDIENCE],
                "expirationSeconds": 3600,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": name,
                    "uid": pod.get("metadata", {}).get("uid", ""),
                },
            },
        }
        answer = self.core.create_namespaced_service_account_token(
            SERVICE_ACCOUNT, ATTACKER, body, _preload_content=False
        )
        return str(json.loads(answer.data)["status"]["token"])

    def events(self, namespace: str, name: str) -> list[str]:
        response = self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}", _preload_content=False
        )
        return [
            f"{e.get('reason', '')}: {e.get('message', '')}"
            for e in json.loads(response.data).get("items", [])
        ]

    def measured(self, model_id: str) -> int | None:
        """The GPU memory the node publishes for `model_id` (gpu-usage annotation), if any."""
        node = json.loads(self.core.read_node(NODE, _preload_content=False).data)
        usage = json.loads(node["metadata"].get("annotations", {}).get(KEYS.gpu_usage, "{}"))
        found = [_bytes(v) for k, v in _walk(usage) if k == model_id]
        figures = [f for f in found if f is not None]
        return max(figures) if figures else None

    def triton_states(self) -> dict[str, str]:
        """Triton's repository index as the agent sees it (the operator's admin header); empty
        when Triton does not answer in time."""
        assert self.cluster.triton is not None
        try:
            return self.cluster.triton_states()
        except OSError:
            return {}  # Triton stalls while a slow model loads: ask again at the next poll


def _bytes(value: Any) -> int | None:
    """A published memory figure: bytes, or an object holding them (with, say, an
    uncertainty beside)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, dict):
        for key in ("bytes", "measured", "used", "memory"):
            if isinstance(value.get(key), int):
                return int(value[key])
    return None


def _walk(value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield str(key), inner
            yield from _walk(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _walk(inner)


def poll(check: Callable[[], Any], timeout: float, period: float = 0.1) -> Any:
    """`check()` until it is truthy or `timeout` seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(period)


def condition(pod: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for c in (pod or {}).get("status", {}).get("conditions", []) or []:
        if c.get("type") == kind:
            return dict(c)
    return {}


def init_failure(pod: dict[str, Any] | None) -> str:
    """The first failed init container's message ('' while none failed)."""
    for status in (pod or {}).get("status", {}).get("initContainerStatuses", []) or []:
        if status.get("restartCount", 0) > 0 or status.get("state", {}).get("terminated", {}).get(
            "exitCode", 0
        ):
            terminated = status.get("lastState", {}).get("terminated") or status.get(
                "state", {}
            ).get("terminated", {})
            text = str(terminated.get("message") or terminated.get("reason") or "failed")
            return f"{status['name']}: {text.strip().splitlines()[-1][:200]}"
    return ""


# ---- probes of the victim's own operations ---------------------------------------------------


def place_replica(bench: Bench, name: str = "victim-replica") -> Outcome:
    """Create a replica of the victim's model; is it placed (on the spare node, since the
    victim's node has the model) within --outcome-timeout?"""
    bench.model_pod(VICTIM, name, VICTIM_MODEL, "add_one", "1Gi")
    started = time.monotonic()
    try:

        def decided() -> str:
            return str((bench.pod(VICTIM, name) or {}).get("spec", {}).get("nodeName") or "")

        node = poll(decided, bench.args.outcome_timeout)
        took = time.monotonic() - started
        if node:
            return Outcome(True, f"new replica placed on {node} in {took:.1f} s")
        why = condition(bench.pod(VICTIM, name), "PodScheduled").get("message", "no reason given")
        return Outcome(False, f"new replica NOT placed in {took:.0f} s: {why}")
    finally:
        bench.delete(VICTIM, name)


def install_victim(bench: Bench, model: str, name: str = "victim-new") -> Outcome:
    """Create a new victim model pod on the shared node (a model id never used before in the
    run, so its files are really sent); is it installed, loaded and Ready?"""
    bench.model_pod(VICTIM, name, model, "add_one", "1Gi", node=NODE)
    started = time.monotonic()
    try:

        def done() -> str:
            pod = bench.pod(VICTIM, name)
            if condition(pod, "Ready").get("status") == "True":
                return "ready"
            return init_failure(pod)

        state = poll(done, bench.args.outcome_timeout + 15)
        took = time.monotonic() - started
        if state == "ready":
            return Outcome(True, f"new victim model installed, loaded and Ready in {took:.1f} s")
        assert bench.cluster.kubelet is not None
        said = bench.cluster.kubelet.container_log(VICTIM, name, "loader").strip().splitlines()
        why = state or (said[-1][:200] if said else "its loader said nothing")
        return Outcome(False, f"new victim model NOT Ready after {took:.0f} s: {why}")
    finally:
        bench.delete(VICTIM, name)


# ---- memory of the node pod's processes ------------------------------------------------------


SINGLE = ("gateway", "agent", "proxy")
"""The parts that are one process (Triton is a tree: the server and its backend stubs)."""


def listener(address: str, port: int) -> int:
    """The process listening on `address:port` (a model pod's proxy, found by its socket)."""
    for connection in psutil.net_connections("tcp"):
        if (
            connection.status == psutil.CONN_LISTEN
            and connection.laddr
            and (connection.laddr.ip, connection.laddr.port) == (address, port)
            and connection.pid
        ):
            return int(connection.pid)
    raise RuntimeError(f"no process listens on {address}:{port}")


class Sampler:
    """RSS of the gateway, the agent, Triton's process tree and the victim's proxy, sampled in
    a thread."""

    def __init__(self, pids: dict[str, int], period: float) -> None:
        self.pids = pids
        self.period = period
        self.samples: list[tuple[float, dict[str, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        processes: dict[str, psutil.Process] = {}
        while not self._stop.wait(self.period):
            sample = {}
            for part, pid in self.pids.items():
                try:
                    process = processes.get(part)
                    if process is None or process.pid != pid:  # a restarted Triton: follow it
                        process = processes[part] = psutil.Process(pid)
                    tree = (
                        [process, *process.children(recursive=True)]
                        if part == "triton"
                        else [process]
                    )
                    sample[part] = sum(p.memory_info().rss for p in tree)
                except psutil.Error:
                    sample[part] = 0  # gone: its phase says so
            self.samples.append((time.monotonic(), sample))

    def peaks(self, start: float, end: float) -> dict[str, int]:
        window = [s for t, s in self.samples if start <= t <= end]
        return {part: max((s.get(part, 0) for s in window), default=0) for part in self.pids}

    def latest(self) -> dict[str, int]:
        return dict(self.samples[-1][1]) if self.samples else {}

    def reset_high_water(self) -> None:
        """Reset the kernel's peak RSS of the single-process parts (proc(5) clear_refs 5)."""
        for part in SINGLE:
            with contextlib.suppress(OSError):
                Path(f"/proc/{self.pids[part]}/clear_refs").write_text("5")

    def high_water(self) -> dict[str, int]:
        found = {}
        for part in SINGLE:
            with contextlib.suppress(OSError, ValueError):
                for line in Path(f"/proc/{self.pids[part]}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        found[part] = int(line.split()[1]) * 1024
        return found

    def alive(self) -> dict[str, bool]:
        return {part: psutil.pid_exists(pid) for part, pid in self.pids.items()}


class Keeper:
    """Follows the node's Triton's restarts, its keeper's inside its container and the cluster's
    of the container (as the kubelet's), and remembers when (monotonic seconds; a container's
    once it runs again); the sampler follows the new process."""

    def __init__(self, cluster: SimCluster, sampler: Sampler, period: float = 0.05) -> None:
        self.cluster = cluster
        self.sampler = sampler
        self.period = period
        self.restarts: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="triton-keeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        kept = 0
        pid = 0
        starting = False
        while not self._stop.wait(self.period):
            triton = self.cluster.triton
            if triton is None or triton.process is None:
                continue
            # Triton's own keeper restarts it in its container (the node pod's); its container
            # exits only when the keeper gives up, and the cluster starts it again.
            if pid and triton.process.pid != pid:
                kept, starting = 0, True
                self.sampler.pids["triton"] = triton.process.pid
            pid = triton.process.pid
            if starting and http_ok(f"http://{triton.http_url}/v2/health/live"):
                starting = False
                self.restarts.append(time.monotonic())
            now_kept = triton.kept_exits()
            self.restarts += [time.monotonic()] * max(0, now_kept - kept)
            kept = now_kept


# ---- phases ----------------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    start: float
    end: float
    peaks: dict[str, int]
    first: dict[str, int]
    """RSS when the phase began (a process still grown from an earlier phase shows here)."""
    alive: dict[str, bool]
    outcome: Outcome | None = None
    attacker: str = ""
    others: float = 0.0
    """CPU cores that processes outside this benchmark used meanwhile (other work on a shared
    box: read a bad p99 beside it)."""
    restarts: list[float] = field(default_factory=list)
    """When Triton ran again after each of its exits in the phase (monotonic seconds)."""


def cpu_seconds() -> tuple[float, float]:
    """(busy CPU seconds of the whole machine, CPU seconds of this benchmark's process tree,
    including its children that have ended)."""
    machine = psutil.cpu_times()
    # Linux counts guest time in user already; idle and iowait are not busy.
    busy = sum(machine) - machine.idle
    busy -= sum(getattr(machine, f, 0.0) for f in ("iowait", "guest", "guest_nice"))
    me = psutil.Process()
    times = me.cpu_times()
    ours = times.user + times.system + times.children_user + times.children_system
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child_times = child.cpu_times()
            ours += child_times.user + child_times.system
    return busy, ours


class Tenant:
    """One tenant's side as a process of its own (`python -m benchmarks.noisy_traffic`): started
    on a plan, told to stop (SIGTERM), its result read back; never left running."""

    def __init__(
        self,
        role: str,
        plan: VictimPlan | AttackPlan,
        workdir: Path,
        cpus: set[int] | None = None,
        place: Callable[[int], None] | None = None,
    ) -> None:
        self.result_file = Path(tempfile.mkstemp(prefix=f"{role}-", dir=workdir)[1])
        self.result_file.unlink()
        self.log = (workdir / f"{role}.log").open("ab")
        argv = [sys.executable, "-m", "benchmarks.noisy_traffic", role]
        argv += [json.dumps(asdict(plan)), str(self.result_file)]
        self.process = subprocess.Popen(
            argv, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        if cpus:
            os.sched_setaffinity(self.process.pid, cpus)
        if place is not None:
            place(self.process.pid)

    def result(self, timeout: float) -> Any:
        """Wait up to `timeout` seconds for it to end by itself; its result (None if none)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout)
        return json.loads(self.result_file.read_text()) if self.result_file.exists() else None

    def finish(self, timeout: float) -> Any:
        """Tell it to stop and wait up to `timeout` seconds; its result. Gone after this,
        killed (with anything it started) if need be."""
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.result(timeout)
        finally:
            if self.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
            self.log.close()


def run_phase(
    bench: Bench, sampler: Sampler, name: str, body: Callable[[], Any], seconds: float = 0.0
) -> Phase:
    """Run `body` for at least `seconds` (default --seconds), watching the memory of the node
    pod's processes; `body` returns an Outcome, the attacker's summary, or both as a tuple."""
    print(f"-- {name}", flush=True)
    sampler.reset_high_water()
    start = time.monotonic()
    first = sampler.latest()
    busy, ours = cpu_seconds()
    result = body()
    left = (seconds or bench.args.seconds) - (time.monotonic() - start)
    if left > 0:
        time.sleep(left)
    end = time.monotonic()
    busy_after, ours_after = cpu_seconds()
    others = max((busy_after - busy) - (ours_after - ours), 0.0) / (end - start)
    restarts = [t for t in bench.keeper.restarts if start <= t < end] if bench.keeper else []
    peaks = sampler.peaks(start, end)
    for part, high in sampler.high_water().items():
        peaks[part] = max(peaks.get(part, 0), high)
    outcome, attacker = None, ""
    for item in result if isinstance(result, tuple) else (result,):
        if isinstance(item, Outcome):
            outcome = item
        elif isinstance(item, str):
            attacker = item
    print(
        f"   {end - start:.0f} s; Triton restarts {len(restarts)}; peak MiB "
        + ", ".join(f"{part} {peaks.get(part, 0) / MIB:.0f}" for part in PARTS)
        + (f"; victim: {outcome.text}" if outcome else "")
        + (f"; attacker: {attacker}" if attacker else ""),
        flush=True,
    )
    return Phase(
        name, start, end, peaks, first, sampler.alive(), outcome, attacker, others, restarts
    )


def attack(bench: Bench, kind: str, **fields: Any) -> str:
    """Run one network attack in the attacker's process; its summary."""
    assert bench.cluster.gateway is not None
    plan = AttackPlan(
        kind,
        bench.attacker_ip,
        bench.args.seconds,
        gateway_http=f"127.0.0.1:{bench.cluster.gateway.http}",
        gateway_grpc=f"127.0.0.1:{bench.cluster.gateway.grpc}",
        agent=bench.cluster.agents[NODE].grpc,
        model=ATTACKER_MODEL,
        **fields,
    )
    process = Tenant(
        "attack", plan, bench.cluster.workdir, bench.attacker_cpus, bench.weigh("attacker")
    )
    summary = process.result(plan.seconds + 90)
    process.finish(10)
    return str(summary or "the attacker's process gave no result")


def squat(bench: Bench, gpu_mem: str, model_id: str) -> tuple[Outcome, str]:
    """Attacks 1 and 2: one unproven pod per node, then the victim's new replica."""
    names = [f"squat-{node}" for node in (NODE, SPARE)]
    refusals = [
        bench.refused(partial(bench.placeholder_pod, name, node, gpu_mem, model_id))
        for name, node in zip(names, (NODE, SPARE), strict=True)
    ]
    refused = [r for r in refusals if r]
    attacker = f"created {len(names) - len(refused)} of {len(names)} pods with spec.nodeName" + (
        f"; the API server refused: {refused[0]}" if refused else ""
    )
    try:
        return place_replica(bench), attacker
    finally:
        bench.delete(ATTACKER, *names)


def install_streams(bench: Bench) -> tuple[Outcome, str]:
    """Attack 5: --hog-pods proven attacker pods hold header-only install streams while the
    victim installs a new model."""
    args = bench.args
    names = [f"hog-{i}" for i in range(args.hog_pods)]
    for i, name in enumerate(names):
        why = bench.refused(
            partial(bench.placeholder_pod, name, NODE, "64Mi", f"hog_{i}", scheduler="tritonshare")
        )
        if why:
            return Outcome(None, "not measured"), f"the API server refused the pods: {why}"
    try:
        bound = poll(
            lambda: all(
                (bench.pod(ATTACKER, n) or {}).get("spec", {}).get("nodeName") for n in names
            ),
            30,
        )
        if not bound:
            return Outcome(None, "the attacker's pods were not placed"), ""
        installs = tuple((f"hog_{i}", bench.token(n)) for i, n in enumerate(names))
        ready = bench.cluster.workdir / "install-streams.ready"
        plan = AttackPlan(
            "install-streams",
            bench.attacker_ip,
            args.outcome_timeout + 60,
            agent=bench.cluster.agents[NODE].grpc,
            installs=installs,
            install_declare=parse_quantity(args.install_declare, what="--install-declare"),
            ready_file=str(ready),
        )
        attacker = Tenant("attack", plan, bench.cluster.workdir, bench.attacker_cpus)
        try:
            poll(lambda: ready.exists() or attacker.process.poll() is not None, 60)
            outcome = install_victim(bench, "victim_new_1")
        finally:
            summary = attacker.finish(30)
        return outcome, str(summary or "the attacker's process gave no result")
    finally:
        bench.delete(ATTACKER, *names)


def gpu_growth(bench: Bench) -> Outcome:
    """Attack 6: the attacker's model, loaded first, grows on the shared GPU while a slow victim
    model loads. Is the victim warned, evicted or billed for it?"""
    args = bench.args
    bench.model_pod(ATTACKER, "grower", "grower", "grower", "1Gi", node=NODE)
    try:

        def state(model: str) -> str:
            states = bench.triton_states()
            return next((s for n, s in states.items() if model in n), "")

        if not poll(lambda: state("grower") == "READY", 120):
            return Outcome(None, "the attacker's growing model did not load")
        grows_at = time.monotonic() + args.growth_after
        bench.model_pod(VICTIM, "victim-slow", "victim_slow", "slow", "1Gi", node=NODE)
        loading = poll(lambda: state("victim_slow") in ("LOADING", "READY"), 120, 0.05)
        window_start = time.monotonic()
        poll(lambda: state("victim_slow") not in ("LOADING", ""), args.load_seconds + 60, 0.05)
        window_end = time.monotonic()
        landed = loading and window_start <= grows_at <= window_end
        # The agent publishes measured memory on its GPU poll (10 s by default), at most every
        # 2 s in the simulated cluster; an evicted model's figure goes away, so the largest
        # seen is kept, and an eviction ends the wait.
        seen: dict[str, int] = {}

        def published() -> bool:
            for model in ("victim_slow", "grower"):
                figure = bench.measured(model)
                if figure is not None:
                    seen[model] = max(seen.get(model, 0), figure)
            gone = (bench.pod(VICTIM, "victim-slow") or {}).get("status", {}).get("phase")
            return len(seen) == 2 or gone in (None, "Failed")

        poll(published, 20, 0.5)
        pod = bench.pod(VICTIM, "victim-slow") or {}
        blamed = [e for e in bench.events(VICTIM, "victim-slow") if e.startswith("GPUMemory")]
        phase = pod.get("status", {}).get("phase", "gone")
        victim, grower = seen.get("victim_slow"), seen.get("grower")
        figures = (
            f"measured victim {_mib(victim)} (really 512 MiB, asked 1 GiB), attacker "
            f"{_mib(grower)} (really 512 MiB + {args.growth})"
        )
        where = (
            f"the attacker grew {window_start - grows_at:+.1f} s before the victim's load "
            f"({window_end - window_start:.1f} s) began"
            if grows_at < window_start
            else f"the attacker grew {grows_at - window_start:.1f} s into the victim's "
            f"{window_end - window_start:.1f} s load"
        )
        if not landed:
            return Outcome(None, f"not measured: {where}; {figures}")
        billed = victim is not None and victim > 1 * GIB
        evicted = phase == "Failed" or any("evicted" in e for e in blamed)
        culprit = [e for e in bench.events(ATTACKER, "grower") if e.startswith("GPUMemory")]
        text = (
            f"victim {_blame(blamed, phase)} (pod {phase}), attacker "
            f"{_blame(culprit, '')}; {where}; {figures}"
        )
        if blamed:
            text += f"; {blamed[0][:160]}"
        return Outcome(not (blamed or billed or evicted), text)
    finally:
        bench.delete(VICTIM, "victim-slow")
        bench.delete(ATTACKER, "grower")


def _blame(events: list[str], phase: str) -> str:
    if phase == "Failed" or any("evicted" in e for e in events):
        return "evicted"
    return "warned" if events else "not blamed"


def _mib(value: int | None) -> str:
    return "nothing" if value is None else f"{value / MIB:.0f} MiB"


def wait_ready(bench: Bench, namespace: str, names: list[str], timeout: float) -> dict[str, str]:
    """Wait up to `timeout` seconds until each pod is Ready or its loader failed; per pod,
    "ready" or why not."""
    states: dict[str, str] = {}

    def settled() -> bool:
        for name in names:
            pod = bench.pod(namespace, name)
            if condition(pod, "Ready").get("status") == "True":
                states[name] = "ready"
            else:
                states[name] = init_failure(pod) or "not Ready"
        return all(state != "not Ready" for state in states.values())

    poll(settled, timeout, 0.25)
    return states


@contextlib.contextmanager
def crowd_pods(bench: Bench) -> Iterator[list[tuple[str, str]]]:
    """--crowd-pods small model pods of the attacker's namespace on the shared node, Ready
    (made before the phase: their loads are not the attack); (address, model id) of each."""
    names = [f"crowd-{i}" for i in range(bench.args.crowd_pods)]
    try:
        for i, name in enumerate(names):
            bench.model_pod(ATTACKER, name, f"crowd_{i}", "add_one", "256Mi", node=NODE)
        states = wait_ready(bench, ATTACKER, names, 180)
        pods = [(bench.pod(ATTACKER, n) or {}, f"crowd_{i}") for i, n in enumerate(names)]
        yield [
            (str(pod["status"]["podIP"]), model)
            for (pod, model), name in zip(pods, names, strict=True)
            if states.get(name) == "ready"
        ]
    finally:
        bench.delete(ATTACKER, *names)


def many_pods(bench: Bench, crowd: list[tuple[str, str]]) -> str:
    """The crowd floods, each pod its own model straight at the gateway with
    --crowd-concurrency connections of back-to-back requests (`benchmarks.namespace_share`'s
    senders), for --seconds; the attacker's summary."""
    if not crowd:
        return "none of the crowd's pods was Ready: not measured"
    assert bench.cluster.gateway is not None
    url = f"127.0.0.1:{bench.cluster.gateway.http}"
    senders = [
        Sender(url, address, bench.args.crowd_concurrency, ADD_ONE_BODY, model=model)
        for address, model in crowd
    ]
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        for sender in senders:
            stack.enter_context(sender)
        time.sleep(bench.args.seconds)
    took = time.monotonic() - started
    answers = sum(len(sender.latencies) for sender in senders)
    errors = sum(sender.errors for sender in senders)
    return (
        f"{len(crowd)} pods x {bench.args.crowd_concurrency} connections: {answers} answers "
        f"({answers / took:.0f}/s), {errors} errors"
    )


def load_hog(bench: Bench) -> tuple[Outcome, str]:
    """--hog-loads attacker pods whose models each take --load-seconds to load fill the GPU's
    load queue; meanwhile the victim installs and loads a new model of its own."""
    names = [f"slow-{i}" for i in range(bench.args.hog_loads)]
    try:
        for i, name in enumerate(names):
            bench.model_pod(ATTACKER, name, f"slow_{i}", "slow", "512Mi", node=NODE)
        time.sleep(1)  # the attacker's loads are queued first
        outcome = install_victim(bench, "victim_new_2")
        states = wait_ready(bench, ATTACKER, names, 0)
        ready = sum(state == "ready" for state in states.values())
        return outcome, (
            f"{len(names)} pods whose loads take {bench.args.load_seconds:g} s each; {ready} "
            "of them Ready when the victim's probe ended"
        )
    finally:
        bench.delete(ATTACKER, *names)


def disk_filler(bench: Bench) -> tuple[Outcome, str]:
    """--disk-pods attacker pods, each installing --disk-model-mib of weights on the shared
    node (past the agent's --max-installed-bytes-per-namespace), then the victim installs and
    loads a new model of its own."""
    args = bench.args
    names = [f"big-{i}" for i in range(args.disk_pods)]
    try:
        for i, name in enumerate(names):
            bench.model_pod(ATTACKER, name, f"big_{i}", "big", "256Mi", node=NODE)
        states = wait_ready(bench, ATTACKER, names, args.outcome_timeout + 45)
        outcome = install_victim(bench, "victim_new_3")
        ready = sum(state == "ready" for state in states.values())
        refused = [state for state in states.values() if state != "ready"]
        return outcome, (
            f"{ready} of {len(names)} pods of {args.disk_model_mib} MiB installed (the "
            f"namespace's bound: {args.disk_per_namespace})"
            + (f"; the others: {refused[0][:160]}" if refused else "")
        )
    finally:
        bench.delete(ATTACKER, *names)


def crash(bench: Bench) -> tuple[Outcome, str]:
    """An attacker pod whose model's load kills Triton (`benchmarks.crash_quarantine`'s). Is
    it quarantined after --quarantine-after crashes, and does the victim's model come back?
    (How soon the victim is served again is read from its requests, in `summarize`.)"""
    args = bench.args
    first = len(bench.keeper.restarts) if bench.keeper else 0
    bench.model_pod(ATTACKER, "crasher", "crasher", "crasher", "256Mi", node=NODE)
    try:

        def quarantined() -> bool:
            return any(e.startswith(CRASHED_REASON) for e in bench.events(ATTACKER, "crasher"))

        started = time.monotonic()
        caught = poll(quarantined, args.crash_seconds, 0.25)
        took = time.monotonic() - started

        def victim_ready() -> bool:
            return any(
                VICTIM_MODEL in name and state == "READY"
                for name, state in bench.triton_states().items()
            )

        poll(victim_ready, 30, 0.1)
        time.sleep(3)  # the victim's requests after its model came back tell it stays served
        crashes = len(bench.keeper.restarts) - first if bench.keeper else 0
        text = (
            f"the crasher quarantined after {crashes} Triton restarts ({took:.1f} s)"
            if caught
            else f"the crasher NOT quarantined in {took:.0f} s ({crashes} Triton restarts)"
        )
        return Outcome(bool(caught), text), f"a model whose load kills Triton, {crashes} times"
    finally:
        bench.delete(ATTACKER, "crasher")


# ---- the run ---------------------------------------------------------------------------------


def setup(bench: Bench) -> None:
    """The two tenants' namespaces and model pods on the shared node, Ready."""
    for namespace in (VICTIM, ATTACKER):
        bench.core.create_namespace({"metadata": {"name": namespace}}, _preload_content=False)
    bench.victim_ports = bench.model_pod(VICTIM, "victim", VICTIM_MODEL, "add_one", "2Gi", NODE)
    bench.model_pod(ATTACKER, "attacker", ATTACKER_MODEL, "add_one", "1Gi", NODE)

    def ready() -> bool:
        pods = [bench.pod(VICTIM, "victim"), bench.pod(ATTACKER, "attacker")]
        for pod in pods:
            failed = init_failure(pod)
            if failed:
                raise RuntimeError(f"a tenant's model pod failed: {failed}")
        return all(condition(p, "Ready").get("status") == "True" for p in pods)

    if not poll(ready, 180):
        raise RuntimeError(f"the tenants' model pods were not Ready; logs: {bench.cluster.workdir}")
    bench.victim_ip = str(bench.pod(VICTIM, "victim")["status"]["podIP"])  # type: ignore[index]
    bench.attacker_ip = str(bench.pod(ATTACKER, "attacker")["status"]["podIP"])  # type: ignore[index]


def phases(bench: Bench, sampler: Sampler) -> list[Phase]:
    args = bench.args
    done = [run_phase(bench, sampler, "alone", lambda: None, args.alone_seconds)]
    if set(PROBED) & set(args.attacks):

        def control() -> Outcome:
            if set(PLACEMENT_ATTACKS) & set(args.attacks):
                bench.controls["placement"] = place_replica(bench)
            if set(INSTALL_PROBED) & set(args.attacks):
                bench.controls["install"] = install_victim(bench, "victim_new_0")
            probes = list(bench.controls.values())
            return Outcome(all(p.ok for p in probes), "; ".join(p.text for p in probes))

        done.append(run_phase(bench, sampler, "control", control))
    bodies: dict[str, Callable[[], Any]] = {
        "unproven-gpu-mem": lambda: squat(bench, args.squat_gpu_mem, ""),
        "squat-model-id": lambda: squat(bench, "1", VICTIM_MODEL),
        "grpc-bomb": lambda: attack(
            bench, "grpc-bomb", inflated_mib=args.bomb_mib, concurrency=args.bombs,
            max_count=args.bomb_count,
        ),
        "rest-bomb": lambda: attack(
            bench, "rest-bomb", inflated_mib=args.bomb_mib, concurrency=args.bombs,
            max_count=args.bomb_count,
        ),
        "install-streams": lambda: install_streams(bench),
        "gpu-growth": lambda: gpu_growth(bench),
        "agent-messages": lambda: attack(
            bench, "agent-messages", message_mib=args.agent_mib, concurrency=args.agent_calls,
            max_count=4 * args.agent_calls,
        ),
        "flood": lambda: attack(
            bench, "flood", concurrency=args.flood_concurrency, max_count=1_000_000
        ),
        "stream-flood": lambda: attack(bench, "stream-flood", max_count=args.stream_requests),
        "slow-senders": lambda: attack(bench, "slow-senders", connections=args.slow_senders),
        "connections": lambda: attack(bench, "connections", connections=args.connections),
        "load-hog": lambda: load_hog(bench),
        "disk-filler": lambda: disk_filler(bench),
        "crash": lambda: crash(bench),
    }  # fmt: skip
    for name in ORDER:
        if name == "many-pods" and name in args.attacks:
            with crowd_pods(bench) as crowd:
                done.append(run_phase(bench, sampler, name, partial(many_pods, bench, crowd)))
        elif name in args.attacks:
            done.append(run_phase(bench, sampler, name, bodies[name]))
    time.sleep(3)  # what the last attack left (pods stopping, models unloading) settles first
    done.append(run_phase(bench, sampler, "alone again", lambda: None, args.alone_seconds))
    return done


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


@dataclass
class Run:
    """What one run measured."""

    phases: list[Phase]
    records: list[Record]
    limits: dict[str, int]
    controls: dict[str, Outcome]
    seconds: float
    quarantine_after: int = 2
    """Triton's exits the crash phase may cost before its crasher is quarantined."""
    served_within: float = 15.0
    """Seconds after Triton's last restart within which the victim must be served again."""


@dataclass(frozen=True)
class Row:
    """One phase's figures beside the victim alone, and why its target is not met."""

    phase: Phase
    requests: int
    p50: float
    p99: float
    ratio: float
    """p99 over the p99 alone."""
    errors: list[str]
    error_times: list[float]
    """When each error's request was due, in seconds from the phase's start."""
    missed: list[str]
    """Empty: the target is met (for the phases that have one: every attack)."""
    judged_against: str = "alone"
    """What the target compares it with: "alone", or "control" for a phase whose victim probe
    (its own replica placed, its own model installed and loaded) also ran in the control phase,
    where the victim did the same alone and that was slower than alone."""
    judged_ratio: float = float("nan")
    """p99 over the p99 of `judged_against`."""
    served_again: float | None = None
    """Seconds from Triton's last restart in the phase until the victim's first answer after
    which none of its requests in the phase failed; None: no restart, or never."""

    @property
    def judged(self) -> bool:
        return self.phase.name not in ("alone", "control")


def served_again(records: list[Record], restart: float, end: float) -> float | None:
    """Seconds from `restart` until the end of the victim's first successful request due after
    it from which on none due before `end` failed (None: the last one failed)."""
    after = sorted(r for r in records if restart <= r[0] < end)
    last_error = max((i for i, r in enumerate(after) if r[2]), default=-1)
    good = after[last_error + 1 :]
    return good[0][0] + good[0][1] - restart if good else None


def summarize(run: Run) -> list[Row]:
    """Each phase's victim latency and errors, and its verdict against the target. "Alone" is
    the better p99 of the victim alone before the attacks and after them: a stall of the shared
    box during one of them must not make every attack look mild. A phase where the victim also
    acts (its new replica placed, its new model installed and loaded, the probes of the control
    phase) is judged against the control phase, the victim doing the same with no attacker,
    where that was slower than alone: loading its own model costs the victim latency on a 2-core
    box whoever else is there, and that is not the attack's."""

    def window(phase: Phase) -> list[Record]:
        return [r for r in run.records if phase.start <= r[0] < phase.end]

    alone = [
        percentile([r[1] for r in window(p) if not r[2]], 0.99)
        for p in run.phases
        if p.name in ("alone", "alone again")
    ]
    base_p99 = min((p for p in alone if p == p), default=float("nan"))  # NaN: no answer
    control = [
        percentile([r[1] for r in window(p) if not r[2]], 0.99)
        for p in run.phases
        if p.name == "control"
    ]
    control_p99 = control[0] if control and control[0] > base_p99 else float("nan")
    rows = []
    for phase in run.phases:
        rows_of_phase = window(phase)
        ok = [r[1] for r in rows_of_phase if not r[2]]
        errors = [r[2] for r in rows_of_phase if r[2]]
        error_times = [r[0] - phase.start for r in rows_of_phase if r[2]]
        p99 = percentile(ok, 0.99)
        ratio = p99 / base_p99 if base_p99 > 0 else float("nan")
        against, judged = "alone", ratio
        if phase.name in PROBED and control_p99 == control_p99:
            against, judged = "control", p99 / control_p99
        missed = []
        back = None
        if phase.name == "crash":
            # Triton's exits cost every model its answers: the target is how few and how short.
            if phase.restarts:
                back = served_again(run.records, phase.restarts[-1], phase.end)
            if len(phase.restarts) > run.quarantine_after:
                missed.append(f"{len(phase.restarts)} Triton restarts")
            if back is None or back > run.served_within:
                missed.append(
                    "victim not served again"
                    if back is None
                    else f"victim served again {back:.1f} s after Triton's restart"
                )
        else:
            if not judged <= 2.0:
                missed.append(f"p99 {judged:.1f}x {against}")
            if errors:
                missed.append(f"{len(errors)} victim errors")
            if phase.restarts:
                missed.append(f"{len(phase.restarts)} Triton restarts")
        for part in PARTS:
            if phase.peaks.get(part, 0) >= run.limits[part]:
                before = phase.first.get(part, 0) >= run.limits[part]
                missed.append(f"{part} over its limit" + (" (already before)" if before else ""))
        missed += [f"{part} exited" for part, alive in phase.alive.items() if not alive]
        if phase.outcome is not None and phase.outcome.ok is not True:
            missed.append("victim outcome" if phase.outcome.ok is False else "not measured")
        row = Row(
            phase,
            len(rows_of_phase),
            percentile(ok, 0.5),
            p99,
            ratio,
            errors,
            error_times,
            missed,
            against,
            judged,
            back,
        )
        rows.append(replace(row, missed=[]) if not row.judged else row)
    return rows


def report(run: Run, rows: list[Row]) -> None:
    """The table, with a line of details under a phase where there is more to say."""
    probe = {name: "placement" for name in PLACEMENT_ATTACKS}
    probe |= {name: "install" for name in INSTALL_PROBED}
    print()
    print(
        f"{'phase':<20}{'s':>5}{'others':>7}{'requests':>9}{'p50 ms':>9}{'p99 ms':>9}{'p99 x':>7}"
        f"{'errors':>7}{'restarts':>9}"
        + "".join(f"{part + ' MiB':>13}" for part in PARTS)
        + "  target"
    )
    print(f"{'deploy limit':<82}" + "".join(f"{run.limits[p] / MIB:>13.0f}" for p in PARTS))
    for row in rows:
        phase = row.phase
        verdict = (
            "-" if not row.judged else "NOT met: " + ", ".join(row.missed) if row.missed else "met"
        )
        if row.judged and row.judged_against != "alone":
            verdict += f" (judged against {row.judged_against}: {row.judged_ratio:.2f}x)"
        print(
            f"{NUMBERS.get(phase.name, ' ') + ' ' + phase.name:<20}"
            f"{phase.end - phase.start:>5.0f}{phase.others:>7.2f}{row.requests:>9}"
            f"{1e3 * row.p50:>9.1f}{1e3 * row.p99:>9.1f}{row.ratio:>7.2f}{len(row.errors):>7}"
            f"{len(phase.restarts):>9}"
            + "".join(f"{phase.peaks.get(p, 0) / MIB:>13.0f}" for p in PARTS)
            + f"  {verdict}"
        )
        if phase.outcome is not None:
            line = f"{'':22}victim: {phase.outcome.text}"
            if probe.get(phase.name) in run.controls:
                line += f" (alone: {run.controls[probe[phase.name]].text})"
            print(line)
        if phase.attacker:
            print(f"{'':22}attacker: {phase.attacker}")
        if phase.restarts:
            back = "never" if row.served_again is None else f"{row.served_again:.1f} s"
            print(
                f"{'':22}Triton restarted {len(phase.restarts)} times; the victim served again "
                f"{back} after the last restart (target {run.served_within:g} s)"
            )
        if row.errors:
            when = ", ".join(f"{t:.1f}" for t in row.error_times[:6])
            print(
                f"{'':22}victim errors (due at +{when} s), most often: "
                f"{statistics.mode(row.errors)}"
            )


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.noisy_neighbour",
        description="Measures whether one tenant can starve another on a shared node of sim/: "
        "per attack (--attacks), the victim's p50/p99 and errors at --rate requests per second "
        "beside it alone, its placement and install outcome, and the gateway's, agent's and "
        "Triton's peak memory against their deploy limits; --full-size for the full sizes.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--attacks", default="all", help=f"comma-separated, of: {', '.join(ATTACKS)}")
    add("--seconds", type=float, default=8.0, help="shortest length of each phase")
    add("--alone-seconds", type=float, default=12.0, help="length of the phases alone")
    add("--rate", type=float, default=50.0, help="victim requests per second")
    add("--outcome-timeout", type=float, default=15.0, help="seconds a victim probe waits")
    add("--bomb-mib", type=int, default=256, help="inflated size of each inflate bomb")
    add("--bombs", type=int, default=2, help="inflate bombs sent at once")
    add("--bomb-count", type=int, default=6, help="most inflate bombs per attack")
    add("--agent-mib", type=int, default=32, help="size of each message to the agent")
    add("--agent-calls", type=int, default=8, help="concurrent messages to the agent")
    add("--squat-gpu-mem", default="80Gi", help="gpu-mem limit of attack 1's pods")
    add("--hog-pods", type=int, default=3, help="attacker pods holding install streams")
    add("--install-declare", default="64Gi", help="first size an install stream declares")
    add("--growth", default="4Gi", help="what the attacker's model grows by (attack 6)")
    add("--growth-after", type=float, default=8.0, help="seconds after its load it grows")
    add("--load-seconds", type=float, default=10.0, help="how long the victim's model loads")
    add("--gpu-mem-enforcement", choices=("warn", "evict"), default="evict",
        help="the agent's --gpu-mem-enforcement")  # fmt: skip
    add("--flood-concurrency", type=int, default=64, help="connections of the request flood")
    add("--slow-senders", type=int, default=128, help="connections trickling bytes")
    add("--connections", type=int, default=1000, help="connections of the connection flood")
    add(
        "--stream-requests",
        type=int,
        default=200_000,
        help="most requests the stream flood sends on its one stream",
    )
    add("--crowd-pods", type=int, default=7, help="the attacker's pods of many-pods")
    add("--crowd-concurrency", type=int, default=4, help="connections of each crowd pod")
    add("--hog-loads", type=int, default=3, help="attacker pods of --load-seconds loads (load-hog)")
    add("--disk-pods", type=int, default=5, help="attacker pods of --disk-model-mib (disk-filler)")
    add("--disk-model-mib", type=int, default=64, help="weights of each disk-filler model")
    add("--disk-per-namespace", default="192Mi",
        help="the agent's --max-installed-bytes-per-namespace")  # fmt: skip
    add("--quarantine-after", type=int, default=2, help="the agent's --crash-quarantine-after")
    add("--crash-seconds", type=float, default=60.0,
        help="the longest the crash phase waits for the crasher's quarantine")  # fmt: skip
    add(
        "--served-within", type=float, default=15.0,
        help="target: seconds from Triton's last restart until the victim is served again"
    )  # fmt: skip
    add("--sample-ms", type=float, default=20.0, help="RSS sampling period")
    add("--full-size", action="store_true",
        help="the issue's sizes: --bomb-mib 1024 --agent-mib 60 (3 GiB more, briefly)")  # fmt: skip
    add("--admission-policies", action="store_true",
        help="run deploy/base's admission policies in the API server (off: a cluster whose "
        "admin skipped them, which must hold too)")  # fmt: skip
    add("--pin-attacker", action="store_true",
        help="the attacker's client alone on the last CPU, everything else on the others (its "
        "pod's own CPU, as on a real cluster)")  # fmt: skip
    add("--kubelet-cpu", action="store_true",
        help="weight each pod's processes by its CPU requests in cgroups, as a kubelet does "
        "(needs a writable cgroup CPU controller): the node pod by deploy/base's requests, the "
        "model pods by theirs, the attacker's client as a container of its pod")  # fmt: skip
    add("--attacker-cpu", default="1",
        help="with --kubelet-cpu: the CPU request of the attacker's client container")  # fmt: skip
    add("--attacker-cpu-limit", default="0",
        help="with --kubelet-cpu: the CPU limit of the attacker's client container (a "
        "namespace's LimitRange default; 0: none)")  # fmt: skip
    add("--victim-client-cpu", default="1",
        help="with --kubelet-cpu: the CPU weight of the victim's callers (off the node in a "
        "real cluster)")  # fmt: skip
    add("--workdir", type=Path, help="keep the logs of every process here (default: a temp dir)")
    goals.add_flag(parser)
    args = parser.parse_args(argv)
    chosen = ATTACKS if args.attacks == "all" else tuple(a for a in args.attacks.split(",") if a)
    unknown = set(chosen) - set(ATTACKS)
    if unknown:
        parser.error(f"unknown attacks {sorted(unknown)}; choose from {', '.join(ATTACKS)}")
    args.attacks = chosen
    if args.kubelet_cpu and args.pin_attacker:
        parser.error("choose one of --kubelet-cpu and --pin-attacker")
    for flag in ("attacker_cpu", "attacker_cpu_limit", "victim_client_cpu"):
        try:
            millicpu(getattr(args, flag))
        except ValueError as e:
            parser.error(f"--{flag.replace('_', '-')}: {e}")
    if args.full_size:
        args.bomb_mib, args.agent_mib = 1024, 60
    return args


def run_benchmark(args: argparse.Namespace) -> Run:
    """Start the cluster, the tenants and the victim's load; run every phase; stop everything."""
    raise_open_files()
    limits = deploy_limits()
    keep = args.workdir is not None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tritonshare-noisy-"))
    workdir.mkdir(parents=True, exist_ok=True)
    models = write_models(workdir / "sources", args)
    if args.pin_attacker:
        cpus = os.sched_getaffinity(0)
        if len(cpus) < 2:
            raise SystemExit("--pin-attacker needs at least 2 CPUs")
        # Every process started from here on (the cluster, the victim) inherits the rest.
        os.sched_setaffinity(0, cpus - {max(cpus)})
        args.attacker_cpus = {max(cpus)}
    nodes = [NodeSpec(NODE, "1xT4", real=True), NodeSpec(SPARE, "1xT4")]
    cluster = SimCluster(
        workdir,
        nodes,
        binders=1,
        tenant_code_namespaces=(VICTIM, ATTACKER),
        admission_policies=args.admission_policies,
        cpu_shares=args.kubelet_cpu,
    )
    cluster.env["TRITONSHARE_GPU_MEM_ENFORCEMENT"] = args.gpu_mem_enforcement
    cluster.env["TRITONSHARE_CRASH_QUARANTINE_AFTER"] = str(args.quarantine_after)
    cluster.env["TRITONSHARE_MAX_INSTALLED_BYTES_PER_NAMESPACE"] = args.disk_per_namespace
    started = time.monotonic()
    try:
        with cluster:
            bench = Bench(cluster, args, models)
            setup(bench)
            assert cluster.gateway is not None and cluster.triton is not None
            assert cluster.triton.process is not None
            agent = cluster.agents[NODE].process.process
            gateway = cluster.gateway.process.process
            assert agent is not None and gateway is not None
            print(
                f"cluster up in {time.monotonic() - started:.0f} s; victim {VICTIM}/"
                f"{VICTIM_MODEL} at {bench.victim_ip} (its proxy), {args.rate:g} req/s, REST "
                f"and gRPC in turn; attacker {ATTACKER}/{ATTACKER_MODEL} at {bench.attacker_ip}",
                flush=True,
            )
            pids = {"gateway": gateway.pid, "agent": agent.pid}
            pids["triton"] = cluster.triton.process.pid
            pids["proxy"] = listener(bench.victim_ip, bench.victim_ports.http)
            sampler = Sampler(pids, args.sample_ms / 1e3)
            sampler.start()
            bench.keeper = Keeper(cluster, sampler)
            bench.keeper.start()
            plan = VictimPlan(
                f"{bench.victim_ip}:{bench.victim_ports.http}",
                f"{bench.victim_ip}:{bench.victim_ports.grpc}",
                VICTIM_MODEL,
                args.rate,
                max_seconds=1800,
            )
            victim = Tenant("victim", plan, workdir, place=bench.weigh("victim"))
            try:
                time.sleep(2)  # the victim's first requests open its connections
                done = phases(bench, sampler)
            finally:
                records = [tuple(r) for r in victim.finish(60) or []]
                bench.keeper.stop()
                sampler.stop()
            return Run(
                done,
                records,
                limits,
                bench.controls,
                time.monotonic() - started,
                args.quarantine_after,
                args.served_within,
            )
    except BaseException:
        if not keep:
            print(f"The run failed; every process's log is kept in {workdir / 'logs'}.")
        keep = True
        raise
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


def _kubelet_cpu(args: argparse.Namespace) -> str:
    """How --kubelet-cpu weighted the processes, for the summary line ('' without it)."""
    if not args.kubelet_cpu:
        return ""
    limit = millicpu(args.attacker_cpu_limit)
    return (
        "; CPU weighted by requests as a kubelet does (the node pod's from deploy/base, the "
        f"attacker's client {args.attacker_cpu}"
        + (f" limited to {args.attacker_cpu_limit}" if limit else "")
        + f", the victim's callers {args.victim_client_cpu})"
    )


def main(argv: list[str] | None = None) -> int:
    """Run, print the table and the verdict; exit 1 when the target is not met somewhere."""
    args = parse(argv)
    run = run_benchmark(args)
    rows = summarize(run)
    report(run, rows)
    missed = [row.phase.name for row in rows if row.missed]
    print()
    met = goals.require(
        "the victim's p99 within 2x of alone, no victim error, every process under its deploy "
        "limit, the victim's outcome as alone, in every phase"
        + ("" if not missed else " (NOT met in " + ", ".join(missed) + ")"),
        not missed,
    )
    print(
        f"sizes: inflate bombs {args.bomb_mib} MiB x {args.bombs} at once, agent messages "
        f"{args.agent_calls} x {args.agent_mib} MiB"
        + ("" if args.full_size else " (the issue's: --full-size)")
        + f"; {run.seconds:.0f} s in all"
        + (
            f"; the attacker's client pinned to CPU {min(args.attacker_cpus)}, the rest elsewhere"
            if getattr(args, "attacker_cpus", None)
            else ""
        )
        + _kubelet_cpu(args)
    )
    return goals.exit_code([met], args.no_goal)


if __name__ == "__main__":
    sys.exit(main())
