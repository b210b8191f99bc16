"""The `tritonshare.io/ModelLoaded` pod condition: whether the node serves each model pod's model.

For every Running pod on this node whose placement is proven, each pass compares what the node
has of its model (`ModelReports.status`, as the pod itself would learn it) with the condition on the
pod, and writes the condition only when its status or reason changes. The status and reason for
each state are `agent.phases.CONDITIONS`'; this module adds the message: `True` (ModelReady) when
the model is READY; `False` when it is missing (ModelMissing: the node pod was replaced or the
repository lost; the pod's proxy reinstalls it), installed but not loaded (ModelNotLoaded),
failed (ModelFailed, with Triton's reason; ModelLoadGivenUp once its loads are no longer tried),
asleep (ModelSleeping: an on-demand model unloaded while idle; no Event, and the pod's readiness,
the proxy's, stays True),
quarantined after Triton exited under its loads (ModelCrashedTriton,
`agent.quarantine.crashledger`), the pod's requests quarantined after Triton exited with them at it
(RequestsCrashedTriton, `agent.status.requestcrash`: the model stays loaded, the gateway refuses the
pod), or Triton is down (TritonUnavailable). A change to False also records a Warning Event
(ModelNotServed), deduplicated per pod and reason by `agent.kube.events`. LOADING and UNLOADING are
passing states and change nothing.

Pods still in their loader are judged only on quarantine (their loader reports the rest), pods
being deleted not at all: a pod whose files are quarantined (`Quarantines.for_pod`: its own
install, or the one refused for the same files) or whose requests are gets the condition and the
Event whatever its phase. A pod a controller owns whose own files are quarantined is then marked
Failed (ModelCrashedTriton, pods/status as the kubelet writes it), so that its controller
replaces it and the binder stops charging it; a pod refused at install is not (its replacement
would be refused again: it stays in its loader, saying why). When
the agent itself is down, nobody here writes: the binder's `agentdown` marks the pods instead
(status Unknown), and this pass sets them back once the agent runs again.
A model host's replica (`agent.pods.modelpods`) is a pod here: its condition is the host's
`<prefix>loaded-<model>`, judged once the host runs; until the host's loader first makes it READY
a missing, unloaded or failed model reads ModelPending, or, while the host's loader reports it
cannot load it (`agent.pods.loadfailures`), the loader's reason (FetchFailed, ModelInvalid...) with
its message and an Event: the loader names the cause as a model pod's loader does, Triton's refusal
included, so the agent's own ModelFailed waits for its word; so does one Triton has loaded
(`failing`: its loader lists it only once it made it READY); the pass runs at once when a
host's report changes. Once a draining replica is not served it reads ModelDrained (no Event).
While the node pod stops (`stopping`), every host replica reads NodePodStopping (no Event), as
does each model pod the stop takes out of its Service (`leaving`).
A replica whose proof fails reads False with the prover's reason (NotPlacedByBinder,
PlacementChanged); the condition of a replica that left the host is taken off.
The write is a strategic-merge patch of pods/status (one condition, merged by type), which the
agent's admission policy narrows to pods bound to the agent's own node. Owns the decision and the
pass; the API call is agent.kube.client's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from agent.errors import AgentError, KubeError, NotPlacedError, TritonUnreachableError
from agent.kube.events import PodEvents
from agent.models.loadquarantine import CRASHED_REASON, PodQuarantine, crash_message
from agent.models.statuses import ModelStatus
from agent.phases import CONDITIONS, PASSING, ModelState
from agent.pods.loadfailures import LoadFailure
from agent.pods.modelpods import PENDING_REASON, PodInfo
from agent.pods.provenpods import Proven
from agent.quarantine.suspects import REASON as REQUESTS_CRASHED_REASON
from common.conditions import Condition
from common.hosted import (
    LOAD_FAILURE_REASONS,
    NODE_STOPPING_REASON,
    SLEEPING_REASON,
    TRITON_UNAVAILABLE_REASON,
)
from common.lifecycle import spawn
from common.logs import subject

log = logging.getLogger(__name__)

NOT_SERVED_EVENT = "ModelNotServed"


def NO_REFUSALS(pod_key: str) -> str:  # noqa: N802 (a null object, named as a constant)
    """Why the node gateway refuses a pod's requests where it keeps no table: never."""
    return ""


GIVEN_UP_REASON = "ModelLoadGivenUp"
"""The reason of a FAILED model whose loads the agent no longer tries (--max-load-attempts)."""
NOT_PLACED_REASON = "NotPlacedByBinder"
DRAINED_REASON = "ModelDrained"
"""The reason of a draining replica once its model is no longer served: it may leave its host."""
QUIET_REASONS = frozenset({SLEEPING_REASON, PENDING_REASON, DRAINED_REASON, NODE_STOPPING_REASON})
"""Reasons of a False condition that are no fault: no Event."""
REINSTALL_WRITE_SECONDS = 10.0
REMEMBERED = 10_000


@dataclass(frozen=True)
class Verdict:
    """What the condition should say."""

    status: str
    reason: str
    message: str


class Hosts(Protocol):
    """This node's pods and model hosts as the conditions see them
    (`agent.pods.nodepods.NodePods`)."""

    by_key: dict[str, PodInfo]
    """namespace/name (a replica's: namespace/<model>/<ordinal>) -> the pod the agent knows."""

    def unproven(self) -> list[tuple[PodInfo, NotPlacedError]]: ...

    def stale(self) -> list[tuple[PodInfo, list[str]]]: ...


class ConditionWriter(Protocol):
    async def set_pod_condition(
        self, namespace: str, name: str, condition: Condition, *, was: str | None = None
    ) -> None: ...


def drained(pod: PodInfo) -> Verdict:
    """The condition of a draining replica no longer served on its host."""
    return Verdict(
        "False",
        DRAINED_REASON,
        f"model {pod.model_id} is not served here: replica {pod.name} is leaving the model "
        f"host (draining)",
    )


def missing(model_id: str) -> Verdict:
    return Verdict(
        *CONDITIONS[ModelState.ABSENT],
        f"model {model_id} is missing on the node (its node pod was replaced or its "
        f"repository lost): the pod's proxy installs it again from the pod's own files",
    )


LOADERS_TO_SAY = frozenset(
    {CONDITIONS[state][1] for state in (ModelState.ABSENT, ModelState.INSTALLED, ModelState.FAILED)}
    | {GIVEN_UP_REASON}
)
"""A replica's verdicts its host's loader says instead while it has not made it READY once: the
loader drives its first load, and names the cause as a model pod's loader does."""


def pending(pod: PodInfo, wanted: Verdict, failure: LoadFailure | None = None) -> Verdict:
    """What a replica's condition says before its host's loader first makes it READY (or once
    its loader reports it cannot load its files, new ones among them): a missing or unloaded
    model is on its way (no Event), or failing to load as its loader reports (`failure`:
    Triton's refusal among them, which the loader reports a moment after the agent sees it); a
    quarantine, a refusal or Triton down the agent knows says so."""
    if wanted.reason not in LOADERS_TO_SAY:
        return wanted
    if failure is not None:
        return failing(pod, failure)
    return Verdict(
        "False",
        PENDING_REASON,
        f"model {pod.model_id} is not loaded yet: the model host's loader installs and loads "
        f"replica {pod.name}",
    )


def failing(pod: PodInfo, failure: LoadFailure) -> Verdict:
    """A replica its host's loader reports it cannot load, Triton's READY among them (a load
    the loader gave up on ended anyway, and fetching its files again fails): the loader lists a
    replica only once it has made it READY, so the host's proxy does not serve it. The same
    words either way, so that a retry that ends READY a moment before its loader lists it
    rewrites nothing."""
    return Verdict(
        "False",
        failure.reason,
        f"model {pod.model_id} is not loaded: the model host's loader cannot load replica "
        f"{pod.name}: {failure.message}",
    )


def verdict(model_id: str, status: ModelStatus | None, triton_live: bool) -> Verdict | None:
    """The condition for a model in `status` (None: Triton could not be asked); None when the
    state is a passing one that should change nothing."""
    if not triton_live or status is None:
        return Verdict(
            "False",
            TRITON_UNAVAILABLE_REASON,
            f"model {model_id} is not served: the node's Triton is not reachable",
        )
    if status.state in PASSING:
        return None
    if status.state is ModelState.ABSENT:
        return missing(model_id)
    if status.quarantined:
        return Verdict("False", status.quarantine_reason or CRASHED_REASON, status.reason)
    if status.sleeping:
        return Verdict(
            "False",
            SLEEPING_REASON,
            f"model {model_id} is asleep: on-demand, it was unloaded from Triton after an idle "
            f"unload (or to make room), its files kept; its next request loads it again",
        )
    where = f"GPU {status.gpu_uuid}" if status.gpu_uuid else "the node"
    messages = {
        ModelState.READY: f"model {model_id} is READY on {where}",
        ModelState.INSTALLED: (
            f"model {model_id}'s files are on the node but it is not loaded in Triton"
        ),
        ModelState.FAILED: (
            f"model {model_id} failed on the node: {status.reason or 'no reason given'}"
        ),
    }
    if status.given_up:
        return Verdict("False", GIVEN_UP_REASON, messages[status.state])
    return Verdict(*CONDITIONS[status.state], messages[status.state])


class ModelConditions:
    """Keeps each proven, Running model pod's ModelLoaded condition in step with the node."""

    def __init__(
        self,
        writer: ConditionWriter,
        events: PodEvents,
        condition_type: str,
        status_of: Callable[[Proven], Awaitable[ModelStatus]],
        *,
        refused: Callable[[str], str],
        quarantine: Callable[[Proven], PodQuarantine | None],
        fail_pod: Callable[[str, str, str, str], Awaitable[None]],
        hosts: Hosts,
        remove: Callable[[str, str, str], Awaitable[None]],
        load_failure: Callable[[PodInfo], LoadFailure | None],
        replica_condition: Callable[[str, int], tuple[str, str]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`refused(pod)`: why the node gateway refuses the pod's requests (empty: it does
        not; `NO_REFUSALS` where the node has no gateway table); `quarantine(pod)`: whether the
        pod's model files are quarantined on the node; `fail_pod(namespace, name, reason,
        message)` marks a pod Failed (its phase only: `fail` says why first); `hosts`: the
        node's pods, and the model hosts' replicas that are not proven and their conditions
        left behind, which `remove(namespace, name, condition type)` takes off;
        `load_failure(replica)`: what the replica's host's loader reports it cannot load
        (`agent.pods.loadfailures`); `replica_condition(model, ordinal)`: the host pod and the
        condition type of a replica the agent does not know (yet)."""
        self._writer = writer
        self._load_failure = load_failure
        self._hosts = hosts
        self._remove = remove
        self._refused = refused
        self._quarantine = quarantine
        self._fail_pod = fail_pod
        self._replica_condition = replica_condition
        self._failed: set[str] = set()
        """Uids of the pods marked Failed (until the watch shows them terminated)."""
        self._events = events
        self.condition_type = condition_type
        self._status_of = status_of
        self._clock = clock
        self.writes = 0
        self._said_at_once: dict[str, float] = {}
        """Pod uid -> when a condition was last written at once for it (`_at_once`)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self.stopping = ""
        """Set when the node pod stops: every host replica's condition says this (False,
        NODE_STOPPING_REASON) whatever the node has of it."""
        self.leaving: dict[str, str] = {}
        """The model pods (namespace/name) the node pod's stop takes out of their Services: each
        one's condition says why (False, NODE_STOPPING_REASON) whatever the node has of it."""

    def reinstalling(self, proven: Proven) -> None:
        """A Running pod (its loader long done) installs its model again: the node had lost it.
        Said at once, not at the next pass, which a fast reinstall would beat."""
        self._at_once(proven, missing(proven.pod.model_id))

    def unloading(self, proven: Proven) -> None:
        """A draining host replica's loader unloads its model: the host's proxy has drained it,
        so it serves nothing here from now on. Said at once (ModelDrained), not once Triton has
        unloaded it (seconds for a large model, while Triton still reports it READY): the binder
        must not count it served meanwhile, for instance when it wants the replica again and
        keeps it (it is loaded again first) while another replica's host leaves its Service."""
        if proven.pod.model_loaded != ("False", DRAINED_REASON):
            self._at_once(proven, drained(proven.pod))

    def _at_once(self, proven: Proven, wanted: Verdict) -> None:
        """Write `wanted` now; returns at once. At most one such write per pod per
        REINSTALL_WRITE_SECONDS, whatever a tenant calls."""
        pod = proven.pod
        now = self._clock()
        last = self._said_at_once.get(pod.uid)
        if last is not None and now - last < REINSTALL_WRITE_SECONDS:
            return
        if len(self._said_at_once) >= REMEMBERED:
            self._said_at_once.clear()
        self._said_at_once[pod.uid] = now
        spawn(
            f"Setting {self.condition_type} on pod {pod.key}",
            self._write(proven, wanted),
            consequence="the pod does not show it",
            keep=self._tasks,
        )

    async def close(self) -> None:
        """Wait for the writes under way (at shutdown)."""
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)

    async def run(
        self,
        stop: asyncio.Event,
        pods: Callable[[], list[Proven] | None],
        triton_live: Callable[[], bool],
        period: float,
    ) -> None:
        """A pass every `period` seconds, and at once after `loaded` (coalesced: one pass for
        all the loads since the last began), until `stop` is set (none before the pods are
        listed)."""
        while not stop.is_set():
            self._wake.clear()
            listed = pods()
            if listed is not None:
                await self.sync(listed, triton_live())
                await self.sync_hosts()
            if self._wake.is_set():
                continue
            waits = [asyncio.ensure_future(w) for w in (stop.wait(), self._wake.wait())]
            try:
                await asyncio.wait(waits, timeout=period, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()

    def loaded(self) -> None:
        """A model was loaded on the node: its pod's (or host replica's) condition says so at
        the next pass, now, not up to a period later (the Service waits on it)."""
        self._wake.set()

    def failures_reported(self) -> None:
        """A host's loader reports other failures than before: its replicas' conditions say
        so at the next pass, now (the TritonModel's status follows them)."""
        self._wake.set()

    async def sync(self, pods: Iterable[Proven], triton_live: bool) -> None:
        """One pass over the pods; a failed write is logged and tried again next pass."""
        # A draining replica is judged too: its condition turning False tells the binder that
        # its loader has unloaded it, and that it may leave the host.
        live = [p for p in pods if not p.pod.deleting or p.pod.draining]
        # A replica is judged once its host runs: its loader is the host's, which never ends.
        judged = [p for p in live if p.pod.running or (p.pod.host and p.pod.host_running)]
        crashed = [p for p in live if p not in judged and await self._judge_in_init(p)]
        statuses: list[ModelStatus | BaseException | None] = [None] * len(judged)
        if triton_live:
            # Together, so their reads of Triton's index are one request (agent.triton).
            statuses = await asyncio.gather(
                *(self._status_of(p) for p in judged), return_exceptions=True
            )
        for proven, status in zip(judged, statuses, strict=True):
            pod = proven.pod
            why = self.stopping if pod.host else self.leaving.get(pod.key, "")
            if why:
                leaving = Verdict("False", NODE_STOPPING_REASON, why)
                if (leaving.status, leaving.reason) != pod.model_loaded:
                    await self._write(proven, leaving)
                continue
            why = self._refused(pod.object_key)
            if why:
                quarantined = Verdict("False", REQUESTS_CRASHED_REASON, why)
                if (quarantined.status, quarantined.reason) != pod.model_loaded:
                    await self._write(proven, quarantined)
                continue
            if isinstance(status, AgentError) and not isinstance(status, TritonUnreachableError):
                # The agent refuses this pod its model (another live pod owns the id): that is
                # why it is not served, said without naming the owner.
                refused = Verdict("False", status.event_reason or "ModelRefused", str(status))
                if (refused.status, refused.reason) != pod.model_loaded:
                    await self._write(proven, refused)
                continue
            if isinstance(status, BaseException):
                # Not an answer about this pod's model: one call to Triton that timed out (a
                # Triton that stays away is told by the liveness watch, `triton_live`, not as a
                # refusal of every pod's model), or a failure of our own.
                log.warning(
                    "Cannot tell whether pod %s's model %s is served (%s): its %s condition "
                    "is left as it is.",
                    pod.key,
                    pod.model_id,
                    status,
                    self.condition_type,
                    extra=subject(pod=pod.key, model=pod.model_id),
                )
                continue
            wanted = verdict(pod.model_id, status, triton_live)
            if wanted is not None and pod.draining and wanted.status == "False":
                wanted = drained(pod)
            elif wanted is not None and pod.host:
                # Its loader's word while it has not made the replica READY, and whenever it
                # reports a failure: a replica that served earlier files may be given new ones
                # its loader cannot load (a roll), which is no missing model; one Triton has
                # loaded is not served while its loader cannot load it.
                failure = self._load_failure(pod)
                if wanted.status == "False" and (not pod.running or failure is not None):
                    wanted = pending(pod, wanted, failure)
                elif wanted.status == "True" and failure is not None:
                    wanted = failing(pod, failure)
            if wanted is not None and wanted.reason == CRASHED_REASON:
                crashed.append(proven)
            if wanted is None or (wanted.status, wanted.reason) == pod.model_loaded:
                if wanted is None or wanted.reason not in LOAD_FAILURE_REASONS:
                    continue
                if wanted.message == pod.loaded_message:
                    continue  # a new cause of the same kind replaces the old message
            await self._write(proven, wanted)
        for proven in crashed:
            await self._fail(proven)

    async def sync_hosts(self) -> None:
        """The model hosts' replicas whose proofs fail say why (their loaded condition False,
        with the prover's reason, and an Event); a host's loaded condition of a replica it no
        longer serves is taken off."""
        for replica, error in self._hosts.unproven():
            refused = Verdict("False", error.event_reason or NOT_PLACED_REASON, str(error))
            if (refused.status, refused.reason) != replica.model_loaded:
                await self._write_on(replica, refused)
        for host, types in self._hosts.stale():
            for condition_type in types:
                try:
                    await self._remove(host.namespace, host.name, condition_type)
                except KubeError as e:
                    log.warning(
                        "Removing %s from model host %s has failed (%s): trying again next pass.",
                        condition_type,
                        host.key,
                        e,
                        extra=subject(pod=host.key),
                    )
                    continue
                self.writes += 1
                log.info(
                    "Model host %s: %s removed (its replica left the host).",
                    host.key,
                    condition_type,
                    extra=subject(pod=host.key),
                )

    async def _judge_in_init(self, proven: Proven) -> bool:
        """Set the condition of a pod in its loader whose requests or files are quarantined;
        True when its own files are (it may be marked Failed)."""
        pod = proven.pod
        why = self._refused(pod.object_key)
        held = self._quarantine(proven)
        if why:
            wanted = Verdict("False", REQUESTS_CRASHED_REASON, why)
        elif held is not None:
            wanted = Verdict("False", CRASHED_REASON, crash_message(held.record))
        else:
            return False
        if (wanted.status, wanted.reason) != pod.model_loaded:
            await self._write(proven, wanted)
        return held is not None and held.installed

    async def _fail(self, proven: Proven) -> None:
        """Mark a controlled pod whose own files are quarantined Failed, once."""
        pod = proven.pod
        if not pod.controlled or pod.uid in self._failed:
            return
        held = self._quarantine(proven)
        if held is None or not held.installed:
            return
        message = (
            f"{crash_message(held.record)}; the pod is marked Failed so that its controller "
            f"replaces it"
        )
        try:
            await self._fail_pod(pod.namespace, pod.name, CRASHED_REASON, message)
        except KubeError as e:
            log.warning(
                "Marking pod %s Failed has failed (%s): trying again next pass; its %s "
                "condition says why it is not served.",
                pod.key,
                e,
                self.condition_type,
                extra=subject(pod=pod.key, model=pod.model_id),
            )
            return
        if len(self._failed) >= REMEMBERED:
            self._failed.clear()
        self._failed.add(pod.uid)
        log.warning(
            "Pod %s is marked Failed (%s): its model's files are quarantined on this node; its "
            "controller replaces it.",
            pod.key,
            CRASHED_REASON,
            extra=subject(pod=pod.key, model=pod.model_id),
        )

    async def fail(self, namespace: str, name: str, reason: str, message: str) -> None:
        """Mark a pod Failed, its condition saying why first: a pod the agent fails says so
        whatever its phase (a pod in its loader has no condition yet). A model host's replica
        (`<model>/<ordinal>`) only says so: its host serves the others."""
        known = self._hosts.by_key.get(f"{namespace}/{name}")
        model, replica, ordinal = name.rpartition("/")
        if known is not None:
            where, condition_type = known.object_name, known.condition_type
        elif replica:
            where, condition_type = self._replica_condition(model, int(ordinal))
        else:
            where, condition_type = name, ""
        condition = Condition(condition_type or self.condition_type, "False", reason, message)
        was = known.model_loaded[0] or None if known is not None else None
        await self._writer.set_pod_condition(namespace, where, condition, was=was)
        if not replica:
            await self._fail_pod(namespace, name, reason, message)

    async def _write(self, proven: Proven, wanted: Verdict) -> None:
        await self._write_on(proven.pod, wanted)

    async def _write_on(self, pod: PodInfo, wanted: Verdict) -> None:
        """Set the pod's condition (a replica's on its host), and an Event when it says the
        model is not served for a fault."""
        condition_type = pod.condition_type or self.condition_type
        try:
            await self._writer.set_pod_condition(
                pod.namespace,
                pod.object_name,
                Condition(condition_type, wanted.status, wanted.reason, wanted.message),
                was=pod.model_loaded[0] or None,
            )
        except KubeError as e:
            log.warning(
                "Setting %s=%s on pod %s has failed (%s): trying again next pass.",
                condition_type,
                wanted.status,
                pod.object_key,
                e,
                extra=subject(pod=pod.key, model=pod.model_id),
            )
            return
        self.writes += 1
        log.info(
            "Pod %s: %s=%s (%s): %s.",
            pod.object_key,
            condition_type,
            wanted.status,
            wanted.reason,
            wanted.message,
            extra=subject(pod=pod.key, model=pod.model_id),
        )
        if wanted.status != "True" and wanted.reason not in QUIET_REASONS:
            self._events.warn(pod.key, pod.uid, NOT_SERVED_EVENT, wanted.message)
