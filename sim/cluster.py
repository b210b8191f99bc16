"""A whole simulated tritonshare cluster on one machine, for the demo and the end-to-end test.

Owns starting and stopping, in a fixed order: the simulated API server (in this process),
deploy/base's node DaemonSets (stored only: their pods are the Triton, agent and gateway processes
below), the Node objects (as kubelets, GPU feature discovery and the device plugin would write
them: `sim.gpustack`), a real Triton on the CPU and a gateway for each node whose pods run for
real, one agent per node (`python -m sim.gpu.agent_node`, mock NVML), the binder replicas
(`python -m binder`), the controller manager (`sim.controllers`: Deployments and ReplicaSets, in
this process), a kubelet per real node and a hollow kubelet for the other nodes, and the kubelets'
part in the node pods it runs itself (`sim.node.nodepods`: their containers started again when they
exit or fail their liveness probe);
with `webhook=True` also tritonshare's mutating webhook (`python -m webhook`, registered as the
chart registers it: `sim.admission_webhook`) and a model store serving model archives over HTTPS
(`sim.modelstore`), so pods written in the short form run end to end. Every process
logs to a file under the work directory. A part that is not in the tree yet is reported in
`missing` and left out; nothing pretends to be it. It must not create model pods: that is the
caller's scenario.

With `admission_policies=True` the API server also runs the project's
ValidatingAdmissionPolicies (deploy/base) and the binders call it with their service account's
token; off by default (see `SimCluster.admission_policies`).

A real node whose `gpus` is `REAL_GPUS` runs on this machine's own GPUs: its agent is `python -m
agent` reading the real NVML (no mock, no `--cpu-only`: models are pinned to the GPUs), and its
Triton runs them there with the Python backend's stub environment checked (numpy<2); with
`gpu_mem_reserve` and `process_allowance` the binders place as on a real cluster
(`sim.demo.gpucheck`).

Each real node has an address of its own in 127.0.0.0/8 (127.0.0.1, 127.0.0.2, ... in the order
given), where its agent and gateway listen on the same ports as every other real node's, as on a
real cluster; their pods share one pool of pod IPs (`sim.node.addresses`).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import yaml

from common.contract import (
    DEFAULT_SYSTEM_NAMESPACE,
    GPU_NODE_TAINT_EFFECT,
    GPU_NODE_TAINT_VALUE,
    TENANT_CODE_NODE,
    Keys,
    agent_lease_name,
)
from common.podresources import CPU, MEMORY
from sim import admission_webhook
from sim.apiserver import ApiServerSettings, RunningApiServer, start_in_thread
from sim.controllers.manager import ControllerManager
from sim.controllers.nodelifecycle import GRACE_SECONDS as NODE_MONITOR_GRACE
from sim.gpu.spec import parse_spec
from sim.gpustack import (
    NVIDIA_GPU,
    GpuStackError,
    NodeGpus,
    feature_labels,
    mock_gpus,
    node_size,
    nvml_gpus,
    render_node_daemonsets,
    selects,
)
from sim.modelstore import ModelStore
from sim.node.addresses import PodAddresses
from sim.node.cpushares import (
    CpuGroups,
    CpuGroupsUnavailableError,
    container_millicpu,
    pod_millicpu,
)
from sim.node.heartbeat import RENEW_SECONDS
from sim.node.kubelet import HollowKubelet, Kubelet
from sim.node.mirrorpods import Mirror, MirrorPods
from sim.node.nodepods import ContainerExit, NodePodKubelet, Running
from sim.processes import (
    ClusterError,
    ManagedProcess,
    available,
    http_ok,
    process_stats,
    wait_started,
    wait_until,
)
from sim.tls import TlsUnavailableError, self_signed
from sim.triton import (
    PARALLEL_LOADS,
    TritonServer,
    TritonUnavailableError,
    free_port,
    stub_environment_problem,
)

DAEMONSETS_PART = "node DaemonSets"
"""How `SimCluster.missing` names the API server's node DaemonSets when they could not be stored."""
# The admin header sim.triton's restricted Triton expects; the agent sends it, tenants cannot.
TRITON_ADMIN_HEADER = "tritonshare-admin-key:local"
KEYS = Keys()
# The cluster's own calls (registering nodes, creating the scenario's pods) in the audit log.
USER_AGENT = "tritonshare-sim-cluster"
BINDER_LEASE_SECONDS = 6
AGENT_GPUS_SECONDS = 60.0
AGENT_STOP_GRACE = 40.0
"""How long a replaced node pod's agent may take to stop: its hosts' drain (--stop-drain-seconds
and --stop-unroute-seconds, 13 s by default) and its cleanups."""
"""How long a node's agent may take to publish its GPUs before the cluster gives up."""
ADMISSION_POLICY_FILES = tuple(
    Path(__file__).resolve().parents[1] / "deploy" / "base" / name
    for name in (
        "agent-admission-policy.yaml",
        "model-pod-admission-policy.yaml",
        "gpu-node-admission-policy.yaml",
    )
)
DEPLOY_BASE = Path(__file__).resolve().parents[1] / "deploy" / "base"
NODE_DAEMONSET = DEPLOY_BASE / "node" / "node-daemonset.yaml"
BINDER_DEPLOYMENT = DEPLOY_BASE / "binder-deployment.yaml"
PRIORITY_CLASS = DEPLOY_BASE / "priority-class.yaml"
WEBHOOK_DEPLOYMENT = DEPLOY_BASE.parent / "webhook" / "webhook-deployment.yaml"
SYSTEM_NAMESPACE_MANIFEST = DEPLOY_BASE / "namespace.yaml"
EXAMPLE_NAMESPACE_MANIFEST = DEPLOY_BASE.parent / "example" / "namespace.yaml"
"""The namespaces as shipped, with their Pod Security labels (`apply_namespace`)."""
CHART_CRDS = Path(__file__).resolve().parents[1] / "charts" / "tritonshare" / "crds"
"""The CRDs the cluster serves from the start: the chart's own (TritonModel)."""
BINDER_SERVICE_ACCOUNT = "tritonshare-binder"
# deploy/base/node/node-daemonset.yaml's host ports (with SimCluster's node_ports).
NODE_AGENT_PORT = 8100
NODE_GATEWAY_HTTP_PORT = 8010
NODE_GATEWAY_GRPC_PORT = 8011
NODE_GATEWAY_METRICS_PORT = 8012
SERVICE_ACCOUNT_TOKEN_SECONDS = 7 * 24 * 3600
GPU_NODE_TAINT = {
    "key": KEYS.gpu_node,
    "value": GPU_NODE_TAINT_VALUE,
    "effect": GPU_NODE_TAINT_EFFECT,
}


REAL_GPUS = "real"
"""`NodeSpec.gpus` of a node on this machine's own GPUs, read through the real NVML."""
NODE_POD_GROUP = "node-pod"
"""The first real node's node pod's CPU group (with `cpu_shares`); another real node's is
`node-pod-<node>`."""
FIRST_NODE_ADDRESS = ipaddress.IPv4Address("127.0.0.1")
"""The first real node's address; the next real nodes' follow (127.0.0.2, ...). Hollow nodes
have it too (nothing listens for them)."""


@functools.cache
def node_pod_template() -> dict[str, Any]:
    """The pod template of deploy/base's node DaemonSet: Triton, the agent and the gateway."""
    daemonset = yaml.safe_load(NODE_DAEMONSET.read_text())
    return cast(dict[str, Any], daemonset["spec"]["template"])


@functools.cache
def _deployment_template(manifest: Path) -> dict[str, Any]:
    """The pod template of the Deployment in `manifest` (deploy/'s binder, webhook)."""
    for document in yaml.safe_load_all(manifest.read_text()):
        if document and document.get("kind") == "Deployment":
            return cast(dict[str, Any], document["spec"]["template"])
    raise ValueError(f"{manifest} holds no Deployment")


def _container_names(manifest: Path) -> list[str]:
    return [c["name"] for c in _deployment_template(manifest)["spec"]["containers"]]


def node_container_millicpu(pod: dict[str, Any], name: str) -> int:
    """The CPU request, in millicpus, of the pod's container `name` (0: none)."""
    for container in pod["spec"]["containers"]:
        if container["name"] == name:
            return container_millicpu(container)
    raise ValueError(f"the node pod has no container {name!r}")


def install_admission_policies(api: kubernetes.client.ApiClient) -> list[str]:
    """Create deploy/base's ValidatingAdmissionPolicies and their bindings through the API, as an
    admin applying the base would; their names. (Read from the files, not rendered by kustomize:
    the base changes nothing in them that the API server looks at.)"""
    admission = cast(Any, kubernetes.client.AdmissionregistrationV1Api(api))
    names = []
    for path in ADMISSION_POLICY_FILES:
        for obj in yaml.safe_load_all(path.read_text()):
            if obj["kind"] == "ValidatingAdmissionPolicy":
                admission.create_validating_admission_policy(obj, _preload_content=False)
            else:
                admission.create_validating_admission_policy_binding(obj, _preload_content=False)
            names.append(f"{obj['kind']}/{obj['metadata']['name']}")
    return names


def apply_namespace(api: kubernetes.client.ApiClient, manifest: Path) -> str:
    """Create the Namespace of `manifest`, or give an existing one its labels (its Pod Security
    levels), as `kubectl apply` would; its name."""
    namespace = yaml.safe_load(manifest.read_text())
    name = str(namespace["metadata"]["name"])
    core = cast(Any, kubernetes.client.CoreV1Api(api))
    try:
        core.create_namespace(namespace, _preload_content=False)
    except kubernetes.client.ApiException as e:
        if e.status != 409:
            raise
        patch = {"metadata": {"labels": namespace["metadata"].get("labels") or {}}}
        core.patch_namespace(name, patch, _preload_content=False)
    return name


# The proxy's --source-address as an environment variable: set by the kubelet to each pod's IP,
# as the stand-in for its own network namespace (sim.node.podnetwork).
SOURCE_ADDRESS_VARIABLE = "TRITONSHARE_SOURCE_ADDRESS"


def write_placement_keys(directory: Path) -> Path:
    """A placement-key directory as the mounted Secret looks (file `current`: 32 random bytes,
    base64), readable only by its owner, as the cluster admin creates it at install."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = directory / "current"
    key.write_text(base64.b64encode(secrets.token_bytes(32)).decode())
    key.chmod(0o600)
    return directory


def _port_free(address: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((address, port))
        except OSError:
            return False
    return True


class PortTakenError(ClusterError):
    """A part could not bind the port chosen for it: another process took it meanwhile."""


@dataclass(frozen=True)
class NodeSpec:
    """One simulated GPU node."""

    name: str
    gpus: str
    """Mock NVML spec, such as 2xT4 or 1xA100-80GB; `REAL_GPUS` for this machine's own."""
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, str], ...] = ()
    real: bool = False
    """Served by a real Triton and the local kubelet (its pods run as processes)."""


def _gpu_count(node: NodeSpec) -> int:
    """The node's GPUs as its spec says (1 for this machine's own: not read before it starts)."""
    if node.gpus == REAL_GPUS:
        return 1
    return len(parse_spec(node.gpus, seed=node.name).gpus)


@dataclass(frozen=True)
class NodePorts:
    """The ports every real node's agent and gateway listen on, each on its node's address."""

    agent: int
    gateway_http: int
    gateway_grpc: int
    gateway_metrics: int


@dataclass
class AgentHandle:
    node: str
    process: ManagedProcess
    grpc: str = ""
    http: str = ""


@dataclass
class GatewayHandle:
    """The node gateway of a node whose pods run for real: the model pods' one way to Triton."""

    process: ManagedProcess
    http: int
    grpc: int
    metrics: int
    caller_table: Path
    address: str = str(FIRST_NODE_ADDRESS)

    def serving_pid(self) -> int | None:
        """The gateway process its keeper (the container's main process, `--keep-listening`)
        runs now; None while it runs none."""
        keeper = self.process.process
        if keeper is None or keeper.poll() is not None:
            return None
        return next(
            (p.pid for p in process_stats() if p.parent == keeper.pid and p.state != "Z"), None
        )


@dataclass
class BinderHandle:
    identity: str
    process: ManagedProcess
    http: str


class SimCluster:
    """Start with start(), stop with stop() (also on failure); or use as a context manager."""

    def __init__(
        self,
        workdir: Path,
        nodes: Sequence[NodeSpec],
        *,
        binders: int = 2,
        tenant_code_namespaces: Sequence[str] = ("models",),
        admission_policies: bool = False,
        webhook: bool = False,
        cpu_shares: bool = False,
        node_ports: bool = False,
        masquerade: bool = False,
        gpu_mem_reserve: int = 0,
        process_allowance: int = 0,
        process_context: int = 0,
        process_driver_share: int = 0,
        parallel_loads: int = PARALLEL_LOADS,
        gpu_poll_seconds: float | None = None,
        keep_pod_logs: bool = False,
        crds: Sequence[Path] = (),
        mirror_pods: bool = False,
        node_monitor_grace: float = NODE_MONITOR_GRACE,
        node_heartbeat_seconds: float = RENEW_SECONDS,
        default_unreachable_toleration: int = 300,
        say: Callable[[str], None] = lambda _: None,
    ) -> None:
        """`mirror_pods`: list the node pods, binders and webhook it runs as pods of the system
        namespace (`sim.node.mirrorpods`; `make sim-up` does). Every node's kubelet renews its
        node's Lease every `node_heartbeat_seconds`; the controller manager's node lifecycle
        controller takes a node silent for `node_monitor_grace` seconds for unreachable and
        evicts its pods after their tolerations (the API server's default for the unreachable
        taint: `default_unreachable_toleration` seconds)."""
        self.node_monitor_grace = node_monitor_grace
        self.node_heartbeat_seconds = node_heartbeat_seconds
        self.default_unreachable_toleration = default_unreachable_toleration
        self.lost: set[str] = set()
        """The nodes lost (`lose_node`) and not restored."""
        if len({n.name for n in nodes}) != len(nodes):
            raise ValueError("two simulated nodes have the same name: give each its own")
        self.workdir = workdir
        self.nodes = list(nodes)
        real = [n.name for n in self.nodes if n.real]
        self.node_addresses = {
            n.name: str(FIRST_NODE_ADDRESS + (real.index(n.name) if n.real else 0))
            for n in self.nodes
        }
        """Each node's address (its InternalIP and status.hostIP): real nodes each their own."""
        self.binder_count = binders
        self.tenant_code_namespaces = tuple(tenant_code_namespaces)
        """Namespaces the agents let run their own code in Triton: the scenario's tiny models
        use the Python backend, which a real operator allows only for namespaces it trusts.
        Every node is then dedicated to them (labelled), and the binders place only their model
        pods: a pod of another namespace waits with `node(s) are dedicated to tenant code`."""
        self.admission_policies = admission_policies
        """Run deploy/base's ValidatingAdmissionPolicies in the API server, and the binders with
        their service account's token (the model-pod policy lets only the binder write
        placements). Off by default: everything else in the sim calls the API server without
        credentials, as the cluster admin, whom the model-pod policy holds to its rules too, so
        the demo's squatter (a pod created with spec.nodeName, to show the agent refusing it)
        would be refused at the API server instead; and the agents, processes without a pod,
        have no pod-bound token naming their node, so they stay the admin, whom the agent
        policy does not concern."""
        self.keep_pod_logs = keep_pod_logs
        self.crds = tuple(crds)
        """More CRD files (or folders of them) the API server serves beside the chart's, such as
        KServe's (deploy/kserve-crds)."""
        """Keep each stopped pod's container logs in `pod_logs` (a benchmark's post-mortem)."""
        self.webhook_wanted = webhook
        """Run tritonshare's webhook and the model store (pods in the short form)."""
        self.cpu_shares = cpu_shares
        """Weight each pod's processes by its CPU requests, as a kubelet does: the model pods'
        (the kubelet) and the real node's node pod's (its Triton, agent and gateway, with the
        requests of deploy/base/node/node-daemonset.yaml), in cgroups of their own
        (`sim.node.cpushares`). Off by default: it needs a writable cgroup CPU controller."""
        self.cpu: CpuGroups | None = None
        self.node_ports = node_ports
        """Run the real nodes' agents and gateways on deploy/base's ports (agent gRPC 8100, gateway
        REST 8010, gRPC 8011 and metrics 8012), so that model pods written as deploy/example
        writes them reach them at `$(HOST_IP)`. Off by default: fixed ports let one such cluster
        run on a machine at a time. Every node's Triton runs ONNX models
        (`sim.triton.TritonServer.onnx_standin`)."""
        self.masquerade = masquerade
        """The pods' connections to their node's agent and gateway leave from the node's address,
        as a CNI that masquerades node-local traffic makes them (the portmap plugin's SNAT): the
        gateway knows each pod by its caller key alone (`sim.node.podnetwork`)."""
        self.gpu_mem_reserve = gpu_mem_reserve
        self.process_allowance = process_allowance
        """The binders' --gpu-mem-reserve and --gpu-mem-process-allowance: 0 by default, as the
        mock GPUs hold no driver share or Triton context, and their models no context of their
        own unless `process_context` says so (bytes each Python model's stub takes on them)."""
        self.process_context = process_context
        self.process_driver_share = process_driver_share
        """Bytes each such stub also costs the mock GPU beyond NVML's per-process figure, as the
        driver's part of a CUDA context does on a real one (`sim.gpu.load`)."""
        self.parallel_loads = parallel_loads
        """The real nodes' agents' --parallel-loads, and their Tritons' --model-load-thread-count
        that times their GPUs, as the chart sets both from `agent.parallelLoads`."""
        self.gpu_poll_seconds = gpu_poll_seconds
        """The agents' --gpu-poll-seconds (None: theirs): how fresh their GPU figures are."""
        self.say = say
        self.missing: list[str] = []
        self.node_daemonsets: list[dict[str, Any]] = []
        """deploy/base's node DaemonSets as stored (none where kubectl cannot render them)."""
        self.exit_codes: dict[str, int | None] = {}
        """Exit code of each stopped part (binder-N, agent/NODE); negative: killed by a signal."""
        self.apiserver: RunningApiServer | None = None
        self.kubeconfig = workdir / "kubeconfig"
        self.placement_key_dir = workdir / "placement-key"
        self.kube: kubernetes.client.ApiClient | None = None
        self.ports: NodePorts | None = None
        self.tritons: dict[str, TritonServer] = {}
        self.agents: dict[str, AgentHandle] = {}
        self.gateways: dict[str, GatewayHandle] = {}
        self.webhook: admission_webhook.WebhookHandle | None = None
        self.model_store: ModelStore | None = None
        self.binders: list[BinderHandle] = []
        self.controllers: ControllerManager | None = None
        self.kubelets: dict[str, Kubelet] = {}
        self.pod_addresses = PodAddresses()
        """The pod IPs of every real node's pods: one pool, so that no two pods share one."""
        self.hollow: HollowKubelet | None = None
        self.node_pod_kubelet = NodePodKubelet(
            self, [n.name for n in self.nodes], node_pod_template()
        )
        """Starts the node pods' containers again when they exit or fail their liveness probe, as
        the nodes' kubelets would (from `start` on; `restarts`, `container_exits`)."""
        self._kubelet_clients: list[kubernetes.client.ApiClient] = []
        self.mirror_pods: MirrorPods | None = None
        self._mirrors_wanted = mirror_pods
        self._restarts_before: dict[str, dict[str, int]] = {}
        """Node -> its containers' restarts when its node pod was last replaced."""
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "KUBECONFIG": str(self.kubeconfig)}

    @property
    def core(self) -> Any:
        """CoreV1Api of the cluster, untyped (callers pass and read raw dicts)."""
        assert self.kube is not None
        return cast(Any, kubernetes.client.CoreV1Api(self.kube))

    @property
    def pod_logs(self) -> Path:
        """Where the stopped pods' container logs are kept with `keep_pod_logs`: one directory a
        pod (`<namespace>_<pod>_<uid>`), one file a container."""
        return self.workdir / "pod-logs"

    @property
    def real_nodes(self) -> list[NodeSpec]:
        """The nodes whose pods run for real, in the order given."""
        return [n for n in self.nodes if n.real]

    @property
    def real_node(self) -> NodeSpec | None:
        """The first real node (the only one in most scenarios)."""
        return next((n for n in self.nodes if n.real), None)

    @property
    def triton(self) -> TritonServer | None:
        """The first real node's Triton."""
        real = self.real_node
        return None if real is None else self.tritons.get(real.name)

    def triton_states(self, node: str | None = None, timeout: float = 5.0) -> dict[str, str]:
        """Model name -> state in the repository index of `node`'s Triton (the first real
        node's by default) as its agent sees it, through the admin header; {} with no Triton.
        OSError when Triton does not answer within `timeout`."""
        triton = self.triton if node is None else self.tritons.get(node)
        if triton is None:
            return {}
        name, _, value = TRITON_ADMIN_HEADER.partition(":")
        request = urllib.request.Request(
            f"http://{triton.http_url}/v2/repository/index",
            data=b"{}",
            headers={name: value},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            index = json.loads(response.read())
        return {str(m["name"]): str(m.get("state", "")) for m in index}

    @property
    def gateway(self) -> GatewayHandle | None:
        """The first real node's gateway."""
        real = self.real_node
        return None if real is None else self.gateways.get(real.name)

    @property
    def kubelet(self) -> Kubelet | None:
        """The first real node's kubelet."""
        real = self.real_node
        return None if real is None else self.kubelets.get(real.name)

    def log_tails(self, lines: int = 15) -> str:
        """The last `lines` of the binders' and agents' logs, for a wait that timed out."""
        parts = [b.process for b in self.binders] + [a.process for a in self.agents.values()]
        return "\n".join(f"--- {p.log_path.name}:\n{p.log_tail(lines)}" for p in parts)

    def _suffix(self, node: NodeSpec) -> str:
        """'' for the first real node, `-<name>` for another: its files' and groups' names."""
        return "" if node == self.real_node else f"-{node.name}"

    def _new_triton(self, node: NodeSpec, log_name: str) -> TritonServer:
        suffix = self._suffix(node)
        triton = TritonServer(
            self.workdir / f"triton{suffix}" / "models",
            restricted=True,
            log_path=self.workdir / "logs" / f"{log_name}{suffix}.log",
            onnx_standin=True,
            gpu_metrics=node.gpus == REAL_GPUS,
            kept=True,  # as the node pod's Triton container runs it
            # As the chart sets it: the agent's loads at once on each of the node's GPUs.
            parallel_loads=self.parallel_loads * _gpu_count(node),
        )
        triton.model_repository.mkdir(parents=True, exist_ok=True)
        return triton

    def start(self) -> None:
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        if self.cpu_shares:
            try:
                self.cpu = CpuGroups("tritonshare-sim")
            except CpuGroupsUnavailableError as e:
                raise ClusterError(str(e)) from e
            for node in self.real_nodes:
                self.cpu.place(
                    NODE_POD_GROUP + self._suffix(node), pod_millicpu(node_pod_template())
                )
        write_placement_keys(self.placement_key_dir)
        self.apiserver = start_in_thread(
            settings=ApiServerSettings(
                crds=(CHART_CRDS, *self.crds),
                default_unreachable_toleration_seconds=self.default_unreachable_toleration,
            )
        )
        self.apiserver.write_kubeconfig(self.kubeconfig)
        self.kube = self.apiserver.api_client()
        self.kube.user_agent = USER_AGENT
        self.say(f"Simulated Kubernetes API server is up at {self.apiserver.url}.")
        apply_namespace(self.kube, SYSTEM_NAMESPACE_MANIFEST)
        self._store_node_daemonsets()
        if self.admission_policies:
            installed = install_admission_policies(self.kube)
            self.say(f"The API server runs tritonshare's admission policies ({len(installed)}).")
        for node in self.nodes:
            self._register(node)
        self.say(f"Registered {len(self.nodes)} GPU nodes (as their kubelets would).")
        self.ports = (
            NodePorts(
                NODE_AGENT_PORT,
                NODE_GATEWAY_HTTP_PORT,
                NODE_GATEWAY_GRPC_PORT,
                NODE_GATEWAY_METRICS_PORT,
            )
            if self.node_ports
            else NodePorts(*(self._free_node_port() for _ in range(4)))
        )
        # Each Triton takes seconds to start: the nodes' start side by side, as nodes boot.
        with ThreadPoolExecutor(max(1, len(self.real_nodes))) as starting:
            list(starting.map(self._start_triton, self.real_nodes))
        self._start_gateways()
        self._start_agents()
        if self.webhook_wanted:
            self._start_webhook()
        self._start_binders()
        if self.webhook is not None:
            self._register_webhook(self.webhook)
        self._start_controllers()
        self._start_kubelets()
        if self._mirrors_wanted:
            self._start_mirror_pods()

    def _free_node_port(self) -> int:
        """A TCP port free a moment ago on every real node's address (each node binds it)."""
        addresses = sorted({self.node_addresses[n.name] for n in self.real_nodes})
        while True:
            port = free_port()
            if all(_port_free(address, port) for address in addresses[1:]):
                return port

    def _start_triton(self, node: NodeSpec, log_name: str = "tritonserver") -> None:
        triton = self._new_triton(node, log_name)
        problem = stub_environment_problem() if node.gpus == REAL_GPUS else ""
        if problem:
            raise ClusterError(problem)
        try:
            triton.start()
        except (TritonUnavailableError, RuntimeError, TimeoutError) as e:
            triton.discard()
            raise ClusterError(f"the real Triton of node {node.name} did not start: {e}") from e
        self.tritons[node.name] = triton
        self._weigh(node, "triton", triton.process)
        where = "on this machine's GPUs" if node.gpus == REAL_GPUS else "on the CPU"
        self.say(
            f"A real Triton 2.51 is serving node {node.name} {where} (HTTP "
            f"{triton.http_url}, gRPC {triton.grpc_url}; admin APIs restricted)."
        )

    def _weigh(
        self, node: NodeSpec, container: str, process: subprocess.Popen[bytes] | None
    ) -> None:
        """The node pod's `container`, just started, into its CPU group (with cpu_shares)."""
        if self.cpu is None or process is None:
            return
        requested = node_container_millicpu(node_pod_template(), container)
        group = f"{NODE_POD_GROUP}{self._suffix(node)}/{container}"
        self.cpu.place(group, requested, [process.pid])

    def _start_controllers(self) -> None:
        assert self.apiserver is not None
        api = self.apiserver.api_client()
        self._kubelet_clients.append(api)
        self.controllers = ControllerManager(
            api, clock=self.apiserver.clock.now, node_monitor_grace=self.node_monitor_grace
        )
        self.controllers.start()
        if not self.controllers.wait_synced(30):
            raise ClusterError("the controller manager did not list the cluster within 30 s")
        self.say("The controller manager rolls Deployments and keeps ReplicaSets' pods.")

    def _start_mirror_pods(self) -> None:
        assert self.apiserver is not None
        # The node pod's PriorityClass, as `kubectl apply -k deploy/base` creates it.
        scheduling = cast(Any, kubernetes.client.SchedulingV1Api(self.kube))
        with contextlib.suppress(kubernetes.client.ApiException):  # there already
            scheduling.create_priority_class(
                yaml.safe_load(PRIORITY_CLASS.read_text()), _preload_content=False
            )
        api = self.apiserver.api_client()
        self._kubelet_clients.append(api)
        self.mirror_pods = MirrorPods(
            api,
            DEFAULT_SYSTEM_NAMESPACE,
            self._mirrors,
            self._mirror_state,
            lambda mirror: self._replace_mirrored(mirror.node),
            clock=self.apiserver.clock.now,
        )
        self.mirror_pods.start()
        self.say("The node pods, binders and webhook are listed as pods of tritonshare-system.")

    def _mirrors(self) -> list[Mirror]:
        """The pods this cluster runs as processes, as `kubectl get pods -A` is to list them."""
        apps = cast(Any, kubernetes.client.AppsV1Api(self.kube))
        wanted = []
        for daemonset in apps.list_namespaced_daemon_set(DEFAULT_SYSTEM_NAMESPACE).items:
            template = self.kube.sanitize_for_serialization(daemonset.spec.template)  # type: ignore[union-attr]
            owner = {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "name": daemonset.metadata.name,
                "uid": daemonset.metadata.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
            labels = {
                n.name: self._node(n.name)["metadata"].get("labels") or {} for n in self.real_nodes
            }
            for node in self.real_nodes:
                if node.name in self.agents and selects(
                    {"spec": {"template": template}}, labels[node.name]
                ):
                    wanted.append(
                        Mirror(
                            f"node/{node.name}",
                            daemonset.metadata.name,
                            template,
                            node.name,
                            owner,
                            True,
                        )
                    )
        for binder in self.binders:
            wanted.append(
                Mirror(
                    f"binder/{binder.identity}",
                    "tritonshare-binder",
                    _deployment_template(BINDER_DEPLOYMENT),
                )
            )
        if self.webhook is not None:
            wanted.append(
                Mirror("webhook", "tritonshare-webhook", _deployment_template(WEBHOOK_DEPLOYMENT))
            )
        return wanted

    def _mirror_state(self, mirror: Mirror) -> dict[str, tuple[bool, int]]:
        """Each container of the mirrored pod: running, and its restarts since the pod began."""
        if mirror.key.startswith("node/"):
            node = mirror.node
            restarts = self.restarts(node)
            before = self._restarts_before.get(node, {})
            return {
                name: (
                    self.container_run(node, name) is not None,
                    restarts.get(name, 0) - before.get(name, 0),
                )
                for name in ("triton", "agent", "gateway")
            }
        if mirror.key == "webhook":
            process = self.webhook.process if self.webhook is not None else None
            running = (
                process is not None
                and process.process is not None
                and process.process.poll() is None
            )
            return {c: (running, 0) for c in _container_names(WEBHOOK_DEPLOYMENT)}
        identity = mirror.key.partition("/")[2]
        binder = next((b for b in self.binders if b.identity == identity), None)
        running = (
            binder is not None
            and binder.process.process is not None
            and binder.process.process.poll() is None
        )
        return {c: (running, 0) for c in _container_names(BINDER_DEPLOYMENT)}

    def _replace_mirrored(self, node: str) -> None:
        """A node pod's mirror deleted: the node pod replaced, as its DaemonSet would."""
        self.replace_node_pod(node)
        self._restarts_before[node] = dict(self.restarts(node))

    def _store_node_daemonsets(self) -> None:
        """deploy/base's node DaemonSets, as `kubectl apply -k deploy/base` creates them: the
        cluster runs their pods' containers as processes (`sim.gpustack`)."""
        try:
            self.node_daemonsets = render_node_daemonsets()
        except GpuStackError as e:
            self.missing.append(f"{DAEMONSETS_PART} ({e})")
            return
        apps = cast(Any, kubernetes.client.AppsV1Api(self.kube))
        for daemonset in self.node_daemonsets:
            namespace = daemonset["metadata"]["namespace"]
            apps.create_namespaced_daemon_set(namespace, daemonset, _preload_content=False)
        names = ", ".join(d["metadata"]["name"] for d in self.node_daemonsets)
        self.say(f"The API server stores deploy/base's node DaemonSets ({names}).")

    def _gpus(self, node: NodeSpec) -> NodeGpus:
        """The node's GPUs, as GPU feature discovery and the device plugin find them."""
        try:
            return (
                nvml_gpus(node.name) if node.gpus == REAL_GPUS else mock_gpus(node.gpus, node.name)
            )
        except GpuStackError as e:
            raise ClusterError(str(e)) from e

    def _register(self, node: NodeSpec) -> None:
        # Agents that allow tenant code start only on nodes dedicated to it; the binders place
        # the same namespaces, and only them, there.
        dedicated = {KEYS.tenant_code: TENANT_CODE_NODE} if self.tenant_code_namespaces else {}
        gpus = self._gpus(node)
        # GPU feature discovery's labels; the node's own override them.
        labels = {
            "kubernetes.io/hostname": node.name,
            **feature_labels(gpus),
            **dedicated,
            **node.labels,
        }
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node.name, "labels": labels},
            # Every node is a tritonshare GPU node: the taint only model pods and the node pod
            # tolerate (deploy/base/gpu-node-admission-policy.yaml), then the node's own.
            "spec": {"taints": [GPU_NODE_TAINT, *(dict(t) for t in node.taints)]},
        }
        self.core.create_node(body, _preload_content=False)
        size = node_size(self.node_daemonsets, labels)
        # The device plugin advertises every GPU of the node.
        resources = {
            "cpu": f"{size[CPU]}m",
            "memory": f"{size[MEMORY] >> 20}Mi",
            "pods": "110",
            **({NVIDIA_GPU: str(gpus.count)} if gpus.count else {}),
        }
        status = {
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                "addresses": [{"type": "InternalIP", "address": self.node_addresses[node.name]}],
                "capacity": resources,
                "allocatable": resources,
            }
        }
        self.core.patch_node_status(node.name, status, _preload_content=False)

    def _start_agents(self) -> None:
        if not (available("agent.__main__") and available("sim.gpu.agent_node")):
            self.missing.append(
                "agent (python -m agent / sim.gpu.agent_node is not in the tree yet)"
            )
            return
        for node in self.nodes:
            self._start_agent(node)
        self._wait_agents(list(self.agents))
        self.say(f"{len(self.agents)} agents are publishing their GPUs and renewing their leases.")

    def _start_agent(self, node: NodeSpec) -> None:
        """The node's agent's process, which serves once it has written its ports file
        (`_wait_agents`): a real node's on the node's agent port, another's on any port."""
        listen_grpc = "127.0.0.1:0"
        if node.real:
            assert self.ports is not None
            listen_grpc = f"{self.node_addresses[node.name]}:{self.ports.agent}"
        node_dir = self.workdir / "nodes" / node.name
        node_dir.mkdir(parents=True, exist_ok=True)
        ports_file = node_dir / "agent-ports.json"
        ports_file.unlink(missing_ok=True)
        triton = self.tritons.get(node.name)
        gateway = self.gateways.get(node.name)
        if node.real and triton is not None:
            repository, triton_url = triton.model_repository, triton.http_url
            triton_grpc_url = triton.grpc_url
        else:
            # No Triton here: the agent publishes GPUs and liveness; nothing is loaded.
            repository, triton_url = node_dir / "models", f"127.0.0.1:{free_port()}"
            triton_grpc_url = f"127.0.0.1:{free_port()}"
            repository.mkdir(parents=True, exist_ok=True)
        simulated = [
            "--simulate-model-memory", "--process-context", str(self.process_context),
            "--process-driver-share", str(self.process_driver_share),
            "--gpu-compute",
        ] if node.real else []  # fmt: skip
        on_gpus = node.gpus == REAL_GPUS
        argv = [
            *([sys.executable, "-m", "agent"] if on_gpus else [
                sys.executable, "-m", "sim.gpu.agent_node", "--gpus", node.gpus, *simulated, "--"
            ]),
            "--node-name", node.name,
            "--kubeconfig", str(self.kubeconfig),
            "--model-repository", str(repository),
            "--triton-http-url", triton_url,
            "--triton-grpc-url", triton_grpc_url,
            "--triton-admin-header", TRITON_ADMIN_HEADER,
            "--listen-grpc", listen_grpc,
            "--listen-http", f"{self.node_addresses[node.name]}:0",
            "--ports-file", str(ports_file),
            "--placement-key-dir", str(self.placement_key_dir),
            "--tenant-code-namespaces", ",".join(self.tenant_code_namespaces),
            # Measured GPU memory reaches the binder within seconds in the demo.
            "--usage-publish-seconds", "2",
            "--parallel-loads", str(self.parallel_loads),
            *([] if self.gpu_poll_seconds is None else [
                "--gpu-poll-seconds", str(self.gpu_poll_seconds)
            ]),
            *([] if on_gpus else ["--cpu-only"]),
        ]  # fmt: skip
        if node.real and gateway is not None:
            argv += ["--gateway-table", str(gateway.caller_table)]
        pid_file = self._write_triton_pid(node)
        if pid_file is not None:
            argv += ["--triton-pid-file", str(pid_file)]
        process = ManagedProcess(
            f"agent/{node.name}", argv, self.workdir / "logs" / f"agent-{node.name}.log"
        )
        process.start(self.env)
        if node.real:
            self._weigh(node, "agent", process.process)
        self.agents[node.name] = AgentHandle(node.name, process)

    def _write_triton_pid(self, node: NodeSpec) -> Path | None:
        """Write the PID of a real node's Triton (its keeper's) where its agent reads it, as the
        node pod's Triton container writes it: the agent tells Triton's processes from others on
        the GPUs and measures Triton's host memory. The file; None where no Triton runs."""
        triton = self.tritons.get(node.name)
        if not node.real or triton is None or triton.process is None:
            return None
        pid_file = self.workdir / "nodes" / node.name / "triton.pid"
        pid_file.write_text(f"{triton.process.pid}\n")
        return pid_file

    def _read_agent_ports(self, handle: AgentHandle) -> bool:
        """Fill in the agent's addresses from its ports file; whether it has written it yet."""
        ports_file = self.workdir / "nodes" / handle.node / "agent-ports.json"
        if not ports_file.exists():
            return False
        ports = json.loads(ports_file.read_text())
        handle.grpc, handle.http = ports["grpc"], ports["http"]
        return True

    def _wait_agents(self, names: Sequence[str]) -> None:
        for name in names:
            handle = self.agents[name]
            wait_started(
                handle.process, f"the agent of node {name}", partial(self._read_agent_ports, handle)
            )
        for name in names:
            wait_until(
                f"node {name}'s GPUs published by its agent",
                partial(self._has_gpus, name),
                AGENT_GPUS_SECONDS,
                f"See {self.agents[name].process.log_path}.",
            )
            wait_until(
                f"node {name}'s agent lease", partial(self._lease, agent_lease_name(name)), 60
            )

    def _start_gateways(self) -> None:
        """Every real node's gateway; the node ports chosen again (up to twice) when one of them
        was taken by another process between their choice and the gateway's bind."""
        for attempt in range(3):
            try:
                for node in self.real_nodes:
                    self._start_gateway(node)
                return
            except PortTakenError:
                for gateway in self.gateways.values():
                    gateway.process.stop()
                self.gateways.clear()
                if self.node_ports or attempt == 2:
                    raise
                self.ports = NodePorts(*(self._free_node_port() for _ in range(4)))

    def _start_gateway(self, node: NodeSpec) -> None:
        """A real node's gateway, on the node's address, before its agent, which writes the
        caller table the gateway follows (until then the gateway refuses everyone)."""
        handle = self._launch_gateway(node)
        if handle is None:
            return
        address = handle.address
        try:
            wait_started(
                handle.process,
                f"the gateway of node {node.name}",
                partial(http_ok, f"http://{address}:{handle.metrics}/healthz"),
            )
        except ClusterError as e:
            handle.process.stop()
            if "address already in use" in handle.process.log_tail(40).lower():
                raise PortTakenError(str(e)) from e
            raise
        self.gateways[node.name] = handle
        self.say(
            f"Node {node.name}'s gateway is the model pods' one way to Triton (REST "
            f"{address}:{handle.http}, gRPC {address}:{handle.grpc}): it knows each pod by its "
            "address."
        )

    def _launch_gateway(self, node: NodeSpec) -> GatewayHandle | None:
        """A real node's gateway's process, started; None where the node runs no Triton."""
        triton = self.tritons.get(node.name)
        if triton is None or self.ports is None:
            return None
        node_dir = self.workdir / "nodes" / node.name
        node_dir.mkdir(parents=True, exist_ok=True)
        address = self.node_addresses[node.name]
        ports = self.ports
        caller_table = node_dir / "gateway" / "callers.json"
        argv = [
            sys.executable, "-m", "proxy.gateway",
            "--caller-table", str(caller_table),
            "--triton-http-url", triton.http_url,
            "--triton-grpc-url", triton.grpc_url,
            "--listen-http", f"{address}:{ports.gateway_http}",
            "--listen-grpc", f"{address}:{ports.gateway_grpc}",
            "--listen-metrics", f"{address}:{ports.gateway_metrics}",
            "--keep-listening",  # as the node pod runs it
        ]  # fmt: skip
        log_path = self.workdir / "logs" / f"gateway-{node.name}.log"
        handle = GatewayHandle(
            ManagedProcess(f"gateway/{node.name}", argv, log_path),
            ports.gateway_http,
            ports.gateway_grpc,
            ports.gateway_metrics,
            caller_table,
            address,
        )
        handle.process.start(self.env)
        self._weigh(node, "gateway", handle.process.process)
        return handle

    def _start_webhook(self) -> None:
        """The model store, and the webhook's process with the real node's ports (registered
        once it serves, after the binders have started: `_register_webhook`)."""
        real = self.real_node
        if not available("webhook.__main__"):
            self.missing.append("webhook (python -m webhook is not in the tree yet)")
            return
        if real is None or self.ports is None or real.name not in self.agents:
            self.missing.append("webhook (no node runs pods, so no pod it completes could run)")
            return
        try:
            cert, key = self_signed(self.workdir / "tls")
        except TlsUnavailableError as e:
            self.missing.append(f"webhook ({e})")
            return
        self.model_store = ModelStore(self.workdir / "model-store", cert, key)
        self.model_store.start()
        ports = admission_webhook.NodePorts(
            agent=self.ports.agent,
            gateway_http=self.ports.gateway_http,
            gateway_grpc=self.ports.gateway_grpc,
        )
        self.webhook = admission_webhook.start(self.workdir / "logs", self.env, cert, key, ports)

    def _register_webhook(self, webhook: admission_webhook.WebhookHandle) -> None:
        assert self.kube is not None and self.model_store is not None
        admission_webhook.register(webhook, self.kube)
        self.say(
            "tritonshare's webhook completes model pods written in the short form (a model URI "
            f"and a GPU memory annotation); their models come from a model store at "
            f"{self.model_store.base_url}."
        )

    def _start_binders(self) -> None:
        if not available("binder.__main__"):
            self.missing.append("binder (python -m binder is not in the tree yet)")
            return
        kubeconfig = self._binder_kubeconfig()
        for i in range(self.binder_count):
            identity = f"binder-{i}"
            http = f"127.0.0.1:{free_port()}"
            argv = [
                sys.executable, "-m", "binder",
                "--kubeconfig", str(kubeconfig),
                "--listen-http", http,
                "--identity", identity,
                "--placement-key-dir", str(self.placement_key_dir),
                # Short leases, so a crashed leader is replaced within seconds in the demo.
                "--lease-duration", str(BINDER_LEASE_SECONDS),
                "--renew-deadline", str(BINDER_LEASE_SECONDS * 2 // 3),
                "--retry-period", "1",
                "--tenant-code-namespaces", ",".join(self.tenant_code_namespaces),
                "--gpu-mem-reserve", str(self.gpu_mem_reserve),
                "--gpu-mem-process-allowance", str(self.process_allowance),
            ]  # fmt: skip
            if self.ports is not None and self.gateways:
                # The model hosts it creates reach the real nodes' agents and gateways where the
                # simulation runs them (the same ports on every node), as the webhook's model
                # pods do.
                argv += [
                    "--agent-port", str(self.ports.agent),
                    "--triton-http-port", str(self.ports.gateway_http),
                    "--triton-grpc-port", str(self.ports.gateway_grpc),
                ]  # fmt: skip
            process = ManagedProcess(identity, argv, self.workdir / "logs" / f"{identity}.log")
            process.start(self.env)
            self.binders.append(BinderHandle(identity, process, http))
        for binder in self.binders:
            wait_started(
                binder.process, binder.identity, partial(http_ok, f"http://{binder.http}/healthz")
            )
        wait_until("a binder leader elected", self.binder_leader, 60)
        self.say(f"{len(self.binders)} binders are running; {self.binder_leader()} is the leader.")

    def _binder_kubeconfig(self) -> Path:
        """The admin's kubeconfig, or under the admission policies one with the binder's
        service-account token (the identity the model-pod policy trusts with placements)."""
        if not self.admission_policies:
            return self.kubeconfig
        assert self.apiserver is not None
        token = self.apiserver.service_account_token(
            DEFAULT_SYSTEM_NAMESPACE, BINDER_SERVICE_ACCOUNT, SERVICE_ACCOUNT_TOKEN_SECONDS
        )
        return self.apiserver.write_kubeconfig(self.workdir / "kubeconfig-binder", token=token)

    def _start_kubelets(self) -> None:
        assert self.apiserver is not None
        for node in self.real_nodes:
            self._start_kubelet(node)
        hollow = [n.name for n in self.nodes if not n.real]
        if hollow:
            api = self.apiserver.api_client()
            self._kubelet_clients.append(api)
            self.hollow = HollowKubelet(
                api,
                hollow,
                heartbeat_seconds=self.node_heartbeat_seconds,
                clock=self.apiserver.clock.now,
            )
            self.hollow.start()
        self.say(
            f"The kubelet of {', '.join(self.kubelets) or 'no node'} runs its pods as processes; "
            f"a hollow kubelet marks pods on {', '.join(hollow) or 'no node'} Running without "
            "running them."
        )
        self.node_pod_kubelet.start()
        self.say(
            "The node pods' containers are started again when they exit or fail their liveness "
            "probe, as the kubelet does."
        )

    def _start_kubelet(self, node: NodeSpec) -> None:
        assert self.apiserver is not None
        env = dict(self.env)
        if self.webhook is not None:
            # The pods trust the sim's certificate (the model store's), as pods of a cluster
            # with a private CA do.
            env["SSL_CERT_FILE"] = str(self.webhook.ca)
        api = self.apiserver.api_client()
        self._kubelet_clients.append(api)
        kubelet = Kubelet(
            api,
            node.name,
            self.workdir / f"kubelet{self._suffix(node)}",
            host_ip=self.node_addresses[node.name],
            base_env=env,
            # The proxy's --source-address: the pod's connections leave from its own IP.
            source_address_variables=(SOURCE_ADDRESS_VARIABLE,),
            masquerade=self.masquerade,
            cpu=self.cpu,
            addresses=self.pod_addresses,
            kept_logs=self.pod_logs if self.keep_pod_logs else None,
            heartbeat_seconds=self.node_heartbeat_seconds,
            clock=self.apiserver.clock.now,
        )
        kubelet.start()
        self.kubelets[node.name] = kubelet

    def lose_node(self, node: str) -> float:
        """Lose a real node whole, as a power or network failure does: its Triton, agent,
        gateway and every pod's processes SIGKILLed at once, its kubelet gone (no more heartbeat
        or status: the node lifecycle controller finds it after its grace). Nothing of it is
        started again until `restore_node`. Returns the monotonic time of the loss."""
        real = self._real(node, "lose")
        for container in ("triton", "agent", "gateway"):
            self.node_pod_kubelet.leave_down(real.name, container)
        kubelet = self.kubelets.pop(real.name)
        agent, gateway = self.agents[real.name], self.gateways[real.name]
        triton = self.tritons[real.name]
        processes = [agent.process.process, gateway.process.process, triton.process]
        for process in processes:
            if process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
        lost = time.monotonic()
        kubelet.lose()
        triton.discard()
        for handle in (agent.process, gateway.process):
            self.exit_codes[handle.name] = handle.stop(grace=0)
        self.lost.add(real.name)
        self.say(f"Node {real.name} is lost: every process of it killed, its kubelet silent.")
        return lost

    def restore_node(self, node: str) -> float:
        """Boot a lost node again: a new node pod (Triton with an empty repository, gateway,
        agent) and its kubelet, whose heartbeat makes it Ready again (the node lifecycle
        controller then lifts its taints) and which finishes the deletion of its evicted pods.
        Returns the monotonic time at which its agent runs again."""
        if node not in self.lost:
            raise ClusterError(f"node {node} is not lost: nothing to restore")
        real = next(n for n in self.real_nodes if n.name == node)
        with self.node_pod_kubelet.paused(node):
            triton = self.tritons.pop(node)
            shutil.rmtree(triton.model_repository.parent, ignore_errors=True)
            self.gateways.pop(node, None)
            shutil.rmtree(self.workdir / "nodes" / node / "gateway", ignore_errors=True)
            self._start_triton(real, f"tritonserver-{secrets.token_hex(3)}")
            self._start_gateway(real)
            self._start_agent(real)
            self._wait_agents([node])
        self._start_kubelet(real)
        self.lost.discard(node)
        self.say(f"Node {node} is back with an empty repository.")
        return time.monotonic()

    def container_run(self, node: str, container: str) -> Running | None:
        """The current run of `node`'s node pod's `container` (`triton`, `agent`, `gateway`), for
        the node pod kubelet; None where the node runs none."""
        spec = next(n for n in self.nodes if n.name == node)
        address = self.node_addresses[node]
        if container == "triton":
            triton = self.tritons.get(node)
            if triton is None or triton.process is None:
                return None
            return Running(triton.process, triton.log_path, {}, address)
        if container == "agent":
            agent = self.agents.get(node)
            if agent is None or agent.process.process is None:
                return None
            # Its HTTP port is any free one, known once it has written its ports file.
            known = agent.http or self._read_agent_ports(agent)
            ports = {"agent-http": int(agent.http.rpartition(":")[2])} if known else {}
            return Running(agent.process.process, agent.process.log_path, ports, address)
        if container == "gateway" and spec.real:
            gateway = self.gateways.get(node)
            if gateway is None or gateway.process.process is None:
                return None
            ports = {
                "gateway-http": gateway.http,
                "gateway-grpc": gateway.grpc,
                "gateway-metrics": gateway.metrics,
            }
            return Running(gateway.process.process, gateway.process.log_path, ports, address)
        return None

    def start_container_again(self, node: str, container: str) -> None:
        """Start `node`'s node pod's `container` again after its run ended, as the kubelet does:
        the others and every volume stay. Triton (its keeper) is live when this returns; the
        agent and the gateway have only started (their liveness probe follows them)."""
        spec = next(n for n in self.nodes if n.name == node)
        if container == "triton":
            triton = self.tritons[node]
            try:
                triton.restart()
            except (TritonUnavailableError, RuntimeError, TimeoutError) as e:
                raise ClusterError(f"the real Triton of node {node} did not start: {e}") from e
            self._weigh(spec, "triton", triton.process)
            self._write_triton_pid(spec)
        elif container == "agent":
            self._start_agent(spec)
        elif container == "gateway":
            gateway = self._launch_gateway(spec)
            if gateway is not None:
                self.gateways[node] = gateway
        else:
            raise ValueError(f"the node pod has no container {container!r} to start")

    def restarts(self, node: str) -> dict[str, int]:
        """How many times each container of `node`'s node pod was started again after it exited
        or failed its liveness probe, since the cluster started."""
        return self.node_pod_kubelet.restarts(node)

    def container_exits(self) -> list[ContainerExit]:
        """Every node pod container's run that ended other than by the cluster's will (a crash,
        a kill from outside, a failed liveness probe), oldest first."""
        return self.node_pod_kubelet.exits()

    def _has_gpus(self, name: str) -> bool:
        return KEYS.gpus in self._node(name)["metadata"].get("annotations", {})

    def _node(self, name: str) -> dict[str, Any]:
        response = self.core.read_node(name, _preload_content=False)
        node: dict[str, Any] = json.loads(response.data)
        return node

    def _lease(self, name: str) -> dict[str, Any] | None:
        assert self.kube is not None
        api = cast(Any, kubernetes.client.CoordinationV1Api(self.kube))
        try:
            response = api.read_namespaced_lease(
                name, DEFAULT_SYSTEM_NAMESPACE, _preload_content=False
            )
        except kubernetes.client.exceptions.ApiException as e:
            if e.status == 404:
                return None
            raise
        lease: dict[str, Any] = json.loads(response.data)
        return lease

    def _real(self, node: str | None, doing: str) -> NodeSpec:
        """The real node named `node` (None: the first) whose node pod runs, for `doing`."""
        spec = (
            self.real_node
            if node is None
            else next((n for n in self.real_nodes if n.name == node), None)
        )
        if spec is None or spec.name not in self.agents or spec.name not in self.gateways:
            raise ClusterError(f"no node pod to {doing}: {node or 'the cluster'} runs no real node")
        return spec

    def replace_node_pod(self, node: str | None = None) -> float:
        """Replace a real node's node pod (`node`; None: the first real node) as a DaemonSet
        update does: the old pod's agent, gateway and Triton get SIGTERM, and a new pod starts
        them again on the node's same host ports (the agent's gRPC, the gateway's), with new,
        empty emptyDir volumes (the model repository, the agent's owner records and staging, the
        gateway's caller table). Returns the monotonic time at which the new pod's agent,
        gateway and Triton all run."""
        real = self._real(node, "replace")
        with self.node_pod_kubelet.paused(real.name):
            agent, gateway = self.agents[real.name], self.gateways.pop(real.name)
            # The agent first: it takes the node's hosts out of their Services while the gateway
            # and Triton still answer, as the chart's preStop pauses keep them.
            self.exit_codes[agent.process.name] = agent.process.stop(grace=AGENT_STOP_GRACE)
            self.exit_codes[gateway.process.name] = gateway.process.stop()
            triton = self.tritons.pop(real.name)
            triton.stop()
            shutil.rmtree(triton.model_repository.parent)
            shutil.rmtree(self.workdir / "nodes" / real.name / "gateway", ignore_errors=True)
            self._start_triton(real, "tritonserver-2")
            self._start_gateway(real)
            self._start_agent(real)
            self._wait_agents([real.name])
        self.say(f"Node {real.name}'s node pod was replaced; its repository starts empty.")
        return time.monotonic()

    def restart_node_container(self, container: str, node: str | None = None) -> float:
        """Restart one container of a real node's node pod (`node`; None: the first real node)
        in place, as the kubelet does after an image change on the pod (`agent` or `gateway`):
        the others and every volume stay. Returns the monotonic time at which it runs again."""
        real = self._real(node, "restart a container of")
        if container not in ("agent", "gateway"):
            raise ValueError(f"the node pod has no container {container!r} to restart here")
        with self.node_pod_kubelet.paused(real.name):
            if container == "agent":
                agent = self.agents[real.name]
                # SIGINT: a real agent reads its own Pod, not being deleted, and does not drain
                # the node's hosts; the simulated node pod has no Pod to read.
                stopped = agent.process.stop(sig=signal.SIGINT)
                self.exit_codes[agent.process.name] = stopped
                self._start_agent(real)
                self._wait_agents([real.name])
            else:
                gateway = self.gateways.pop(real.name)
                self.exit_codes[gateway.process.name] = gateway.process.stop()
                self._start_gateway(real)
        return time.monotonic()

    def kill_agent(self, node: str) -> None:
        """Kill a node's agent for good (SIGKILL): the node pod kubelet leaves it down, its Lease
        is left to expire; Triton and the gateway keep running."""
        self.node_pod_kubelet.leave_down(node, "agent")
        agent = self.agents[node]
        assert agent.process.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(agent.process.process.pid, signal.SIGKILL)
        agent.process.process.wait(10)

    def crash_binder(self, identity: str) -> None:
        """Kill a binder abruptly (SIGKILL): its leader lease is left to expire."""
        binder = next(b for b in self.binders if b.identity == identity)
        assert binder.process.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(binder.process.process.pid, signal.SIGKILL)
        binder.process.process.wait(10)

    def binder_leader(self) -> str:
        """The identity holding the binder leader lease ('' when none)."""
        lease = self._lease("tritonshare-binder")
        return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")

    def stop_parts(self) -> None:
        """Stop the kubelets, binders, agents and Triton; the API server keeps serving (its
        audit log records their last calls, such as a leader releasing its lease). The end of a
        simulation is a node switched off: pods' containers and Triton are killed, not drained
        (replace_node_pod and deleting pods through the API show graceful termination)."""
        self.node_pod_kubelet.stop()
        if self.controllers is not None:
            self.controllers.stop()
        if self.hollow is not None:
            self.hollow.stop()
        for kubelet in self.kubelets.values():
            kubelet.stop()
        for api in self._kubelet_clients:
            api.close()  # type: ignore[no-untyped-call]
        self._kubelet_clients.clear()
        for binder in self.binders:
            self.exit_codes[binder.process.name] = binder.process.stop()
        for agent in self.agents.values():
            # Switched off: no drain of the node's hosts (the agent drains on SIGTERM only).
            self.exit_codes[agent.process.name] = agent.process.stop(sig=signal.SIGINT)
        for gateway in self.gateways.values():
            self.exit_codes[gateway.process.name] = gateway.process.stop()
        if self.webhook is not None:
            self.exit_codes[self.webhook.process.name] = self.webhook.process.stop()
        if self.model_store is not None:
            self.model_store.stop()
        for triton in self.tritons.values():
            triton.discard()
        if self.cpu is not None:
            self.cpu.close()
            self.cpu = None

    def stop(self) -> None:
        """Stop everything, last started first. Safe to call on a half-started cluster, and
        after stop_parts()."""
        self.stop_parts()
        if self.kube is not None:
            self.kube.close()  # type: ignore[no-untyped-call]
        if self.apiserver is not None:
            self.apiserver.stop()

    def __enter__(self) -> SimCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
