"""The rule that turns the gateway's witnesses of Triton's unexpected exits into quarantined pods.

At each unexpected exit of the node's Triton the gateway names the pods whose requests were at
Triton, and those that sent one just before (`common.crashwitness`). An exit at which exactly one
pod was present counts against it: its run grows by one, and at `quarantine_after` exits in a row
it is quarantined. An exit at which several pods were present is ambiguous and counts against none
of them (their runs neither grow nor end); it puts each of them on probation for
`probation_seconds` (renewed by each ambiguous exit it is present at), and the gateway lets no two
probationers' requests be at Triton at once, so the next exit names one of them alone. An exit a
pod is absent from ends its run, not its probation. So a busy neighbour present at every exit of an
attacker's is never quarantined with it: once serialized, the attacker's exits find it alone. A
quarantine stays until an operator clears it.

Loads are evidence too (`agent.quarantine.crashledger`), and they come first (`at_exit`): with a
load in flight at the exit, a pod whose last request was answered is no evidence, and pods whose
requests were at Triton share the exit with the load (ambiguous: on probation, counted against none,
and the load is not counted either, until it is counted alone for a later exit:
`agent.quarantine.crashledger` then counts this one against it too and ends the probation it gave);
with a load that finished READY within the settling window and no request at Triton, the load is the
suspect, not the pod that sent last; with requests of other pods at Triton too, they share the exit
(the pods on probation, the load only suspected).
Pure: the clock is an argument, no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace

from common.crashwitness import Suspect

REASON = "RequestsCrashedTriton"
"""The reason of the pod's condition and Warning Event once its requests are quarantined."""


@dataclass(frozen=True)
class CallerRecord:
    """The unexpected exits of Triton in a row at which one pod had requests at Triton."""

    pod: str
    """namespace/name."""
    model_id: str
    uid: str
    crashes: int
    quarantined: bool = False
    probation_until: float = 0.0
    """Unix seconds until which the gateway serializes its requests with other probationers'
    (it was present at an ambiguous exit); 0: never on probation."""

    def on_probation(self, now: float) -> bool:
        return not self.quarantined and now < self.probation_until

    @property
    def namespace(self) -> str:
        return self.pod.partition("/")[0]

    def matches(self, selector: str) -> bool:
        """Whether an operator's `selector` names it: its pod (namespace/name), namespace/model
        id, or model id."""
        return selector in (self.pod, f"{self.namespace}/{self.model_id}", self.model_id)


def message(record: CallerRecord) -> str:
    """What the pod, its clients and the operator are told of its quarantine."""
    return (
        f"requests of pod {record.pod} (model {record.model_id}) were at the node's Triton when "
        f"it exited unexpectedly {record.crashes} times in a row: the pod is quarantined on this "
        f"node and the node gateway refuses its requests, so that the node's other models stay "
        f"served; fix what its requests make the model do, then ask the operator to clear it "
        f"(tritonshare quarantine clear <node> {record.pod})"
    )


def at_exit(
    suspects: Iterable[Suspect],
    *,
    loading: bool,
    settling: Collection[str] = (),
    restoring: bool = False,
    explained: Collection[str] = (),
) -> tuple[list[Suspect], bool]:
    """The pods one exit counts for, of the gateway's `suspects`, and whether it is ambiguous,
    given whether a load was in flight (`loading`), which pods' loads had finished READY within
    their settling window (`settling`, namespace/name), or whether a reload of what Triton held
    before was in flight (`restoring`: no change, but no answered sender counts beside it) when
    Triton died. A settling load of a pod not named shares the exit with the pods whose
    requests were at Triton: nothing in it tells them apart (unless it is `explained`, of
    pods whose suspect reload shares a second exit in a row). Otherwise one pod named alone
    counts; several (at Triton, or having sent within the gateway's window) share it."""
    named = list(suspects)
    at_triton = [s for s in named if s.in_flight > 0]
    if loading:
        return at_triton, bool(at_triton)
    if (settling or restoring) and not at_triton:
        return [], False
    if set(settling) - set(explained) - {s.pod for s in named}:
        return at_triton, True
    return named, len(named) > 1


def counted(
    records: Mapping[str, CallerRecord],
    suspects: Iterable[Suspect],
    quarantine_after: int,
    *,
    now: float = 0.0,
    probation_seconds: float = 0.0,
    ambiguous: bool = False,
) -> dict[str, CallerRecord]:
    """The records after one unexpected exit at `now` whose witnesses name `suspects`: a lone
    suspect's run grows by one (quarantined at `quarantine_after`) unless the exit is
    `ambiguous` (a load shared it); several suspects' runs, or an ambiguous exit's, stay as they
    are and each is on probation until `now + probation_seconds`; every absent pod's run ends
    (its probation stays until it lapses); quarantines stay."""
    present = {s.pod: s for s in suspects}
    alone = len(present) == 1 and not ambiguous
    after: dict[str, CallerRecord] = {}
    for pod, record in records.items():
        if record.quarantined:
            after[pod] = record
        elif pod not in present and record.on_probation(now):
            after[pod] = replace(record, crashes=0)
    for pod, suspect in sorted(present.items()):
        if pod in after and after[pod].quarantined:
            continue
        before = records.get(pod)
        crashes = before.crashes if before is not None else 0
        until = before.probation_until if before is not None else 0.0
        if alone:
            crashes += 1
        else:
            until = max(until, now + probation_seconds)
        quarantined = crashes >= quarantine_after
        after[pod] = CallerRecord(
            pod, suspect.model_id, suspect.uid, crashes, quarantined, 0.0 if quarantined else until
        )
    return after


def merged(witnessed: Iterable[Iterable[Suspect]]) -> list[Suspect]:
    """The suspects of several records of one exit (the sentinel saw it more than once), each
    pod once, with the most requests any record saw."""
    by_pod: dict[str, Suspect] = {}
    for suspects in witnessed:
        for suspect in suspects:
            known = by_pod.get(suspect.pod)
            if known is None or suspect.in_flight > known.in_flight:
                by_pod[suspect.pod] = suspect
    return [by_pod[pod] for pod in sorted(by_pod)]
