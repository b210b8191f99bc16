"""Holding probationers' requests at the node gateway while a load the agent watches settles.

A load or wake whose READY the agent watches (`agent.quarantine.crashledger`: an exit of Triton
while it is in flight or settling counts against it) shares an exit with any pod's request at Triton
then (`agent.quarantine.suspects.at_exit`): the load is not counted and the pods go on probation. A
probationer was at such an exit before, so a busy one would share the next too, and a model that
kills Triton as it loads, or seconds after, would cost one more exit each time. So while a watched
load is in flight, and for `hold_seconds` after it ends (READY or not), the caller table marks each
probationer's rows held (`common.callers.Caller.held`) and the gateway holds their new requests,
each at most `proxy.policy.probation.HELD_REQUEST_SECONDS`: an exit then is the load's alone. A
probationer's own load holds it while in flight (its requests would explain the exit), not after:
an exit with its requests beside its own settling load counts against its requests.

A load of files the ledger suspects (or of a held namespace: `agent.quarantine.crashledger`) is a
suspect's trial: the hold lasts its whole settling window, `TRIAL_MARGIN_SECONDS` more, and the
caller table marks the held rows `trial`, so the gateway refuses their new requests instead of
holding each for a bounded time. A model that kills Triton later than `hold_seconds` after its READY
then finds no probationer's request at Triton, and its exit is its own: a busy probationer is
never the one at Triton at each of its exits.

A namespace's trials take at most half of the probationers' time: its next trial begins only
once the time since its last one's refusal ended is as long as that refusal was (`trial_turn`),
so a held namespace that loads one new model after another (each a trial) delays its own loads,
not a neighbour's answers. Trials go one at a time.

A trial of files counted for an exit alone (`agent.quarantine.crashledger.CrashLedger.suspected`)
holds **every** pod's new requests on the node while it is in flight, not only the
probationers': a pod not on probation whose requests were at Triton when such a load killed it
would share the exit (`agent.quarantine.suspects.at_exit`), go on probation, and have its
requests refused through every later trial, while the files need one exit more. The hold of the
whole node is bounded: each request at most `proxy.policy.probation.HELD_REQUEST_SECONDS`, each
trial at most `hold_seconds` from its begin, and each file's trials `node_holds_per_file` times
(`--crash-quarantine-after`); since files are suspected only once an exit was counted against
them alone, a namespace holds the node at most that many times for each exit of Triton its
files caused, within its trials' half of the time.

A watched load waits first, at most `drain_seconds`, until the gateway's activity table
(`common.activity`), written since the hold began, shows every held model held with no request at
Triton (`drained`): a request sent before the gateway followed the table may take seconds there.
It then waits until the held models have sent nothing for `quiet_seconds` (the gateway's witness
names every pod that sent a request `common.crashwitness.BESIDE_SECONDS` before an exit), and,
when the table showed them moving meanwhile (a restore letting their requests go), until the
table has said so that long: it is written once a second, a moment behind the requests.
Pods not on probation are held only through such a trial, and with none held nothing waits.
What it must not do: decide who is on probation (`agent.quarantine.suspects`), which loads are
watched (`agent.quarantine.crashledger`), or write the table (`agent.pods.callertable`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Collection

from common.activity import ActivityTable
from common.crashwitness import BESIDE_SECONDS

log = logging.getLogger(__name__)

DRAIN_SECONDS = 8.0
"""How long, at most, a watched load waits for the held pods' requests at Triton to be answered
and for them to have sent nothing for `BESIDE_SECONDS` (a restore after an exit first, about 3 s,
then that quiet)."""

NONE_HELD = -math.inf
"""What `latest_use` says when no pod is held: nothing to wait for."""

POLL_SECONDS = 0.1
"""How often the activity table is read meanwhile."""

MAX_FILES = 10_000
"""Suspected files whose node holds are counted at most (the oldest forgotten first): a tenant
cannot fill the agent's memory."""

TRIAL_MARGIN_SECONDS = 2.0
"""How long a suspect's trial outlasts its settling window (the agent's and the gateway's clocks,
and the moment the agent sees an exit, may differ by that much)."""


def drained(held: Collection[str], table: ActivityTable | None, since: float) -> bool:
    """Whether `table`, written at or after `since` (Unix seconds), shows each model of `held`
    (names in Triton) held by the gateway with no request at Triton, and none held for a restore
    after an exit (what that hold lets go is not held again); True when none is held."""
    if not held:
        return True
    if table is None or table.written_at < since:
        return False
    for name in held:
        activity = table.models.get(name)
        if activity is None or not activity.held or activity.at_triton or activity.restoring:
            return False
    return True


def latest_use(held: Collection[str], table: ActivityTable | None, since: float) -> float | None:
    """None unless `drained`; then when a request of a held model last began or ended (Unix
    seconds), or `NONE_HELD`."""
    if not held:
        return NONE_HELD
    if table is None or not drained(held, table, since):
        return None
    return max(table.models[name].last_used for name in held)


class ProbationHold:
    """The node's watched loads under way, and until when the hold lasts after the last."""

    def __init__(
        self,
        hold_seconds: float,
        *,
        node_holds_per_file: int = 0,
        drain_seconds: float = DRAIN_SECONDS,
        quiet_seconds: float = BESIDE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.hold_seconds = hold_seconds
        """How long the hold lasts after a watched load ends; 0: no hold."""
        self.node_holds_per_file = node_holds_per_file
        """How many trials of one suspected file's hold every pod's requests (0: none)."""
        self.drain_seconds = drain_seconds
        self.quiet_seconds = quiet_seconds
        """How long the held pods must have sent nothing before a watched load begins: the
        gateway's witness names every pod that sent a request that long before an exit."""
        self._node_holds: dict[str, int] = {}
        """By suspected file (manifest digest), its trials that held every pod."""
        self._node_trials: dict[str, int] = {}
        self._node_exited: set[str] = set()
        """The pods whose such trial ended with Triton gone: every other pod is held until
        `triton_back` (at most until `_node_until`), as probationers are after such a load."""
        """The pods (namespace/name) whose trial in flight holds every pod, with how many."""
        self._node_until = 0.0
        """Until when the node's hold of the last such trial lasts at most (`clock` seconds)."""
        self._clock = clock
        self._wall = wall
        self.loads = 0
        """Watched loads under way."""
        self.trials = 0
        """Suspects' loads (trials) among them."""
        self.trial_until = 0.0
        """When the last suspect's settling window ends (`clock` seconds)."""
        self._next_trial: dict[str, float] = {}
        """By namespace, when its next trial may begin (`clock` seconds): `trial_turn`."""
        self._trial_began: dict[str, float] = {}
        self._claimed = False
        self._turn = asyncio.Event()
        self._ended: dict[str, float] = {}
        """The pods (namespace/name) of the watched loads ended lately, with until when each
        holds (`clock` seconds)."""
        self._exited: set[str] = set()
        """Those of them whose load ended with Triton gone: held until `triton_back`."""
        self.on_change: Callable[[], None] | None = None
        """Called when the hold begins or ends: writes the caller table
        (`agent.pods.callertable`)."""
        self.drained: Callable[[float], float | None] | None = None
        """Whether the gateway holds the held pods and their requests at Triton are answered, as
        it wrote after the given Unix time, and when their last request began or ended
        (`latest_use`); None: nothing to wait for."""
        self._lapse: asyncio.TimerHandle | None = None
        self._since = 0.0
        """When the watched loads under way began (Unix seconds): the gateway's word must be
        newer."""

    @property
    def until(self) -> float:
        """When the hold ends with no watched load under way (`clock` seconds): the latest
        ended load's window."""
        return max(self._ended.values(), default=0.0)

    def holding(self) -> bool:
        """Whether probationers' requests are held now."""
        return self.hold_seconds > 0 and (self.loads > 0 or self._clock() < self.until)

    def holds(self, pod: str, probation: bool = True) -> bool:
        """Whether the requests of `pod` (namespace/name) are held now: on `probation`, while
        any watched load is in flight, or another pod's ended less than `hold_seconds` ago;
        not on probation, while a suspected file's trial holds the node (`holds_node`), but
        the trial's own pod."""
        if not probation:
            # Not the trial's own pod: its model is the one loading (the gateway shows no
            # activity of it to drain), and its requests cannot be at Triton before it is READY.
            trials = self._node_trials
            return self.holds_node() and pod not in trials and pod not in self._node_exited
        if not self.holding():
            return False
        now = self._clock()
        return self.loads > 0 or any(p != pod and now < t for p, t in self._ended.items())

    def holds_node(self) -> bool:
        """Whether every pod's new requests are held now, on probation or not: a suspected
        file's trial is in flight, for at most `hold_seconds` from its begin."""
        trials = self._node_trials or self._node_exited
        return bool(trials) and self._clock() < self._node_until

    def trial(self) -> bool:
        """Whether the hold is a suspect's trial now: held pods' requests are refused."""
        return self.holding() and (self.trials > 0 or self._clock() < self.trial_until)

    def trial_wait(self, namespace: str) -> float:
        """Seconds until a trial of `namespace` may begin as far as its share goes (0: now)."""
        return max(0.0, self._next_trial.get(namespace, 0.0) - self._clock())

    async def trial_turn(self, namespace: str) -> None:
        """Wait until a trial of `namespace` may begin, one trial at a time: as long after its
        last trial's refusal ended as that refusal lasted, so a namespace's trials refuse
        probationers at most half the time. The turn is the caller's until its `end` (or
        `trial_over`, when it never began)."""
        while self.hold_seconds > 0:
            wait = self.trial_wait(namespace)
            if not self._claimed and wait <= 0:
                self._claimed = True
                return
            change = self._turn
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(change.wait(), None if self._claimed else wait)

    def trial_over(self) -> None:
        """The trial whose turn was taken is over (or never began): the next may wait its turn."""
        self._claimed = False
        self._turn.set()
        self._turn = asyncio.Event()

    async def begin(self, pod: str, *, trial: bool = False, suspect: str = "") -> None:
        """A watched load of `pod` (a suspect's: `trial`) is about to reach Triton: hold
        probationers from now on (every pod, for a trial of the files `suspect` counted for an
        exit alone, while its allowance lasts), and wait (at most `drain_seconds`) for the
        gateway to have drained them. Every `begin` is followed by one `end`, whatever
        happens."""
        if self.hold_seconds <= 0:
            return
        node = bool(trial and suspect and self._hold_node(suspect))
        if self.loads == 0 or node:
            # Pods whose own load had ended, or not on probation, were not held: only a newer
            # word of the gateway's.
            self._since = self._wall()
        self.loads += 1
        if trial:
            self._trial_began[pod.partition("/")[0]] = self._clock()
        self.trials += 1 if trial else 0
        if node:
            self._node_trials[pod] = self._node_trials.get(pod, 0) + 1
            self._node_until = self._clock() + self.hold_seconds
            # The node's hold lapses then even with the load still in flight.
            asyncio.get_running_loop().call_later(self.hold_seconds, self._node_lapsed)
        if self.on_change is not None:
            self.on_change()  # a probationer's row may have come since the hold began
        deadline = self._clock() + self.drain_seconds
        moving = False
        quiet_from = math.inf  # when the table began to show them drained, once seen moving
        while self.drained is not None:
            last = self.drained(self._since)
            if last == NONE_HELD:
                return
            now = self._clock()
            if last is None:
                moving = True  # the table shows a request at Triton, or a restore
                quiet_from = math.inf
            else:
                # Seen moving, the table may be a moment behind what a restore let go: it must
                # stay drained as long as the quiet asked, not only say so once.
                quiet_from = min(quiet_from, now) if moving else -math.inf
                if now - quiet_from >= self.quiet_seconds and (
                    self._wall() - last >= self.quiet_seconds
                ):
                    return
            if now >= deadline:
                # The gateway did not answer: the load goes on, its neighbours held or not.
                log.warning(
                    "A watched load of pod %s goes on after %.0f s without the node gateway "
                    "showing the held pods' requests answered: an exit of Triton now may be "
                    "shared with them.",
                    pod,
                    self.drain_seconds,
                )
                return
            await asyncio.sleep(POLL_SECONDS)

    def _hold_node(self, suspect: str) -> bool:
        """Whether a trial of the files `suspect` may hold every pod's requests, counting it."""
        held = self._node_holds.get(suspect, 0)
        if held >= self.node_holds_per_file:
            return False
        if suspect not in self._node_holds and len(self._node_holds) >= MAX_FILES:
            self._node_holds.pop(next(iter(self._node_holds)))  # the oldest first
        self._node_holds[suspect] = held + 1
        return True

    def _node_lapsed(self) -> None:
        held = self._node_trials or self._node_exited
        if self.on_change is not None and held and not self.holds_node():
            self.on_change()  # the pods not on probation go now

    def end(
        self, pod: str, *, trial: bool = False, settle_seconds: float = 0.0, exited: bool = False
    ) -> None:
        """A watched load of `pod` has ended: the hold lasts `hold_seconds` more (an exit of
        Triton in that time is still the load's), for other probationers than `pod`; a
        suspect's (`trial`) answered READY, its settling window (`settle_seconds`) and
        `TRIAL_MARGIN_SECONDS` more, if longer, as a trial. A load that ended with Triton gone
        (`exited`) holds until Triton is back (`triton_back`), at most `hold_seconds`: the
        agent sees the load fail the moment Triton dies, a moment before the gateway sees
        Triton go, and a held request let go then would fail at the dead Triton and be counted
        beside the exit; let go once Triton is back, it waits for its model in the gateway's
        restore instead, and the crasher's next load waits for it to be answered (`begin`)."""
        if self.hold_seconds <= 0:
            return
        self.loads -= 1
        self.trials -= 1 if trial else 0
        if pod in self._node_trials:
            self._node_trials[pod] -= 1
            if not self._node_trials[pod]:
                del self._node_trials[pod]
            if exited:
                self._node_exited.add(pod)
        now = self._clock()
        lasts = self.hold_seconds
        refused_until = now
        if trial and settle_seconds > 0:
            lasts = max(lasts, settle_seconds + TRIAL_MARGIN_SECONDS)
            self.trial_until = max(self.trial_until, now + lasts)
            refused_until = now + lasts
        if trial:
            namespace = pod.partition("/")[0]
            began = self._trial_began.pop(namespace, now)
            self._next_trial = {n: t for n, t in self._next_trial.items() if t > now}
            self._next_trial[namespace] = began + 2 * (refused_until - began)
            self.trial_over()
        self._ended = {p: t for p, t in self._ended.items() if t > now}
        self._ended[pod] = max(self._ended.get(pod, 0.0), now + lasts)
        if exited:
            self._exited.add(pod)
        else:
            self._exited.discard(pod)  # its window runs its whole length
        if self.on_change is not None:
            self.on_change()  # its own pod's requests go now
        loop = asyncio.get_running_loop()
        if self._lapse is None or self._lapse.when() > loop.time() + lasts:
            if self._lapse is not None:
                self._lapse.cancel()
            self._lapse = loop.call_later(lasts, self._lapsed)

    def triton_back(self) -> None:
        """Triton accepts connections again (after an exit, or a drop of the agent's
        sentinel): the hold after each load that ended with Triton gone ends now. The gateway
        saw that exit too, and holds the requests it lets go until their models are loaded
        again (`proxy.gateway.restore`)."""
        if not self._exited and not self._node_exited:
            return
        self._node_exited.clear()
        now = self._clock()
        for pod in self._exited:
            if pod in self._ended:
                self._ended[pod] = min(self._ended[pod], now)
        self._exited.clear()
        if self.on_change is not None:
            self.on_change()  # the pods held after it go now

    def _lapsed(self) -> None:
        self._lapse = None
        if self.on_change is not None:
            self.on_change()  # the pods whose hold ended go now
        now = self._clock()
        later = [t for t in self._ended.values() if t > now]
        if later and self.loads == 0:  # with a load under way, its end schedules the next
            self._lapse = asyncio.get_running_loop().call_later(min(later) - now, self._lapsed)
