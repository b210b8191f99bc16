"""Which groups of waiting models get a placeholder this pass, and which placeholders go.

A node autoscaler adds a node for every placeholder it can, so placeholders are a shared budget:
MAX_PLACEHOLDERS in all, split among the namespaces with waiting models before any namespace's
groups are served (max-min fair: a namespace that asks for less leaves the rest to the others),
and at most MAX_PER_NAMESPACE each. A namespace's models cannot hold another's share however many
they are, and a namespace that holds more than its share once others wait loses its pending
placeholders past it (those bound to a node stay: the node is coming).

Within its share, a group of waiting models (`binder.nodescaling.placeholders.Group`):

- with no placeholder gets one;
- while one of its placeholders is pending, waits for the autoscaler;
- once every placeholder of the group is bound and each of their nodes runs a model and has
  served models (a live agent, its GPUs published) for `grace` seconds while models still wait,
  gets one more (up to MAX_PER_GROUP): the new node was not enough;
- whose placeholder's node has served for `grace` seconds running no model at all is refused:
  the node added for it did not take it, so another would not either;
- whose placeholder has been pending for `pending_limit` seconds is refused: no node group
  matches its node selection, or none can grow (Cluster Autoscaler answers such a pod with a
  `NotTriggerScaleUp` Event, Karpenter with none);
- a refused group's placeholders go, and the caller remembers the refusal (`Plan.unhelped`) for
  a while;
- that no longer waits has its placeholders deleted, as has a placeholder that ended.

A model gets no placeholder, and is told why (`Plan.refused`), when no node a node autoscaler
could add would let it be placed: it asks more GPU memory than the largest GPU the cluster's
nodes and node groups offer (`Bounds.largest_gpu`), or more than its namespace's GPU memory quota
leaves (`Bounds.headroom`). A namespace's placeholders also count against that quota: each
charges the least request of the models it stands for, and a namespace gets none past its
quota, as its replicas would not be placed past it.

Pure: decisions from what the watches showed and the times and bounds it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from binder.nodescaling.placeholders import (
    MAX_PER_GROUP,
    MAX_PER_NAMESPACE,
    MAX_PLACEHOLDERS,
    Group,
    Placeholder,
    Waiting,
)
from common.quantity import format_bytes


@dataclass(frozen=True)
class Bounds:
    """What a new node could hold and what each namespace may still place, in bytes."""

    largest_gpu: int = 0
    """The most GPU memory one GPU of the cluster's nodes or of a node group offers, after the
    reserve; 0: unknown (no model is refused for its size)."""
    headroom: Mapping[str, int] = field(default_factory=dict)
    """Namespace -> the GPU memory its quotas leave; a namespace absent has no quota."""


@dataclass(frozen=True)
class Refusal:
    """A waiting model no placeholder asks a node for, and why (a clause for people)."""

    waiting: Waiting
    reason: str


@dataclass(frozen=True)
class Plan:
    """What one pass writes: placeholders to make (their groups), placeholders to delete, the
    models refused one, and the groups newly refused (key, reason) for the caller to remember:
    their node did not take them, or none came."""

    create: tuple[Group, ...] = ()
    delete: tuple[Placeholder, ...] = ()
    refused: tuple[Refusal, ...] = ()
    unhelped: tuple[tuple[str, str], ...] = ()


def why_not(entry: Waiting, bounds: Bounds) -> str:
    """Why no node a node autoscaler adds would let the model be placed ("" when one may)."""
    if bounds.largest_gpu and entry.request > bounds.largest_gpu:
        return (
            f"it requests {format_bytes(entry.request)} of GPU memory, more than the largest "
            f"GPU of the cluster's nodes and node groups offers "
            f"({format_bytes(bounds.largest_gpu)} after the reserve)"
        )
    room = bounds.headroom.get(entry.namespace)
    if room is not None and entry.request > room:
        return (
            f"it requests {format_bytes(entry.request)} of GPU memory and the GPU memory "
            f"quota of namespace {entry.namespace} leaves {format_bytes(room)}"
        )
    return ""


def shares(demand: Mapping[str, int], floor: Mapping[str, int] | None = None) -> dict[str, int]:
    """Namespace -> the placeholders it may hold: MAX_PLACEHOLDERS split max-min fairly among
    the namespaces by what each asks (`demand`), at most MAX_PER_NAMESPACE each, but never below
    its `floor` (the placeholders it holds that cannot go: bound to a node), which the others
    share the rest around. With no floors every namespace gets min(its demand,
    MAX_PER_NAMESPACE, MAX_PLACEHOLDERS // len(demand)) at least."""
    floor = floor or {}
    fixed: dict[str, int] = {}
    while True:
        given: dict[str, int] = {}
        left = max(0, MAX_PLACEHOLDERS - sum(fixed.values()))
        order = sorted(
            (namespace for namespace in demand if namespace not in fixed),
            key=lambda namespace: (demand[namespace], namespace),
        )
        for index, namespace in enumerate(order):
            fair = left // (len(order) - index)
            given[namespace] = min(demand[namespace], MAX_PER_NAMESPACE, fair)
            left -= given[namespace]
        over = {ns: floor[ns] for ns in given if floor.get(ns, 0) > given[ns]}
        if not over:
            return {**given, **fixed}
        fixed.update(over)


def plan(
    waiting: Iterable[Waiting],
    placeholders: Iterable[Placeholder],
    served_for: Callable[[str], float | None],
    grace: float,
    *,
    running: Iterable[str] = (),
    bounds: Bounds = Bounds(),
    refused: Mapping[str, str] | None = None,
    pending_for: Callable[[Placeholder], float] = lambda placeholder: 0.0,
    pending_limit: float = 0.0,
) -> Plan:
    """This pass's placeholder writes. `served_for(node)`: seconds the node has served models
    (None: not yet); `running`: the nodes that run a model pod or a model host; `refused`: group
    key -> why it gets no placeholder (a refusal the caller remembers); `pending_for`: seconds a
    pending placeholder has been seen pending, refused past `pending_limit` (0: never)."""
    refused = refused or {}
    refusals: list[Refusal] = []
    groups: dict[str, Group] = {}
    members: dict[str, list[Waiting]] = {}
    for entry in waiting:
        key = entry.group.key
        why = why_not(entry, bounds) or refused.get(key, "")
        if why:
            refusals.append(Refusal(entry, why))
            continue
        groups.setdefault(key, entry.group)
        members.setdefault(key, []).append(entry)
    delete: list[Placeholder] = []
    by_group: dict[str, list[Placeholder]] = {}
    for placeholder in placeholders:
        if placeholder.ended:
            continue  # going already (or to be deleted by whoever ended it)
        if placeholder.group not in groups:
            delete.append(placeholder)
        else:
            by_group.setdefault(placeholder.group, []).append(placeholder)
    serving = set(running)
    unhelped: list[tuple[str, str]] = []
    for key, mine in sorted(by_group.items()):
        idle = sorted(
            p.node
            for p in mine
            if p.node and p.node not in serving and _served(served_for(p.node), grace)
        )
        stuck = pending_limit > 0 and any(
            not p.node and pending_for(p) >= pending_limit for p in mine
        )
        if idle:
            why = (
                f"node {idle[0]} was added for it and has served for {grace:g} s without taking "
                "it, so another node would not either"
            )
        elif stuck:
            why = (
                f"its placeholder has been pending for {pending_limit:g} s: no node group "
                "matches its node selection, or none can grow"
            )
        if idle or stuck:
            unhelped.append((key, why))
            delete.extend(mine)
            refusals.extend(Refusal(entry, why) for entry in members.pop(key))
            del by_group[key], groups[key]
    create = _turns(groups, members, by_group, served_for, grace, bounds, delete)
    return Plan(
        tuple(create),
        tuple(sorted(delete, key=lambda p: p.name)),
        tuple(refusals),
        tuple(unhelped),
    )


def _turns(
    groups: Mapping[str, Group],
    members: Mapping[str, list[Waiting]],
    by_group: Mapping[str, list[Placeholder]],
    served_for: Callable[[str], float | None],
    grace: float,
    bounds: Bounds,
    delete: list[Placeholder],
) -> list[Group]:
    """The groups that get a placeholder, each namespace within its share and its quota; the
    pending placeholders past a namespace's share are added to `delete`."""
    need = {key: min(entry.request for entry in entries) for key, entries in members.items()}
    held: dict[str, list[Placeholder]] = {}
    wants: dict[str, list[str]] = {}
    for key, group in sorted(groups.items()):
        mine = by_group.get(key, [])
        held.setdefault(group.namespace, []).extend(mine)
        if (
            not any(not p.node for p in mine)
            and len(mine) < MAX_PER_GROUP
            and all(_served(served_for(p.node), grace) for p in mine)
        ):
            wants.setdefault(group.namespace, []).append(key)
    demand = {
        namespace: len(held.get(namespace, [])) + len(wants.get(namespace, []))
        for namespace in {*held, *wants}
    }
    bound = {ns: sum(1 for p in mine if p.node) for ns, mine in held.items()}
    allowed = shares(demand, bound)
    for namespace, mine in sorted(held.items()):
        excess = len(mine) - allowed[namespace]
        if excess > 0:
            # Past its share while others wait: its newest pending placeholders go (a bound one
            # stays, its node is coming).
            pending = sorted((p for p in mine if not p.node), key=lambda p: p.name, reverse=True)
            delete.extend(pending[:excess])
            held[namespace] = [p for p in mine if p not in pending[:excess]]
    room_left = MAX_PLACEHOLDERS - sum(len(mine) for mine in held.values())
    create: list[Group] = []
    for namespace in sorted(wants):
        mine = held.get(namespace, [])
        quota = bounds.headroom.get(namespace)
        charged = sum(need[p.group] for p in mine)
        for key in wants[namespace][: max(0, allowed[namespace] - len(mine))]:
            if room_left <= 0:
                break
            if quota is not None and charged + need[key] > quota:
                continue
            create.append(groups[key])
            charged += need[key]
            room_left -= 1
    return create


def _served(seconds: float | None, grace: float) -> bool:
    return seconds is not None and seconds >= grace
