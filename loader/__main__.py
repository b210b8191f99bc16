"""`python -m loader`: parse settings, configure logs, run the loader (loader.app), report.

Exits with the code of the failure (loader.errors.ExitCode) and writes a one-line reason to the
termination log, so `kubectl describe pod` shows why the init container failed. SIGTERM or SIGINT
stop it cleanly (exit 143). With --host it follows a model host's replicas until SIGTERM or
SIGINT, then exits 0. Owns the command line and the outcome only: the assembly and its
order live in app.py, the decisions in loading.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from common.logs import configure_logging, subject
from common.version import VERSION
from loader.app import run_host, run_until_stopped
from loader.errors import ExitCode, LoaderError
from loader.settings import Settings, parse_settings, termination_log_from

log = logging.getLogger("loader")

# Kubernetes keeps at most 4096 bytes of a termination message.
_TERMINATION_MESSAGE_BYTES = 4096


def write_termination_log(path: Path, message: str) -> None:
    """Write one line for Kubernetes to show; a missing or read-only path is only a warning."""
    # One line, whitespace collapsed: Triton's reasons carry multi-line Python tracebacks.
    line = " ".join(message.split())
    kept = line.encode()[: _TERMINATION_MESSAGE_BYTES - 1].decode("utf-8", errors="ignore")
    data = kept.encode() + b"\n"
    try:
        path.write_bytes(data)
    except OSError as e:
        log.warning(
            "Cannot write the termination log %s (%s): the outcome is only in this log.",
            path,
            e.strerror,
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the loader and return its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        settings = parse_settings(args, os.environ)
    except LoaderError as e:
        configure_logging("INFO", "text", name="loader")
        log.error("The loader cannot start: %s.", e)
        write_termination_log(termination_log_from(args, os.environ), f"loader: {e}")
        return int(e.exit_code)
    if settings.host:
        return _run_host(settings)
    configure_logging(
        settings.log_level,
        settings.log_format,
        name="loader",
        fields=subject(model=settings.model_id),
    )
    log.info(
        "The loader of tritonshare %s is loading model %s from %s through the agent at %s "
        "(timeout %.0f s).",
        VERSION,
        settings.model_id,
        settings.model_dir,
        settings.agent_address,
        settings.timeout_seconds,
    )
    try:
        outcome = asyncio.run(run_until_stopped(settings))
    except LoaderError as e:
        log.error(
            "Model %s was not loaded (exit code %d): %s.",
            settings.model_id,
            e.exit_code,
            e,
            extra={"exit_code": int(e.exit_code), "model_id": settings.model_id},
        )
        write_termination_log(settings.termination_log, str(e))
        return int(e.exit_code)
    except Exception as e:
        log.exception("The loader failed unexpectedly for model %s.", settings.model_id)
        write_termination_log(settings.termination_log, f"the loader failed unexpectedly: {e!r}")
        return int(ExitCode.AGENT_FAILED)
    summary = outcome.summary()
    log.info(
        "Done: %s.",
        summary,
        extra={
            "model_id": settings.model_id,
            "bytes_sent": outcome.bytes_sent,
            "model_bytes": outcome.model_bytes,
            "files": outcome.files,
            "installed": outcome.installed,
            "attempts": outcome.attempts,
            "seconds": round(outcome.seconds, 3),
        },
    )
    write_termination_log(settings.termination_log, summary)
    return int(ExitCode.OK)


def _run_host(settings: Settings) -> int:
    configure_logging(settings.log_level, settings.log_format, name="loader")
    log.info(
        "The loader of tritonshare %s follows this model host's replicas through the agent at "
        "%s: files under %s, the ready models listed in %s.",
        VERSION,
        settings.agent_address,
        settings.model_root,
        settings.models_file,
    )
    try:
        asyncio.run(run_host(settings))
    except Exception as e:
        log.exception("The host's loader failed unexpectedly.")
        write_termination_log(settings.termination_log, f"the loader failed unexpectedly: {e!r}")
        return int(ExitCode.AGENT_FAILED)
    log.info("The host's loader stopped.")
    return int(ExitCode.OK)


if __name__ == "__main__":
    sys.exit(main())
