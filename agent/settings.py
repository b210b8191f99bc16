"""The agent's settings: one frozen object whose fields each declare their flag, variable, default
and help once with common.settings (`DECLARATION` and --help are derived from them), parsed once in
`agent.__main__`. A field's docstring, where it has one, says only what its --help line does not.

Everything else receives the object. Nothing here reads files or talks to anything.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agent.installs.modelconfig import (
    DEFAULT_MAX_INSTANCES,
    DEFAULT_MAX_QUEUE_SECONDS,
    DEFAULT_MAX_VERSIONS,
    DEFAULT_SAFE_BACKENDS,
)
from common.contract import (
    DEFAULT_AGENT_AUDIENCE,
    DEFAULT_AGENT_GRPC_PORT,
    DEFAULT_AGENT_HTTP_PORT,
    DEFAULT_MIN_GPU_MEM,
    DEFAULT_PREFIX,
    DEFAULT_SCHEDULER_NAME,
    DEFAULT_SYSTEM_NAMESPACE,
    Keys,
)
from common.settings import (
    BadValueError,
    Declaration,
    declared,
    host_port,
    log_format_flag,
    log_level_flag,
    names,
    number,
    one_of,
    path,
    quantity,
    seconds,
    setting,
    text,
    whole,
    whole_or_cpus,
)

DEFAULT_PLATFORM_ACCOUNTS = (
    f"system:serviceaccount:{DEFAULT_SYSTEM_NAMESPACE}:tritonshare-binder",
    f"system:serviceaccount:{DEFAULT_SYSTEM_NAMESPACE}:tritonshare-agent",
)


class SettingsError(ValueError):
    """A flag or variable with a value the agent cannot use; says which and what to write."""


def _admin_header(value: str) -> tuple[str, str]:
    name, sep, header_value = value.partition(":")
    if not sep or not name.strip():
        raise BadValueError("is not a header; write Name:value")
    return name.strip(), header_value.strip()


def _prefix(value: str) -> str:
    """The prefix as written, once the contract accepts it (a ContractError says why not)."""
    Keys(value)
    return value


# The GPU-memory flags the agent shares with its check (agent.gpucheck), which must read them as
# the agent does.


def gpu_mem_reserve_flag() -> Any:
    return setting(
        "gpu-mem-reserve",
        "bytes of every GPU kept for CUDA and Triton (a quantity)",
        quantity(),
        default="0",
    )


def gpu_source_flag() -> Any:
    return setting(
        "gpu-source",
        "where NVML is read: nvml (in the agent's own container) or triton (in Triton's, through "
        "the NVML relay's socket)",
        one_of("nvml", "triton"),
        default="nvml",
    )


def nvml_relay_socket_flag() -> Any:
    return setting(
        "nvml-relay-socket",
        "the NVML relay's Unix socket in Triton's container (with --gpu-source=triton)",
        path,
        default=Path("/run/tritonshare/nvml/nvml.sock"),
    )


def gpu_mem_enforcement_flag() -> Any:
    return setting(
        "gpu-mem-enforcement",
        "warn or evict a model using more GPU memory than it asked for (evict only where no "
        "other model could have caused the excess; otherwise warn)",
        one_of("warn", "evict"),
        default="warn",
    )


def gpu_mem_tolerance_flag() -> Any:
    return setting(
        "gpu-mem-tolerance",
        "fraction of the request a model may exceed it by (at least 256Mi)",
        number(minimum=0, below=10),
        default="0.05",
    )


@declared
class ConnectionSettings:
    """Where the agent runs and what it talks to: its node, Triton and its host memory, the model
    repository, its listeners and the names it goes by."""

    node_name: str = setting(
        "node-name",
        "this node's name",
        also_env=("NODE_NAME",),
        required="NODE_NAME comes from the Downward API's spec.nodeName",
    )
    model_repository: Path = setting(
        "model-repository",
        "Triton's model repository directory",
        path,
        required="Triton's model repository directory",
    )
    """Shared with the Triton container."""
    kubeconfig: str | None = setting(
        "kubeconfig",
        "kubeconfig file; default: in-cluster config",
        default=None,
        also_env=("KUBECONFIG",),
    )
    triton_http_url: str = setting(
        "triton-http-url", "Triton HTTP host:port", host_port, default="127.0.0.1:8000"
    )
    triton_grpc_url: str = setting(
        "triton-grpc-url",
        "Triton gRPC host:port, for loads and unloads",
        host_port,
        default="127.0.0.1:8001",
    )
    """Not HTTP: a load over HTTP holds every open HTTP connection to Triton, every tenant's REST
    inference among them, for as long as the load runs (`agent.triton`)."""
    triton_admin_header: tuple[str, str] | None = setting(
        "triton-admin-header",
        "Name:value header for Triton's restricted APIs",
        _admin_header,
        default=None,
    )
    """None: Triton's repository API is unrestricted."""
    triton_pid_file: Path | None = setting(
        "triton-pid-file",
        "file holding Triton's PID, in a PID namespace shared with the agent; unset: Triton's "
        "processes are not known",
        path,
        default=None,
    )
    """Triton's container writes it. Needed to measure Triton's host memory and to tell its GPU
    processes from others; None: neither is done."""
    gpu_source: str = gpu_source_flag()
    """`nvml`: the agent's container must see the GPUs (DRA's shared claim, or the environment
    variable). `triton`: the device plugin gave the GPUs to Triton's container, whose relay
    (`agent.gpus.relay`) the agent asks, so its own container needs no GPU."""
    nvml_relay_socket: Path = nvml_relay_socket_flag()
    """The node pod shares its directory."""
    triton_memory_limit: int = setting(
        "triton-memory-limit",
        "bytes Triton's container may use (its limits.memory, from the downward API); 0: its "
        "cgroup's memory.max where readable",
        quantity(),
        default="0",
    )
    """With 0 and no readable memory.max, loads are not admitted on host memory."""
    triton_memory_reserve: int = setting(
        "triton-memory-reserve",
        "bytes of Triton's memory limit kept free of models (requests in flight)",
        quantity(),
        default="1Gi",
    )
    """Room for requests in flight and Triton's own growth."""
    triton_memory_per_load: int = setting(
        "triton-memory-per-load",
        "host bytes a load is assumed to take until the same files were measured",
        quantity(),
        default="512Mi",
    )
    """At least the files' size: a backend's libraries and a Python backend's stub process come with
    the first load."""
    min_gpu_mem: int = setting(
        "min-gpu-mem",
        "the binder's --min-gpu-mem: a model host naming more replicas than the GPUs' memory "
        "over it serves none",
        quantity(),
        default=DEFAULT_MIN_GPU_MEM,
    )
    """The least GPU memory the binder places a model with."""
    triton_memory_floor: int = setting(
        "triton-memory-floor",
        "host bytes each loaded model is charged to its namespace at least",
        quantity(),
        default="64Mi",
    )
    """Whatever it was measured at: a model of one byte still takes Triton's memory."""
    triton_memory_namespace_percent: float = setting(
        "triton-memory-namespace-percent",
        "percent of Triton's memory limit less the reserve one namespace's models may hold",
        number(minimum=1, below=100.001),
        default="50",
    )
    """So that no namespace fills Triton before others load."""
    staging_dir: Path | None = setting(
        "staging-dir",
        "staging directory (same filesystem, outside the repository); default: "
        "<repository>/../.tritonshare-staging",
        path,
        default=None,
    )
    listen_grpc: str = setting(
        "listen-grpc", "gRPC API host:port", host_port, default=f"0.0.0.0:{DEFAULT_AGENT_GRPC_PORT}"
    )
    """Port 0: any free port, logged and written to --ports-file."""
    listen_http: str = setting(
        "listen-http",
        "health and metrics host:port",
        host_port,
        default=f"0.0.0.0:{DEFAULT_AGENT_HTTP_PORT}",
    )
    """Serves /healthz, /readyz and /metrics."""
    ports_file: Path | None = setting(
        "ports-file", "write the bound ports there as JSON once serving", path, default=None
    )
    """As {"grpc": "host:port", "http": "host:port"}."""
    cpu_only: bool = setting(
        "cpu-only", "run model instances on the CPU; NVML is optional", default=False, switch=True
    )
    """Model instances are KIND_CPU."""
    advertise_gpu_mem: bool = setting(
        "advertise-gpu-mem",
        "advertise <prefix>gpu-mem in the Node's status capacity",
        default=False,
        switch=True,
    )
    """As an extended resource."""
    key_prefix: str = setting(
        "key-prefix", "annotation and resource key prefix", _prefix, default=DEFAULT_PREFIX
    )
    system_namespace: str = setting(
        "system-namespace", "namespace of the agent Lease", text, default=DEFAULT_SYSTEM_NAMESPACE
    )
    scheduler_name: str = setting(
        "scheduler-name", "schedulerName of the pods served", text, default=DEFAULT_SCHEDULER_NAME
    )
    audience: str = setting(
        "audience", "audience of callers' tokens", text, default=DEFAULT_AGENT_AUDIENCE
    )
    """Their projected service-account tokens must carry it."""
    platform_accounts: tuple[str, ...] = setting(
        "platform-accounts",
        "comma-separated usernames allowed to list models and GPUs",
        names,
        default=",".join(DEFAULT_PLATFORM_ACCOUNTS),
    )
    """Each as system:serviceaccount:NS:NAME; the calls are ListModels, ListGpus and GetModel."""


@declared
class LoopSettings:
    """The agent's loops: how often it looks, how long loads, unloads and stops may take, and how
    Triton's exits are counted."""

    gpu_poll_seconds: float = setting(
        "gpu-poll-seconds", "seconds between NVML reads", seconds(positive=True), default="10"
    )
    lease_renew_seconds: float = setting(
        "lease-renew-seconds",
        "seconds between Lease renewals",
        seconds(positive=True),
        default="5",
    )
    """One write each; the default makes three per Lease duration, so one slow write does not let a
    live agent's Lease run out."""
    node_resync_seconds: float = setting(
        "node-resync-seconds", "seconds between rereads of the Node", seconds(), default="600"
    )
    """To repair annotations someone else changed."""
    resync_seconds: float = setting(
        "resync-seconds",
        "seconds between full reconciliations of Triton",
        seconds(positive=True),
        default="60",
    )
    """Besides the ones pod changes bring."""
    triton_poll_seconds: float = setting(
        "triton-poll-seconds",
        "seconds between Triton liveness checks",
        seconds(positive=True),
        default="2",
    )
    """A restart it finds brings a reconciliation."""
    orphan_grace_seconds: float = setting(
        "orphan-grace-seconds",
        "seconds a model without a pod is kept after its last install or load",
        seconds(),
        default="30",
    )
    unload_timeout_seconds: float = setting(
        "unload-timeout-seconds",
        "seconds to wait for an unloaded model to become UNAVAILABLE",
        seconds(),
        default="120",
    )
    crash_quarantine_after: int = setting(
        "crash-quarantine-after",
        "Triton exits in a row under a model's loads, or with a pod's requests at it, before "
        "the model or the pod is quarantined on the node",
        whole(minimum=1),
        default="3",
    )
    """Only unexpected exits count, and a pod's requests as the node gateway saw them. A quarantined
    model's files are never loaded on this node again, and a quarantined pod's requests are refused
    by the gateway, until an operator clears them."""
    crash_namespace_quarantine_after: int = setting(
        "crash-namespace-quarantine-after",
        "Triton exits under a namespace's loads past --crash-quarantine-after, in all its files, "
        "before the node loads no model of the namespace",
        whole(minimum=1),
        default="2",
    )
    """Every exit under one of a namespace's loads counts against it. Once one of its files is
    quarantined on this node, or at --crash-quarantine-after exits, its models load as suspects
    (last, alone, with a quiet period); at --crash-quarantine-after plus this many, none of them
    loads until an operator clears `NAMESPACE/*`."""
    crash_quarantine_expiry_seconds: float = setting(
        "crash-quarantine-expiry-seconds",
        "seconds after which a quarantine of a model's files on the node lapses (0: never)",
        seconds(),
        default="86400",
    )
    """It rests on this node's evidence alone: the files may load again, and one more crash in a row
    quarantines them again. A quarantine of a pod's requests does not lapse."""
    crash_probation_seconds: float = setting(
        "crash-probation-seconds",
        "seconds a pod present with others at an exit of Triton stays on probation",
        seconds(),
        default="600",
    )
    """Renewed by each such exit. The exit counts against none of them, and the gateway lets no two
    probationers' requests be at Triton at once, so the next exit names one alone."""
    crash_settle_seconds: float = setting(
        "crash-settle-seconds",
        "seconds after a load's READY during which Triton's exit still counts against it (0: off)",
        seconds(),
        default="60",
    )
    """A wake's READY too. Such an exit is one with no load in flight and no request at Triton (a
    model may kill Triton after loading: a timer, a thread, a leak); models under suspicion load
    again one at a time, each after the previous one's window. A reload of what Triton held before
    it restarted is not watched. Any exit in the window counts, a restart by the operator's hand
    too."""
    crash_hold_seconds: float = setting(
        "crash-hold-seconds",
        "seconds after a watched load ends during which the gateway holds probationers' "
        "requests (0: off)",
        seconds(),
        default="10",
    )
    """Also while a load or wake whose READY is watched (--crash-settle-seconds) is in flight; each
    new request is held 8 s at most (then it goes on), so that an exit of Triton then counts
    against the load alone. Each such load first waits, 8 s at most, for the gateway to have the
    held pods' requests at Triton answered and for them to have sent none for 2 s. A trial of
    files an exit was counted against alone holds every pod's requests, this long at most from
    its begin (after one that ended with Triton's exit: until Triton is back, within that bound)."""
    load_timeout_seconds: float = setting(
        "load-timeout-seconds",
        "seconds any Triton load may take (the cap of the per-load bound)",
        seconds(),
        default="600",
    )
    """A load's bound grows with the model's size (--load-timeout-base-seconds,
    --load-timeout-per-gib-seconds)."""
    load_timeout_base_seconds: float = setting(
        "load-timeout-base-seconds",
        "seconds a load may hold its GPU, plus --load-timeout-per-gib-seconds per GiB of files",
        seconds(positive=True),
        default="30",
    )
    """Past its bound a load is abandoned (unloaded, counted a failed load) and its GPU's slot
    passed on."""
    load_timeout_per_gib_seconds: float = setting(
        "load-timeout-per-gib-seconds",
        "seconds a load may hold its GPU per GiB of the model's files",
        seconds(),
        default="60",
    )
    """On top of --load-timeout-base-seconds, up to --load-timeout-seconds."""
    max_load_attempts: int = setting(
        "max-load-attempts",
        "failed loads in a row after which a model is not tried again (0: no bound)",
        whole(minimum=0),
        default="5",
    )
    """Refused or abandoned loads count; the model is tried again once its files are installed again
    or its pod is recreated."""
    parallel_loads: int = setting(
        "parallel-loads",
        "loads measured by their own processes (Python backend) that may run at once on one GPU",
        whole(minimum=1),
        default="8",
    )
    """Such loads (and wakes) are billed their processes' memory (NVML's per-process figures); other
    loads keep the GPU to themselves. Triton's `--model-load-thread-count` should be this times the
    node's GPUs (the chart sets both from `agent.parallelLoads`). Twelve such models created at
    once on an H200 were all Ready 1.91x one model's time at 8, 2.31x at 4 (docs/results.md)."""
    stop_drain_seconds: float = setting(
        "stop-drain-seconds",
        "on SIGTERM, the longest wait for this node's model hosts and pods to leave their Services",
        seconds(),
        default="10",
    )
    """SIGTERM: the node pod deleted or replaced. Before stopping, the agent marks every model host
    replica on the node not served (reason NodePodStopping) and tells the hosts' loaders the node
    stops (they list every model leaving: their proxies close their clients' connections after each
    answer); the model pods whose controller has a pod Ready on another node leave too (the
    gateway answers their readiness not ready: `agent.status.stopping`). It waits for the binder to
    take the hosts out of their Services and for those pods to turn unready, then
    --stop-unroute-seconds more. 0: no drain. SIGINT never drains. Triton and the gateway must
    outlive it (the chart's preStop pauses)."""
    pod_name: str = setting(
        "pod-name",
        "the node pod's own name (the downward API's metadata.name), in --system-namespace",
        text,
        default="",
    )
    """On SIGTERM the agent drains the node's hosts only if this pod is being deleted: the
    kubelet's restart of the agent's container alone leaves them served. Empty: every SIGTERM
    drains."""
    stop_unroute_seconds: float = setting(
        "stop-unroute-seconds",
        "on SIGTERM, seconds this node's hosts stay served after leaving their Services",
        seconds(),
        default="3",
    )
    """Requests routed before the Services' endpoints caught up are answered meanwhile."""
    load_backoff_max_seconds: float = setting(
        "load-backoff-max-seconds",
        "the longest wait before a failed load is tried again",
        seconds(positive=True),
        default="300",
    )
    """The wait starts at --resync-seconds and doubles per failure in a row."""
    token_cache_seconds: float = setting(
        "token-cache-seconds",
        "seconds a TokenReview answer is reused for the same token",
        seconds(),
        default="30",
    )
    """Never past the token's expiry."""
    lease_duration_seconds: int = setting(
        "lease-duration-seconds",
        "leaseDurationSeconds of the Lease",
        whole(minimum=1),
        default="15",
    )
    """The binder places nothing on a node whose agent has been dead that long, and fails the pods
    it had placed there that were never served."""


@declared
class Settings(LoopSettings, ConnectionSettings):
    """Everything the agent can be told: its connections and loops (the bases, whose fields come
    first in that order), then its files, bounds and limits."""

    placement_key_dir: Path | None = setting(
        "placement-key-dir",
        "directory of the placement-key Secret (files current, previous)",
        path,
        default=None,
        required="the agent acts only for pods whose placement the binder signed with the "
        "placement-key Secret, see docs/security.md",
    )
    """`previous` is optional."""
    state_dir: Path | None = setting(
        "state-dir",
        "where model ownership is kept (outside the repository); default: "
        "<repository>/../.tritonshare-state",
        path,
        default=None,
    )
    gateway_table: Path | None = setting(
        "gateway-table",
        "file the node gateway reads its callers from (shared with the gateway only); unset: "
        "no gateway",
        path,
        default=None,
    )
    crash_witness_file: Path | None = setting(
        "crash-witness-file",
        "file the node gateway records Triton's deaths in (read here); default: "
        "crash-witness.json beside --gateway-table",
        path,
        default=None,
    )
    """Which pods had requests at Triton when it died (`common.crashwitness`; the gateway's
    --crash-witness-file); read only with --gateway-table."""
    gateway_table_refresh_seconds: float = setting(
        "gateway-table-refresh-seconds",
        "seconds between rewrites of an unchanged caller table",
        seconds(positive=True),
        default="5",
    )
    """Past its --table-max-age the gateway serves only the last fresh table's callers, for its
    --table-stale-grace, then none."""
    activity_table: Path | None = setting(
        "activity-table",
        "file the node gateway writes its models' activity to; default: activity.json beside "
        "--gateway-table",
        path,
        default=None,
    )
    """Which models are serving (`common.activity`), read when idle on-demand models are put to
    sleep to make room; without it or --gateway-table, no model is ever evicted."""
    activity_max_age_seconds: float = setting(
        "activity-max-age-seconds",
        "seconds after which the gateway's activity table is stale and nothing is evicted",
        seconds(positive=True),
        default="5",
    )
    evict_min_idle_seconds: float = setting(
        "evict-min-idle-seconds",
        "seconds an on-demand model must have been idle before it may be evicted",
        seconds(),
        default="2",
    )
    """Idle: it began or ended no request, and did not load, in that time."""
    tenant_code_namespaces: tuple[str, ...] = setting(
        "tenant-code-namespaces",
        "comma-separated namespaces allowed to run their own code in Triton (python, custom "
        "backends)",
        names,
        default=(),
    )
    """Their own code: python and custom backends, backend or op libraries shipped with the
    model."""
    safe_backends: tuple[str, ...] = setting(
        "safe-backends",
        "comma-separated backends whose models cannot reach beyond themselves (see "
        "docs/agent.md before adding one: pytorch, tensorflow and openvino graphs read files)",
        names,
        default=",".join(DEFAULT_SAFE_BACKENDS),
    )
    """Allowed for every namespace."""
    max_model_bytes: int = setting(
        "max-model-bytes",
        "largest model one pod may install (a quantity)",
        quantity(minimum=1),
        default="64Gi",
    )
    max_model_instances: int = setting(
        "max-model-instances",
        "most instances one model's config may ask Triton for (instance_group counts summed)",
        whole(minimum=1),
        default=str(DEFAULT_MAX_INSTANCES),
    )
    """Each is a session of the backend in the shared Triton, with its own threads and memory."""
    max_model_queue_seconds: float = setting(
        "max-model-queue-seconds",
        "longest a model's batchers may keep a request or an idle sequence; a config asking more "
        "is loaded with this",
        seconds(positive=True),
        default=str(DEFAULT_MAX_QUEUE_SECONDS),
    )
    """Bounds `dynamic_batching.max_queue_delay_microseconds`, the sequence batcher's
    `max_queue_delay_microseconds` and `max_sequence_idle_microseconds`, and every queue policy's
    `default_timeout_microseconds` in the load's config override: Triton's unload of a model
    waits for the requests its batchers hold, so an unload (its GPU's queue, its memory) ends
    within about this. The pod gets a Warning Event (ModelQueueBounded) naming each value
    lowered."""
    max_model_versions: int = setting(
        "max-model-versions",
        "most version directories one model may have",
        whole(minimum=1),
        default=str(DEFAULT_MAX_VERSIONS),
    )
    """Refused at install and at load. Triton loads each version its `version_policy` selects with
    all of the config's instances and warmup runs, so those bounds count once per selected
    version."""
    max_load_data_bytes: int = setting(
        "max-load-data-bytes",
        "most bytes of data one model's config may make Triton allocate when it loads it: "
        "warmup samples and initial sequence states (a quantity)",
        quantity(minimum=1),
        default="64Mi",
    )
    """Every input of every warmup sample times its batch size, and every initial sequence state
    (held while the model is loaded); also the most of any such data file."""
    max_model_threads: int = setting(
        "max-model-threads",
        "most threads one thread-count parameter of a model's config may ask its backend for "
        "per instance (intra_op_thread_count and the like); auto = the node's CPUs, 0 = no bound",
        whole_or_cpus,
        default="auto",
    )
    """The parameters: onnxruntime's `intra_op_thread_count` and `inter_op_thread_count`, PyTorch's
    and OpenVINO's the like. Each instance's session starts that many threads in the shared Triton,
    so a model could otherwise start `instances x any number` of them; more threads than cores only
    contend. A config past it, or with a thread count that is not a whole number, is refused at
    install and load."""
    gpu_mem_reserve: int = gpu_mem_reserve_flag()
    """The same value as the binder's --gpu-mem-reserve."""
    gpu_mem_enforcement: str = gpu_mem_enforcement_flag()
    """Over: above its request plus --gpu-mem-tolerance. `warn` is an Event and a metric; `evict`
    also unloads the model and marks its pod Failed, where the excess is beyond its figure's
    uncertainty."""
    gpu_mem_tolerance: float = gpu_mem_tolerance_flag()
    usage_publish_seconds: float = setting(
        "usage-publish-seconds",
        "shortest time between two gpu-usage annotation writes",
        seconds(),
        default="60",
    )
    install_deadline_seconds: float = setting(
        "install-deadline-seconds",
        "seconds one install may take",
        seconds(positive=True),
        default="1800",
    )
    install_idle_seconds: float = setting(
        "install-idle-seconds",
        "seconds an install may send nothing",
        seconds(positive=True),
        default="120",
    )
    install_first_chunk_seconds: float = setting(
        "install-first-chunk-seconds",
        "seconds an install may take from its header to its first chunk",
        seconds(positive=True),
        default="10",
    )
    max_calls_per_pod: int = setting(
        "max-calls-per-pod",
        "calls one pod may have in progress at once",
        whole(minimum=1),
        default="8",
    )
    """More are refused RESOURCE_EXHAUSTED."""
    max_calls_per_namespace: int = setting(
        "max-calls-per-namespace",
        "calls the pods of one namespace may have in progress at once",
        whole(minimum=1),
        default="16",
    )
    max_calls: int = setting(
        "max-calls",
        "calls the agent serves at once (its memory bound, see docs/agent.md)",
        whole(minimum=1),
        default="32",
    )
    """Authenticating ones included; more are refused UNAVAILABLE before any message of theirs is
    read."""
    max_install_bytes_per_namespace: int = setting(
        "max-install-bytes-per-namespace",
        "bytes the installs in progress of one namespace may have written (a quantity)",
        quantity(minimum=1),
        default="64Gi",
    )
    """Counted as they arrive, never as declared."""
    model_cache_bytes: int = setting(
        "model-cache-bytes",
        "bytes of model files the node keeps after their last pod leaves (a quantity; 0: none)",
        quantity(),
        default="16Gi",
    )
    """Kept for the next replica of the same namespace and revision, over all namespaces, evicted
    least recently used."""
    model_cache_dir: Path | None = setting(
        "model-cache-dir",
        "where kept model files live (same filesystem, outside the repository); default: "
        "<repository>/../.tritonshare-kept",
        path,
        default=None,
    )
    max_installed_bytes_per_namespace: int = setting(
        "max-installed-bytes-per-namespace",
        "bytes one namespace's models may hold on the node's disk, installed, kept and being "
        "installed (a quantity; 0: half the repository volume)",
        quantity(),
        default="0",
    )
    """The volume's size is read at start; so no namespace can fill the disk others install on."""
    auth_failure_cache_seconds: float = setting(
        "auth-failure-cache-seconds",
        "seconds a refused token is refused without a new TokenReview",
        seconds(),
        default="5",
    )
    idle_connection_seconds: float = setting(
        "idle-connection-seconds",
        "seconds a gRPC connection with no call in progress is kept open",
        seconds(),
        default="120",
    )
    """Then the agent ends it (GOAWAY): grpc's server has no bound on connections, and each idle one
    holds about 15 KiB for ever, so a tenant's source ports could otherwise pass the agent's memory
    limit. Clients reconnect on their next call."""
    log_level: str = log_level_flag()
    log_format: str = log_format_flag()

    @property
    def keys(self) -> Keys:
        return Keys(self.key_prefix)

    @property
    def activity_path(self) -> Path | None:
        """The activity table's file: `activity_table`, else beside the caller table."""
        if self.activity_table is not None:
            return self.activity_table
        return self.gateway_table.parent / "activity.json" if self.gateway_table else None


DECLARATION = Declaration.of(
    Settings,
    "python -m agent",
    "tritonshare agent: GPUs on the Node, and the owner of Triton's repository.",
    error=SettingsError,
)


def parse_settings(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Settings from flags, falling back to environment variables, then to the defaults."""
    settings = Settings(
        **DECLARATION.values(
            sys.argv[1:] if argv is None else argv, os.environ if environ is None else environ
        )
    )
    if settings.lease_renew_seconds >= settings.lease_duration_seconds:
        raise SettingsError(
            "--lease-renew-seconds must be shorter than --lease-duration-seconds, or the Lease "
            "expires between renewals"
        )
    return settings
