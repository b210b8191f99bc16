"""The one way every part writes a status condition: `type`, `status`, `reason`, `message`,
`lastTransitionTime` (and `observedGeneration` where the object has a generation).

As apimachinery's `meta.SetStatusCondition` does, `lastTransitionTime` moves only when `status`
changes: a new reason or message under the same status keeps the time the status began, so
`kubectl get` shows how long a thing has been so, not when it was last said. Times are RFC 3339
in whole seconds with a `Z`, as `metav1.Time` serialises. Three shapes of write use it: a whole
list (`set_condition`: a merge patch that replaces `status.conditions`), one condition beside
others the writer builds (`condition_for`), and one condition merged by type by the API server
(`condition_patch`: a strategic-merge patch of pods/status, which keeps the fields it leaves out).
A kind whose status has several conditions declares them once as a `ConditionSet` (Knative's
`apis.ConditionSet`): which ones it carries, which writer owns each, and how its happy condition
(`Ready`) follows from its dependents. Pure: it reads the clock only where no `now` is given, and
writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

STATUSES = frozenset({"True", "False", "Unknown"})


def rfc3339(moment: datetime) -> str:
    """`moment` as `metav1.Time` writes it: UTC, whole seconds, a `Z`."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_rfc3339() -> str:
    """The time now, as `rfc3339` writes it."""
    return rfc3339(datetime.now(UTC))


@dataclass(frozen=True)
class Condition:
    """What a writer says: the condition of `type` has `status` for `reason`."""

    type: str
    status: str
    reason: str
    message: str
    observed_generation: int | None = None
    """The generation of the object's spec this was judged on; None: not written."""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(
                f"condition {self.type}: status {self.status!r} is not one of "
                f"{', '.join(sorted(STATUSES))}"
            )


def find(conditions: Iterable[Any] | None, condition_type: str) -> dict[str, Any] | None:
    """The condition of `condition_type` in a status's `conditions` (None when there is none;
    entries that are not objects are passed over)."""
    for condition in conditions or ():
        if isinstance(condition, dict) and condition.get("type") == condition_type:
            return condition
    return None


def condition_for(
    new: Condition, old: Mapping[str, Any] | None, *, now: datetime | None = None
) -> dict[str, Any]:
    """`new` as written over `old` (the condition of its type now, or None): `old`'s
    lastTransitionTime kept while the status stays (now when `old` has none), and `old` kept
    whole (its other fields too) while nothing it says changes."""
    if old is not None and old.get("status") == new.status and old.get("lastTransitionTime"):
        if old.get("reason") == new.reason and old.get("message") == new.message:
            written = dict(old)
            if new.observed_generation is not None:
                written["observedGeneration"] = new.observed_generation
            return written
        since = str(old["lastTransitionTime"])
    else:
        since = rfc3339(now or datetime.now(UTC))
    written = {
        "type": new.type,
        "status": new.status,
        "reason": new.reason,
        "message": new.message,
        "lastTransitionTime": since,
    }
    if new.observed_generation is not None:
        written["observedGeneration"] = new.observed_generation
    return written


def set_condition(
    conditions: Iterable[Any] | None, new: Condition, *, now: datetime | None = None
) -> list[dict[str, Any]]:
    """The conditions with `new` set (`condition_for`): in the place of the old one of its type,
    or last; the others, and their order, as they were."""
    kept = [c for c in conditions or () if isinstance(c, dict)]
    old = find(kept, new.type)
    written = condition_for(new, old, now=now)
    if old is None:
        return [*kept, written]
    return [written if c is old else c for c in kept]


def condition_patch(
    new: Condition, was: str | None, *, now: datetime | None = None
) -> dict[str, Any]:
    """`new` as one entry of a strategic-merge patch of `status.conditions` (merged by type)
    when the old condition is not at hand, only its status: `was` (None: not known). Without a
    change of status it leaves lastTransitionTime out, so the API server keeps the one there."""
    patch: dict[str, Any] = {
        "type": new.type,
        "status": new.status,
        "reason": new.reason,
        "message": new.message,
    }
    if was != new.status:
        patch["lastTransitionTime"] = rfc3339(now or datetime.now(UTC))
    if new.observed_generation is not None:
        patch["observedGeneration"] = new.observed_generation
    return patch


@dataclass(frozen=True)
class ConditionSet:
    """The conditions one kind's status carries, declared once: `owners` maps each type to the
    one writer that decides it; `happy` (its `Ready`) also reads False while a `dependents`
    condition does, and Unknown while one is Unknown (Knative's `ConditionSet.Manage`). A type
    not declared is refused, so no writer can add a condition nobody else knows of."""

    happy: str
    dependents: tuple[str, ...]
    owners: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        missing = [t for t in (self.happy, *self.dependents) if t not in self.owners]
        if missing:
            raise ValueError(f"conditions {', '.join(missing)} have no owner in the set")

    def owned_by(self, owner: str) -> frozenset[str]:
        """The types `owner` decides."""
        return frozenset(t for t, o in self.owners.items() if o == owner)

    def happy_of(self, own: Condition, said: Mapping[str, Condition]) -> Condition:
        """The happy condition: `own` (what its owner judges of it alone) while that is not
        True; else False with the first False dependent's reason and message, else Unknown
        with the first Unknown one's, else `own`. A dependent not in `said` is not judged."""
        if own.type != self.happy:
            raise ValueError(f"condition {own.type} is not this set's happy one ({self.happy})")
        if own.status != "True":
            return own
        for wanted in ("False", "Unknown"):
            for kind in self.dependents:
                dependent = said.get(kind)
                if dependent is not None and dependent.status == wanted:
                    return Condition(
                        self.happy,
                        wanted,
                        dependent.reason,
                        dependent.message,
                        own.observed_generation,
                    )
        return own

    def compose(
        self,
        old: Iterable[Any] | None,
        said: Mapping[str, Condition | None],
        *,
        now: datetime | None = None,
    ) -> list[dict[str, Any]]:
        """The status's conditions once `said` (type -> its new condition, None: removed) is
        written over `old`: each said one through `condition_for` (its lastTransitionTime
        moves only with its status), the others of `old` kept as they are, in the set's
        order, then any other writer's types as they were. Raises ValueError for a type the
        set does not declare."""
        unknown = sorted(set(said) - set(self.owners))
        if unknown:
            raise ValueError(f"conditions {', '.join(unknown)} are not declared in the set")
        kept = [c for c in old or () if isinstance(c, dict)]
        written: list[dict[str, Any]] = []
        for kind in self.owners:
            previous = find(kept, kind)
            if kind in said:
                new = said[kind]
                if new is not None:
                    written.append(condition_for(new, previous, now=now))
            elif previous is not None:
                written.append(previous)
        written.extend(c for c in kept if c.get("type") not in self.owners)
        return written
