"""Assembles the loader and owns its order: check and hash the model, then drive the agent; or,
with --host, follow a model host's replicas (host.py) until SIGTERM.

The order is fixed: validate the model directory, hash it (off the event loop), open one agent
client, run the load (loading.py decides), and close the client whatever happened. SIGTERM or
SIGINT cancel the run, which ends as a StoppedError. The command line, the logs and the
termination log belong to `__main__`; the decisions belong to loading.py.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
import urllib.request
from collections.abc import Awaitable, Callable

from loader.agentclient import AgentClient
from loader.errors import StoppedError
from loader.host import Host, HostTiming
from loader.loading import Loading, Outcome, Timing
from loader.manifest import build_manifest
from loader.retry import Backoff
from loader.settings import Settings
from loader.validate import validate_model_directory

log = logging.getLogger("loader")


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
        unreachable_seconds=settings.agent_unreachable_seconds,
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


async def run_until_stopped(settings: Settings) -> Outcome:
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


def proxy_holds(url: str) -> Callable[[str], Awaitable[bool | None]]:
    """Whether the host's proxy at `url` (its /metrics) still serves a model: it drops a model's
    series once the model has left its table and its requests have finished. None when the
    proxy cannot be asked."""

    def read() -> str | None:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:  # noqa: S310 (the pod's own)
                return str(answer.read().decode(errors="replace"))
        except (OSError, ValueError):
            return None

    async def holds(model: str) -> bool | None:
        text = await asyncio.to_thread(read)
        return None if text is None else f'model="{model}"' in text

    return holds


async def run_host(settings: Settings) -> None:
    """Follow the host's replicas until SIGTERM or SIGINT; one agent client for the whole run.
    Stopping leaves the models file as it is: the host's proxy unloads its models as it drains."""
    assert settings.models_file is not None and settings.model_root is not None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def stopping(sig: signal.Signals) -> None:
        log.info("Received %s: stopping, leaving the loaded models to the host's proxy.", sig.name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping, sig)
    client = AgentClient(
        settings.agent_address,
        settings.token_file,
        chunk_bytes=settings.chunk_bytes,
        reconnect_max_seconds=settings.backoff_max_seconds,
    )
    host = Host(
        client,
        settings.model_root,
        settings.models_file,
        HostTiming(
            poll_seconds=settings.host_poll_seconds,
            drain_seconds=settings.drain_seconds,
            unroute_seconds=settings.unroute_seconds,
            call_seconds=settings.attempt_timeout_seconds,
            load=Timing(
                total_seconds=settings.timeout_seconds,
                attempt_seconds=settings.attempt_timeout_seconds,
                poll_seconds=settings.poll_seconds,
                backoff=Backoff(settings.backoff_initial_seconds, settings.backoff_max_seconds),
                unreachable_seconds=settings.agent_unreachable_seconds,
            ),
            fetch_seconds=settings.fetch_timeout_seconds,
        ),
        parallel=settings.host_parallel,
        max_bytes=settings.max_model_bytes,
        secret_dir=settings.storage_secret_dir,
        proxy_holds=proxy_holds(settings.proxy_metrics_url) if settings.proxy_metrics_url else None,
    )
    try:
        await host.run(stop)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await client.close()
