"""What a reconciliation pass does after Triton exits: crash markers, suspects, reload order.

A crash marker left over (`agent.quarantine.crashledger`: a load Triton died under, or just after)
whose model the Triton that answers does not know (a Triton started again lists it with no state;
one in the middle of unloading it, or that unloaded it, has not exited: `KNOWN_TO_THIS_PROCESS`)
is counted against its model's files, unless pods' requests were at Triton then (only suspected
when they were other pods' and the load had finished); at the node's limit the model is
quarantined (never loaded again here, its pod told by a Warning Event and, when a controller
replaces it, marked Failed: ModelCrashedTriton).
After a crash, models under suspicion are loaded last and one at a time, each after the
previous one's settling window, so that the others are served again first and an innocent
model is not loaded beside the guilty one; the others' reloads (models Triton held before it
restarted) are not watched. A namespace whose trial share is spent waits its turn
(`agent.models.probationhold`). When suspects wait, another pass is asked for (the wake event):
at once after this pass's actions, or when a settling window ends.
The reconciler (`agent.models.reconcile`) plans with this and carries out its crash actions here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from agent.errors import AgentError
from agent.kube.events import PodEvents
from agent.metrics import AgentMetrics
from agent.models.loadquarantine import (
    CRASHED_REASON,
    NAMESPACE_CRASHED_REASON,
    crash_message,
    namespace_message,
)
from agent.models.nodemodels import Models
from agent.models.passplan import Action
from agent.phases import Event
from agent.pods.provenpods import Proven
from agent.quarantine.crashledger import Marker
from agent.triton import KNOWN_TO_THIS_PROCESS, LOADING, READY, UNLOADING, IndexEntry
from common.logs import subject

log = logging.getLogger(__name__)


class AfterCrash:
    """Which crash markers a pass blames, when suspects load, and what a blamed crash costs."""

    def __init__(
        self,
        models: Models,
        metrics: AgentMetrics,
        events: PodEvents,
        wake: asyncio.Event,
        fail_pod: Callable[[str, str, str, str], Awaitable[None]],
    ) -> None:
        self.models = models
        self.metrics = metrics
        self.events = events
        self._wake = wake
        self._fail_pod = fail_pod
        self.deferred = False
        """Suspects of a crash were left for a later pass (`order`)."""
        self.settling = False
        """A load answered READY is in its settling window (`agent.quarantine.crashledger`)."""
        self.loads_under_way = False
        """A load is in flight or settling: no suspect loads beside it (`blamed`)."""
        self._settle_pass: asyncio.TimerHandle | None = None

    def begin(self) -> None:
        """A pass starts: nothing is deferred or settling until its plan says so."""
        self.deferred = self.settling = False

    def pass_when_settled(self) -> None:
        """Suspects wait for a settling window: the pass that lets them load comes then."""
        settle = self.models.crashes.quiet_seconds  # a held namespace's load settles longer
        if self.settling and settle > 0 and self._settle_pass is None:
            self._settle_pass = asyncio.get_running_loop().call_later(settle, self._settled)

    def _settled(self) -> None:
        self._settle_pass = None
        self._wake.set()

    def blamed(self, index: dict[str, IndexEntry], wanted: dict[str, Proven]) -> list[Action]:
        """The crash actions of this pass, one per marker counted or suspected; markers of
        loads that finished or nobody blames are answered. Notes whether loads are under way."""
        models = self.models
        markers = models.crashes.markers()
        loads_under_way = False
        died_loading: list[Marker] = []
        died_after: list[Marker] = []
        died_restoring: list[Marker] = []
        for name, marker in markers.items():
            entry = index.get(name)
            if marker.finished_at and entry is not None and entry.state == READY:
                # Settling: a suspect does not load beside it, so the next crash names one.
                if not models.crashes.settled(marker):
                    loads_under_way = True
                    self.settling = True
            elif marker.finished_at and models.records.is_busy(name):
                continue  # an unload or a new load of it: decided when that ends
            elif models.records.is_busy(name) or (entry is not None and entry.state == LOADING):
                loads_under_way = True
            elif entry is not None and entry.state == READY:
                models.crashes.answered(name)  # Triton finished it after the agent stopped
            elif entry is not None and entry.state == UNLOADING:
                # An unload under way in the Triton the load went to (its instances finish
                # their queues): no exit. The marker stays, so an exit before it ends counts.
                continue
            elif entry is not None and entry.state in KNOWN_TO_THIS_PROCESS:
                models.crashes.answered(name)  # unloaded, or refused, by the same Triton
            elif marker.finished_at:
                died_after.append(marker)
            else:
                (died_restoring if marker.restore else died_loading).append(marker)
        self.loads_under_way = loads_under_way
        # A load in flight when Triton died is the suspect; loads that had finished (settling)
        # only when none was in flight; reloads of what Triton held before, only when neither.
        # Several files there: the most recent load counts, the others are only suspected; each
        # loads again alone.
        # A settling load that shared the exit with other pods' requests is only suspected.
        # A load in flight at the exit whose pod asked for it again at once was decided already
        # (`Models.load`): it was in flight all the same.
        taken = models.crashes.in_flight_taken()
        blamed = [] if taken and not died_loading else died_loading or died_after or died_restoring
        unexplained = []
        shared = []
        for marker in [*died_loading, *died_after, *died_restoring]:
            if marker not in blamed:
                models.crashes.answered(marker.name)
            elif models.crashes.explained(marker):
                continue
            elif models.crashes.at_triton(marker):
                shared.append(marker)
            else:
                unexplained.append(marker)
        latest = max(unexplained, key=lambda m: m.finished_at or m.started_at, default=None)
        actions = []
        for marker in [*unexplained, *shared]:
            owner = wanted.get(marker.name)
            alone = latest is not None and marker.digest == latest.digest
            actions.append(
                Action(marker.name, Event.CRASH_SUSPECTED, owner, marker=marker, alone=alone)
            )
        return actions

    def order(self, plan: dict[str, Action], suspects: list[Action]) -> None:
        """Suspects last, and one at a time: nothing else loads beside the one trying. A
        namespace whose trial share is spent waits its turn; the passes go on meanwhile."""
        if not suspects:
            return
        due = [s for s in suspects if s.owner is None or not self._trial_wait(s.owner)]
        self.settling = self.settling or len(due) < len(suspects)
        if not plan and not self.loads_under_way and due:
            plan[due[0].name] = due[0]
        self.deferred = len(suspects) > 1 or suspects[0].name not in plan

    def _trial_wait(self, pod: Proven) -> float:
        return self.models.hold.trial_wait(pod.namespace)

    async def crashed(self, marker: Marker, pod: Proven | None, *, alone: bool = True) -> None:
        """A load Triton died under: count it, and quarantine the model at the limit."""
        namespace = marker.pod.partition("/")[0]
        was_held = self.models.crashes.namespace_quarantine(namespace)
        counted = self.models.quarantine.crash_suspected(marker, alone=alone)
        held = self.models.crashes.namespace_quarantine(namespace)
        if held is not None and was_held is None:
            log.error(
                "Quarantined: %s.",
                namespace_message(held),
                extra=subject(pod=marker.pod, model=marker.model_id),
            )
            if pod is not None:
                self.events.warn(
                    pod.key, pod.uid, NAMESPACE_CRASHED_REASON, namespace_message(held)
                )
        self.metrics.crashes_suspected.inc()
        limit = self.models.crashes.quarantine_after
        where = subject(pod=marker.pod, model=marker.model_id)
        if not alone:
            log.warning(
                "Triton exited while model %s of pod %s loaded or settled, beside a model loaded "
                "after it or other pods' requests at Triton: it is not counted, but it is a "
                "suspect and loads again after the other models, alone (%d of %d crashes in a "
                "row so far).",
                marker.model_id,
                marker.pod,
                counted.crashes,
                limit,
                extra=where,
            )
            return
        if not counted.quarantined:
            log.warning(
                "Triton exited while loading model %s of pod %s (%d of %d crashes in a row "
                "before quarantine): it loads again after the other models, alone.",
                marker.model_id,
                marker.pod,
                counted.crashes,
                limit,
                extra=where,
            )
            return
        message = crash_message(counted)
        log.error("Quarantined: %s.", message, extra=where)
        if pod is None:
            return
        self.events.warn(pod.key, pod.uid, CRASHED_REASON, message)
        if pod.pod.controlled:
            # Its controller replaces it; the binder may place the replacement elsewhere.
            try:
                await self._fail_pod(pod.namespace, pod.pod.name, CRASHED_REASON, message)
            except AgentError as e:
                log.warning(
                    "Marking pod %s Failed has failed (%s): its condition still says why.",
                    pod.key,
                    e,
                    extra=where,
                )
