"""Keeping the node gateway's caller table (`common.callers`) in step with this node's model pods.

A caller is a pod the agent would act for: a live pod on this node whose placement it can prove,
that owns its model's name in Triton here (`Reconciler.wanted`), with an address of its own. Its
entry carries that name (`tritonName`) when it is the pod's private one; a model installed before
private names is served under its public id, and its entry carries none. A pod on the host
network shares the node's address, as does anything else on the node, so it never qualifies; nor
does an address two pods claim at once (both are left out: an address that names two pods names
none). A model host is one caller per model it serves (`agent.pods.modelpods`): one row per
(address, model), each with the host as its pod and a replica's uid and private name; of several
replicas of the model there, a loaded one's, not draining first, of lowest ordinal (`_preferred`),
so a surge beside the old replica takes over once loaded, and a draining one's requests go to
another loaded one at once (its own in flight finish before its loader unloads it). When that one is
loaded and not draining, the row also names every other such replica (`Caller.spread`): the
gateway spreads the model's requests over them all. The table is
rewritten as soon as the pods or the owners change (coalesced to one write per event-loop turn)
and at least every `refresh_seconds`, which is how the gateway knows the agent is alive. Until
the agent has listed the node's pods it writes nothing, so after an agent restart the gateway
goes on with the table it has. What it must not do: decide proofs or ownership (the
reconciler and `agent.models.nodemodels` do).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from agent.pods.modelpods import PodInfo
from agent.pods.provenpods import Proven
from common.callers import Caller, CallerTable, write_table

log = logging.getLogger(__name__)


def callers_of(
    owners: Mapping[str, Proven], key_of: Callable[[str], str] | None = None
) -> tuple[list[Caller], list[str]]:
    """The callers among the proven owners (by their models' names in Triton), and why the
    others are left out (for the log); with `key_of`, each row carries its pod's key digest
    (`key_of(pod uid)`, a host's own uid for each of its rows)."""
    candidates: dict[str, list[tuple[str, Caller]]] = {}
    hosted: dict[tuple[str, str, str], list[tuple[PodInfo, Caller]]] = {}
    """A host's replicas per model, one row in the end (`_row`)."""
    left_out = []
    for name, proven in sorted(owners.items()):
        pod = proven.pod
        if pod.host_network or not pod.pod_ip or pod.pod_ip == pod.host_ip:
            if pod.host_network or pod.pod_ip:
                left_out.append(f"{pod.object_key} shares the node's address")
            continue
        private = "" if name == pod.model_id else name
        caller = Caller(pod.pod_ip, pod.model_id, pod.object_key, pod.uid, pod.concurrency, private)
        if key_of is not None:
            caller = replace(caller, key=key_of(pod.object_uid))
        if pod.host:
            hosted.setdefault((pod.pod_ip, pod.object_uid, pod.model_id), []).append((pod, caller))
            continue
        candidates.setdefault(pod.pod_ip, []).append((pod.object_uid, caller))
    for (address, host_uid, _), replicas in sorted(hosted.items()):
        candidates.setdefault(address, []).append((host_uid, _row(replicas)))
    callers: list[Caller] = []
    for address, claimants in sorted(candidates.items()):
        pods = {uid for uid, _ in claimants}
        models = {c.model_id for _, c in claimants}
        if len(pods) == 1 and len(models) == len(claimants):
            callers.extend(c for _, c in claimants)
        elif len(pods) == 1:
            left_out.append(f"{claimants[0][1].pod} names a model twice at address {address}")
        else:
            names = ", ".join(sorted({c.pod for _, c in claimants}))
            left_out.append(f"address {address} is claimed by several pods ({names})")
    return callers, left_out


def _row(replicas: list[tuple[PodInfo, Caller]]) -> Caller:
    """A host's row for its replicas of one model: the preferred one's, naming the others
    loaded and not draining as its spread when it is so itself (else it alone is reached, as
    `_preferred` orders)."""
    ordered = sorted(replicas, key=lambda replica: _preferred(replica[0]))
    (first, row), rest = ordered[0], ordered[1:]
    if not _spreads(first):
        return row
    return replace(
        row,
        spread=tuple((c.name_in_triton, c.uid) for pod, c in rest if _spreads(pod)),
    )


def _spreads(replica: PodInfo) -> bool:
    """Whether a replica takes a share of its model's requests: loaded and not draining."""
    return replica.model_loaded[0] == "True" and not replica.deleting


def _preferred(replica: PodInfo) -> tuple[bool, bool, int]:
    """Orders a host's replicas of one model, the one to reach first: loaded (its loaded
    condition True), not draining, lowest ordinal."""
    loaded = replica.model_loaded[0] == "True"
    return not loaded, replica.deleting, int(replica.uid.rpartition("/")[2])


def nobody_quarantined(pod: str) -> str:
    """No pod's requests are refused (a node without the gateway's witness of Triton's exits,
    `agent.status.requestcrash`)."""
    return ""


def nobody_on_probation(pod: str) -> bool:
    """No pod is on probation (a node without the gateway's witness of Triton's exits)."""
    return False


class CallerPublisher:
    """Writes the caller table at `path` whenever the callers change, and every refresh."""

    def __init__(
        self,
        path: Path,
        node_name: str,
        owners: Callable[[], Mapping[str, Proven] | None],
        *,
        refresh_seconds: float = 5.0,
        quarantine: Callable[[str], str],
        probation: Callable[[str], bool],
        held: Callable[[str, bool], bool],
        trial: Callable[[], bool],
        clock: Callable[[], float] = time.time,
        key_of: Callable[[str], str],
    ) -> None:
        """`key_of(pod uid)` is the digest of a pod's caller key (`agent.pods.callerkeys`).
        `quarantine(pod)` says why a pod's requests are refused (`agent.status.requestcrash`);
        the entry of such a pod carries it, and the gateway refuses its requests with it.
        `probation(pod)` says whether the gateway serializes its requests with other
        probationers' (`agent.quarantine.suspects`); `held(pod, probation)` whether it holds the
        pod's new requests now, given whether it is on probation (`agent.models.probationhold`);
        `trial()` whether the hold is a suspect's trial (the gateway refuses held probationers'
        requests; a pod not on probation held through it is only held). A node without the
        gateway's witness of Triton's exits passes `nobody_quarantined` and
        `nobody_on_probation`."""
        self.path = path
        self._quarantine = quarantine
        self._probation = probation
        self._held = held
        self._trial = trial
        self.node_name = node_name
        self._owners = owners
        self.refresh_seconds = refresh_seconds
        self._clock = clock
        self._key_of = key_of
        self._last: tuple[Caller, ...] | None = None
        self._reported: frozenset[str] = frozenset()
        self._pending = False
        self._stopping: dict[str, str] = {}
        """Model pods leaving their Services as the node pod stops, by namespace/name: why."""

    def leave_services(self, pods: Mapping[str, str]) -> None:
        """The model pods `pods` (namespace/name: why) leave their Services as the node pod
        stops: their rows say so (`Caller.stopping`) from the next write, which is now."""
        self._stopping = dict(pods)
        self.publish()

    def held_names(self) -> list[str]:
        """The names in Triton of the rows last written held, each replica of a row's spread
        too (`agent.models.probationhold`)."""
        return [r.name_in_triton for c in self._last or () if c.held for r in c.replicas()]

    def changed(self) -> None:
        """The pods or the owners changed: write the table at the end of this event-loop turn."""
        if self._pending:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.publish()
            return
        self._pending = True
        loop.call_soon(self.publish)

    def publish(self, *, force: bool = False) -> None:
        """Write the table if the callers changed (or `force`, to refresh its time)."""
        self._pending = False
        owners = self._owners()
        if owners is None:
            return  # the pods are not listed yet: the table on disk stays as it is
        callers, left_out = callers_of(owners, self._key_of)
        callers = [replace(c, quarantined=self._quarantine(c.pod)) for c in callers]
        callers = [replace(c, probation=self._probation(c.pod)) for c in callers]
        callers = [replace(c, held=self._held(c.pod, c.probation)) for c in callers]
        if self._stopping:
            callers = [replace(c, stopping=self._stopping.get(c.pod, "")) for c in callers]
        if self._trial():
            callers = [replace(c, trial=c.held and c.probation) for c in callers]
        reported = frozenset(left_out)
        for reason in sorted(reported - self._reported):
            log.warning("Not a gateway caller: %s.", reason)
        self._reported = reported
        current = tuple(callers)
        if current == self._last and not force:
            return
        try:
            write_table(self.path, CallerTable(self.node_name, self._clock(), current))
        except OSError as e:
            log.error(
                "Cannot write the gateway's caller table %s (%s): the gateway refuses every "
                "pod once the table it has grows stale; check the volume.",
                self.path,
                e.strerror,
            )
            return
        if current != self._last:
            log.info(
                "Gateway callers: %s.",
                ", ".join(
                    f"{c.pod} ({c.address}) -> {c.model_id} "
                    f"({', '.join(r.name_in_triton for r in c.replicas())} in Triton)"
                    for c in current
                )
                or "none",
            )
        self._last = current

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh the table every `refresh_seconds` until `stop`."""
        while not stop.is_set():
            self.publish(force=True)
            try:
                await asyncio.wait_for(stop.wait(), self.refresh_seconds)
            except TimeoutError:
                continue
