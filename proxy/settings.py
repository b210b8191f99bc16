"""The proxy's settings: one frozen object, parsed once in `__main__` from flags and env vars.

Every flag has an environment variable `TRITONSHARE_<FLAG_UPPER>` (dashes become underscores);
a flag on the command line wins over the variable. Nothing here reads the environment at import.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from common.contract import (
    DEFAULT_PREFIX,
    DEFAULT_PROXY_GRPC_PORT,
    DEFAULT_PROXY_HTTP_PORT,
    DEFAULT_PROXY_METRICS_PORT,
    DEFAULT_SYSTEM_NAMESPACE,
    ContractError,
    validate_model_id,
)
from common.flags import described
from common.quantity import QuantityError, parse_quantity

ONE_GIB = 1024**3


@dataclass(frozen=True)
class Settings:
    """Everything the proxy needs to run; see `parse_settings` for the flag of each field."""

    model_id: str
    """The pod's own Triton model name; the only model the proxy lets requests reach."""
    triton_http_url: str
    """host:port of the node's Triton HTTP endpoint (no scheme)."""
    triton_grpc_url: str
    """host:port of the node's Triton gRPC endpoint."""
    source_address: str = ""
    """The local address connections to Triton (the node gateway) leave from; empty: the
    kernel's choice, which in a pod is the pod's address. The simulated cluster, whose pods share
    the host's network, sets each pod's own address here so the gateway can tell them apart."""
    listen_http: tuple[str, int] = ("0.0.0.0", DEFAULT_PROXY_HTTP_PORT)
    """host and port the tenant-facing KServe v2 REST endpoint listens on; default 0.0.0.0:9000."""
    listen_grpc: tuple[str, int] = ("0.0.0.0", DEFAULT_PROXY_GRPC_PORT)
    """host and port the tenant-facing gRPC endpoint listens on; default 0.0.0.0:9001."""
    listen_metrics: tuple[str, int] = ("0.0.0.0", DEFAULT_PROXY_METRICS_PORT)
    """host and port of /metrics, /healthz and /readyz, kept off the Service port; default 9002."""
    max_body_bytes: int = ONE_GIB
    """Largest REST body and gRPC message accepted and returned, in bytes; default 1 GiB."""
    container_concurrency: int = 0
    """Hard limit on in-flight inference requests (streams count once); 0 means unlimited."""
    queue_size: int | None = None
    """Inference requests allowed to wait for a slot; None means 10x the concurrency limit."""
    queue_timeout_seconds: float = 30.0
    """Seconds a request may wait for a slot before it is refused with 503/RESOURCE_EXHAUSTED."""
    drain_seconds: float = 5.0
    """Seconds to keep serving after SIGTERM while reporting not ready (endpoints update)."""
    finish_timeout_seconds: float = 20.0
    """Seconds to wait for in-flight requests after the drain period before giving up on them."""
    head_timeout_seconds: float = 30.0
    """Seconds a REST client may take to send a request's head once it has begun (a slower one is
    answered 408 and closed), and a gRPC client to send the HTTP/2 connection preface (else the
    connection closes), so slow senders cannot hold connections open (slowloris)."""
    idle_timeout_seconds: float = 300.0
    """Seconds a tenant connection may stay open with no request or call in progress before it is
    closed (gRPC with GOAWAY, so clients reconnect on their next call); 0 keeps it forever."""
    concurrency_window_seconds: float = 60.0
    """Window of the time-weighted average concurrency gauge, in seconds (Knative uses 60)."""
    agent_address: str = ""
    """host:port of the node's agent gRPC API; empty means do not ask for an unload on exit."""
    token_file: Path | None = None
    """The pod's projected service-account token (audience tritonshare-agent), read per call."""
    agent_timeout_seconds: float = 30.0
    """Seconds to wait for the agent to unload the model on shutdown."""
    grpc_mode: str = "relay"
    """`relay` (default): the HTTP/2 frame relay (`proxy/grpc/relay.py`); `grpcio`: grpc.aio."""
    log_level: str = "INFO"
    """Root log level."""
    log_format: str = "text"
    """`text` for people, `json` for log pipelines."""
    key_prefix: str = DEFAULT_PREFIX
    """Contract key prefix (accepted for symmetry with the other parts; the proxy uses none)."""
    system_namespace: str = DEFAULT_SYSTEM_NAMESPACE
    """Namespace of the platform's components (accepted for symmetry with the other parts)."""

    @property
    def queue_limit(self) -> int:
        """How many requests may wait; 0 when there is no concurrency limit (nothing waits)."""
        if self.container_concurrency == 0:
            return 0
        if self.queue_size is None:
            return 10 * self.container_concurrency
        return self.queue_size


class SettingsError(ValueError):
    """A flag or environment variable has a value the proxy cannot use."""


def listen_address(value: str, what: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise SettingsError(f"{what}: {value!r} is not host:port; write for example 0.0.0.0:9000")
    return (host or "0.0.0.0", int(port))


def upstream_address(value: str, what: str) -> str:
    if "://" in value:
        raise SettingsError(f"{what}: {value!r} has a scheme; write only host:port")
    listen_address(value, what)
    return value


def parse_settings(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Settings:
    """Read the flags (and `TRITONSHARE_*` variables) into Settings, or raise SettingsError."""
    env = os.environ if env is None else env
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="python -m proxy",
        description="Per-model KServe v2 REST and gRPC front door to the node's shared Triton.",
    )

    def flag(name: str, help_text: str, default: str | None = None) -> None:
        variable = "TRITONSHARE_" + name.upper().replace("-", "_")
        parser.add_argument(
            f"--{name}",
            default=env.get(variable, default),
            help=described(help_text, default, variable),
        )

    flag("model-id", "the pod's own Triton model name")
    flag("triton-http-url", "host:port of the node's Triton HTTP endpoint")
    flag("triton-grpc-url", "host:port of the node's Triton gRPC endpoint")
    flag(
        "source-address",
        "local address of connections to Triton or the node gateway (empty: the pod's own)",
        "",
    )
    flag("listen-http", "REST listen address", f"0.0.0.0:{DEFAULT_PROXY_HTTP_PORT}")
    flag("listen-grpc", "gRPC listen address", f"0.0.0.0:{DEFAULT_PROXY_GRPC_PORT}")
    flag("listen-metrics", "metrics/health listen address", f"0.0.0.0:{DEFAULT_PROXY_METRICS_PORT}")
    flag("max-body", "largest body or message, a quantity such as 1Gi", "1Gi")
    flag("container-concurrency", "in-flight inference limit, 0 = unlimited", "0")
    flag("queue-size", "waiting requests allowed (default 10x the limit)")
    flag("queue-timeout", "seconds a request may wait for a slot", "30")
    flag("drain-seconds", "seconds to keep serving after SIGTERM", "5")
    flag("finish-timeout", "seconds to wait for in-flight requests at shutdown", "20")
    flag("head-timeout", "seconds to send a REST request head or the gRPC preface", "30")
    flag("idle-timeout", "seconds an idle tenant connection stays open, 0 = forever", "300")
    flag("concurrency-window", "seconds of the average concurrency gauge", "60")
    flag("agent-address", "host:port of the node agent (empty: no unload on exit)", "")
    flag("token-file", "the pod's projected service-account token file")
    flag("agent-timeout", "seconds to wait for the agent's unload", "30")
    flag("grpc-mode", "gRPC endpoint: relay (HTTP/2 frame relay) or grpcio", "relay")
    flag("log-level", "log level", "INFO")
    flag("log-format", "text or json", "text")
    flag("key-prefix", "contract key prefix", DEFAULT_PREFIX)
    flag("system-namespace", "the platform's namespace", DEFAULT_SYSTEM_NAMESPACE)
    args = parser.parse_args(list(argv))

    missing = [
        f"--{n}"
        for n in ("model-id", "triton-http-url", "triton-grpc-url")
        if not getattr(args, n.replace("-", "_"))
    ]
    if missing:
        raise SettingsError(f"missing required settings {', '.join(missing)}; pass them as flags")
    try:
        model_id = validate_model_id(args.model_id)
        max_body = parse_quantity(args.max_body, what="--max-body")
    except (ContractError, QuantityError) as e:
        raise SettingsError(str(e)) from e
    if max_body < 1024:
        raise SettingsError(f"--max-body {args.max_body!r} is under 1Ki; requests would not fit")

    def number(name: str, value: str, *, integer: bool = False) -> float:
        try:
            parsed = int(value) if integer else float(value)
        except ValueError as e:
            kind = "a whole number" if integer else "a number of seconds"
            raise SettingsError(f"--{name} {value!r} is not {kind}") from e
        if parsed < 0:
            raise SettingsError(f"--{name} {value!r} is negative; use 0 or more")
        return parsed

    if args.log_format not in ("text", "json"):
        raise SettingsError(f"--log-format {args.log_format!r} is neither 'text' nor 'json'")
    if args.grpc_mode not in ("grpcio", "relay"):
        raise SettingsError(f"--grpc-mode {args.grpc_mode!r} is neither 'grpcio' nor 'relay'")
    source_address = args.source_address or ""
    if source_address:
        try:
            ipaddress.ip_address(source_address)
        except ValueError as e:
            raise SettingsError(
                f"--source-address {source_address!r} is not an IP address; write for example "
                "10.0.0.7, or leave it empty"
            ) from e
        if args.grpc_mode == "grpcio":
            raise SettingsError(
                "--source-address works with --grpc-mode relay only (grpc.aio cannot choose its "
                "source address)"
            )
    agent_address = args.agent_address or ""
    if agent_address:
        upstream_address(agent_address, "--agent-address")
        if not args.token_file:
            raise SettingsError(
                "--agent-address is set but --token-file is not; the agent accepts only calls "
                "carrying the pod's projected token: pass its path"
            )
    return Settings(
        model_id=model_id,
        triton_http_url=upstream_address(args.triton_http_url, "--triton-http-url"),
        triton_grpc_url=upstream_address(args.triton_grpc_url, "--triton-grpc-url"),
        source_address=source_address,
        listen_http=listen_address(args.listen_http, "--listen-http"),
        listen_grpc=listen_address(args.listen_grpc, "--listen-grpc"),
        listen_metrics=listen_address(args.listen_metrics, "--listen-metrics"),
        max_body_bytes=max_body,
        container_concurrency=int(
            number("container-concurrency", args.container_concurrency, integer=True)
        ),
        queue_size=(
            None
            if args.queue_size in (None, "")
            else int(number("queue-size", args.queue_size, integer=True))
        ),
        queue_timeout_seconds=number("queue-timeout", args.queue_timeout),
        drain_seconds=number("drain-seconds", args.drain_seconds),
        finish_timeout_seconds=number("finish-timeout", args.finish_timeout),
        head_timeout_seconds=number("head-timeout", args.head_timeout),
        idle_timeout_seconds=number("idle-timeout", args.idle_timeout),
        concurrency_window_seconds=max(1.0, number("concurrency-window", args.concurrency_window)),
        agent_address=agent_address,
        token_file=Path(args.token_file) if args.token_file else None,
        agent_timeout_seconds=number("agent-timeout", args.agent_timeout),
        grpc_mode=args.grpc_mode,
        log_level=args.log_level,
        log_format=args.log_format,
        key_prefix=args.key_prefix,
        system_namespace=args.system_namespace,
    )
