"""When the reconciler loads again a model whose load failed, and when it gives up.

A wanted model whose load failed waits a resync period before the reconciliation pass
(`agent.models.reconcile`) loads it again, twice as long after each failure in a row up to
`--load-backoff-max-seconds`: each try holds its GPU's slot. After `--max-load-attempts`
failures in a row it is not loaded again until its files are installed again or its pod is
recreated; its pod is told so once, by a Warning Event (ModelLoadGivenUp; its condition says so
too, from `ModelReports.status`). A model whose loads are no longer given up is told again should
they be given up once more.
The schedule itself is `agent.phases.RetryPolicy`, read from the model's life; this module holds
the policy and who was told.
"""

from __future__ import annotations

import logging

from agent.kube.events import PodEvents
from agent.metrics import AgentMetrics
from agent.phases import Life, RetryPolicy
from agent.pods.provenpods import Proven
from common.logs import subject

log = logging.getLogger(__name__)


class LoadRetries:
    """The back-off of failed loads, and the pods told that theirs are given up."""

    def __init__(
        self,
        metrics: AgentMetrics,
        events: PodEvents,
        *,
        resync_seconds: float,
        load_backoff_max_seconds: float,
        max_load_attempts: int,
    ) -> None:
        self.metrics = metrics
        self.events = events
        self.policy = RetryPolicy(
            first=resync_seconds,
            factor=2.0,
            cap=load_backoff_max_seconds,
            attempts=max_load_attempts,
        )
        self._given_up: set[str] = set()
        """Names whose pods were told their loads are given up (told once per name)."""

    def retry_at(self, life: Life) -> float:
        """When the model's next load may start (0: at once; infinity: given up)."""
        return self.policy.retry_at(life)

    def given_up(self, name: str, pod: Proven, life: Life) -> bool:
        """Whether the model's loads are given up; if so its pod is told, once."""
        if self.policy.retry_at(life) != float("inf"):
            return False
        self._announce_given_up(name, pod, life)
        return True

    def only_given_up(self, names: set[str]) -> None:
        """Of the names told, those given up still: the others are told again next time."""
        self._given_up &= names

    def _announce_given_up(self, name: str, pod: Proven, life: Life) -> None:
        """Tell the pod, once, that its model's loads are given up (its condition says so too,
        from `ModelReports.status`)."""
        if name in self._given_up:
            return
        self._given_up.add(name)
        self.metrics.reconciles.labels("load_given_up").inc()
        message = (
            f"model {pod.model_id} ({name} in Triton) failed to load {life.failures} times in a "
            f"row (--max-load-attempts {self.policy.attempts}); the tritonshare agent does not "
            f"try again until the model's files are installed again or the pod is recreated. "
            f"The last failure: {life.failure}"
        )
        log.warning("%s.", message, extra=subject(pod=pod.key, model=pod.model_id))
        self.events.warn(pod.key, pod.uid, "ModelLoadGivenUp", message)
