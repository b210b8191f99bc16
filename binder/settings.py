"""The binder's settings: one frozen object whose fields each declare their flag, variable, default
and help once with common.settings (`DECLARATION` is derived from them); a flag wins over its
variable. Parsed once in `__main__`.

Every problem is a SettingsError saying which flag or variable to fix. Nothing here talks to the
cluster or reads the kubeconfig: that happens when the binder starts.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

from binder.errors import SettingsError
from binder.framework.placement import POLICIES, Policy
from common.backends import PROCESS_ALLOWANCE
from common.contract import (
    DEFAULT_AGENT_AUDIENCE,
    DEFAULT_AGENT_GRPC_PORT,
    DEFAULT_BINDER_HTTP_PORT,
    DEFAULT_GATEWAY_GRPC_PORT,
    DEFAULT_GATEWAY_HTTP_PORT,
    DEFAULT_MIN_GPU_MEM,
    DEFAULT_SCHEDULER_NAME,
    DEFAULT_SYSTEM_NAMESPACE,
    Keys,
)
from common.logs import LogFormat
from common.settings import (
    BadValueError,
    Declaration,
    address,
    boolean,
    declared,
    keys_flag,
    log_format_flag,
    log_level_flag,
    names,
    number,
    one_of,
    path,
    port,
    quantity,
    seconds,
    setting,
    text,
    whole,
)
from common.version import VERSION

_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _label_key(key: str) -> bool:
    """Kubernetes' rule for a label key: an optional DNS subdomain prefix and `/`, then a name."""
    prefix, slash, name = key.rpartition("/")
    if slash and (len(prefix) > 253 or not _LABEL_PREFIX.fullmatch(prefix)):
        return False
    return _LABEL_NAME.fullmatch(name) is not None


def label_requirements(value: str) -> tuple[tuple[str, str | None], ...]:
    """`key=value` or `key` (the label exists), comma-separated; keys and values as Kubernetes
    writes labels."""
    pairs: list[tuple[str, str | None]] = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        key, equals, label_value = (word.strip() for word in item.partition("="))
        if not _label_key(key):
            raise BadValueError(f"{item!r} names no label key: write key=value or key")
        if equals and label_value and not _LABEL_NAME.fullmatch(label_value):
            raise BadValueError(f"{item!r} has no label value Kubernetes accepts")
        pairs.append((key, label_value if equals else None))
    return tuple(pairs)


def label_key(value: str) -> str:
    """A label key as Kubernetes writes it, or empty (none)."""
    key = value.strip()
    if key and not _label_key(key):
        raise BadValueError("is no label key (such as karpenter.k8s.aws/instance-gpu-memory)")
    return key


def default_identity() -> str:
    return f"{socket.gethostname()}_{os.getpid()}"


@declared
class Settings:
    """Everything the binder needs to know, validated."""

    kubeconfig: str | None = setting(
        "kubeconfig",
        "kubeconfig file; absent means in-cluster config",
        default=None,
        env="KUBECONFIG",
    )
    """Path of a kubeconfig file; None means the in-cluster service account. Default None."""
    listen_http: tuple[str, int] = setting(
        "listen-http",
        "host:port of /healthz, /readyz, /metrics",
        address,
        default=f"0.0.0.0:{DEFAULT_BINDER_HTTP_PORT}",
    )
    """Where /healthz, /readyz and /metrics listen, host and port. Default 0.0.0.0:9200."""
    keys: Keys = keys_flag()
    """The contract's keys, from --key-prefix. Default prefix tritonshare.io/."""
    system_namespace: str = setting(
        "system-namespace",
        "namespace of the agent and leader leases",
        text,
        default=DEFAULT_SYSTEM_NAMESPACE,
    )
    """Namespace of the agent leases and the leader lease. Default tritonshare-system."""
    scheduler_name: str = setting(
        "scheduler-name",
        "spec.schedulerName of the pods to schedule",
        text,
        default=DEFAULT_SCHEDULER_NAME,
    )
    """Pods with this spec.schedulerName are ours. Default tritonshare."""
    policy: Policy = setting("policy", "binpack or spread", one_of(*POLICIES), default="binpack")
    """`binpack` (a used GPU's tightest block before an empty GPU, the smallest empty one first,
    the largest GPU kind last: fills GPUs, keeps the largest free for big models) or `spread`.
    Default binpack."""
    placement_key_dir: Path | None = setting(
        "placement-key-dir",
        "directory of the placement-key Secret (files current and previous)",
        path,
        default=None,
        required="the binder signs every placement with the placement-key Secret, and agents "
        "refuse pods without that proof (docs/security.md)",
    )
    """Directory holding the placement keys (`current`, optionally `previous`: the mounted
    placement-key Secret) the binder signs each placement with. Required to run. Default none."""
    gpu_mem_reserve: int = setting(
        "gpu-mem-reserve",
        "bytes kept free on every GPU, a quantity such as 512Mi",
        quantity(),
        default="0",
    )
    """Bytes kept free on every GPU for the CUDA context and Triton (a quantity). Default 0."""
    min_gpu_mem: int = setting(
        "min-gpu-mem",
        "the least GPU memory a model pod or TritonModel replica may ask, a quantity",
        quantity(),
        default=DEFAULT_MIN_GPU_MEM,
    )
    """The least GPU memory a model may ask (a quantity): a model asking less is not placed, so
    a GPU-memory quota bounds a namespace's models. Default 64Mi."""
    gpu_mem_process_allowance: int = setting(
        "gpu-mem-process-allowance",
        "bytes booked beyond the request of a model that may run in a process of its own "
        "(Python backend: its CUDA context), a quantity",
        quantity(),
        default=f"{PROCESS_ALLOWANCE // 1024**2}Mi",
    )
    """Bytes booked on top of the GPU memory request of every model whose pod or TritonModel
    does not declare an in-process backend in `<prefix>backend` (`common.backends`): a Python
    model's stub process holds its own CUDA context. Default 640Mi."""
    tenant_code_namespaces: tuple[str, ...] = setting(
        "tenant-code-namespaces",
        "comma-separated namespaces allowed to run their own code in Triton: their model pods "
        "go only to nodes labelled <prefix>tenant-code=true, every other pod never does",
        names,
        default=(),
    )
    """Namespaces allowed to run their own code in Triton, the same list as the agents'
    --tenant-code-namespaces on the dedicated nodes: their model pods are placed only on nodes
    labelled `<prefix>tenant-code: "true"`, and the model pods of every other namespace never
    on such a node (docs/security.md, "Nodes dedicated to tenant code"). Default: none."""
    host_image: str = setting(
        "host-image",
        "image of the loader and the proxy in the model host pods the binder creates for "
        "TritonModels",
        text,
        default=f"ghcr.io/tritonshare/tritonshare:{VERSION}",
    )
    """Image of a model host's loader and proxy (the webhook's --image). Default the release's
    image."""
    agent_port: int = setting(
        "agent-port",
        "the agent's gRPC hostPort, written into model hosts",
        port(),
        default=str(DEFAULT_AGENT_GRPC_PORT),
    )
    """The agent's gRPC hostPort on every GPU node (the webhook's --agent-port). Default 8100."""
    triton_http_port: int = setting(
        "triton-http-port",
        "hostPort of the node gateway's REST side, written into model hosts",
        port(),
        default=str(DEFAULT_GATEWAY_HTTP_PORT),
    )
    """The node gateway's REST hostPort, a host proxy's way to Triton (the webhook's
    --triton-http-port). Default 8010."""
    triton_grpc_port: int = setting(
        "triton-grpc-port",
        "hostPort of the node gateway's gRPC side, written into model hosts",
        port(),
        default=str(DEFAULT_GATEWAY_GRPC_PORT),
    )
    """The node gateway's gRPC hostPort (the webhook's --triton-grpc-port). Default 8011."""
    audience: str = setting(
        "audience",
        "audience of a model host's projected token for the agent",
        text,
        default=DEFAULT_AGENT_AUDIENCE,
    )
    """Audience of a model host's projected token for the agent (the webhook's --audience).
    Default tritonshare-agent."""
    host_drain_seconds: float = setting(
        "host-drain-seconds",
        "seconds a replica leaving its model host may stay while it drains",
        seconds(),
        default="60",
    )
    """The longest a replica leaving a model host (scaled down) stays listed there as draining
    after the binder takes it out of its Service: it is removed, and its GPU memory freed, once
    the agent reports it no longer loaded there, or after this many seconds. Default 60."""
    identity: str = setting(
        "identity",
        "this replica's name in the leader lease (default hostname_pid)",
        default_factory=default_identity,
    )
    """This replica's name in the leader lease. Default hostname_pid (the pod name in a pod)."""
    leader_elect: bool = setting(
        "leader-elect", "true or false: take part in leader election", boolean, default="true"
    )
    """Take part in leader election; off means always act as leader (one replica). Default on."""
    lease_duration_seconds: float = setting(
        "lease-duration", "seconds a leader lease is valid", seconds(positive=True), default="15"
    )
    """Seconds a leader lease stays valid without renewal; followers take over after. Default 15."""
    renew_deadline_seconds: float = setting(
        "renew-deadline",
        "seconds the leader tries to renew before stepping down",
        seconds(positive=True),
        default="10",
    )
    """Seconds the leader keeps trying to renew before it steps down. Default 10."""
    retry_period_seconds: float = setting(
        "retry-period",
        "seconds between leader election attempts",
        seconds(positive=True),
        default="2",
    )
    """Seconds between two leader election attempts or renewals. Default 2."""
    backoff_initial_seconds: float = setting(
        "backoff-initial",
        "seconds before the first retry of an unschedulable pod",
        seconds(positive=True),
        default="1",
    )
    """Seconds before the first retry of an unschedulable pod; doubles per failure. Default 1."""
    backoff_max_seconds: float = setting(
        "backoff-max", "largest retry delay in seconds", seconds(positive=True), default="120"
    )
    """Seconds, the longest wait between two retries of an unschedulable pod. Default 120."""
    bind_workers: int = setting(
        "bind-workers", "binding API calls in flight at once", whole(minimum=1), default="8"
    )
    """API calls for binding in flight at once. Default 8."""
    scheduled_events_per_second: float = setting(
        "scheduled-events-per-second",
        "most Scheduled Events recorded a second on the pods bound (0: none)",
        number(),
        default="50",
    )
    """Most `Scheduled` Events ("Successfully assigned ns/pod to node, GPU i (uuid)") recorded a
    second, with a burst of twice as many, as kube-scheduler's client bounds its own
    (--kube-api-qps 50, --kube-api-burst 100); a pod bound while none is left gets none
    (`tritonshare_binder_scheduled_events_skipped_total`). 0 records none. Default 50."""
    consolidate_moves: int = setting(
        "consolidate-moves",
        "pods one plan may evict to give a pod waiting on split GPU memory one block "
        "(0: never evict)",
        whole(),
        default="0",
    )
    """Pods one plan may evict to make room for a pod that waits only because the free GPU
    memory of its nodes is split across GPUs (binder.framework.consolidation); 0 never evicts.
    Default 0: an eviction stops another team's serving model for a reload elsewhere."""
    preemption: bool = setting(
        "preemption",
        "true or false: evict lower-priority tritonshare pods for a pod that fits nowhere",
        boolean,
        default="true",
    )
    """Let a pending pod of higher spec.priority that fits nowhere have lower-priority
    tritonshare pods evicted (through the Eviction API) to make room, as kube-scheduler's
    DefaultPreemption does. Default on."""
    node_autoscaling: bool = setting(
        "node-autoscaling",
        "true or false: placeholder pods for models no node fits, and scale-down guards on "
        "nodes that serve models",
        boolean,
        default="false",
    )
    """Make a placeholder pod (default scheduler, PriorityClass tritonshare-placeholder) for
    models that fit no node, so Cluster Autoscaler or Karpenter adds one, and keep their
    scale-down annotations on nodes that serve models (binder.nodescaling). Needs RBAC on
    `patch` of nodes. Default off."""
    placeholder_image: str = setting(
        "placeholder-image",
        "image of the placeholder pods",
        text,
        default="registry.k8s.io/pause:3.10",
    )
    """The image of the placeholder pods (a pause container). Default registry.k8s.io/pause:3.10."""
    placeholder_node_selector: tuple[tuple[str, str | None], ...] = setting(
        "placeholder-node-selector",
        "labels a new node must have for a placeholder: key=value or key, comma-separated",
        label_requirements,
        default="nvidia.com/gpu.present=true",
    )
    """Labels a node must have for a placeholder to fit, beside the waiting model's own node
    rules: `key=value` or `key` (the label exists), comma-separated, so the node autoscaler adds
    a GPU node. Default nvidia.com/gpu.present=true (GPU feature discovery's label); on EKS
    with Karpenter `karpenter.k8s.aws/instance-gpu-count`, on GKE
    `cloud.google.com/gke-accelerator`; empty: none."""
    placeholder_gpu_memory_label: str = setting(
        "placeholder-gpu-memory-label",
        "the node label giving a GPU's memory in MiB, which a placeholder's node must have enough "
        "of (empty: none)",
        label_key,
        default="tritonshare.io/gpu-memory",
    )
    """The node label whose value is the memory of one of the node's GPUs in MiB (Karpenter's
    `karpenter.k8s.aws/instance-gpu-memory`, or this label set on a node group): a placeholder
    asks for a node where it is at least the largest request of the models it stands for plus
    `--gpu-mem-reserve`, or where it is absent (a node group not labelled). Default
    tritonshare.io/gpu-memory; empty: no GPU size asked."""
    placeholder_grace_seconds: float = setting(
        "placeholder-grace",
        "seconds models may still wait once a placeholder's node serves before another node is "
        "asked for",
        seconds(),
        default="120",
    )
    """Seconds models may still wait once each node their placeholders were bound to serves
    models before one more placeholder asks for another node. Default 120."""
    placeholder_pending_seconds: float = setting(
        "placeholder-pending-timeout",
        "seconds a placeholder may stay pending before its models ask for no node (0: never)",
        seconds(),
        default="900",
    )
    """Seconds a placeholder may stay pending (no node autoscaler added a node it fits) before
    its models are told that no node group matches them and ask for no node for 30 minutes.
    Default 900, Cluster Autoscaler's --max-node-provision-time."""
    node_group_gpu_mem: int = setting(
        "node-group-gpu-mem",
        "memory of the largest GPU a node group can add, a quantity (0: the cluster's nodes')",
        quantity(),
        default="0",
    )
    """The memory of the largest GPU any node group of the node autoscaler can add (a quantity
    such as 80Gi), for a model larger than every GPU of the cluster's nodes: a model that asks
    more than the largest of these, the reserve taken off, gets no placeholder. Node
    autoscalers publish no node group's GPUs through the API. Default 0: the largest GPU of the
    cluster's nodes bounds it (none: no model is refused for its size)."""
    agent_down_grace_seconds: float = setting(
        "agent-down-grace",
        "seconds a node's agent may be down before its model pods are deleted (0: never)",
        seconds(),
        default="300",
    )
    """Seconds a node's agent may stay down (its Lease expired) before the binder deletes the
    node's controller-owned model pods so their controllers replace them elsewhere; 0 turns the
    deletion off (the pods still get the condition and Event). Default 300, Kubernetes' own
    grace for an unreachable node and the gateway's --table-stale-grace, so the gateway stops
    serving the pods about when they are replaced."""
    agent_down_deletions_per_second: float = setting(
        "agent-down-deletions-per-second",
        "most model pods deleted per second for dead agents",
        seconds(positive=True),
        default="0.1",
    )
    """Most model pods deleted per second for dead agents, cluster-wide (a token bucket of 1),
    as kube-controller-manager's --node-eviction-rate, while the agents of more than 2 nodes and
    at least 55% of them are down at once; otherwise the floor of each node's rate
    (--agent-down-replace-seconds). Default 0.1."""
    agent_down_replace_seconds: float = setting(
        "agent-down-replace-seconds",
        "seconds past --agent-down-grace within which a node's model pods are all deleted for "
        "replacement, whatever their count (0: at --agent-down-deletions-per-second)",
        seconds(),
        default="60",
    )
    """Seconds past --agent-down-grace within which the controller-owned model pods of a node
    whose agent is down are all deleted for their controllers to replace: the node's deletion
    rate is its pods' count over this (at least --agent-down-deletions-per-second), so 80 pods
    go at 1.3 a second. Not while most agents are down at once (see
    --agent-down-deletions-per-second). 0: --agent-down-deletions-per-second alone. Default 60."""
    autoscale_period_seconds: float = setting(
        "autoscale-period",
        "seconds between two reads of the proxies' counts by the built-in autoscaler (0: off)",
        seconds(),
        default="1",
    )
    """Seconds between two reads of the model hosts' counts (`/autoscaling`) and decisions of
    the built-in autoscaler for TritonModels with spec.autoscaling (binder.autoscaler.loop); 0
    turns it off. Default 1, as often as Knative's autoscaler reads its pods."""
    inferenceservices: bool = setting(
        "inferenceservices",
        "true or false: serve ModelMesh-mode KServe InferenceServices as TritonModels",
        boolean,
        default="true",
    )
    """Serve KServe's ModelMesh-mode InferenceServices (serving.kserve.io) of namespaces
    labelled modelmesh-enabled=true as TritonModels (binder.inferenceservices). On, it does
    nothing while the API server serves no InferenceServices and looks again every 30 s.
    Default true."""
    gpu_memory_estimate: int = setting(
        "gpu-memory-estimate",
        "GPU memory a TritonModel or InferenceService that declares none is booked at until "
        "its files are measured, a quantity",
        quantity(minimum=64 << 20),
        default="1Gi",
    )
    """The first estimate of a model that declares no GPU memory (a TritonModel without
    spec.gpuMemory; an InferenceService without the tritonshare.io/gpu-memory annotation): its
    replicas are booked at it until one of its files has loaded and been measured, then at what
    it measured plus the margin (`binder.cluster.modelsizes`). A quantity of at least 64Mi.
    Default 1Gi."""
    gpu_memory_margin: float = setting(
        "gpu-memory-margin",
        "percent booked above a model's measured GPU memory when it declares none",
        number(minimum=0.0, below=1000.0),
        default="10",
    )
    """Percent of its measured GPU memory booked above it for a model that declares none (the
    larger of this and --gpu-memory-margin-min). Default 10."""
    gpu_memory_margin_min: int = setting(
        "gpu-memory-margin-min",
        "the least GPU memory booked above a model's measured GPU memory when it declares none, "
        "a quantity",
        quantity(),
        default="128Mi",
    )
    """The least booked above the measured GPU memory of a model that declares none (a
    quantity). Default 128Mi."""
    modelmesh_namespace_label: str = setting(
        "modelmesh-namespace-label",
        "the namespace label (value true) whose ModelMesh InferenceServices the binder serves",
        text,
        default="modelmesh-enabled",
    )
    """The namespace label, set to "true", that hands a namespace's ModelMesh-mode
    InferenceServices to the binder. ModelMesh's own (modelmesh-enabled) by default; another
    key (such as tritonshare.io/modelmesh) lets a namespace move while ModelMesh still serves
    the others (docs/modelmesh.md). Default modelmesh-enabled."""
    kserve_namespace: str = setting(
        "kserve-namespace",
        "KServe's namespace, where its inferenceservice-config ConfigMap is read",
        text,
        default="kserve",
    )
    """KServe's namespace: its inferenceservice-config ConfigMap (`deploy`'s
    defaultDeploymentMode) is read there when the system namespace has none. Default kserve."""
    watch_failure_grace_seconds: float = setting(
        "watch-failure-grace",
        "seconds a cache's watch may keep failing before /readyz reports not ready",
        seconds(positive=True),
        default="30",
    )
    """Seconds a cache's list or watch may keep failing (API server unreachable, 429, 5xx)
    before /readyz reports not ready; the cache keeps retrying either way. Default 30."""
    log_level: str = log_level_flag("DEBUG, INFO, WARNING or ERROR")
    """Log level name. Default INFO."""
    log_format: LogFormat = log_format_flag()
    """`text` for people, `json` for log pipelines. Default text."""


DECLARATION = Declaration.of(
    Settings,
    "python -m binder",
    "Schedule pods with schedulerName tritonshare onto a node and a GPU by GPU memory, with "
    "kube-scheduler's node rules.",
    error=SettingsError,
)


def parse_settings(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Settings:
    """Parse and check flags and environment; raise SettingsError saying what to fix."""
    settings = Settings(**DECLARATION.values(argv, os.environ if environ is None else environ))
    if not settings.retry_period_seconds < settings.renew_deadline_seconds:
        raise SettingsError("--retry-period must be shorter than --renew-deadline")
    if not settings.renew_deadline_seconds < settings.lease_duration_seconds:
        raise SettingsError(
            "--renew-deadline must be shorter than --lease-duration, or two replicas could both "
            "believe they lead"
        )
    return settings
