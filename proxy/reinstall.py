"""Keeping the pod's model on its node: when the node has lost it, install and load it again.

A node pod replaced with an empty repository, a lost repository or a Triton restarted without its
files leave a model pod Running with nothing to serve. The pod still holds its model's files (the
storage initializer's volume, mounted read-only into the proxy with --model-dir), so every
--model-check-seconds the proxy asks Triton, through the node gateway, whether its own model is
ready; only when it is not does it ask the agent (GetModel, with the pod's token) what the node
has. A model the agent reports `sleeping` (an on-demand model unloaded while idle, files kept) is
not lost: the residency is told, so the next request wakes it. Only the answer ABSENT (no files,
no failure on record) starts a reinstall, and the
reinstall is the loader itself (`python -m loader` with the init container's flags, as a child
process): the same validation, hashing, install, load, retries and refusals, through the same
agent RPCs and the same checks of the pod's token and proof of placement, on the GPU of its proof.
The parts never import each other (import-linter), so the loader's code is run, not imported; a
child also gives its memory back when it ends.

What is not reinstalled: a model the agent reports FAILED (Triton rejected it), a pod the agent
refuses (terminated, evicted for GPU memory, no proof, another pod's model), and, after the
loader ended with a permanent exit code (docs/loader.md: 2 usage, 3 invalid model, 4 refused,
5 rejected by the node), nothing more from this container: the reason stays in /readyz and the
log until the pod is recreated. Other failures (agent unreachable, timed out) are tried again
after a doubling delay up to --reinstall-backoff-max. One loader at a time, so the most one pod
makes the agent hold is one install of its own model, as at the pod's start.
Owns this decision and the child's lifecycle; must not parse settings or serve requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import resource
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc.aio

from proxy.agentclient import AgentClient, AgentUnavailableError, ModelOnNode

log = logging.getLogger(__name__)

# The loader's exit codes that retrying cannot change (docs/loader.md, loader/errors.py).
PERMANENT_EXIT_CODES = {
    2: "the loader's settings are wrong",
    3: "the model files are invalid",
    4: "the agent refused this pod",
    5: "the node rejected the model",
}
# States in which the node holds the model, or is busy with it: nothing to reinstall.
_ON_NODE = frozenset({"INSTALLED", "LOADING", "READY", "UNLOADING"})


class Sleeping(Protocol):
    """What the watch tells an on-demand model's residency (proxy.residency) it saw."""

    def found_asleep(self, why: str) -> None:
        """The node holds the model asleep (unloaded while idle, files kept)."""

    def found_loaded(self) -> None:
        """Triton serves the model."""

    @property
    def look_now(self) -> asyncio.Event:
        """Set when the model should be looked at before the next period."""


@dataclass(frozen=True)
class LoaderRun:
    """How one run of the loader ended: its exit code and its one-line outcome."""

    exit_code: int
    message: str
    peak_bytes: int = 0
    """The largest resident memory of any loader this proxy has run so far (the kernel keeps
    one figure for all waited-for children), in bytes: what the reinstall adds to the proxy's
    container at most."""


@dataclass(frozen=True)
class ReinstallTiming:
    """How often to look, and how long to wait after a failed reinstall."""

    check_seconds: float
    backoff_max_seconds: float


class Reinstaller:
    """Watches the pod's model and reinstalls it when the node no longer has it."""

    def __init__(
        self,
        model_id: str,
        agent: AgentClient,
        own_model_ready: Callable[[], Awaitable[bool]],
        run_loader: Callable[[], Awaitable[LoaderRun]],
        timing: ReinstallTiming,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        residency: Sleeping | None = None,
    ) -> None:
        self._model_id = model_id
        self._agent = agent
        self._own_model_ready = own_model_ready
        self._run_loader = run_loader
        self._timing = timing
        self._clock = clock
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not secrets
        self._residency = residency
        self._failures = 0
        self._next_attempt = 0.0
        self._given_up = ""
        self.reason = ""
        """Why the model is not served ('' when it is, or nothing is known yet), for /readyz."""
        self.reinstalls = 0
        """Reinstalls that ended with the model READY."""

    async def watch(self, stopping: asyncio.Event) -> None:
        """Check, and reinstall when needed, until `stopping` is set."""
        async with self._agent.channel() as channel:
            while not stopping.is_set():
                await self.check_once(channel)
                await self._pause(stopping)

    async def _pause(self, stopping: asyncio.Event) -> None:
        """Until the next check: the period, or less when stopping or asked to look now."""
        if self._residency is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self._timing.check_seconds)
            return
        look_now = self._residency.look_now
        waits = {asyncio.ensure_future(stopping.wait()), asyncio.ensure_future(look_now.wait())}
        try:
            await asyncio.wait(
                waits, timeout=self._timing.check_seconds, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for wait in waits:
                wait.cancel()
            look_now.clear()

    async def check_once(self, channel: grpc.aio.Channel) -> None:
        """One look at the model, and a reinstall when the node has lost it."""
        if await self._own_model_ready():
            if self.reason:
                log.info("Model %s is served again.", self._model_id)
            self.reason = ""
            self._failures = 0
            if self._residency is not None:
                self._residency.found_loaded()
            return
        try:
            seen = await self._agent.model_on_node(self._model_id, channel)
        except AgentUnavailableError as e:
            self._note(f"model {self._model_id} is not served, and {e}")
            return
        if seen.sleeping:
            # Unloaded while idle, its files kept: not lost. The next request wakes it.
            if self._residency is not None:
                self._residency.found_asleep("the agent reports it asleep")
            if self.reason:
                log.info("Model %s is asleep on the node, not lost.", self._model_id)
            self.reason = ""
            self._failures = 0
            return
        if seen.state != "ABSENT":
            self._note(_why_not_served(self._model_id, seen))
            return
        if self._given_up:
            self._note(self._given_up)
            return
        if self._clock() < self._next_attempt:
            return  # the reason of the failed reinstall stands
        await self._reinstall()

    async def _reinstall(self) -> None:
        self.reason = f"model {self._model_id} is missing on the node: reinstalling it"
        log.warning(
            "Model %s is missing on the node (the node pod was replaced, or its repository "
            "lost): reinstalling it from this pod's files.",
            self._model_id,
        )
        started = self._clock()
        outcome = await self._run_loader()
        seconds = self._clock() - started
        if outcome.exit_code == 0:
            self._failures = 0
            self.reinstalls += 1
            self.reason = ""
            log.info(
                "Model %s is reinstalled and READY after %.1f s (the loader's peak memory: "
                "%.0f MiB): %s.",
                self._model_id,
                seconds,
                outcome.peak_bytes / 2**20,
                outcome.message,
            )
            return
        self._failures += 1
        permanent = PERMANENT_EXIT_CODES.get(outcome.exit_code)
        if permanent is not None:
            self._given_up = (
                f"model {self._model_id} is missing on the node and cannot be reinstalled "
                f"({permanent}: {outcome.message}); not trying again from this container: "
                f"fix the cause and recreate the pod"
            )
            self.reason = self._given_up
            log.error("%s.", self._given_up[0].upper() + self._given_up[1:])
            return
        delay = self._delay()
        self._next_attempt = self._clock() + delay
        self.reason = (
            f"model {self._model_id} is missing on the node; reinstalling it failed "
            f"(exit {outcome.exit_code}: {outcome.message})"
        )
        log.warning(
            "Reinstalling model %s failed after %.1f s (exit %d: %s): trying again in %.0f s.",
            self._model_id,
            seconds,
            outcome.exit_code,
            outcome.message,
            delay,
        )

    def _delay(self) -> float:
        base = self._timing.check_seconds * 2 ** min(self._failures, 16)
        capped = min(self._timing.backoff_max_seconds, base)
        return float(capped * self._rng.uniform(0.5, 1.0))

    def _note(self, reason: str) -> None:
        if reason != self.reason:
            log.warning("%s.", reason[0].upper() + reason[1:])
        self.reason = reason


def _why_not_served(model_id: str, seen: ModelOnNode) -> str:
    if seen.state == "FAILED":
        return (
            f"model {model_id} failed on the node and is not reinstalled: "
            f"{seen.reason or 'no reason given'}"
        )
    if seen.state == "REFUSED":
        return f"the agent refuses this pod, so model {model_id} is not reinstalled: {seen.reason}"
    if seen.state in _ON_NODE:
        return f"model {model_id} is {seen.state} on the node, not yet served through its gateway"
    return f"model {model_id} is {seen.state} on the node"


class LoaderProcess:
    """Runs `python -m loader` with `flags` as a child; its one-line outcome comes back on a
    pipe given as its --termination-log (the container's own file is the proxy's)."""

    def __init__(self, flags: Sequence[str]) -> None:
        self._flags = list(flags)
        self._child: asyncio.subprocess.Process | None = None

    async def run(self) -> LoaderRun:
        """Run the loader to its end (stdout and stderr go to the proxy's own)."""
        read_end, write_end = os.pipe()
        try:
            self._child = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "loader",
                *self._flags,
                f"--termination-log=/dev/fd/{write_end}",
                pass_fds=(write_end,),
                stdin=asyncio.subprocess.DEVNULL,
            )
            os.close(write_end)
            write_end = -1
            exit_code = await self._child.wait()
            message = await asyncio.to_thread(_read_all, read_end)
        finally:
            self._child = None
            for fd in (read_end, write_end):
                if fd >= 0:
                    os.close(fd)
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux
        return LoaderRun(exit_code, " ".join(message.split()) or "(no message)", peak)

    async def stop(self, grace: float) -> None:
        """SIGTERM the running loader (it stops cleanly, exit 143), SIGKILL after `grace`."""
        child = self._child
        if child is None or child.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            child.terminate()
        try:
            await asyncio.wait_for(child.wait(), grace)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            await child.wait()


def loader_flags(
    model_dir: Path,
    model_id: str,
    agent_address: str,
    token_file: Path,
    *,
    log_level: str,
    log_format: str,
) -> list[str]:
    """The loader's flags for the pod's model, as the init container has them (its other
    settings at their defaults)."""
    return [
        f"--model-dir={model_dir}",
        f"--model-id={model_id}",
        f"--agent-address={agent_address}",
        f"--token-file={token_file}",
        f"--log-level={log_level}",
        f"--log-format={log_format}",
    ]


def _read_all(fd: int) -> str:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")
