"""A TritonModel's priority, resolved from the cluster's PriorityClasses as the Priority
admission plugin resolves a pod's.

`spec.priorityClassName` names a class whose `value` and `preemptionPolicy` every replica of
the model takes; a name no class has is refused in the API server's words (the model's replicas
are then not placed); without a name the class marked `globalDefault` applies (the lowest, should
several be), else priority 0 and PreemptLowerPriority. A TritonModel has no field for a number of
its own: its namespace chooses a class, never a priority. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from binder.cluster.modelviews import ModelInfo

PREEMPT_LOWER = "PreemptLowerPriority"
NEVER = "Never"
CLASS_NOT_FOUND = "PriorityClassNotFound"
"""The Placed condition's reason for a model whose priorityClassName names no class."""


@dataclass(frozen=True)
class PriorityClassInfo:
    """A PriorityClass as a replica's priority reads it."""

    name: str
    value: int
    global_default: bool = False
    preemption_policy: str = PREEMPT_LOWER


def priority_class_from_api(obj: Mapping[str, Any]) -> PriorityClassInfo:
    meta = obj.get("metadata") or {}
    value = obj.get("value")
    return PriorityClassInfo(
        name=str(meta.get("name", "")),
        value=value if isinstance(value, int) and not isinstance(value, bool) else 0,
        global_default=obj.get("globalDefault") is True,
        preemption_policy=str(obj.get("preemptionPolicy") or PREEMPT_LOWER),
    )


def class_of(
    name: str, classes: Mapping[str, PriorityClassInfo]
) -> tuple[PriorityClassInfo | None, str]:
    """The class a replica takes (None: priority 0) and, when `name` names no class, why not in
    the API server's words ("" otherwise)."""
    if name:
        found = classes.get(name)
        return found, "" if found is not None else f"no PriorityClass with name {name} was found"
    defaults = [c for c in classes.values() if c.global_default]
    return (min(defaults, key=lambda c: (c.value, c.name)) if defaults else None), ""


def resolve(model: ModelInfo, classes: Mapping[str, PriorityClassInfo]) -> ModelInfo:
    """The model with its replicas' priority and preemptionPolicy from its class, and
    `priority_problem` set when its class does not exist."""
    chosen, problem = class_of(model.priority_class, classes)
    priority = chosen.value if chosen is not None else 0
    policy = chosen.preemption_policy if chosen is not None else PREEMPT_LOWER
    template = model.template
    if (template.priority, template.preemption_policy, model.priority_problem) == (
        priority,
        policy,
        problem,
    ):
        return model
    template = replace(template, priority=priority, preemption_policy=policy)
    return replace(model, template=template, priority_problem=problem)
