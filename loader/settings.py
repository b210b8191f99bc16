"""The loader's settings: one frozen object whose fields each declare their flag, variable, default
and help once with common.settings (`DECLARATION` is derived from them); a flag wins over its
variable. Parsed once in `__main__`.

Every problem is a SettingsError (exit code 2) that says which flag or variable to fix. Must not
read the model directory or the token file: that happens per attempt, later.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from common.contract import DEFAULT_AGENT_GRPC_PORT
from common.logs import LogFormat
from common.modelpod import STORAGE_SECRET_DIR
from common.settings import (
    BadValueError,
    Declaration,
    declared,
    log_format_flag,
    log_level_flag,
    model_id,
    path,
    quantity,
    seconds,
    setting,
    whole,
)
from loader.errors import SettingsError


def http_url(value: str) -> str:
    """An `http://` or `https://` URL with a host, kept as written; empty: none."""
    if not value:
        return value
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BadValueError("is not an http:// URL; write e.g. http://$(POD_IP):9002/metrics")
    return value


DEFAULT_MODEL_DIR = Path("/mnt/models")
DEFAULT_TOKEN_FILE = Path("/var/run/secrets/tritonshare/token")
DEFAULT_TERMINATION_LOG = Path("/dev/termination-log")


def _agent_address(value: str) -> str:
    try:
        return normalize_address(value)
    except SettingsError as e:
        raise ValueError(str(e)) from None


@declared
class Settings:
    """Everything the loader needs to know, validated."""

    agent_address: str = setting(
        "agent-address",
        "the node's agent as host:port (port defaults to 8100)",
        _agent_address,
        required="the node's IP (status.hostIP through the Downward API) and the agent's "
        "port, such as 10.0.0.5:8100",
    )
    """The node's agent as `host:port`; a bare host gets port 8100. Required."""
    model_id: str = setting(
        "model-id",
        "the model's id, as its clients name it (the agent installs it under a private name in "
        "Triton)",
        model_id,
        default="",
    )
    """The model's public id (the pod's `tritonshare.io/model-id` annotation), the name its
    clients send; the agent installs it under the pod's private name in Triton. Required, but
    with --host (a host's models come from the agent)."""
    model_dir: Path = setting(
        "model-dir", "model directory to send", path, default=str(DEFAULT_MODEL_DIR)
    )
    """The model directory to send (config.pbtxt and version directories). Default /mnt/models."""
    token_file: Path = setting(
        "token-file", "projected service-account token file", path, default=str(DEFAULT_TOKEN_FILE)
    )
    """The projected service-account token, re-read on every attempt because the kubelet rotates
    it. Default /var/run/secrets/tritonshare/token."""
    timeout_seconds: float = setting(
        "timeout",
        "overall seconds until the model must be READY",
        seconds(positive=True),
        default="600",
    )
    """Seconds, overall, from start until the model must be READY. Default 600."""
    agent_unreachable_seconds: float = setting(
        "agent-unreachable-seconds",
        "seconds with no connection to the agent before giving up (exit 7)",
        seconds(positive=True),
        default="15",
    )
    """Seconds the loader goes on with no connection to the agent at all (refused, no route,
    still connecting) before it exits 7: a pod bound to a node whose agent died is not left
    waiting for `timeout_seconds`. An agent that answers, even "busy", resets it. Default 15,
    the agent's Lease duration: an agent gone that long is dead to the binder too, which fails
    the pod with this exit's message for its controller to replace."""
    attempt_timeout_seconds: float = setting(
        "attempt-timeout",
        "seconds one short agent call may take",
        seconds(positive=True),
        default="30",
    )
    """Seconds one short agent call (GetModel) may take before it is retried. Default 30. Installs
    and loads are bounded by the overall timeout only: a big model takes long to send or load."""
    backoff_initial_seconds: float = setting(
        "backoff-initial",
        "seconds, first retry delay cap (doubles per retry)",
        seconds(positive=True),
        default="0.25",
    )
    """Seconds, the first retry's largest delay; doubles per retry (full jitter). Default 0.25."""
    backoff_max_seconds: float = setting(
        "backoff-max",
        "seconds, largest retry delay (and longest wait between reconnects to the agent)",
        seconds(positive=True),
        default="5",
    )
    """Seconds, the cap of one retry's delay. Default 5."""
    poll_seconds: float = setting(
        "poll-interval",
        "seconds between looks at a LOADING model",
        seconds(positive=True),
        default="0.5",
    )
    """Seconds between two looks at a model the agent reports as LOADING. Default 0.5."""
    max_model_bytes: int = setting(
        "max-model-bytes",
        "largest model directory, a quantity such as 32Gi",
        quantity(minimum=1),
        default="32Gi",
    )
    """Bytes, the largest model directory the loader will send (a quantity: 32Gi). Default 32Gi."""
    chunk_bytes: int = setting(
        "chunk-bytes",
        "bytes per file chunk, a quantity such as 1Mi",
        quantity(minimum=1),
        default="1Mi",
    )
    """Bytes per file chunk sent to the agent. Default 1Mi (gRPC's default limit is 4Mi)."""
    termination_log: Path = setting(
        "termination-log",
        "file for the one-line outcome",
        path,
        default=str(DEFAULT_TERMINATION_LOG),
    )
    """Where the one-line outcome goes, for `kubectl describe pod`. Default /dev/termination-log."""
    host: bool = setting(
        "host",
        "run as a model host's loader: follow the host's replicas until stopped",
        switch=True,
        default=False,
    )
    """Run as a model host's long-lived loader (loader/host.py): poll the agent's ListHosted,
    fetch, install and load each replica, and list the ready ones in --models-file. Off: load
    --model-dir once and exit (a model pod's init container)."""
    models_file: Path | None = setting(
        "models-file",
        "with --host: the file listing the ready models for the host's proxy",
        path,
        default=None,
    )
    """With --host, required: where the ready replicas are listed (a JSON list of `model`,
    `maxConcurrency`, `idleSeconds`), replaced whole; the host's proxy reads its table there."""
    model_root: Path | None = setting(
        "model-root",
        "with --host: the directory each replica's files are fetched into (ROOT/<model>)",
        path,
        default=None,
    )
    """With --host, required: each replica's files are fetched from its storage URI into
    ROOT/<model> (an emptyDir), then sent to the agent."""
    host_poll_seconds: float = setting(
        "host-poll-seconds",
        "with --host: seconds between two looks at the host's replicas",
        seconds(positive=True),
        default="0.25",
    )
    """With --host: seconds between two ListHosted calls (the agent answers from its pod watch:
    no API read per call). Default 0.25."""
    drain_seconds: float = setting(
        "drain-seconds",
        "with --host: seconds a leaving replica stays loaded after it left the models file",
        seconds(),
        default="30",
    )
    """With --host: seconds between removing a leaving replica from the models file and
    unloading it, for the proxy to finish its requests (its --finish-timeout, 20 s by default,
    plus its reread period). Default 30."""
    unroute_seconds: float = setting(
        "unroute-seconds",
        "with --host: seconds a leaving replica stays in the models file, served, while its "
        "Service stops sending to this host",
        seconds(),
        default="5",
    )
    """With --host: seconds a leaving (draining) replica is still served after the binder took
    the host out of its Service, so requests routed before the endpoints caught up are answered
    (as a model pod's preStop pause). Default 5."""
    proxy_metrics_url: str = setting(
        "proxy-metrics-url",
        "with --host: the host's proxy's metrics URL; a leaving replica is unloaded as soon as "
        "the proxy has drained it (its series gone), within --drain-seconds",
        http_url,
        default="",
    )
    """With --host: the host proxy's /metrics (http://$(POD_IP):9002/metrics in a host). The proxy
    drops a model's series once its requests in flight have finished, so the drain ends then;
    empty or unreachable: the loader waits the whole --drain-seconds. Default empty."""
    storage_secret_dir: Path = setting(
        "storage-secret-dir",
        "with --host: where the replicas' storage Secrets are mounted (DIR/<Secret>/)",
        path,
        default=STORAGE_SECRET_DIR,
    )
    """With --host: each replica's spec.storageSecret is read from DIR/<Secret>/ (keys
    `https-host` and `headers`), where the binder mounts it in the host's loader. Default
    /var/secrets/storage."""
    host_parallel: int = setting(
        "host-parallel",
        "with --host: replicas fetched and loaded at once",
        whole(minimum=1),
        default="8",
    )
    """With --host: how many replicas are fetched and loaded at the same time. A model holds one
    of them at most (its replicas take turns), and models retrying after a failure hold one
    fewer than this at most (loader/slots.py). Default 8, the agent's --parallel-loads: each load
    holds one of the calls the agent lets a model host have at once (its namespace's,
    --max-calls-per-namespace, 16), and the loader's polls (ListHosted), keys and drains need a
    few more."""
    fetch_timeout_seconds: float = setting(
        "fetch-timeout",
        "with --host: seconds one replica's fetch may take in all (listing, downloads, unpacking)",
        seconds(positive=True),
        default="300",
    )
    """With --host: seconds one replica's fetch from its storage URI may take in all (the
    listing, every download, unpacking); past it the fetch fails (`FetchFailed`, retried with
    backoff) and its slot is free at once. Default 300: 32Gi at about 110 MB/s."""
    log_level: str = log_level_flag("DEBUG, INFO, WARNING, ERROR or CRITICAL")
    """Log level name. Default INFO."""
    log_format: LogFormat = log_format_flag()
    """`text` for people, `json` for log pipelines. Default text."""


DECLARATION = Declaration.of(
    Settings,
    "python -m loader",
    "Send a model directory to the node's tritonshare agent, load it into Triton, and wait until "
    "it is READY.",
    error=SettingsError,
)


def parse_settings(argv: Sequence[str], environ: Mapping[str, str]) -> Settings:
    """Parse and check the flags and environment; raise SettingsError saying what to fix."""
    settings = Settings(**DECLARATION.values(argv, environ))
    if settings.host:
        _check_host(settings)
    elif not settings.model_id:
        raise SettingsError(
            "--model-id is required (in a pod, the tritonshare.io/model-id annotation through "
            "the Downward API; a model host's loader runs with --host instead): set the flag or "
            "TRITONSHARE_MODEL_ID"
        )
    if not settings.chunk_bytes <= 3 * 1024 * 1024:
        raise SettingsError(
            f"--chunk-bytes {settings.chunk_bytes} must be at most 3Mi, below gRPC's 4Mi message "
            f"limit"
        )
    if settings.backoff_max_seconds < settings.backoff_initial_seconds:
        raise SettingsError("--backoff-max must be at least --backoff-initial")
    return settings


def _check_host(settings: Settings) -> None:
    if settings.model_id:
        raise SettingsError(
            "--model-id names a model pod's one model; with --host the models come from the "
            "agent (the host's replicas): drop --model-id"
        )
    for flag, value in (
        ("--models-file", settings.models_file),
        ("--model-root", settings.model_root),
    ):
        if value is None:
            raise SettingsError(
                f"{flag} is required with --host: set it to a path in the emptyDir the host's "
                f"loader and proxy share"
            )


def termination_log_from(argv: Sequence[str], environ: Mapping[str, str]) -> Path:
    """The termination log path, read leniently, so even a settings error can be written there."""
    return Path(DECLARATION.raw(argv, environ, "termination-log") or DEFAULT_TERMINATION_LOG)


def normalize_address(address: str) -> str:
    """`host:port` for gRPC; a bare host or IP (v4 or v6) gets the agent's default port."""
    address = address.strip()
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        port = rest.removeprefix(":") if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise SettingsError(f"agent address {address!r} is malformed; write [IPv6]:port")
        return f"[{host}]:{_port(port or str(DEFAULT_AGENT_GRPC_PORT), address)}"
    if address.count(":") > 1:
        try:
            ipaddress.IPv6Address(address)
        except ValueError as e:
            raise SettingsError(
                f"agent address {address!r} is malformed; write host:port, or [IPv6]:port"
            ) from e
        return f"[{address}]:{DEFAULT_AGENT_GRPC_PORT}"
    host, _, port = address.partition(":")
    if not host:
        raise SettingsError(
            f"agent address {address!r} has no host; set it to the node's IP, such as "
            f"10.0.0.5:{DEFAULT_AGENT_GRPC_PORT}"
        )
    return f"{host}:{_port(port or str(DEFAULT_AGENT_GRPC_PORT), address)}"


def _port(text: str, address: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise SettingsError(f"agent address {address!r} has port {text!r}; use 1-65535")
    return int(text)
