"""The churn benchmark's pass rule: a pure function of the run's records (no clock, no I/O).

A run passes when, over the counted time:

- no request failed: every failed request of every model counts, but for those of the crasher's
  own model and those a documented bound refused (`BOUND_REFUSALS`: each listed with its bound
  and reason);
- every change applied completed within its stated time (`Change.limit`);
- every process exit is one a change expected (`why_expected`); any other exit fails the run;
- no answer took longer than `HOLD_BOUND`, the longest the product documents holding a request;
- each model was sent at least `MIN_PER_MINUTE` requests a minute.

`check_goals` prints each part of the rule beside its goal (`benchmarks.goals`).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from benchmarks import goals
from benchmarks.churnload import Request

HOLD_BOUND = 30.0
"""Seconds: the longest the product documents holding a request before it answers: a wake from
zero or of an on-demand model (`--wake-timeout-seconds`, 30, docs/proxy.md and docs/deploy.md),
a wait for a concurrency slot (`--queue-timeout`, 30); a gateway or Triton restart's hold
(`--connect-retry` 5 s, then `--restore-hold-seconds` 20) is shorter. Past it the product answers
503 with Retry-After (gRPC UNAVAILABLE) itself."""
MIN_PER_MINUTE = 120
"""Requests a model must be sent a minute, over every way together, for its run to count. The
closed loop sends as fast as the model answers: on the simulated 2-CPU nodes the gateway's node
in-flight budget (`--max-in-flight-node` auto: 2, one a namespace while both send) serves a
namespace's models on a node one request at a time, about 300 a minute for a lone replica of a
model taking 50 ms beside three others."""
CRASHER = "crasher"
"""The crasher's model: it kills Triton as it loads; no client calls it, and its own failures are
not counted."""

BOUND_REFUSALS: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (
        re.compile(r"is scaled to zero and is starting; this host holds \d+ of its requests"),
        "a parked model's queue (its queue limit, or 1,024 a host: docs/deploy.md)",
        "more requests waited for the parked model than its host holds",
    ),
    (
        re.compile(r"its queue is full"),
        "the proxy's queue (`--queue-size`: docs/proxy.md)",
        "more requests waited for a slot than the queue holds",
    ),
)
"""Answers a documented capacity bound gives: a request the bound refused, not one that failed.
The load is sized to stay under them; any that happen are listed with their bound."""


@dataclass
class Change:
    """One change of the schedule, as applied."""

    kind: str
    node: str
    limit: float = 0.0
    """Seconds the change is stated to complete in (its waits' own limits are within it)."""
    start: float = 0.0
    moment: float = 0.0
    """When its disruptive step happened (the kill, the patch, the replacement)."""
    took: float | None = None
    """Seconds it took to complete; None: it did not complete."""
    end: float = 0.0
    """The end of its window (completion plus the settling time)."""
    parts: list[Change] = field(default_factory=list)
    """The changes applied at once (`two`), each with this one's window."""
    process: str = ""
    """The node pod's container it aims at (`hang`), or the pod's container
    (`namespace/pod/container`: `oom`), if any."""
    note: str = ""

    @property
    def completed(self) -> bool:
        return self.took is not None and self.took <= self.limit


@dataclass(frozen=True)
class Exit:
    at: float
    name: str
    code: str
    cause: str
    last_lines: str


STORAGE_INITIALIZER = "storage-initializer"
"""A model pod's init container that fetches its files from the store."""
CHURN_CAUSES = ("SIGKILL by the churn", "SIGTERM by the churn", "node pod replaced")
NODE_POD_PROCESSES = ("agent", "gateway", "triton")
STOPPED = ("signal SIGTERM", "signal SIGKILL", "exit code 0", "exit code 143", "exit code 137")
"""How a process the kubelet stops ends: by its SIGTERM, or its SIGKILL after the grace period."""


def why_expected(e: Exit, changes: list[Change]) -> str:
    """Why a change expected this exit; empty when none did: the churn's own kills, a pod's
    containers ending as it is deleted, the crasher and the Triton it kills, a replaced node
    pod's processes stopped (not crashed) during that change, a hung container stopped or
    killed by its liveness probe during its hang, the container the OOM change killed
    (`OOMKilled`, during it), a model pod's storage initializer failing while the store is
    down (during that change; the kubelet starts it again). The parts of a change of several at
    once (`two`) expect what each expects alone."""
    changes = [p for c in changes for p in (c.parts or [c])]
    if e.cause.startswith(CHURN_CAUSES):
        return "the churn's own"
    if "(pod deleted)" in e.cause:
        return "its pod was deleted"
    if e.name.startswith(f"pod crash/{CRASHER}/") or (
        e.name.startswith("triton/") and f"it last loaded {CRASHER}" in e.cause
    ):
        return "the crasher's"
    for change in changes:
        if (
            change.kind == "oom"
            and e.name == f"pod {change.process}"
            and e.cause.startswith("OOMKilled")
            and change.start <= e.at <= change.end
        ):
            return "OOM-killed by the churn"
        if (
            change.kind == "store-down"
            and e.name.startswith("pod ")
            and e.name.endswith(f"/{STORAGE_INITIALIZER}")
            and change.start <= e.at <= change.end
        ):
            return "its fetch failed while the store was down"
    process, _, node = e.name.partition("/")
    for change in changes:
        if node != change.node or not change.start <= e.at <= change.end:
            continue
        if change.kind == "node-pod" and process in NODE_POD_PROCESSES and e.code in STOPPED:
            return "its node pod replaced"
        if (
            change.kind == "hang"
            and process == change.process
            and (e.code in STOPPED or e.cause.startswith("the kubelet killed it"))
        ):
            return "restarted as it hung"
    return ""


def refused_by_bound(request: Request) -> tuple[str, str] | None:
    """The documented bound that refused `request` and why, or None."""
    for pattern, bound, reason in BOUND_REFUSALS:
        if pattern.search(request.detail):
            return bound, reason
    return None


@dataclass
class Verdict:
    failed: list[Request] = field(default_factory=list)
    refused: list[tuple[Request, str, str]] = field(default_factory=list)
    """Requests a documented bound refused, with the bound and the reason."""
    crasher: int = 0
    unfinished: list[Change] = field(default_factory=list)
    unexpected: list[Exit] = field(default_factory=list)
    slow: list[Request] = field(default_factory=list)
    """Answers slower than the hold bound."""
    rates: dict[str, float] = field(default_factory=dict)
    """Requests a minute per model."""
    thin: dict[str, float] = field(default_factory=dict)
    """The models sent fewer than the minimum a minute, and their rate."""

    @property
    def passed(self) -> bool:
        return not (self.failed or self.unfinished or self.unexpected or self.slow or self.thin)

    def reasons(self) -> list[str]:
        """Why the run failed, one line a rule; empty when it passed."""
        said = []
        if self.failed:
            by_model = Counter(r.model for r in self.failed)
            said.append(
                f"{len(self.failed)} failed requests ("
                + ", ".join(f"{m} {n}" for m, n in sorted(by_model.items()))
                + ")"
            )
        if self.unfinished:
            said.append(
                f"{len(self.unfinished)} changes not completed within their time ("
                + ", ".join(c.kind for c in self.unfinished)
                + ")"
            )
        if self.unexpected:
            said.append(
                f"{len(self.unexpected)} unexpected process exits ("
                + ", ".join(e.name for e in self.unexpected)
                + ")"
            )
        if self.slow:
            worst = max(r.end - r.start for r in self.slow)
            said.append(f"{len(self.slow)} answers past the hold bound (worst {worst:.1f} s)")
        if self.thin:
            said.append(
                "too few requests a minute: "
                + ", ".join(f"{m} {rate:.0f}" for m, rate in sorted(self.thin.items()))
            )
        return said


def judge(
    requests: list[Request],
    changes: list[Change],
    exits: list[Exit],
    models: list[str],
    minutes: float,
    hold_bound: float = HOLD_BOUND,
    min_per_minute: float = MIN_PER_MINUTE,
) -> Verdict:
    """The rule, over the counted requests of `models` during `minutes`."""
    verdict = Verdict()
    for r in requests:
        if r.ok:
            if r.end - r.start > hold_bound:
                verdict.slow.append(r)
            continue
        if r.model == CRASHER:
            verdict.crasher += 1
            continue
        bound = refused_by_bound(r)
        if bound is not None:
            verdict.refused.append((r, *bound))
        else:
            verdict.failed.append(r)
    verdict.unfinished = [c for c in changes if not c.completed]
    verdict.unexpected = [e for e in exits if not why_expected(e, changes)]
    sent = Counter(r.model for r in requests)
    for model in models:
        rate = sent[model] / minutes if minutes > 0 else 0.0
        verdict.rates[model] = rate
        if rate < min_per_minute:
            verdict.thin[model] = rate
    return verdict


def check_goals(verdict: Verdict) -> list[bool]:
    """Each part of the rule beside its goal, printed; all True when the run passed."""
    return [
        goals.check("failed requests", len(verdict.failed), 0),
        goals.check("changes not completed within their time", len(verdict.unfinished), 0),
        goals.check("unexpected process exits", len(verdict.unexpected), 0),
        goals.check(f"answers past {HOLD_BOUND:g} s", len(verdict.slow), 0),
        goals.check(
            "fewest requests a model a minute",
            min(verdict.rates.values(), default=0.0),
            MIN_PER_MINUTE,
            ">=",
        ),
    ]


def exit_code(verdict: Verdict) -> int:
    return 0 if verdict.passed else 1
