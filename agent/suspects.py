"""The rule that turns the gateway's witnesses of Triton's unexpected exits into quarantined pods.

At each unexpected exit of the node's Triton the gateway names the pods whose requests were at
Triton (`common.crashwitness`). A pod's count is of exits in a row at which it was a suspect: an
exit it was not present at ends its run, so a pod is quarantined only when it was present at
every one of the last `quarantine_after` exits. A neighbour that happened to have a request at
Triton at one exit is counted once, and its count ends at the next exit it is absent from; a
neighbour present at every exit of a run (a pod that is never idle) is counted as the pod that
causes them, and is quarantined with it: nothing in a witness tells them apart. A quarantine
stays until an operator clears it. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

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


def counted(
    records: Mapping[str, CallerRecord], suspects: Iterable[Suspect], quarantine_after: int
) -> dict[str, CallerRecord]:
    """The records after one unexpected exit whose witnesses name `suspects`: each suspect's
    run grows by one (quarantined at `quarantine_after`), every other run ends, quarantines
    stay."""
    present = {s.pod: s for s in suspects}
    after = {pod: r for pod, r in records.items() if r.quarantined}
    for pod, suspect in sorted(present.items()):
        if pod in after:
            continue
        before = records.get(pod)
        crashes = (before.crashes if before is not None else 0) + 1
        after[pod] = CallerRecord(
            pod, suspect.model_id, suspect.uid, crashes, crashes >= quarantine_after
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
