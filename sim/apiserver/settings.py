"""The simulated API server's settings: one frozen object, declared once in `DECLARATION` with
common.settings, from flags and `TRITONSHARE_<FLAG>` environment variables.

Parsed once by `__main__` (or built directly by `start_in_thread`); nothing reads the environment
anywhere else.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from common.logs import LogFormat
from common.settings import (
    Declaration,
    Setting,
    log_format,
    log_level,
    path,
    port,
    seconds,
    text,
    whole,
)


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


class SettingsError(ValueError):
    """A flag or variable the simulated API server cannot use; says which and what to write."""


DECLARATION = Declaration(
    "python -m sim.apiserver",
    "An in-memory Kubernetes API server for tests, benchmarks and the demo.",
    [
        Setting("host", "address to listen on", text, "127.0.0.1"),
        Setting("port", "TCP port; 0 picks a free one", port(minimum=0), "0"),
        Setting(
            "kubeconfig-out",
            "write a kubeconfig pointing at this server here once it listens",
            path,
        ),
        Setting("history-size", "events kept for watch replay", whole(minimum=1), "10000"),
        Setting(
            "bookmark-interval-seconds",
            "seconds between BOOKMARK events",
            seconds(positive=True),
            "1",
        ),
        Setting(
            "default-watch-timeout-seconds",
            "watch length when the client sets no timeoutSeconds",
            seconds(positive=True),
            "1800",
        ),
        Setting("log-level", "log level", log_level, "INFO"),
        Setting("log-format", "text or json", log_format, "text"),
    ],
    error=SettingsError,
)


def parse_settings(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> ApiServerSettings:
    """Flags win over `TRITONSHARE_<FLAG>` environment variables, which win over defaults."""
    return ApiServerSettings(
        **DECLARATION.values(
            sys.argv[1:] if argv is None else argv, os.environ if environ is None else environ
        )
    )
