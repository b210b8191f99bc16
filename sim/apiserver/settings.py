"""The simulated API server's settings: one frozen object, from flags and environment variables.

Parsed once by `__main__` (or built directly by `start_in_thread`); nothing reads the environment
anywhere else.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from common.logs import LogFormat


@dataclass(frozen=True)
class ApiServerSettings:
    host: str = "127.0.0.1"
    """Address to listen on. Default 127.0.0.1."""
    port: int = 0
    """TCP port; 0 picks a free one. Default 0."""
    kubeconfig_out: Path | None = None
    """Write a kubeconfig for this server here once listening. Default: none."""
    history_size: int = 10_000
    """Events kept for watch replay; older starts get 410 Expired. Default 10,000 events."""
    bookmark_interval_seconds: float = 1.0
    """Seconds between BOOKMARK events on watches that allow them. Default 1 s (upstream: ~60 s;
    shorter here so tests see bookmarks quickly)."""
    default_watch_timeout_seconds: float = 1800.0
    """Watch length when the client sets no timeoutSeconds. Default 1800 s (upstream's minimum)."""
    audit_size: int = 200_000
    """Audit records kept (oldest dropped first). Default 200,000 records."""
    log_level: str = "INFO"
    """Log level name. Default INFO."""
    log_format: LogFormat = "text"
    """`text` or `json`. Default text."""


def _env(environ: Mapping[str, str], flag: str) -> str | None:
    return environ.get("TRITONSHARE_" + flag.upper().replace("-", "_"))


def parse_settings(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> ApiServerSettings:
    """Flags win over `TRITONSHARE_<FLAG>` environment variables, which win over defaults."""
    env = os.environ if environ is None else environ
    defaults = ApiServerSettings()
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="python -m sim.apiserver",
        description="An in-memory Kubernetes API server for tests, benchmarks and the demo.",
    )

    def default(flag: str, value: object) -> object:
        found = _env(env, flag)
        return value if found is None else found

    parser.add_argument("--host", default=default("host", defaults.host))
    parser.add_argument("--port", type=int, default=default("port", defaults.port))
    parser.add_argument(
        "--kubeconfig-out",
        type=Path,
        default=default("kubeconfig-out", None),
        help="write a kubeconfig pointing at this server to PATH once it listens",
    )
    parser.add_argument(
        "--history-size", type=int, default=default("history-size", defaults.history_size)
    )
    parser.add_argument(
        "--bookmark-interval-seconds",
        type=float,
        default=default("bookmark-interval-seconds", defaults.bookmark_interval_seconds),
    )
    parser.add_argument(
        "--default-watch-timeout-seconds",
        type=float,
        default=default("default-watch-timeout-seconds", defaults.default_watch_timeout_seconds),
    )
    parser.add_argument("--log-level", default=default("log-level", defaults.log_level))
    parser.add_argument(
        "--log-format", choices=["text", "json"], default=default("log-format", "text")
    )
    args = parser.parse_args(argv)
    if args.history_size < 1:
        parser.error(f"--history-size must be at least 1, got {args.history_size}")
    if args.bookmark_interval_seconds <= 0:
        parser.error("--bookmark-interval-seconds must be positive")
    return ApiServerSettings(
        host=args.host,
        port=int(args.port),
        kubeconfig_out=Path(args.kubeconfig_out) if args.kubeconfig_out else None,
        history_size=int(args.history_size),
        bookmark_interval_seconds=float(args.bookmark_interval_seconds),
        default_watch_timeout_seconds=float(args.default_watch_timeout_seconds),
        log_level=str(args.log_level).upper(),
        log_format="json" if args.log_format == "json" else "text",
    )
