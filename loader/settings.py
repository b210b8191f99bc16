"""The loader's settings: one frozen object, from flags and `TRITONSHARE_<FLAG>` environment
variables (a flag wins over its variable), parsed once in `__main__`.

Every problem is a SettingsError (exit code 2) that says which flag or variable to fix. Must not
read the model directory or the token file: that happens per attempt, later.
"""

from __future__ import annotations

import argparse
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from common.contract import DEFAULT_AGENT_GRPC_PORT, ContractError, validate_model_id
from common.flags import described
from common.logs import LogFormat
from common.quantity import QuantityError, parse_quantity
from loader.errors import SettingsError

ENV_PREFIX = "TRITONSHARE_"
DEFAULT_MODEL_DIR = Path("/mnt/models")
DEFAULT_TOKEN_FILE = Path("/var/run/secrets/tritonshare/token")
DEFAULT_TERMINATION_LOG = Path("/dev/termination-log")


@dataclass(frozen=True)
class Settings:
    """Everything the loader needs to know, validated."""

    model_id: str
    """The Triton model name (the pod's `tritonshare.io/model-id` annotation). Required."""
    agent_address: str
    """The node's agent as `host:port`; a bare host gets port 8100. Required."""
    model_dir: Path = DEFAULT_MODEL_DIR
    """The model directory to send (config.pbtxt and version directories). Default /mnt/models."""
    token_file: Path = DEFAULT_TOKEN_FILE
    """The projected service-account token, re-read on every attempt because the kubelet rotates
    it. Default /var/run/secrets/tritonshare/token."""
    timeout_seconds: float = 600.0
    """Seconds, overall, from start until the model must be READY. Default 600."""
    attempt_timeout_seconds: float = 30.0
    """Seconds one short agent call (GetModel) may take before it is retried. Default 30. Installs
    and loads are bounded by the overall timeout only: a big model takes long to send or load."""
    backoff_initial_seconds: float = 0.25
    """Seconds, the first retry's largest delay; doubles per retry (full jitter). Default 0.25."""
    backoff_max_seconds: float = 5.0
    """Seconds, the cap of one retry's delay. Default 5."""
    poll_seconds: float = 0.5
    """Seconds between two looks at a model the agent reports as LOADING. Default 0.5."""
    max_model_bytes: int = 32 * 1024**3
    """Bytes, the largest model directory the loader will send (a quantity: 32Gi). Default 32Gi."""
    chunk_bytes: int = 1024 * 1024
    """Bytes per file chunk sent to the agent. Default 1Mi (gRPC's default limit is 4Mi)."""
    termination_log: Path = DEFAULT_TERMINATION_LOG
    """Where the one-line outcome goes, for `kubectl describe pod`. Default /dev/termination-log."""
    log_level: str = "INFO"
    """Log level name. Default INFO."""
    log_format: LogFormat = "text"
    """`text` for people, `json` for log pipelines. Default text."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises SettingsError instead of exiting, so the reason reaches the log."""

    def error(self, message: str) -> NoReturn:
        raise SettingsError(f"{message}; run `python -m loader --help` for the flags")


def _env(name: str) -> str:
    return ENV_PREFIX + name.upper().replace("-", "_")


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    """The command line, with each flag's default taken from its environment variable if set."""
    parser = _Parser(
        allow_abbrev=False,
        prog="python -m loader",
        description="Send a model directory to the node's tritonshare agent, load it into "
        "Triton, and wait until it is READY.",
    )

    def add(flag: str, help_text: str, default: object = None) -> None:
        variable = _env(flag)
        parser.add_argument(
            f"--{flag}",
            default=environ.get(variable, default),
            help=described(help_text, default, variable),
        )

    add("model-id", "Triton model name; in a pod, the tritonshare.io/model-id annotation")
    add("agent-address", "the node's agent as host:port (port defaults to 8100)")
    add("model-dir", "model directory to send", str(DEFAULT_MODEL_DIR))
    add("token-file", "projected service-account token file", str(DEFAULT_TOKEN_FILE))
    add("timeout", "overall seconds until the model must be READY", "600")
    add("attempt-timeout", "seconds one short agent call may take", "30")
    add("backoff-initial", "seconds, first retry delay cap (doubles per retry)", "0.25")
    add("backoff-max", "seconds, largest retry delay", "5")
    add("poll-interval", "seconds between looks at a LOADING model", "0.5")
    add("max-model-bytes", "largest model directory, a quantity such as 32Gi", "32Gi")
    add("chunk-bytes", "bytes per file chunk, a quantity such as 1Mi", "1Mi")
    add("termination-log", "file for the one-line outcome", str(DEFAULT_TERMINATION_LOG))
    add("log-level", "DEBUG, INFO, WARNING or ERROR", "INFO")
    add("log-format", "text or json", "text")
    return parser


def parse_settings(argv: Sequence[str], environ: Mapping[str, str]) -> Settings:
    """Parse and check the flags and environment; raise SettingsError saying what to fix."""
    args = build_parser(environ).parse_args(list(argv))
    if not args.model_id:
        raise SettingsError(
            "no model id: set --model-id or TRITONSHARE_MODEL_ID (in a pod, from the "
            "tritonshare.io/model-id annotation through the Downward API)"
        )
    try:
        model_id = validate_model_id(args.model_id)
    except ContractError as e:
        raise SettingsError(str(e)) from e
    if not args.agent_address:
        raise SettingsError(
            "no agent address: set --agent-address or TRITONSHARE_AGENT_ADDRESS to the node's IP "
            "(status.hostIP through the Downward API) and the agent's port, such as 10.0.0.5:8100"
        )
    log_format = str(args.log_format).lower()
    if log_format not in ("text", "json"):
        raise SettingsError(f"--log-format {args.log_format!r} is neither 'text' nor 'json'")
    log_level = str(args.log_level).upper()
    if log_level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise SettingsError(f"--log-level {args.log_level!r} is not DEBUG, INFO, WARNING or ERROR")
    settings = Settings(
        model_id=model_id,
        agent_address=normalize_address(str(args.agent_address)),
        model_dir=Path(args.model_dir),
        token_file=Path(args.token_file),
        timeout_seconds=_seconds(args.timeout, "--timeout"),
        attempt_timeout_seconds=_seconds(args.attempt_timeout, "--attempt-timeout"),
        backoff_initial_seconds=_seconds(args.backoff_initial, "--backoff-initial"),
        backoff_max_seconds=_seconds(args.backoff_max, "--backoff-max"),
        poll_seconds=_seconds(args.poll_interval, "--poll-interval"),
        max_model_bytes=_bytes(args.max_model_bytes, "--max-model-bytes"),
        chunk_bytes=_bytes(args.chunk_bytes, "--chunk-bytes"),
        termination_log=Path(args.termination_log),
        log_level=log_level,
        log_format="json" if log_format == "json" else "text",
    )
    if not 1 <= settings.chunk_bytes <= 3 * 1024 * 1024:
        raise SettingsError(
            f"--chunk-bytes {args.chunk_bytes!r} must be between 1 byte and 3Mi, below gRPC's "
            f"4Mi message limit"
        )
    if settings.backoff_max_seconds < settings.backoff_initial_seconds:
        raise SettingsError("--backoff-max must be at least --backoff-initial")
    return settings


def termination_log_from(argv: Sequence[str], environ: Mapping[str, str]) -> Path:
    """The termination log path, read leniently, so even a settings error can be written there."""
    parser = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    parser.add_argument(
        "--termination-log",
        default=environ.get(_env("termination-log"), str(DEFAULT_TERMINATION_LOG)),
    )
    known, _ = parser.parse_known_args(list(argv))
    return Path(known.termination_log)


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


def _seconds(value: object, flag: str) -> float:
    try:
        seconds = float(str(value))
    except ValueError as e:
        raise SettingsError(f"{flag} {value!r} is not a number of seconds") from e
    if not seconds > 0 or seconds == float("inf"):
        raise SettingsError(f"{flag} {value!r} must be a positive, finite number of seconds")
    return seconds


def _bytes(value: object, flag: str) -> int:
    try:
        amount = parse_quantity(str(value), what=flag)
    except QuantityError as e:
        raise SettingsError(str(e)) from e
    if amount <= 0:
        raise SettingsError(f"{flag} {value!r} must be more than zero bytes")
    return amount
