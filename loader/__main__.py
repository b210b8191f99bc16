"""`python -m loader`: parse settings, configure logs, check and hash the model, get it READY.

Exits with the code of the failure (loader.errors.ExitCode) and writes a one-line reason to the
termination log, so `kubectl describe pod` shows why the init container failed. SIGTERM or SIGINT
stop it cleanly (exit 143). Owns process wiring only; the decisions live in loading.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from common.logs import configure_logging
from loader.agentclient import AgentClient
from loader.errors import ExitCode, LoaderError, StoppedError
from loader.loading import Loading, Outcome, Timing
from loader.manifest import build_manifest
from loader.retry import Backoff
from loader.settings import Settings, parse_settings, termination_log_from
from loader.validate import validate_model_directory

log = logging.getLogger("loader")

# Kubernetes keeps at most 4096 bytes of a termination message.
_TERMINATION_MESSAGE_BYTES = 4096


async def run(settings: Settings) -> Outcome:
    """Validate, hash, then drive the agent until the model is READY; raise a LoaderError if not."""
    started = time.monotonic()
    model = validate_model_directory(
        settings.model_dir, settings.model_id, settings.max_model_bytes
    )
    log.info(
        "Model directory %s is valid for model %s: %d files, versions %s, backend %s.",
        model.root,
        model.model_id,
        len(model.files),
        ", ".join(str(v) for v in model.versions),
        model.backend or "(chosen by Triton)",
    )
    # Hashing a big model takes seconds of disk reads; keep the event loop free meanwhile.
    manifest = await asyncio.to_thread(build_manifest, model.files)
    log.info(
        "Hashed model %s in %.1f s: manifest digest %s.",
        model.model_id,
        time.monotonic() - started,
        manifest.digest,
    )
    timing = Timing(
        total_seconds=max(0.001, settings.timeout_seconds - (time.monotonic() - started)),
        attempt_seconds=settings.attempt_timeout_seconds,
        poll_seconds=settings.poll_seconds,
        backoff=Backoff(settings.backoff_initial_seconds, settings.backoff_max_seconds),
    )
    client = AgentClient(
        settings.agent_address,
        settings.token_file,
        chunk_bytes=settings.chunk_bytes,
        reconnect_max_seconds=settings.backoff_max_seconds,
    )
    try:
        return await Loading(client, model, manifest, timing, clock=time.monotonic).run()
    finally:
        await client.close()


async def _run_until_stopped(settings: Settings) -> Outcome:
    """Run, turning SIGTERM/SIGINT into a StoppedError instead of a traceback."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    received: list[signal.Signals] = []

    def stop(sig: signal.Signals) -> None:
        received.append(sig)
        task.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop, sig)
    try:
        return await run(settings)
    except asyncio.CancelledError as e:
        if not received:
            raise
        raise StoppedError(
            f"stopped by {received[0].name} before model {settings.model_id} was READY"
        ) from e
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


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
    configure_logging(settings.log_level, settings.log_format, name="loader")
    log.info(
        "Loading model %s from %s through the agent at %s (timeout %.0f s).",
        settings.model_id,
        settings.model_dir,
        settings.agent_address,
        settings.timeout_seconds,
    )
    try:
        outcome = asyncio.run(_run_until_stopped(settings))
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


if __name__ == "__main__":
    sys.exit(main())
