"""An on-demand model's residency as its proxy sees it: loaded, going to sleep, asleep, waking.

The proxy of an `on-demand` pod puts its model to sleep (the agent's `UnloadModel` with
`idle=true`: unloaded from Triton, files kept) once nothing has been held for --idle-seconds, and
wakes it (`LoadModel`) when a request comes for it. Idleness is read off the limiter that every
inference request passes anyway (`held`, and when the last one left): no timer and no clock read
per request. A request that finds the model not loaded waits in `Limiter.acquire` on the one wake
this object runs at a time, for at most --wake-timeout-seconds; a wake that fails (no room on the
GPU) answers every waiter with the agent's reason, and for `RETRY_SECONDS` later requests get the
same answer without another `LoadModel`, so a flood of requests to a model that cannot fit costs
the agent one call per period. A model found unloaded behind the proxy's back (the agent evicted
it for another wake; the model check sees it sleeping) is marked asleep so the next request wakes
it.

A model host's proxy gives each on-demand model of its table its own residency (`Residencies`):
the same state machine, each with its idle time and its own wake.

Owns this state machine, its counters and the idle watch. It calls the agent only through the
`Agent` protocol (proxy.agentclient in the process) and reads time from an injected clock; it
must not touch sockets or answer requests itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from proxy.policy.limiter import Limiter
from proxy.policy.refusals import WakeError
from proxy.processflags import ProxyState

log = logging.getLogger(__name__)

LOADED = "loaded"
UNLOADING = "unloading"
ASLEEP = "idle-unloaded"
WAKING = "waking"
STATES = (LOADED, UNLOADING, ASLEEP, WAKING)
"""Every state, as the `state` label of tritonshare_proxy_model_state."""

PERMANENT_REFUSALS = frozenset({"FAILED_PRECONDITION", "PERMISSION_DENIED"})
"""The agent's answers to an idle unload that asking again cannot change (the pod is `always`
by its proof of placement, or may not act on the model): the proxy stops asking."""

SUSPECT_SECONDS = 0.25
"""The least time between two model checks asked for by answers that look like a missing model
(`suspect`): a flood of bad requests costs the gateway at most four ready requests a second."""

RETRY_SECONDS = 5.0
"""After a failed wake: how long requests are refused with its reason before the next wake is
tried (and the Retry-After they carry)."""


@dataclass(frozen=True)
class AgentAnswer:
    """How one sleep or wake call ended: `ok`, or the agent's status code name and reason."""

    ok: bool
    code: str = "OK"
    reason: str = ""


class Agent(Protocol):
    """The two agent calls residency needs, for the pod's own model."""

    async def sleep(self) -> AgentAnswer:
        """UnloadModel(idle=true)."""

    async def wake(self) -> AgentAnswer:
        """LoadModel of the sleeping model; returns once it is READY or has failed."""


@dataclass(frozen=True)
class IdlePolicy:
    """When to sleep: after `idle_seconds` with nothing held; looked at every `check_seconds`."""

    idle_seconds: float
    check_seconds: float
    wake_timeout_seconds: float


class Residency:
    """The model's residency state, its single wake, and its idle watch."""

    def __init__(
        self,
        model_id: str,
        agent: Agent,
        limiter: Limiter,
        state: ProxyState,
        policy: IdlePolicy,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_wake: Callable[[float], None] = lambda seconds: None,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.model_id = model_id
        self._on_change = on_change
        """Told after `asleep` changes: the proxy decides its pod's readiness from every
        model's (`ProxyState.model_asleep`)."""
        self._on_wake = on_wake
        self._agent = agent
        self._limiter = limiter
        self._proxy_state = state
        self.policy = policy
        self._clock = clock
        self.state = LOADED
        self.asleep = False
        """True in every state but LOADED: requests must go through `wake` first (the limiter
        reads this attribute on its fast path)."""
        self.sleeps = 0
        self.refused_sleeps = 0
        self.wakes = 0
        self.failed_wakes = 0
        self._operation: asyncio.Task[None] | None = None
        """The one agent call in progress (a sleep or a wake): never two at once."""
        self._since = clock()
        """When the model was last loaded by this proxy's doing (start, a wake, a refused
        sleep): idleness counts from here at the earliest."""
        self.given_up = ""
        """Why idle unloads are no longer asked for (a permanent refusal); '' while they are."""
        self.look_now = asyncio.Event()
        """Set by `suspect`: the model check (proxy.reinstall) looks at once."""
        self._suspected = -SUSPECT_SECONDS
        self._failed: tuple[float, str] | None = None
        """The last failed wake: until when its answer stands, and its reason."""

    def _set(self, state: str) -> None:
        self.state = state
        asleep = state != LOADED
        if asleep != self.asleep:
            self.asleep = asleep
            self._on_change()

    # The idle side.

    def idle_seconds(self) -> float:
        """How long nothing has been held (0 while a request is held)."""
        limiter = self._limiter
        if limiter.held:
            return 0.0
        return max(0.0, self._clock() - max(limiter.left, self._since))

    async def check_idle(self) -> None:
        """Sleep the model when it is loaded, idle long enough and nothing else is under way."""
        if self.state != LOADED or self._operation is not None or self._proxy_state.draining:
            return
        if self.given_up:
            return
        if self.idle_seconds() < self.policy.idle_seconds:
            return
        self._set(UNLOADING)
        operation = self._operation = asyncio.get_running_loop().create_task(
            self._sleep(), name=f"the idle unload of model {self.model_id}"
        )
        await asyncio.shield(operation)

    async def _sleep(self) -> None:
        try:
            answer = await _asked(self._agent.sleep)
        finally:
            self._operation = None
        if answer.ok:
            self.sleeps += 1
            self._set(ASLEEP)
            log.info(
                "Model %s was idle for %.0f s: the agent unloaded it (files kept); the next "
                "request wakes it.",
                self.model_id,
                self.policy.idle_seconds,
            )
            return
        self.refused_sleeps += 1
        self._set(LOADED)
        self._since = self._clock()  # look again after a whole idle period
        if answer.code in PERMANENT_REFUSALS:
            self.given_up = f"{answer.code}: {answer.reason}"
            log.error(
                "The agent refuses to put idle model %s to sleep (%s): it stays loaded, and "
                "this proxy no longer asks; check the pod's residency annotation.",
                self.model_id,
                self.given_up,
            )
            return
        log.warning(
            "The agent did not put idle model %s to sleep (%s: %s): it stays loaded; trying "
            "again after another %.0f s idle.",
            self.model_id,
            answer.code,
            answer.reason,
            self.policy.idle_seconds,
        )

    # The wake side.

    def suspect(self) -> None:
        """Triton answered an inference as if the model were not loaded: have the model check
        look now rather than at its next period (at most every SUSPECT_SECONDS)."""
        if self.state != LOADED or self.look_now.is_set():
            return
        now = self._clock()
        if now - self._suspected >= SUSPECT_SECONDS:
            self._suspected = now
            self.look_now.set()

    def found_asleep(self, why: str) -> None:
        """The model is not loaded though this proxy did not sleep it (the agent evicted it for
        another wake): the next request wakes it."""
        if self.state != LOADED or self._operation is not None:
            return
        self._set(ASLEEP)
        log.info("Model %s is unloaded (%s): the next request wakes it.", self.model_id, why)

    def found_loaded(self) -> None:
        """The model is loaded though this proxy thought it asleep (a wake by another path)."""
        if self.state == ASLEEP and self._operation is None:
            self._set(LOADED)

    async def wake(self) -> None:
        """Return once the model is loaded: join the wake in progress or start one, waiting at
        most --wake-timeout-seconds; WakeError past it, or when the agent could not load it
        (its reason in the message)."""
        deadline = self._clock() + self.policy.wake_timeout_seconds
        while self.asleep:
            failed = self._failed
            if failed is not None and self._clock() < failed[0]:
                raise WakeError(failed[1], retry_after=_whole(failed[0] - self._clock()))
            if self._operation is None:
                self._operation = asyncio.get_running_loop().create_task(
                    self._wake(), name=f"the wake of model {self.model_id}"
                )
            operation = self._operation
            left = deadline - self._clock()
            try:
                async with asyncio.timeout(max(left, 0.0)):
                    await asyncio.shield(operation)
            except TimeoutError:
                raise WakeError(
                    f"model {self.model_id} is being loaded after idling and was not ready "
                    f"within {self.policy.wake_timeout_seconds:g} s; retry shortly",
                    retry_after=1,
                ) from None

    async def _wake(self) -> None:
        try:
            self._set(WAKING)
            started = self._clock()
            answer = await _asked(self._agent.wake)
            seconds = self._clock() - started
        finally:
            self._operation = None
        if answer.ok:
            self._failed = None
            self.wakes += 1
            self._on_wake(seconds)
            self._set(LOADED)
            self._since = self._clock()
            log.info("Model %s is awake: loaded in %.2f s.", self.model_id, seconds)
            return
        self.failed_wakes += 1
        reason = (
            f"model {self.model_id} was unloaded while idle and cannot be loaded again now "
            f"({answer.code}: {answer.reason}); retry in {RETRY_SECONDS:g} s"
        )
        self._failed = (self._clock() + RETRY_SECONDS, reason)
        self._set(ASLEEP)
        log.warning("%s.", reason[0].upper() + reason[1:])


class Residencies:
    """The proxy's on-demand models by model id (a model pod's one, or those of a host's table)
    and the one watch over them: each sleeps after its own idle time. With `look` (a host's
    proxy), a model just added, or whose answers look as if it were not loaded, is looked up at
    the agent (`look(model_id)`: True asleep, False loaded, None unknown), so one that slept
    before this proxy started, or that the agent evicted, is marked asleep and its next request
    wakes it; a model pod's reinstall watch (proxy.reinstall) does that for its model."""

    def __init__(self, look: Callable[[str], Awaitable[bool | None]] | None = None) -> None:
        self._look = look
        self.models: dict[str, Residency] = {}

    def add(self, residency: Residency) -> None:
        self.models[residency.model_id] = residency
        if self._look is not None:
            residency.look_now.set()

    def remove(self, model_id: str) -> None:
        self.models.pop(model_id, None)

    def asleep(self, model_id: str) -> bool:
        """Whether `model_id` is on-demand and not loaded now (its next request loads it)."""
        residency = self.models.get(model_id)
        return residency is not None and residency.asleep

    async def check(self) -> None:
        """Sleep each idle model; look up each suspected one."""
        for residency in list(self.models.values()):
            await residency.check_idle()
            if self._look is None or not residency.look_now.is_set():
                continue
            residency.look_now.clear()
            try:
                asleep = await self._look(residency.model_id)
            except Exception:
                log.exception("Asking the agent whether %s is asleep failed.", residency.model_id)
                asleep = None
            if asleep:
                residency.found_asleep("the agent reports it asleep")
            elif asleep is False:
                residency.found_loaded()

    def period(self) -> float:
        """Seconds to the next check: the shortest `check_seconds`; with `look`, at most
        SUSPECT_SECONDS, so a suspected model is looked up soon."""
        if not self.models:
            return 1.0
        seconds = min(r.policy.check_seconds for r in self.models.values())
        return seconds if self._look is None else min(seconds, SUSPECT_SECONDS)

    async def watch(self, stopping: asyncio.Event) -> None:
        """Check every `period` until `stopping` is set."""
        while not stopping.is_set():
            await self.check()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self.period())


async def _asked(call: Callable[[], Awaitable[AgentAnswer]]) -> AgentAnswer:
    """The agent's answer; an unexpected failure of the call is a failed answer, so that every
    waiter gets a refusal it can answer rather than an error it cannot."""
    try:
        return await call()
    except Exception as e:
        log.exception("Calling the agent failed unexpectedly.")
        return AgentAnswer(False, "INTERNAL", f"{type(e).__name__}: {e}")


def _whole(seconds: float) -> int:
    """Seconds as Retry-After writes them: a whole number, at least 1."""
    return max(1, math.ceil(seconds))
