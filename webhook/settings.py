"""The webhook's settings: one frozen object whose fields each declare their flag, variable,
default and help once with common.settings (`DECLARATION` is derived from them), from flags and
TRITONSHARE_* environment variables.

It owns what the webhook writes into the pods it completes (images, ports, keys); nothing here is
read at import time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from common.contract import (
    DEFAULT_AGENT_AUDIENCE,
    DEFAULT_AGENT_GRPC_PORT,
    DEFAULT_GATEWAY_GRPC_PORT,
    DEFAULT_GATEWAY_HTTP_PORT,
    DEFAULT_SCHEDULER_NAME,
    Keys,
)
from common.logs import LogFormat
from common.settings import (
    Declaration,
    address,
    declared,
    keys_flag,
    log_format_flag,
    path,
    port,
    seconds,
    setting,
    text,
)
from common.version import VERSION


class SettingsError(ValueError):
    """A flag is wrong; the message says which and what to write."""


@declared
class Settings:
    """What the webhook serves and what it writes into model pods."""

    listen: tuple[str, int] = setting("listen", "HTTPS host:port", address, default="0.0.0.0:9443")
    """Address of the HTTPS listener (the API server calls it)."""
    tls_cert: Path | None = setting(
        "tls-cert",
        "PEM certificate file (tls.crt); required: the API server calls over HTTPS",
        path,
        default=None,
    )
    """PEM certificate chain (cert-manager's tls.crt). Required to serve."""
    tls_key: Path | None = setting(
        "tls-key", "PEM private key file (tls.key); required with --tls-cert", path, default=None
    )
    """PEM private key (tls.key). Required to serve."""
    keys: Keys = keys_flag()
    """The contract's keys (annotations, the GPU-memory resource), from --key-prefix."""
    scheduler_name: str = setting(
        "scheduler-name",
        "schedulerName written into model pods",
        text,
        default=DEFAULT_SCHEDULER_NAME,
    )
    """spec.schedulerName written into model pods."""
    image: str = setting(
        "image",
        "image of the loader and the proxy containers the webhook writes into model pods",
        text,
        default=f"ghcr.io/tritonshare/tritonshare:{VERSION}",
    )
    """Image of the loader and the proxy."""
    storage_initializer_image: str = setting(
        "storage-initializer-image",
        "image of the init container that fetches a gs://, s3://, https:// or pvc:// model URI",
        text,
        default="kserve/storage-initializer:v0.14.1",
    )
    """Image that fetches s3://, gs://, https:// models (and copies pvc:// ones)."""
    agent_port: int = setting(
        "agent-port", "the agent's gRPC hostPort", port(), default=str(DEFAULT_AGENT_GRPC_PORT)
    )
    """The agent's gRPC hostPort on every GPU node."""
    triton_http_port: int = setting(
        "triton-http-port",
        "hostPort of the node gateway's REST side (the proxies' way to Triton)",
        port(),
        default=str(DEFAULT_GATEWAY_HTTP_PORT),
    )
    """The hostPort of the node gateway's REST side: the proxies' only way to Triton (which
    listens on the node pod's loopback)."""
    triton_grpc_port: int = setting(
        "triton-grpc-port",
        "hostPort of the node gateway's gRPC side (the proxies' way to Triton)",
        port(),
        default=str(DEFAULT_GATEWAY_GRPC_PORT),
    )
    """The hostPort of the node gateway's gRPC side."""
    audience: str = setting(
        "audience",
        "audience of the pod's token for the agent",
        text,
        default=DEFAULT_AGENT_AUDIENCE,
    )
    """Audience of the pod's projected token for the agent."""
    default_idle_seconds: float = setting(
        "default-idle-seconds",
        "seconds an on-demand model idles before it is unloaded, when its pod does not say",
        seconds(minimum=1.0),
        default="300",
    )
    """Idle time of an on-demand pod without the `tritonshare.io/idle-seconds` annotation, in
    seconds (the proxy's --idle-seconds); default 300. Raised to --min-idle-seconds if lower."""
    min_idle_seconds: float = setting(
        "min-idle-seconds",
        "the shortest idle time an on-demand pod may ask for, in seconds",
        seconds(minimum=1.0),
        default="60",
    )
    """Floor on a pod's `tritonshare.io/idle-seconds`, in seconds; default 60. A shorter idle
    time is raised to it: each sleep and wake is a load on the node's agent and Triton."""
    log_format: LogFormat = log_format_flag()
    """text or json."""


DECLARATION = Declaration.of(
    Settings,
    "python -m webhook",
    "Mutating admission webhook that completes tritonshare model pods.",
    error=SettingsError,
)


def parse_settings(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Settings:
    """Read the flags (each also `TRITONSHARE_<FLAG>`) into Settings, or raise SettingsError."""
    return Settings(**DECLARATION.values(argv, os.environ if env is None else env))
