"""The inputs and outputs of an eviction: the node gateway's activity, the rule, what is told.

`agent.models.nodemodels` asks `Evictor.choose` which of a GPU's models to put to sleep for a load
that does not fit, with the models the GPU holds; this reads the gateway's activity table
(`common.activity`), fills in which of them are serving and when each was last used, and applies
`agent.models.eviction`'s rule. A missing, unreadable or stale table means nobody's activity is
known, and nothing is evicted (the load fails with that reason). Once `agent.models.nodemodels` has
put a victim to sleep, `evicted` records the Normal Event on its pod and counts it. The sleeping
itself (through Triton, under the victim's lock, inside the load's GPU turn) is
`agent.models.nodemodels`'.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from agent.kube.events import PodEvents
from agent.metrics import AgentMetrics
from agent.models.eviction import Choice, Gpu, Loaded, choose
from common.activity import ActivityTable, ActivityTableError, freshness_problem, read_table
from common.logs import subject

log = logging.getLogger(__name__)

EVICTED_REASON = "ModelEvicted"


class Evictor:
    """Chooses victims from the gateway's activity, and tells their pods."""

    def __init__(
        self,
        activity_path: Path | None,
        *,
        max_age: float,
        min_idle: float,
        events: PodEvents,
        metrics: AgentMetrics,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.activity_path = activity_path
        self.max_age = max_age
        self.min_idle = min_idle
        self._events = events
        self._metrics = metrics
        self._wall = wall

    def _activity(self, now: float) -> tuple[ActivityTable | None, str]:
        if self.activity_path is None:
            return None, (
                "this node runs no node gateway (--activity-table and --gateway-table unset), so "
                "the agent cannot tell which models are serving"
            )
        try:
            table = read_table(self.activity_path)
        except ActivityTableError as e:
            return None, str(e)
        problem = freshness_problem(table, now, self.max_age)
        return (None, problem) if problem else (table, "")

    def choose(
        self, gpu: Gpu, held: Sequence[Loaded], namespace: str, needed: int, claim: int = 0
    ) -> Choice:
        """The models of `held` to put to sleep (their `last_used` the agent's own: when it last
        loaded or touched them), or why none may be."""
        now = self._wall()
        table, problem = self._activity(now)
        seen = []
        for model in held:
            activity = table.models.get(model.name) if table else None
            if activity is not None:
                model = replace(
                    model,
                    in_flight=activity.in_flight,
                    last_used=max(model.last_used, activity.last_used),
                )
            seen.append(model)
        choice = choose(
            gpu, seen, namespace, needed, now, self.min_idle, claim=claim, activity_problem=problem
        )
        if problem and needed > 0:
            log.warning("No model may be evicted on %s: %s.", gpu.label, problem)
        return choice

    def evicted(
        self,
        victim: Loaded,
        pod_key: str,
        uid: str,
        why: str,
        waking: bool,
        *,
        reclaimed: bool = False,
    ) -> None:
        """`victim` was put to sleep to make room: count it and tell its pod (a Normal Event).
        `reclaimed`: though in use, its namespace held more than its share of the GPU."""
        self._metrics.evictions.labels("wake" if waking else "load").inc()
        self._metrics.sleeps.labels("evicted").inc()
        how = (
            "while in use, its namespace holding more than its share of the GPU's room for "
            "on-demand models,"
            if reclaimed
            else "while idle"
        )
        message = (
            f"model {victim.model_id} was unloaded {how} to make room on its GPU ({why}); "
            f"its files stay on the node and its next request loads it again"
        )
        log.info("%s.", message, extra=subject(pod=pod_key, model=victim.model_id))
        self._events.normal(pod_key, uid, EVICTED_REASON, message)
