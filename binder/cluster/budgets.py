"""PodDisruptionBudgets as the binder reads them: the budget a preemption or a move may not break.

A TritonModel's `spec.minAvailable` is one too, over its replicas (`Budget.model_uid`), kept by
the model host writer (`binder.tritonmodels.hostwriter`). Pure: converted once from the API's
objects by the cache, read by the preemption.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from binder.cluster.podterms import LabelSelector, selector_from_api


@dataclass(frozen=True)
class Budget:
    """A PodDisruptionBudget, as the preemption reads it."""

    namespace: str
    name: str
    selector: LabelSelector
    allowed: int
    """status.disruptionsAllowed."""
    disrupted: frozenset[str] = frozenset()
    """status.disruptedPods: pods already counted against it."""
    model_uid: str = ""
    """For a TritonModel's minAvailable: the model whose replicas it counts (its selector
    unused); `allowed` is its served replicas less its minimum."""


def budget_from_api(obj: Mapping[str, Any]) -> Budget:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    allowed = status.get("disruptionsAllowed")
    disrupted = status.get("disruptedPods")
    return Budget(
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
        selector_from_api(spec.get("selector")),
        allowed if isinstance(allowed, int) and not isinstance(allowed, bool) else 0,
        frozenset(str(k) for k in disrupted) if isinstance(disrupted, dict) else frozenset(),
    )
