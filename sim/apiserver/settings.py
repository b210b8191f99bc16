"""The simulated API server's settings: one frozen object whose fields each declare their flag
once with common.settings (`DECLARATION` is derived from them), from flags and
`TRITONSHARE_<FLAG>` environment variables.

Parsed once by `__main__` (or built directly by `start_in_thread`); nothing reads the environment
anywhere else.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from common.logs import LogFormat
from common.settings import (
    BadValueError,
    Declaration,
    declared,
    log_format_flag,
    log_level_flag,
    names,
    path,
    port,
    seconds,
    setting,
    text,
    unflagged,
    whole,
)


class SettingsError(ValueError):
    """A flag or variable the simulated API server cannot use; says which and what to write."""


def _paths(value: str) -> tuple[Path, ...]:
    paths = tuple(Path(name) for name in names(value))
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise BadValueError(
            f"names no file or folder ({', '.join(missing)}): give CRD manifests or folders of"
            " .yaml files, comma-separated"
        )
    return paths


@declared
class ApiServerSettings:
    host: str = setting("host", "address to listen on", text, default="127.0.0.1")
    """Address to listen on. Default 127.0.0.1."""
    port: int = setting("port", "TCP port; 0 picks a free one", port(minimum=0), default="0")
    """TCP port; 0 picks a free one. Default 0."""
    kubeconfig_out: Path | None = setting(
        "kubeconfig-out",
        "write a kubeconfig pointing at this server here once it listens",
        path,
        default=None,
    )
    """Write a kubeconfig for this server here once listening. Default: none."""
    history_size: int = setting(
        "history-size", "events kept for watch replay", whole(minimum=1), default="10000"
    )
    """Events kept for watch replay; older starts get 410 Expired. Default 10,000 events."""
    bookmark_interval_seconds: float = setting(
        "bookmark-interval-seconds",
        "seconds between BOOKMARK events",
        seconds(positive=True),
        default="1",
    )
    """Seconds between BOOKMARK events on watches that allow them. Default 1 s (upstream: ~60 s;
    shorter here so tests see bookmarks quickly)."""
    default_watch_timeout_seconds: float = setting(
        "default-watch-timeout-seconds",
        "watch length when the client sets no timeoutSeconds",
        seconds(positive=True),
        default="1800",
    )
    """Watch length when the client sets no timeoutSeconds. Default 1800 s (upstream's minimum)."""
    crds: tuple[Path, ...] = setting(
        "crds",
        "comma-separated CustomResourceDefinition manifests (files, or folders of .yaml files)"
        " served from the start",
        _paths,
        default=(),
    )
    """CRD manifests (files, or folders of `.yaml` files) created at start, so their custom
    resources are served at once. Default: none (CRDs can still be created through the API)."""
    default_not_ready_toleration_seconds: int = setting(
        "default-not-ready-toleration-seconds",
        "tolerationSeconds of the not-ready:NoExecute toleration added to every pod without one",
        whole(minimum=0),
        default="300",
    )
    """As kube-apiserver's (the DefaultTolerationSeconds admission plugin). Default 300 s."""
    default_unreachable_toleration_seconds: int = setting(
        "default-unreachable-toleration-seconds",
        "tolerationSeconds of the unreachable:NoExecute toleration added to every pod without one",
        whole(minimum=0),
        default="300",
    )
    """As kube-apiserver's: how long a pod stays bound to a node lost. Default 300 s."""
    log_level: str = log_level_flag()
    """Log level name. Default INFO."""
    log_format: LogFormat = log_format_flag()
    """`text` or `json`. Default text."""
    audit_size: int = unflagged(default=200_000)
    """Audit records kept (oldest dropped first). Default 200,000 records."""


DECLARATION = Declaration.of(
    ApiServerSettings,
    "python -m sim.apiserver",
    "An in-memory Kubernetes API server for tests, benchmarks and the demo.",
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
