"""A model's life on this node: its phases, the events that move it, and what each phase tells.

Owns the one state machine of a model on the node (keyed by its name in Triton): the phases,
the events, the transition table `TRANSITIONS` (data: every (phase, event) pair not in it is
refused), what the agent reports for a phase (`reported`, the `ModelState` of `GetModel`), what
the pod's `ModelLoaded` condition says for that state (`CONDITIONS`), whether a phase counts as
loaded for the metrics, and when a failed load may be tried again (`RetryPolicy`).

It is pure: time is passed in, nothing here reads a clock, the disk or Triton.
`agent.models.nodemodels` holds one `Life` per model, steps it under the model's lock and does the
I/O the step stands for; `agent.models.reconcile` decides which events a pass raises;
`agent.status.conditions` and `agent.metrics` read the results; `agent.installs.filecache` steps the
life of each copy of files kept after its last pod left (CACHED).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from agent.errors import ConflictError
from common.hosted import NOT_LOADED_REASON
from protos import agent_pb2


class ModelState(enum.Enum):
    """agent.proto's ModelState: the proto is the one source of the names and numbers."""

    ABSENT = agent_pb2.MODEL_STATE_ABSENT
    INSTALLED = agent_pb2.MODEL_STATE_INSTALLED
    LOADING = agent_pb2.MODEL_STATE_LOADING
    READY = agent_pb2.MODEL_STATE_READY
    UNLOADING = agent_pb2.MODEL_STATE_UNLOADING
    FAILED = agent_pb2.MODEL_STATE_FAILED


class Phase(enum.Enum):
    """Where a model is in its life on the node, as the agent holds it."""

    ABSENT = "absent"
    """Nothing of it is held: no files the agent installed, not loaded by the agent."""
    INSTALLING = "installing"
    """Its files are being received and checked."""
    INSTALLED = "installed"
    """At rest: the agent does not hold it loaded (its files, when on disk, are kept)."""
    LOADING = "loading"
    """A load of it holds its GPU's slot."""
    READY = "ready"
    """The agent loaded (or adopted) it and holds it loaded."""
    LOST = "lost"
    """Held loaded, but Triton does not have it (Triton restarted, or a load went unanswered):
    loaded again by the next pass."""
    UNLOADING = "unloading"
    """An unload of it holds its GPU's slot."""
    FAILED = "failed"
    """Triton refused its load; tried again once its retry time has come."""
    CACHED = "cached"
    """Its pod is gone; its files stay on the node for a later pod of the same files."""
    IDLE_UNLOADED = "idle-unloaded"
    """An `on-demand` model unloaded while idle; its next request loads it again."""
    WAKING = "waking"
    """An idle-unloaded model loading again for a request that waits for it."""
    QUARANTINED = "quarantined"
    """Coincided with too many of Triton's unexpected exits: never loaded again on this node."""


class Event(enum.Enum):
    """What happens to a model; each is raised by the module named."""

    INSTALL_STARTED = "install started"  # agent.models.nodemodels: an install begins writing
    INSTALL_DONE = "install done"  # agent.models.nodemodels: the files are committed
    INSTALL_FAILED = "install failed"  # agent.models.nodemodels: nothing of the install was kept
    LOAD_STARTED = "load started"  # agent.models.nodemodels: a load takes its GPU's slot
    LOAD_OK = "load ok"  # agent.models.nodemodels: Triton answered the load READY
    LOAD_FAILED = "load failed"  # agent.models.nodemodels: Triton refused the load
    LOAD_REFUSED = "load refused"  # agent.models.nodemodels: the GPU has no room for it
    LOAD_UNANSWERED = (
        "load unanswered"  # agent.models.nodemodels: Triton unreachable, or another error
    )
    UNLOAD_STARTED = "unload started"  # agent.models.nodemodels: a pod or the platform asked
    UNLOADED = "unloaded"  # agent.models.nodemodels: out of Triton, files kept
    # agent.models.nodemodels: files, owner record gone; agent.installs.filecache: copy evicted
    REMOVED = "removed"
    UNLOAD_FAILED = "unload failed"  # agent.models.nodemodels: the unload raised
    ADOPTED = "adopted"  # agent.models.reconcile: Triton runs it and the agent vouches for it
    UNVOUCHED = "unvouched"  # agent.models.reconcile: Triton runs it in a way nobody vouches for
    TRITON_RESTARTED = "Triton restarted"  # agent.models.reconcile: held loaded, not in Triton
    POD_GONE = "pod gone"  # agent.models.reconcile: no live proven pod wants it
    OVER_REQUEST = "measured over request"  # agent.models.reconcile: evicted for its GPU memory
    FILES_KEPT = "files kept"  # agent.installs.filecache: a leaving pod's files kept on the node
    # agent.models.nodemodels: slept or evicted; agent.models.reconcile: on-demand, found at rest
    IDLE = "idle"
    REQUEST_ARRIVED = (
        "request arrived"  # agent.models.nodemodels: a load of a sleeping model (a wake)
    )
    CRASH_SUSPECTED = "crash suspected"  # agent.models.reconcile: its load's crash marker left over
    QUARANTINE_CLEARED = "quarantine cleared"  # agent.models.reconcile: an operator cleared it


_UNLOAD_CAUSES = (Event.UNLOAD_STARTED, Event.POD_GONE, Event.UNVOUCHED, Event.OVER_REQUEST)
_RESTING = (Phase.INSTALLED, Phase.FAILED, Phase.LOST)


def _rows() -> dict[tuple[Phase, Event], Phase]:
    rows: dict[tuple[Phase, Event], Phase] = {}

    def add(phases: tuple[Phase, ...], events: tuple[Event, ...], to: Phase | None) -> None:
        for phase in phases:
            for event in events:
                rows[phase, event] = phase if to is None else to

    # Triton's restart changes only what it held loaded; anything else stays as it is.
    add(tuple(Phase), (Event.TRITON_RESTARTED,), None)
    rows[Phase.READY, Event.TRITON_RESTARTED] = Phase.LOST
    # Installs: from anything at rest, and from READY (Triton may have lost it unnoticed; an
    # install over a model Triton runs is refused by agent.models.nodemodels before it starts).
    installable = (Phase.ABSENT, *_RESTING, Phase.READY, Phase.CACHED, Phase.IDLE_UNLOADED)
    add(installable, (Event.INSTALL_STARTED,), Phase.INSTALLING)
    add((Phase.INSTALLING,), (Event.INSTALL_DONE, Event.INSTALL_FAILED), Phase.INSTALLED)
    # Loads.
    add((*_RESTING, Phase.READY), (Event.LOAD_STARTED,), Phase.LOADING)
    add((Phase.LOADING, Phase.WAKING), (Event.LOAD_OK,), Phase.READY)
    add((Phase.LOADING, Phase.WAKING), (Event.LOAD_FAILED,), Phase.FAILED)
    rows[Phase.LOADING, Event.LOAD_REFUSED] = Phase.INSTALLED
    rows[Phase.LOADING, Event.LOAD_UNANSWERED] = Phase.LOST
    add((Phase.WAKING,), (Event.LOAD_REFUSED, Event.LOAD_UNANSWERED), Phase.IDLE_UNLOADED)
    # Taken over after an agent restart, or vouched for again by a recheck (Triton keeps serving
    # the version it had when a later load of it failed).
    adoptable = (Phase.ABSENT, *_RESTING, Phase.READY, Phase.IDLE_UNLOADED)
    add(adoptable, (Event.ADOPTED,), Phase.READY)
    # Unloads, whatever their cause.
    unloadable = (Phase.ABSENT, *_RESTING, Phase.READY, Phase.IDLE_UNLOADED, Phase.QUARANTINED)
    add(unloadable, _UNLOAD_CAUSES, Phase.UNLOADING)
    add((Phase.CACHED,), (Event.UNLOAD_STARTED,), Phase.UNLOADING)
    add((Phase.UNLOADING,), (Event.UNLOADED, Event.UNLOAD_FAILED), Phase.INSTALLED)
    add((Phase.UNLOADING, Phase.CACHED), (Event.REMOVED,), Phase.ABSENT)
    # Files kept after the pod (LRU), crash quarantine.
    rows[Phase.INSTALLED, Event.FILES_KEPT] = Phase.CACHED
    # Sleep: an on-demand model is unloaded (files kept) and then rests asleep; the reconciler
    # also puts an on-demand model at rest to sleep (after an agent restart, a reinstall). Its
    # next load is a wake.
    rows[Phase.INSTALLED, Event.IDLE] = Phase.IDLE_UNLOADED
    rows[Phase.IDLE_UNLOADED, Event.REQUEST_ARRIVED] = Phase.WAKING
    # A crash is found after the fact: the load that died is unanswered (LOST) by then, or
    # forgotten (INSTALLED) when the agent restarted meanwhile.
    suspects = (Phase.INSTALLED, Phase.LOADING, Phase.READY, Phase.LOST, Phase.WAKING)
    add(suspects, (Event.CRASH_SUSPECTED,), Phase.LOST)
    rows[Phase.QUARANTINED, Event.QUARANTINE_CLEARED] = Phase.INSTALLED
    return rows


TRANSITIONS: dict[tuple[Phase, Event], Phase] = _rows()
"""(phase, event) -> next phase; every pair not here is refused (`RefusedTransitionError`).
CRASH_SUSPECTED goes to QUARANTINED instead of LOST once `Rules.quarantine_after` is reached."""

HELD_LOADED = frozenset({Phase.LOADING, Phase.READY, Phase.LOST, Phase.FAILED, Phase.WAKING})
"""Phases in which the agent means the model to run (the next pass loads it if Triton lacks it)."""


class RefusedTransitionError(ConflictError):
    """An event that may not happen in the model's phase."""

    def __init__(self, phase: Phase, event: Event) -> None:
        super().__init__(
            f"the model is {phase.value} on this node, where {event.value!r} cannot happen: "
            f"the agent does not act on it; try again once its current operation has finished"
        )
        self.phase = phase
        self.event = event


@dataclass(frozen=True)
class Rules:
    """The parameters of the transitions that count."""

    quarantine_after: int = 3
    """Suspected crashes after which a model is quarantined on the node."""


@dataclass(frozen=True)
class Life:
    """One model's phase on the node, with what the transitions remember."""

    phase: Phase = Phase.ABSENT
    failure: str = ""
    """Triton's reason for the last refused load; kept until a load or an install succeeds."""
    failed_at: float = 0.0
    """When that load was refused (the caller's monotonic seconds)."""
    failures: int = 0
    """Loads refused in a row."""
    crashes: int = 0
    """Triton exits in a row this model's loads were suspected of (`agent.quarantine.crashledger`
    keeps the count that survives restarts)."""
    served: bool = False
    """READY when Triton last went, not loaded since but by reloads Triton never answered:
    its reload restores what Triton held (unwatched); a load that died never was."""

    @property
    def held_loaded(self) -> bool:
        return self.phase in HELD_LOADED

    @property
    def counts_loaded(self) -> bool:
        """Whether the metrics count it as loaded: held loaded, its last load not refused."""
        return self.held_loaded and not self.failure


def step(life: Life, event: Event, now: float, reason: str = "", rules: Rules = Rules()) -> Life:
    """The life after `event` at `now` (`reason`: Triton's, for LOAD_FAILED); raises
    RefusedTransitionError for a pair the table does not have."""
    to = TRANSITIONS.get((life.phase, event))
    if to is None:
        raise RefusedTransitionError(life.phase, event)
    kept = (Event.TRITON_RESTARTED, Event.LOAD_STARTED, Event.LOAD_UNANSWERED)
    life = replace(life, served=to is Phase.READY or (life.served and event in kept))
    if event is Event.LOAD_FAILED:
        return replace(life, phase=to, failure=reason, failed_at=now, failures=life.failures + 1)
    if event in (Event.LOAD_OK, Event.INSTALL_DONE):
        return replace(life, phase=to, failure="", failures=0)
    if event is Event.QUARANTINE_CLEARED:
        return replace(life, phase=to, crashes=0)
    if event is Event.CRASH_SUSPECTED:
        crashes = life.crashes + 1
        if crashes >= rules.quarantine_after:
            to = Phase.QUARANTINED
        return replace(life, phase=to, crashes=crashes)
    return replace(life, phase=to)


def given_up(life: Life, attempts: int) -> bool:
    """Whether the model's loads were refused `attempts` times in a row (0: never given up):
    none is tried again until an install succeeds or its pod is recreated (a new name)."""
    return attempts > 0 and bool(life.failure) and life.failures >= attempts


@dataclass(frozen=True)
class RetryPolicy:
    """When a refused load may be tried again by the reconciler: `first` seconds after the
    refusal, times `factor` per refusal in a row, at most `cap` seconds; never after
    `attempts` refusals in a row (0: no such bound)."""

    first: float
    factor: float = 1.0
    cap: float = float("inf")
    attempts: int = 0

    def retry_at(self, life: Life) -> float:
        """When the model's next load may start (0: at once, no refusal is remembered;
        infinity: given up)."""
        if not life.failure:
            return 0.0
        if given_up(life, self.attempts):
            return float("inf")
        delay = self.first * self.factor ** max(life.failures - 1, 0)
        return life.failed_at + min(delay, self.cap)


def reported(life: Life, triton_state: str, installed: bool) -> ModelState:
    """What the agent reports for a model (GetModel, ListModels, the pod's condition): its own
    operation under way first, else what Triton says it runs, else a refused load, else whether
    its files are on disk. `triton_state` is Triton's index state ("" when it lists none)."""
    if life.phase is Phase.LOADING or life.phase is Phase.WAKING:
        return ModelState.LOADING
    if life.phase is Phase.UNLOADING:
        return ModelState.UNLOADING
    by_triton = _TRITON_STATES.get(triton_state)
    if by_triton is not None:
        return by_triton
    if life.failure or life.phase is Phase.QUARANTINED:
        return ModelState.FAILED
    return ModelState.INSTALLED if installed else ModelState.ABSENT


_TRITON_STATES = {
    "READY": ModelState.READY,
    "LOADING": ModelState.LOADING,
    "UNLOADING": ModelState.UNLOADING,
}

CONDITIONS: dict[ModelState, tuple[str, str]] = {
    ModelState.READY: ("True", "ModelReady"),
    ModelState.ABSENT: ("False", "ModelMissing"),
    ModelState.INSTALLED: ("False", NOT_LOADED_REASON),
    ModelState.FAILED: ("False", "ModelFailed"),
}
"""The pod's ModelLoaded condition (status, reason) for each reported state but the passing ones."""

PASSING = frozenset({ModelState.LOADING, ModelState.UNLOADING})
"""Reported states that change nothing on the pod: they end on their own."""
