"""The gateway's settings: one frozen object, parsed once in `__main__` from flags and env vars.

Every flag has an environment variable `TRITONSHARE_<FLAG_UPPER>`; a flag on the command line
wins over the variable. The relay knobs (body limit, timeouts) mean what they mean for the proxy,
whose relay the gateway runs once per calling pod (`relay_settings`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from common.contract import (
    DEFAULT_GATEWAY_GRPC_PORT,
    DEFAULT_GATEWAY_HTTP_PORT,
    DEFAULT_GATEWAY_METRICS_PORT,
)
from common.flags import described
from common.quantity import QuantityError, parse_quantity
from proxy.settings import Settings, SettingsError, listen_address, upstream_address


@dataclass(frozen=True)
class GatewaySettings:
    """Everything the gateway needs to run; see `parse_settings` for the flag of each field."""

    caller_table: Path
    """The agent's caller table (`common.callers`): which pod address may reach which model."""
    triton_http_url: str = "127.0.0.1:8000"
    """host:port of Triton's HTTP endpoint, on the node pod's loopback."""
    triton_grpc_url: str = "127.0.0.1:8001"
    """host:port of Triton's gRPC endpoint, on the node pod's loopback."""
    listen_http: tuple[str, int] = ("0.0.0.0", DEFAULT_GATEWAY_HTTP_PORT)
    """Where model pods' proxies send KServe v2 REST; default 0.0.0.0:8010."""
    listen_grpc: tuple[str, int] = ("0.0.0.0", DEFAULT_GATEWAY_GRPC_PORT)
    """Where model pods' proxies send gRPC; default 0.0.0.0:8011."""
    listen_metrics: tuple[str, int] = ("0.0.0.0", DEFAULT_GATEWAY_METRICS_PORT)
    """/metrics, /healthz and /readyz; default 0.0.0.0:8012."""
    table_poll_seconds: float = 0.1
    """How often the caller table's file is checked for a change (a stat, nothing more)."""
    table_max_age_seconds: float = 60.0
    """A table the agent has not rewritten for this long is treated as empty: every pod is
    refused until the agent writes again (it rewrites every few seconds)."""
    max_body_bytes: int = 1024**3
    head_timeout_seconds: float = 30.0
    idle_timeout_seconds: float = 300.0
    finish_timeout_seconds: float = 20.0
    max_connections_per_pod: int = 512
    """Connections one pod may hold open to the gateway; more are reset at accept, so one pod
    cannot take the gateway's file descriptors from the others."""
    max_in_flight_per_pod: int = 0
    """Inference requests one pod may have at Triton at once through the gateway (its proxy has
    its own limit; this one holds even for a pod that bypasses its proxy); 0: no limit."""
    log_level: str = "INFO"
    log_format: str = "text"

    def relay_settings(self, model_id: str) -> Settings:
        """The proxy relay's settings for one calling pod whose model is `model_id`."""
        return Settings(
            model_id=model_id,
            triton_http_url=self.triton_http_url,
            triton_grpc_url=self.triton_grpc_url,
            max_body_bytes=self.max_body_bytes,
            container_concurrency=self.max_in_flight_per_pod,
            queue_size=0,
            head_timeout_seconds=self.head_timeout_seconds,
            idle_timeout_seconds=self.idle_timeout_seconds,
            finish_timeout_seconds=self.finish_timeout_seconds,
            drain_seconds=0.0,
        )


def parse_settings(argv: Sequence[str], env: Mapping[str, str] | None = None) -> GatewaySettings:
    """Read the flags (and `TRITONSHARE_*` variables) into settings, or raise SettingsError."""
    env = os.environ if env is None else env
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="python -m proxy.gateway",
        description="The node gateway: lets each model pod reach only its own model in the "
        "node's Triton, knowing the pod by its connection's source address.",
    )

    def flag(name: str, help_text: str, default: str | None = None) -> None:
        variable = "TRITONSHARE_" + name.upper().replace("-", "_")
        parser.add_argument(
            f"--{name}",
            default=env.get(variable, default),
            help=described(help_text, default, variable),
        )

    flag("caller-table", "the agent's caller table file (required)")
    flag("triton-http-url", "host:port of Triton's HTTP endpoint", "127.0.0.1:8000")
    flag("triton-grpc-url", "host:port of Triton's gRPC endpoint", "127.0.0.1:8001")
    flag("listen-http", "REST listen address", f"0.0.0.0:{DEFAULT_GATEWAY_HTTP_PORT}")
    flag("listen-grpc", "gRPC listen address", f"0.0.0.0:{DEFAULT_GATEWAY_GRPC_PORT}")
    flag(
        "listen-metrics", "metrics/health listen address", f"0.0.0.0:{DEFAULT_GATEWAY_METRICS_PORT}"
    )
    flag("table-poll-seconds", "seconds between checks of the caller table file", "0.1")
    flag("table-max-age", "seconds after which an unrefreshed caller table counts as empty", "60")
    flag("max-body", "largest body or message, a quantity such as 1Gi", "1Gi")
    flag("head-timeout", "seconds to send a REST request head or the gRPC preface", "30")
    flag("idle-timeout", "seconds an idle connection stays open, 0 = forever", "300")
    flag("finish-timeout", "seconds to wait for in-flight requests at shutdown", "20")
    flag("max-connections-per-pod", "connections one pod may hold open", "512")
    flag(
        "max-in-flight-per-pod", "inference requests one pod may have at Triton, 0 = no limit", "0"
    )
    flag("log-level", "log level", "INFO")
    flag("log-format", "text or json", "text")
    args = parser.parse_args(list(argv))

    if not args.caller_table:
        raise SettingsError(
            "missing --caller-table: the file the node's agent writes (its --gateway-table)"
        )

    def number(name: str, value: str, *, integer: bool = False, positive: bool = False) -> float:
        try:
            parsed = int(value) if integer else float(value)
        except ValueError as e:
            kind = "a whole number" if integer else "a number of seconds"
            raise SettingsError(f"--{name} {value!r} is not {kind}") from e
        if parsed < 0 or (positive and parsed == 0):
            raise SettingsError(
                f"--{name} {value!r} must be {'above' if positive else 'at least'} 0"
            )
        return parsed

    try:
        max_body = parse_quantity(args.max_body, what="--max-body")
    except QuantityError as e:
        raise SettingsError(str(e)) from e
    if args.log_format not in ("text", "json"):
        raise SettingsError(f"--log-format {args.log_format!r} is neither 'text' nor 'json'")
    return GatewaySettings(
        caller_table=Path(args.caller_table),
        triton_http_url=upstream_address(args.triton_http_url, "--triton-http-url"),
        triton_grpc_url=upstream_address(args.triton_grpc_url, "--triton-grpc-url"),
        listen_http=listen_address(args.listen_http, "--listen-http"),
        listen_grpc=listen_address(args.listen_grpc, "--listen-grpc"),
        listen_metrics=listen_address(args.listen_metrics, "--listen-metrics"),
        table_poll_seconds=number("table-poll-seconds", args.table_poll_seconds, positive=True),
        table_max_age_seconds=number("table-max-age", args.table_max_age, positive=True),
        max_body_bytes=max_body,
        head_timeout_seconds=number("head-timeout", args.head_timeout),
        idle_timeout_seconds=number("idle-timeout", args.idle_timeout),
        finish_timeout_seconds=number("finish-timeout", args.finish_timeout),
        max_connections_per_pod=int(
            number("max-connections-per-pod", args.max_connections_per_pod, integer=True)
        ),
        max_in_flight_per_pod=int(
            number("max-in-flight-per-pod", args.max_in_flight_per_pod, integer=True)
        ),
        log_level=args.log_level,
        log_format=args.log_format,
    )
