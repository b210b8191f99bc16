"""The loader's job from start to READY: ask what the node has, send only what is missing, load,
wait, and retry transient failures with backoff until the overall deadline.

One pass: GetModel; if the node already has the same manifest digest (READY, INSTALLED, LOADING
or FAILED), skip the install; otherwise ask the agent to install them from the files the node
kept after an earlier pod of this namespace left (InstallKept), and stream them only when it keeps
none (unloading other files first); then
LoadModel (the agent answers at once for a model already READY where this pod was placed), and
poll while it reports LOADING. A TransientError anywhere restarts the pass after a backoff delay,
so an agent restarted mid-install is simply asked again. Permanent failures propagate at once.
Owns this decision flow; it must not parse settings, hash files or touch gRPC directly.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from common.manifest import Manifest
from common.quantity import format_bytes
from loader.agentclient import InstallResult, ModelState, ModelStatus
from loader.errors import (
    AgentFailedError,
    AgentUnreachableError,
    TimedOutError,
    TransientError,
    TritonRejectedError,
)
from loader.retry import Backoff, Deadline
from loader.validate import ModelDirectory

log = logging.getLogger(__name__)

# States in which the node holds files it can load: skip the install when the digest matches.
_HAS_FILES = frozenset(
    {ModelState.INSTALLED, ModelState.LOADING, ModelState.READY, ModelState.FAILED}
)
# States in which the agent refuses to install other files over the model's.
_LOADED = frozenset({ModelState.READY, ModelState.LOADING})


class Agent(Protocol):
    """The agent calls the flow needs (loader.agentclient.AgentClient in production)."""

    address: str

    async def get_model(self, model_id: str, time_limit: float) -> ModelStatus: ...

    async def load(self, model_id: str, time_limit: float) -> ModelStatus: ...

    async def unload(self, model_id: str, time_limit: float) -> ModelStatus: ...

    async def install(
        self, model: ModelDirectory, manifest: Manifest, time_limit: float
    ) -> InstallResult: ...

    async def install_kept(
        self, model_id: str, manifest: Manifest, time_limit: float
    ) -> InstallResult | None: ...


@dataclass(frozen=True)
class Timing:
    """How long to wait for what."""

    total_seconds: float
    attempt_seconds: float
    poll_seconds: float
    backoff: Backoff
    unreachable_seconds: float = float("inf")
    """How long the loader goes on with no connection to the agent at all before it gives up."""


@dataclass(frozen=True)
class Outcome:
    """What the loader did, for the final log line, the termination log and the tests."""

    status: ModelStatus
    files: int
    model_bytes: int
    bytes_sent: int
    installed: bool
    attempts: int
    seconds: float
    kept: bool = False
    """Installed from the files the node kept, nothing sent."""

    def summary(self) -> str:
        """One line: the model, where it runs, what was sent and how long it took."""
        if self.kept:
            sent = f"its {self.files} files came from the node's kept copy, nothing sent"
        elif self.installed:
            sent = f"sent {self.files} files ({_size(self.bytes_sent)})"
        else:
            sent = f"its {self.files} files were already on the node, nothing sent"
        return (
            f"model {self.status.model_id} is READY on {self.status.describe_placement()} "
            f"after {self.seconds:.1f} s: {sent}"
        )


class Loading:
    """One run of the loader for one model directory."""

    def __init__(
        self,
        agent: Agent,
        model: ModelDirectory,
        manifest: Manifest,
        timing: Timing,
        *,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self._agent = agent
        self._model = model
        self._manifest = manifest
        self._timing = timing
        self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not secrets
        self._bytes_sent = 0
        self._installed = False
        self._kept = False
        # Whether the agent ever answered: tells "timed out" (6) from "unreachable" (7).
        self._reached_agent = False

    async def run(self) -> Outcome:
        """Get the model READY, or raise the LoaderError that says why not."""
        deadline = Deadline(self._timing.total_seconds, self._clock)
        attempt = 0
        # When the first pass of the current run of failures with no connection began: a black
        # hole (a connect that never completes) spends its attempt timeout before failing.
        unreachable_since: float | None = None
        while True:
            attempt += 1
            pass_started = self._clock()
            try:
                status = await self._one_pass(deadline)
            except TransientError as e:
                self._reached_agent = self._reached_agent or e.reached_agent
                delay = self._timing.backoff.delay(attempt - 1, self._rng)
                if not e.no_connection:
                    unreachable_since = None
                else:
                    now = self._clock()
                    if unreachable_since is None:
                        unreachable_since = pass_started
                    left = self._timing.unreachable_seconds - (now - unreachable_since)
                    if left <= 0:
                        raise self._lost_agent(e, now - unreachable_since) from e
                    # One more try at the end of the budget rather than a wait past it.
                    delay = min(delay, left)
                if deadline.remaining() <= delay:
                    raise self._gave_up(e, deadline) from e
                log.warning(
                    "Attempt %d to load model %s failed (%s): retrying in %.1f s, %.0f s left.",
                    attempt,
                    self._model.model_id,
                    e,
                    delay,
                    deadline.remaining(),
                )
                await self._sleep(delay)
                continue
            return Outcome(
                status=status,
                files=len(self._manifest.files),
                model_bytes=self._manifest.total_bytes,
                bytes_sent=self._bytes_sent,
                installed=self._installed,
                kept=self._kept,
                attempts=attempt,
                seconds=deadline.elapsed(),
            )

    async def _one_pass(self, deadline: Deadline) -> ModelStatus:
        model_id = self._model.model_id
        digest = self._manifest.digest
        status = await self._agent.get_model(model_id, deadline.bound(self._timing.attempt_seconds))
        self._reached_agent = True
        same_files = status.manifest_digest == digest and status.state in _HAS_FILES
        if status.state is ModelState.UNLOADING:
            raise TransientError(
                f"model {model_id} is still being unloaded on the node", reached_agent=True
            )
        if same_files:
            log.info(
                "Model %s's files are already on the node (state %s, digest %s): not sending them.",
                model_id,
                status.state.name,
                digest[:12],
            )
            if status.state is ModelState.LOADING:
                status = await self._wait_while_loading(deadline)
                if status.state is ModelState.READY:
                    return status
        else:
            if status.state in _LOADED:
                # Only this pod may hold this model id on this node (the binder sees to it), and
                # its proxy does not run while the loader does: the loaded files are this pod's
                # previous ones, and the agent refuses to overwrite loaded files.
                log.info(
                    "Model %s is %s on the node with other files (digest %s, this pod has %s): "
                    "unloading it to install this pod's files.",
                    model_id,
                    status.state.name,
                    status.manifest_digest[:12] or "unknown",
                    digest[:12],
                )
                await self._agent.unload(model_id, deadline.remaining())
            await self._install(deadline)
        # Even a model already READY with these files is loaded again: the agent answers at once
        # when it runs where this pod was placed, and otherwise moves it there and records this
        # pod as its owner (a pod recreated on the same node has a new GPU and a new uid).
        log.info("Asking the agent to load model %s into Triton.", model_id)
        status = await self._agent.load(model_id, deadline.remaining())
        if status.state is ModelState.LOADING:
            status = await self._wait_while_loading(deadline)
        return self._settled(status)

    async def _install(self, deadline: Deadline) -> None:
        model_id = self._model.model_id
        log.info(
            "Sending model %s to the agent at %s: %d files, %s (digest %s).",
            model_id,
            self._agent.address,
            len(self._manifest.files),
            _size(self._manifest.total_bytes),
            self._manifest.digest[:12],
        )
        started = self._clock()
        kept = await self._agent.install_kept(
            model_id, self._manifest, deadline.bound(self._timing.attempt_seconds)
        )
        if kept is not None:
            self._installed = self._kept = True
            log.info(
                "The node kept model %s's files from an earlier pod of this namespace: "
                "installed from its copy, nothing sent (%.1f s).",
                model_id,
                self._clock() - started,
            )
            return
        result = await self._agent.install(self._model, self._manifest, deadline.remaining())
        self._bytes_sent += result.bytes_sent
        self._installed, self._kept = True, False
        if result.manifest_digest and result.manifest_digest != self._manifest.digest:
            raise AgentFailedError(
                f"the agent installed model {model_id} with manifest digest "
                f"{result.manifest_digest}, but the loader sent {self._manifest.digest}; "
                f"the loader and agent disagree on the manifest format, upgrade them together"
            )
        seconds = self._clock() - started
        if result.unchanged:
            log.info(
                "The agent already had model %s's files: it wrote nothing (%.1f s).",
                model_id,
                seconds,
            )
        else:
            log.info(
                "The agent installed model %s: %s sent, %s written in %.1f s.",
                model_id,
                _size(result.bytes_sent),
                _size(result.bytes_written),
                seconds,
            )

    async def _wait_while_loading(self, deadline: Deadline) -> ModelStatus:
        model_id = self._model.model_id
        log.info("Model %s is LOADING in Triton: waiting for it to become READY.", model_id)
        while True:
            await self._sleep(deadline.bound(self._timing.poll_seconds))
            if deadline.remaining() <= 0:
                raise TransientError(
                    f"model {model_id} was still LOADING when time ran out", reached_agent=True
                )
            status = await self._agent.get_model(
                model_id, deadline.bound(self._timing.attempt_seconds)
            )
            if status.state is not ModelState.LOADING:
                return status

    def _settled(self, status: ModelStatus) -> ModelStatus:
        model_id = self._model.model_id
        if status.state is ModelState.READY:
            return status
        if status.state is ModelState.FAILED:
            reason = status.reason or f"Triton could not load model {model_id} (no reason given)"
            raise TritonRejectedError(f"{reason}; fix config.pbtxt or the model files")
        # INSTALLED or ABSENT after a load: the node changed under us (an agent or Triton
        # restart); ask again from the start.
        raise TransientError(
            f"the agent reported model {model_id} as {status.state.name} after loading it"
            + (f" ({status.reason})" if status.reason else ""),
            reached_agent=True,
        )

    def _lost_agent(self, last: TransientError, seconds: float) -> AgentUnreachableError:
        return AgentUnreachableError(
            f"the node's agent at {self._agent.address} is unreachable: no connection for "
            f"{seconds:.0f} s (--agent-unreachable-seconds {self._timing.unreachable_seconds:g}; "
            f"last: {last}); model {self._model.model_id} is not served. Check the tritonshare "
            f"node pod on this pod's node (its agent container is down or restarting); this "
            f"loader runs again at the container's next restart"
        )

    def _gave_up(
        self, last: TransientError, deadline: Deadline
    ) -> TimedOutError | AgentUnreachableError:
        waited = deadline.elapsed()
        model_id = self._model.model_id
        if self._reached_agent:
            return TimedOutError(
                f"model {model_id} was not READY after {waited:.0f} s (last: {last}); raise "
                f"--timeout for a slow model, or look at the agent's and Triton's logs"
            )
        return AgentUnreachableError(
            f"the agent at {self._agent.address} did not answer for {waited:.0f} s (last: "
            f"{last}); check that the tritonshare agent runs on this node and listens there"
        )


def _size(count: int) -> str:
    """Bytes for a log sentence: '348 bytes', '2Mi'."""
    return f"{count} bytes" if count < 1024 else format_bytes(count)
