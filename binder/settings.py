"""The binder's settings: one frozen object, from flags and `TRITONSHARE_<FLAG>` environment
variables (a flag wins over its variable), parsed once in `__main__`.

Every problem is a ConfigError saying which flag or variable to fix. Nothing here talks to the
cluster or reads the kubeconfig: that happens when the binder starts.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from binder.errors import ConfigError
from binder.placement import POLICIES, Policy
from common.contract import (
    DEFAULT_BINDER_HTTP_PORT,
    DEFAULT_PREFIX,
    DEFAULT_SCHEDULER_NAME,
    DEFAULT_SYSTEM_NAMESPACE,
    ContractError,
    Keys,
)
from common.flags import described
from common.logs import LogFormat
from common.quantity import QuantityError, parse_quantity

ENV_PREFIX = "TRITONSHARE_"


@dataclass(frozen=True)
class Settings:
    """Everything the binder needs to know, validated."""

    kubeconfig: str | None = None
    """Path of a kubeconfig file; None means the in-cluster service account. Default None."""
    listen_http: tuple[str, int] = ("0.0.0.0", DEFAULT_BINDER_HTTP_PORT)
    """Where /healthz, /readyz and /metrics listen, host and port. Default 0.0.0.0:9200."""
    keys: Keys = field(default_factory=Keys)
    """The contract's keys, from --key-prefix. Default prefix tritonshare.io/."""
    system_namespace: str = DEFAULT_SYSTEM_NAMESPACE
    """Namespace of the agent leases and the leader lease. Default tritonshare-system."""
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    """Pods with this spec.schedulerName are ours. Default tritonshare."""
    policy: Policy = "binpack"
    """`binpack` (fill GPUs and nodes, keep whole GPUs free) or `spread`. Default binpack."""
    placement_key_dir: Path | None = None
    """Directory holding the placement keys (`current`, optionally `previous`: the mounted
    placement-key Secret) the binder signs each placement with. Required to run. Default none."""
    gpu_mem_reserve: int = 0
    """Bytes kept free on every GPU for the CUDA context and Triton (a quantity). Default 0."""
    identity: str = field(default_factory=lambda: default_identity())
    """This replica's name in the leader lease. Default hostname_pid (the pod name in a pod)."""
    leader_elect: bool = True
    """Take part in leader election; off means always act as leader (one replica). Default on."""
    lease_duration_seconds: float = 15.0
    """Seconds a leader lease stays valid without renewal; followers take over after. Default 15."""
    renew_deadline_seconds: float = 10.0
    """Seconds the leader keeps trying to renew before it steps down. Default 10."""
    retry_period_seconds: float = 2.0
    """Seconds between two leader election attempts or renewals. Default 2."""
    backoff_initial_seconds: float = 1.0
    """Seconds before the first retry of an unschedulable pod; doubles per failure. Default 1."""
    backoff_max_seconds: float = 120.0
    """Seconds, the longest wait between two retries of an unschedulable pod. Default 120."""
    bind_workers: int = 8
    """API calls for binding in flight at once. Default 8."""
    watch_failure_grace_seconds: float = 30.0
    """Seconds a cache's list or watch may keep failing (API server unreachable, 429, 5xx)
    before /readyz reports not ready; the cache keeps retrying either way. Default 30."""
    log_level: str = "INFO"
    """Log level name. Default INFO."""
    log_format: LogFormat = "text"
    """`text` for people, `json` for log pipelines. Default text."""


def default_identity() -> str:
    return f"{socket.gethostname()}_{os.getpid()}"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message}; run `python -m binder --help` for the flags")


def _env(flag: str) -> str:
    return ENV_PREFIX + flag.upper().replace("-", "_")


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = _Parser(
        allow_abbrev=False,
        prog="python -m binder",
        description="Schedule pods with schedulerName tritonshare onto a node and a GPU by "
        "GPU memory, with kube-scheduler's node rules.",
    )

    def add(flag: str, help_text: str, default: str | None = None) -> None:
        variable = _env(flag)
        parser.add_argument(
            f"--{flag}",
            default=environ.get(variable, default),
            help=described(help_text, default, variable),
        )

    parser.add_argument(
        "--kubeconfig",
        default=environ.get("KUBECONFIG"),
        help="kubeconfig file; absent means in-cluster config (env KUBECONFIG)",
    )
    add(
        "listen-http",
        "host:port of /healthz, /readyz, /metrics",
        f"0.0.0.0:{DEFAULT_BINDER_HTTP_PORT}",
    )
    add("key-prefix", "prefix of the contract's keys", DEFAULT_PREFIX)
    add("system-namespace", "namespace of the agent and leader leases", DEFAULT_SYSTEM_NAMESPACE)
    add("scheduler-name", "spec.schedulerName of the pods to schedule", DEFAULT_SCHEDULER_NAME)
    add("policy", "binpack or spread", "binpack")
    add(
        "placement-key-dir",
        "directory of the placement-key Secret (files current and previous); required",
    )
    add("gpu-mem-reserve", "bytes kept free on every GPU, a quantity such as 512Mi", "0")
    add("identity", "this replica's name in the leader lease (default hostname_pid)", "")
    add("leader-elect", "true or false: take part in leader election", "true")
    add("lease-duration", "seconds a leader lease is valid", "15")
    add("renew-deadline", "seconds the leader tries to renew before stepping down", "10")
    add("retry-period", "seconds between leader election attempts", "2")
    add("backoff-initial", "seconds before the first retry of an unschedulable pod", "1")
    add("backoff-max", "largest retry delay in seconds", "120")
    add("bind-workers", "binding API calls in flight at once", "8")
    add(
        "watch-failure-grace",
        "seconds a cache's watch may keep failing before /readyz reports not ready",
        "30",
    )
    add("log-level", "DEBUG, INFO, WARNING or ERROR", "INFO")
    add("log-format", "text or json", "text")
    return parser


def _seconds(value: str, flag: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise ConfigError(f"{flag} {value!r} is not a number of seconds") from None
    if not seconds > 0:
        raise ConfigError(f"{flag} {value!r} must be more than 0 seconds")
    return seconds


def parse_address(value: str, flag: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{flag} {value!r} is not host:port (such as 0.0.0.0:9200)")
    return host.strip("[]") or "0.0.0.0", int(port)


def parse_settings(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Settings:
    """Parse and check flags and environment; raise ConfigError saying what to fix."""
    environ = os.environ if environ is None else environ
    args = build_parser(environ).parse_args(list(argv))
    try:
        keys = Keys(str(args.key_prefix))
    except ContractError as e:
        raise ConfigError(f"--key-prefix: {e}") from e
    if args.policy not in POLICIES:
        raise ConfigError(f"--policy {args.policy!r} is neither 'binpack' nor 'spread'")
    policy: Policy = "spread" if args.policy == "spread" else "binpack"
    try:
        reserve = parse_quantity(str(args.gpu_mem_reserve), what="--gpu-mem-reserve")
    except QuantityError as e:
        raise ConfigError(str(e)) from e
    leader_elect = str(args.leader_elect).lower()
    if leader_elect not in ("true", "false", "1", "0", "yes", "no"):
        raise ConfigError(f"--leader-elect {args.leader_elect!r} is neither true nor false")
    log_format = str(args.log_format).lower()
    if log_format not in ("text", "json"):
        raise ConfigError(f"--log-format {args.log_format!r} is neither 'text' nor 'json'")
    log_level = str(args.log_level).upper()
    if log_level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ConfigError(f"--log-level {args.log_level!r} is not DEBUG, INFO, WARNING or ERROR")
    try:
        workers = int(args.bind_workers)
    except ValueError:
        workers = 0
    if workers < 1:
        raise ConfigError(f"--bind-workers {args.bind_workers!r} must be a whole number above 0")
    settings = Settings(
        kubeconfig=args.kubeconfig or None,
        listen_http=parse_address(str(args.listen_http), "--listen-http"),
        keys=keys,
        system_namespace=str(args.system_namespace),
        scheduler_name=str(args.scheduler_name),
        policy=policy,
        placement_key_dir=Path(args.placement_key_dir) if args.placement_key_dir else None,
        gpu_mem_reserve=reserve,
        identity=str(args.identity) or default_identity(),
        leader_elect=leader_elect in ("true", "1", "yes"),
        lease_duration_seconds=_seconds(args.lease_duration, "--lease-duration"),
        renew_deadline_seconds=_seconds(args.renew_deadline, "--renew-deadline"),
        retry_period_seconds=_seconds(args.retry_period, "--retry-period"),
        backoff_initial_seconds=_seconds(args.backoff_initial, "--backoff-initial"),
        backoff_max_seconds=_seconds(args.backoff_max, "--backoff-max"),
        bind_workers=workers,
        watch_failure_grace_seconds=_seconds(args.watch_failure_grace, "--watch-failure-grace"),
        log_level=log_level,
        log_format="json" if log_format == "json" else "text",
    )
    if settings.placement_key_dir is None:
        raise ConfigError(
            "--placement-key-dir is required: the binder signs every placement with the "
            "placement-key Secret, and agents refuse pods without that proof (docs/security.md)"
        )
    if not settings.retry_period_seconds < settings.renew_deadline_seconds:
        raise ConfigError("--retry-period must be shorter than --renew-deadline")
    if not settings.renew_deadline_seconds < settings.lease_duration_seconds:
        raise ConfigError(
            "--renew-deadline must be shorter than --lease-duration, or two replicas could both "
            "believe they lead"
        )
    return settings
