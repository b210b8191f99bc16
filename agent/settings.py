"""The agent's settings: one frozen object, from flags and `TRITONSHARE_<FLAG>` variables.

Parsed once, in `agent.__main__`; everything else receives the object. Nothing here reads files
or talks to anything.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.modelconfig import DEFAULT_SAFE_BACKENDS
from common.contract import (
    DEFAULT_AGENT_AUDIENCE,
    DEFAULT_AGENT_GRPC_PORT,
    DEFAULT_AGENT_HTTP_PORT,
    DEFAULT_PREFIX,
    DEFAULT_SCHEDULER_NAME,
    DEFAULT_SYSTEM_NAMESPACE,
    ContractError,
    Keys,
)
from common.flags import described, env_name
from common.quantity import QuantityError, parse_quantity

DEFAULT_PLATFORM_ACCOUNTS = (
    f"system:serviceaccount:{DEFAULT_SYSTEM_NAMESPACE}:tritonshare-binder",
    f"system:serviceaccount:{DEFAULT_SYSTEM_NAMESPACE}:tritonshare-agent",
)


class SettingsError(ValueError):
    """A flag or variable with a value the agent cannot use; says which and what to write."""


@dataclass(frozen=True)
class Settings:
    """Everything the agent can be told."""

    node_name: str
    """Name of the Node this agent serves (the Downward API's spec.nodeName). Required."""
    model_repository: Path
    """Triton's model repository directory, shared with the Triton container. Required."""
    kubeconfig: str | None = None
    """Path of a kubeconfig file; None: in-cluster config. Env KUBECONFIG."""
    triton_http_url: str = "127.0.0.1:8000"
    """Triton's HTTP endpoint, host:port."""
    triton_admin_header: tuple[str, str] | None = None
    """Header "Name:value" for Triton's restricted repository API; None when unrestricted."""
    staging_dir: Path | None = None
    """Where installs are staged; same filesystem, outside the repository. Default:
    <repository>/../.tritonshare-staging."""
    listen_grpc: str = f"0.0.0.0:{DEFAULT_AGENT_GRPC_PORT}"
    """host:port of the agent gRPC API (port 0: any free port, logged and in --ports-file)."""
    listen_http: str = f"0.0.0.0:{DEFAULT_AGENT_HTTP_PORT}"
    """host:port of /healthz, /readyz and /metrics."""
    ports_file: Path | None = None
    """If set, the agent writes {"grpc": "host:port", "http": "host:port"} there once serving."""
    cpu_only: bool = False
    """Run model instances on the CPU (KIND_CPU) and accept a node without NVML."""
    advertise_gpu_mem: bool = False
    """Also advertise <prefix>gpu-mem as an extended resource in the Node's status capacity."""
    key_prefix: str = DEFAULT_PREFIX
    """Prefix of every annotation and resource key."""
    system_namespace: str = DEFAULT_SYSTEM_NAMESPACE
    """Namespace of the agent's Lease."""
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    """schedulerName of the pods this agent serves."""
    audience: str = DEFAULT_AGENT_AUDIENCE
    """Audience callers' projected tokens must carry."""
    platform_accounts: tuple[str, ...] = DEFAULT_PLATFORM_ACCOUNTS
    """Usernames (system:serviceaccount:NS:NAME) allowed to call ListModels, ListGpus, GetModel."""
    gpu_poll_seconds: float = 10.0
    """Seconds between NVML reads."""
    lease_duration_seconds: int = 60
    """leaseDurationSeconds written on the agent's Lease."""
    lease_renew_seconds: float = 20.0
    """Seconds between Lease renewals (one write each)."""
    node_resync_seconds: float = 600.0
    """Seconds between rereads of the Node to repair annotations someone else changed."""
    resync_seconds: float = 60.0
    """Seconds between full reconciliations of Triton with the pods (besides pod changes)."""
    triton_poll_seconds: float = 2.0
    """Seconds between Triton liveness checks (a restart triggers a reconciliation)."""
    orphan_grace_seconds: float = 30.0
    """Seconds a model without a pod is kept after its last install/load before removal."""
    unload_timeout_seconds: float = 120.0
    """Seconds to wait for Triton to report an unloaded model UNAVAILABLE."""
    load_timeout_seconds: float = 600.0
    """Seconds a Triton load may take."""
    token_cache_seconds: float = 30.0
    """Seconds a TokenReview answer is reused for the same token (never past its expiry)."""
    auth_failure_cache_seconds: float = 5.0
    """Seconds a refused token is refused again without asking TokenReview."""
    placement_key_dir: Path | None = None
    """Directory of the placement-key Secret (files `current`, optionally `previous`) that
    proves the binder's placements. Required."""
    state_dir: Path | None = None
    """Where the agent keeps who owns each model id (outside the repository). Default:
    <repository>/../.tritonshare-state."""
    gateway_table: Path | None = None
    """Where the agent writes the node gateway's caller table (a volume shared with the gateway
    only); None: no gateway on this node."""
    gateway_table_refresh_seconds: float = 5.0
    """Seconds between rewrites of the caller table when nothing changed (the gateway treats a
    table older than its --table-max-age as empty)."""
    tenant_code_namespaces: tuple[str, ...] = ()
    """Namespaces whose models may run their own code in the shared Triton (python and custom
    backends, backend or op libraries shipped with the model). Default: none."""
    safe_backends: tuple[str, ...] = DEFAULT_SAFE_BACKENDS
    """Backends that run no tenant code, allowed for every namespace."""
    max_model_bytes: int = 64 * 1024**3
    """Largest model one pod may install, bytes (a quantity such as 64Gi)."""
    install_deadline_seconds: float = 1800.0
    """Seconds one install stream may take in total."""
    install_idle_seconds: float = 120.0
    """Seconds an install stream may go without sending a chunk."""
    max_calls_per_pod: int = 8
    """Calls one pod may have in progress at once (more are refused: RESOURCE_EXHAUSTED)."""
    gpu_mem_reserve: int = 0
    """Bytes of every GPU kept for the CUDA contexts and Triton itself (a quantity); the same
    value as the binder's --gpu-mem-reserve."""
    gpu_mem_enforcement: str = "warn"
    """What happens to a model measured above its request plus the tolerance: `warn` (an Event
    and a metric) or `evict` (also unloaded, and its pod marked Failed)."""
    gpu_mem_tolerance: float = 0.05
    """Fraction of the request a model may use beyond it before it is over (at least 256Mi)."""
    usage_publish_seconds: float = 60.0
    """Shortest time between two writes of the node's gpu-usage annotation."""
    log_level: str = "INFO"
    """Log level."""
    log_format: str = "text"
    """Log format: text or json."""

    @property
    def keys(self) -> Keys:
        return Keys(self.key_prefix)


def _env(environ: Mapping[str, str], flag: str) -> str | None:
    return environ.get("TRITONSHARE_" + flag.upper().replace("-", "_"))


def _host_port(value: str, flag: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise SettingsError(f"--{flag} {value!r} is not host:port (for example 127.0.0.1:8100)")
    return value


def _names(value: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in str(value).split(",") if name.strip())


def parse_settings(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Settings from flags, falling back to environment variables, then to the defaults."""
    env = dict(os.environ if environ is None else environ)
    defaults = Settings(node_name="", model_repository=Path())
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="python -m agent",
        description="tritonshare agent: GPUs on the Node, and the owner of Triton's repository.",
    )

    def add(flag: str, default: object, help_text: str, **kwargs: Any) -> None:
        value = _env(env, flag)
        parser.add_argument(
            f"--{flag}",
            default=value if value is not None else default,
            help=described(help_text, default, env_name(flag)),
            **kwargs,
        )

    def add_flag(flag: str, help_text: str) -> None:
        value = (_env(env, flag) or "").lower() in ("1", "true", "yes")
        help_text = described(f"{help_text}; off unless given", None, env_name(flag))
        parser.add_argument(f"--{flag}", action="store_true", default=value, help=help_text)

    add("node-name", env.get("NODE_NAME"), "this node's name (required)")
    add("model-repository", None, "Triton's model repository directory (required)")
    add("kubeconfig", env.get("KUBECONFIG"), "kubeconfig file; default: in-cluster config")
    add("triton-http-url", defaults.triton_http_url, "Triton HTTP host:port")
    add("triton-admin-header", None, "Name:value header for Triton's restricted APIs")
    add("staging-dir", None, "staging directory (same filesystem, outside the repository)")
    add("listen-grpc", defaults.listen_grpc, "gRPC API host:port")
    add("listen-http", defaults.listen_http, "health and metrics host:port")
    add("ports-file", None, "write the bound ports there as JSON once serving")
    add_flag("cpu-only", "run model instances on the CPU; NVML is optional")
    add_flag("advertise-gpu-mem", "advertise <prefix>gpu-mem in the Node's status capacity")
    add("key-prefix", defaults.key_prefix, "annotation and resource key prefix")
    add("system-namespace", defaults.system_namespace, "namespace of the agent Lease")
    add("scheduler-name", defaults.scheduler_name, "schedulerName of the pods served")
    add("audience", defaults.audience, "audience of callers' tokens")
    add(
        "platform-accounts",
        ",".join(defaults.platform_accounts),
        "comma-separated usernames allowed to list models and GPUs",
    )
    for name in (
        "gpu_poll_seconds",
        "lease_renew_seconds",
        "node_resync_seconds",
        "resync_seconds",
        "triton_poll_seconds",
        "orphan_grace_seconds",
        "unload_timeout_seconds",
        "load_timeout_seconds",
        "token_cache_seconds",
    ):
        add(name.replace("_", "-"), getattr(defaults, name), f"{name} (seconds)", type=float)
    add("lease-duration-seconds", defaults.lease_duration_seconds, "Lease duration", type=int)
    add(
        "placement-key-dir",
        None,
        "directory of the placement-key Secret (files current, previous); required",
    )
    add("state-dir", None, "where model ownership is kept (outside the repository)")
    add(
        "gateway-table",
        None,
        "file the node gateway reads its callers from (shared with the gateway only); unset: "
        "no gateway",
    )
    add(
        "gateway-table-refresh-seconds",
        defaults.gateway_table_refresh_seconds,
        "seconds between rewrites of an unchanged caller table",
        type=float,
    )
    add(
        "tenant-code-namespaces",
        "",
        "comma-separated namespaces allowed to run their own code in Triton (python, custom "
        "backends)",
    )
    add(
        "safe-backends",
        ",".join(defaults.safe_backends),
        "comma-separated backends that run no tenant code",
    )
    add("max-model-bytes", "64Gi", "largest model one pod may install (a quantity)")
    add("gpu-mem-reserve", "0", "bytes of every GPU kept for CUDA and Triton (a quantity)")
    add(
        "gpu-mem-enforcement",
        defaults.gpu_mem_enforcement,
        "warn or evict a model using more GPU memory than it asked for",
        choices=("warn", "evict"),
    )
    add(
        "gpu-mem-tolerance",
        defaults.gpu_mem_tolerance,
        "fraction of the request a model may exceed it by (at least 256Mi)",
        type=float,
    )
    add(
        "usage-publish-seconds",
        defaults.usage_publish_seconds,
        "shortest time between two gpu-usage annotation writes",
        type=float,
    )
    add(
        "install-deadline-seconds",
        defaults.install_deadline_seconds,
        "seconds one install may take",
        type=float,
    )
    add(
        "install-idle-seconds",
        defaults.install_idle_seconds,
        "seconds an install may send nothing",
        type=float,
    )
    add(
        "max-calls-per-pod",
        defaults.max_calls_per_pod,
        "calls one pod may have in progress at once",
        type=int,
    )
    add(
        "auth-failure-cache-seconds",
        defaults.auth_failure_cache_seconds,
        "seconds a refused token is refused without a new TokenReview",
        type=float,
    )
    add("log-level", defaults.log_level, "log level")
    add("log-format", defaults.log_format, "text or json", choices=("text", "json"))
    args = parser.parse_args(argv)

    if not args.node_name:
        raise SettingsError("--node-name is required (or NODE_NAME from the Downward API)")
    if not args.model_repository:
        raise SettingsError("--model-repository is required: Triton's model repository directory")
    admin_header = None
    if args.triton_admin_header:
        name, sep, value = str(args.triton_admin_header).partition(":")
        if not sep or not name:
            raise SettingsError("--triton-admin-header must be Name:value")
        admin_header = (name.strip(), value.strip())
    try:
        Keys(args.key_prefix)
    except ContractError as e:
        raise SettingsError(str(e)) from e
    for name in (
        "gpu_poll_seconds",
        "lease_renew_seconds",
        "resync_seconds",
        "triton_poll_seconds",
    ):
        if getattr(args, name) <= 0:
            raise SettingsError(f"--{name.replace('_', '-')} must be more than 0")
    if not args.placement_key_dir:
        raise SettingsError(
            "--placement-key-dir is required: the agent acts only for pods whose placement the "
            "binder signed with the placement-key Secret (see docs/security.md)"
        )
    try:
        max_model_bytes = parse_quantity(str(args.max_model_bytes), what="--max-model-bytes")
    except QuantityError as e:
        raise SettingsError(str(e)) from e
    if max_model_bytes <= 0:
        raise SettingsError("--max-model-bytes must be more than 0")
    try:
        reserve = parse_quantity(str(args.gpu_mem_reserve), what="--gpu-mem-reserve")
    except QuantityError as e:
        raise SettingsError(str(e)) from e
    if not 0 <= args.gpu_mem_tolerance < 10:
        raise SettingsError("--gpu-mem-tolerance is a fraction of the request, such as 0.05")
    if args.max_calls_per_pod < 1:
        raise SettingsError("--max-calls-per-pod must be 1 or more")
    for name in ("install_deadline_seconds", "install_idle_seconds"):
        if getattr(args, name) <= 0:
            raise SettingsError(f"--{name.replace('_', '-')} must be more than 0")
    if args.lease_renew_seconds >= args.lease_duration_seconds:
        raise SettingsError(
            "--lease-renew-seconds must be shorter than --lease-duration-seconds, or the Lease "
            "expires between renewals"
        )
    return Settings(
        node_name=args.node_name,
        model_repository=Path(args.model_repository),
        kubeconfig=args.kubeconfig or None,
        triton_http_url=args.triton_http_url,
        triton_admin_header=admin_header,
        staging_dir=Path(args.staging_dir) if args.staging_dir else None,
        listen_grpc=_host_port(args.listen_grpc, "listen-grpc"),
        listen_http=_host_port(args.listen_http, "listen-http"),
        ports_file=Path(args.ports_file) if args.ports_file else None,
        cpu_only=bool(args.cpu_only),
        advertise_gpu_mem=bool(args.advertise_gpu_mem),
        key_prefix=args.key_prefix,
        system_namespace=args.system_namespace,
        scheduler_name=args.scheduler_name,
        audience=args.audience,
        platform_accounts=tuple(a.strip() for a in args.platform_accounts.split(",") if a.strip()),
        gpu_poll_seconds=args.gpu_poll_seconds,
        lease_duration_seconds=args.lease_duration_seconds,
        lease_renew_seconds=args.lease_renew_seconds,
        node_resync_seconds=args.node_resync_seconds,
        resync_seconds=args.resync_seconds,
        triton_poll_seconds=args.triton_poll_seconds,
        orphan_grace_seconds=args.orphan_grace_seconds,
        unload_timeout_seconds=args.unload_timeout_seconds,
        load_timeout_seconds=args.load_timeout_seconds,
        token_cache_seconds=args.token_cache_seconds,
        auth_failure_cache_seconds=args.auth_failure_cache_seconds,
        placement_key_dir=Path(args.placement_key_dir),
        state_dir=Path(args.state_dir) if args.state_dir else None,
        gateway_table=Path(args.gateway_table) if args.gateway_table else None,
        gateway_table_refresh_seconds=args.gateway_table_refresh_seconds,
        tenant_code_namespaces=_names(args.tenant_code_namespaces),
        safe_backends=_names(args.safe_backends),
        max_model_bytes=max_model_bytes,
        install_deadline_seconds=args.install_deadline_seconds,
        install_idle_seconds=args.install_idle_seconds,
        max_calls_per_pod=args.max_calls_per_pod,
        gpu_mem_reserve=reserve,
        gpu_mem_enforcement=args.gpu_mem_enforcement,
        gpu_mem_tolerance=args.gpu_mem_tolerance,
        usage_publish_seconds=args.usage_publish_seconds,
        log_level=args.log_level,
        log_format=args.log_format,
    )
