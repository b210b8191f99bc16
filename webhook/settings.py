"""The webhook's settings: one frozen object from flags and TRITONSHARE_* environment variables.

It owns what the webhook writes into the pods it completes (images, ports, keys); nothing here is
read at import time.
"""

from __future__ import annotations

import argparse
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
    ContractError,
    Keys,
)
from common.flags import described
from common.logs import LogFormat


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


def _port(value: str, flag: str, *, lowest: int = 1) -> int:
    try:
        port = int(value)
    except ValueError:
        port = -1
    if not lowest <= port < 65536:
        raise SettingsError(f"--{flag} {value!r} is not a port; write a number from 1 to 65535")
    return port


def parse_settings(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Settings:
    """Read the flags (each also `TRITONSHARE_<FLAG>`) into Settings, or raise SettingsError."""
    env = os.environ if env is None else env
    defaults = Settings()
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="python -m webhook",
        description="Mutating admission webhook that completes tritonshare model pods.",
    )

    def flag(name: str, help_text: str, default: object) -> None:
        variable = "TRITONSHARE_" + name.upper().replace("-", "_")
        value = env.get(variable, None if default is None else str(default))
        parser.add_argument(
            f"--{name}", default=value, help=described(help_text, default, variable)
        )

    flag("listen", "HTTPS host:port", f"{defaults.listen[0]}:{defaults.listen[1]}")
    flag("tls-cert", "PEM certificate file (tls.crt)", None)
    flag("tls-key", "PEM private key file (tls.key)", None)
    flag("key-prefix", "prefix of the contract's keys", DEFAULT_PREFIX)
    flag("scheduler-name", "schedulerName written into model pods", defaults.scheduler_name)
    flag("image", "image of the loader and the proxy", defaults.image)
    flag(
        "storage-initializer-image", "image that fetches models", defaults.storage_initializer_image
    )
    flag("agent-port", "the agent's gRPC hostPort", defaults.agent_port)
    flag(
        "triton-http-port",
        "hostPort of the node gateway's REST side (the proxies' way to Triton)",
        defaults.triton_http_port,
    )
    flag(
        "triton-grpc-port",
        "hostPort of the node gateway's gRPC side (the proxies' way to Triton)",
        defaults.triton_grpc_port,
    )
    flag("audience", "audience of the pod's token for the agent", defaults.audience)
    flag("log-format", "text or json", defaults.log_format)
    args = parser.parse_args(list(argv))
    host, _, port = str(args.listen).rpartition(":")
    if not host:
        raise SettingsError(f"--listen {args.listen!r} is not host:port (for example 0.0.0.0:9443)")
    try:
        keys = Keys(args.key_prefix)
    except ContractError as e:
        raise SettingsError(str(e)) from e
    log_format: LogFormat
    if args.log_format == "json":
        log_format = "json"
    elif args.log_format == "text":
        log_format = "text"
    else:
        raise SettingsError(f"--log-format {args.log_format!r} is neither 'text' nor 'json'")
    return Settings(
        listen=(host, _port(port, "listen", lowest=0)),
        tls_cert=Path(args.tls_cert) if args.tls_cert else None,
        tls_key=Path(args.tls_key) if args.tls_key else None,
        keys=keys,
        scheduler_name=args.scheduler_name,
        image=args.image,
        storage_initializer_image=args.storage_initializer_image,
        agent_port=_port(args.agent_port, "agent-port"),
        triton_http_port=_port(args.triton_http_port, "triton-http-port"),
        triton_grpc_port=_port(args.triton_grpc_port, "triton-grpc-port"),
        audience=args.audience,
        log_format=log_format,
    )
