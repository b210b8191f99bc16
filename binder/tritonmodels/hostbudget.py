"""The PodDisruptionBudget the binder keeps on a namespace's model hosts, so that an eviction of
hosts (kubectl drain; a node emptied before its node pod is replaced) leaves every TritonModel of
the namespace `spec.minAvailable` ready replicas.

One budget per namespace, `BUDGET_NAME`, selecting all its hosts: a host serves many models, and
the Eviction API refuses any eviction of a pod two budgets select, so not one per model. Its
`minAvailable` is the namespace's Ready hosts less the hosts that may go at once: for each model
with a minimum, the most hosts that may be evicted whichever they are (its fullest first) while
its ready replicas stay at its minimum; the least of those over the namespace's models. The
Eviction API counts each eviction against the budget as it admits it, so two drains at once
never both pass; a host not Ready serves nothing and goes freely (`AlwaysAllow`). A model whose
ready replicas are at or below its minimum blocks every eviction of a Ready host of its
namespace, as a PodDisruptionBudget that cannot be met does. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

BUDGET_NAME = "tritonshare-model-hosts"
"""The name of the namespace's budget on its model hosts."""


def evictable(served: Mapping[str, int], minimum: int) -> int | None:
    """How many of its hosts may go at once, whichever they are, so that a model with `served`
    (host -> its ready replicas there) keeps `minimum` ready; None when all of them may."""
    slack = sum(served.values()) - minimum
    if slack < 0:
        return 0
    lost = 0
    for count, there in enumerate(sorted(served.values(), reverse=True)):
        lost += there
        if lost > slack:
            return count
    return None


def min_available(ready_hosts: int, models: Iterable[tuple[Mapping[str, int], int]]) -> int | None:
    """The budget's minAvailable for a namespace with `ready_hosts` Ready hosts and `models`
    ((host -> ready replicas there, minAvailable) of each model with a minimum); None when no
    model has one (no budget)."""
    limits = [evictable(served, minimum) for served, minimum in models]
    if not limits:
        return None
    bounded = [limit for limit in limits if limit is not None]
    if not bounded:
        return 0
    return max(0, ready_hosts - min(bounded))


def budget(namespace: str, host_label: str, minimum: int) -> dict[str, Any]:
    """The namespace's budget on its hosts (those labelled `host_label`)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": BUDGET_NAME, "namespace": namespace},
        "spec": {
            "minAvailable": minimum,
            "selector": {"matchLabels": {host_label: "true"}},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
