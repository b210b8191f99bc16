"""The webhook's settings: one frozen object, declared once in `DECLARATION` (flag, variable,
default, help) with common.settings, from flags and TRITONSHARE_* environment variables.

It owns what the webhook writes into the pods it completes (images, ports, keys); nothing here is
read at import time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from common.contract import (
    DEFAULT_AGENT_AUDIENCE,
    DEFAULT_AGENT_GRPC_PORT,
    DEFAULT_GATEWAY_GRPC_PORT,
    DEFAULT_GATEWAY_HTTP_PORT,
    DEFAULT_PREFIX,
    DEFAULT_SCHEDULER_NAME,
    Keys,
)
from common.logs import LogFormat
from common.settings import Declaration, Setting, address, key_prefix, log_format, path, port, text


class SettingsError(ValueError):
    """A flag is wrong; the message says which and what to write."""


@dataclass(frozen=True)
class Settings:
    """What the webhook serves and what it writes into model pods."""

    listen: tuple[str, int] = ("0.0.0.0", 9443)
    """Address of the HTTPS listener (the API server calls it)."""
    tls_cert: Path | None = None
    """PEM certificate chain (cert-manager's tls.crt). Required to serve."""
    tls_key: Path | None = None
    """PEM private key (tls.key). Required to serve."""
    keys: Keys = field(default_factory=Keys)
    """The contract's keys (annotations, the GPU-memory resource), from --key-prefix."""
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    """spec.schedulerName written into model pods."""
    image: str = "ghcr.io/tritonshare/tritonshare:0.1.0"
    """Image of the loader and the proxy."""
    storage_initializer_image: str = "kserve/storage-initializer:v0.14.1"
    """Image that fetches s3://, gs://, https:// models (and copies pvc:// ones)."""
    agent_port: int = DEFAULT_AGENT_GRPC_PORT
    """The agent's gRPC hostPort on every GPU node."""
    triton_http_port: int = DEFAULT_GATEWAY_HTTP_PORT
    """The hostPort of the node gateway's REST side: the proxies' only way to Triton (which
    listens on the node pod's loopback)."""
    triton_grpc_port: int = DEFAULT_GATEWAY_GRPC_PORT
    """The hostPort of the node gateway's gRPC side."""
    audience: str = DEFAULT_AGENT_AUDIENCE
    """Audience of the pod's projected token for the agent."""
    log_format: LogFormat = "text"
    """text or json."""


DECLARATION = Declaration(
    "python -m webhook",
    "Mutating admission webhook that completes tritonshare model pods.",
    [
        Setting("listen", "HTTPS host:port", address, "0.0.0.0:9443"),
        Setting("tls-cert", "PEM certificate file (tls.crt)", path),
        Setting("tls-key", "PEM private key file (tls.key)", path),
        Setting("key-prefix", "prefix of the contract's keys", key_prefix, DEFAULT_PREFIX, "keys"),
        Setting(
            "scheduler-name", "schedulerName written into model pods", text, DEFAULT_SCHEDULER_NAME
        ),
        Setting("image", "image of the loader and the proxy", text, Settings.image),
        Setting(
            "storage-initializer-image",
            "image that fetches models",
            text,
            Settings.storage_initializer_image,
        ),
        Setting("agent-port", "the agent's gRPC hostPort", port(), str(DEFAULT_AGENT_GRPC_PORT)),
        Setting(
            "triton-http-port",
            "hostPort of the node gateway's REST side (the proxies' way to Triton)",
            port(),
            str(DEFAULT_GATEWAY_HTTP_PORT),
        ),
        Setting(
            "triton-grpc-port",
            "hostPort of the node gateway's gRPC side (the proxies' way to Triton)",
            port(),
            str(DEFAULT_GATEWAY_GRPC_PORT),
        ),
        Setting(
            "audience", "audience of the pod's token for the agent", text, DEFAULT_AGENT_AUDIENCE
        ),
        Setting("log-format", "text or json", log_format, "text"),
    ],
    error=SettingsError,
)


def parse_settings(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Settings:
    """Read the flags (each also `TRITONSHARE_<FLAG>`) into Settings, or raise SettingsError."""
    return Settings(**DECLARATION.values(argv, os.environ if env is None else env))
