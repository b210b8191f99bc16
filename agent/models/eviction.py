"""Which idle on-demand models a GPU gives up so that a load fits: the eviction rule.

When a load (a wake, or an on-demand model's first load) finds no room on its GPU, the agent puts
idle `on-demand` models of that GPU to sleep until it fits. The rule, as `choose` applies it:

- never an `always` model, never one an operation of the agent holds, never one serving a
  request (in flight at Triton or queued at the node gateway), never one used within the floor
  (`--evict-min-idle-seconds`);
- the loading namespace's own idle models first (least recently used first): a namespace never
  evicts another's model while it has one of its own to give up;
- then the models of namespaces over their fair share: a namespace's share is the GPU's
  on-demand room (its memory for models less what `always` models hold) divided among the
  namespaces with on-demand models on the GPU, the loading one included; a namespace holding
  more than that is over it (recomputed after each victim). Least recently used first;
- a namespace within its share loses a model only to an `always` load or to a namespace that
  stays within its own share with the load (`claim`: the on-demand bytes the load adds): one
  namespace's wakes cannot push another below its share to grow past its own;
- such a load (an `always` one, or one that stays within its share) also takes back the room a
  namespace holds past its share when no idle model frees enough: that namespace's models are
  then put to sleep even if used within the floor or serving (`reclaimed`; Triton answers the
  requests in flight before it unloads a model, and refuses new ones), least recently used
  first, until the namespace is within its share. A trickle of requests keeps no model past its
  namespace's share from a namespace within its own;
- all or nothing: when the evictable models cannot free what the load needs, none is evicted
  and the reason says what holds the GPU in the loading namespace's own terms (byte figures, and
  model ids of its own namespace only).

Pure: time and the activity are passed in; `agent.models.evictor` gathers the figures and does the
I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from common.quantity import format_bytes


@dataclass(frozen=True)
class Loaded:
    """One model held on the GPU, as the rule sees it."""

    name: str
    """Its name in Triton."""
    namespace: str
    model_id: str
    bytes: int
    """What it holds on the GPU as admission books it: the larger of request and measured."""
    on_demand: bool
    busy: bool = False
    """An operation of the agent holds it (a load, an unload, a sleep)."""
    in_flight: int = 0
    """Requests at Triton or queued for it at the node gateway."""
    last_used: float = 0.0
    """Unix seconds: the later of its last request (start or end) and its load."""


@dataclass(frozen=True)
class Choice:
    """The models to put to sleep, in order, or why none may be."""

    victims: tuple[Loaded, ...] = ()
    problem: str = ""
    """Empty when the victims free what is needed."""
    reclaimed: frozenset[str] = frozenset()
    """The victims taken though used within the floor or serving (their namespace was over
    its share), by name."""

    @property
    def freed(self) -> int:
        return sum(v.bytes for v in self.victims)


@dataclass(frozen=True)
class Gpu:
    """The GPU the load needs room on."""

    label: str
    """How messages name it, e.g. "GPU 0 (GPU-3f2…)"."""
    capacity: int
    """Its memory for models: total less the reserve, in bytes."""


def evictable(model: Loaded, now: float, min_idle: float) -> bool:
    return (
        model.on_demand
        and not model.busy
        and model.in_flight == 0
        and now - model.last_used >= min_idle
    )


def reclaimable(model: Loaded, namespace: str) -> bool:
    """Whether `model` may be put to sleep, though used, for a load of `namespace` within its
    share while its own namespace is over its share."""
    return model.on_demand and not model.busy and model.namespace != namespace


def choose(
    gpu: Gpu,
    held: Sequence[Loaded],
    namespace: str,
    needed: int,
    now: float,
    min_idle: float,
    *,
    claim: int = 0,
    activity_problem: str = "",
) -> Choice:
    """The idle models of `held` (the GPU's models but the one loading) to put to sleep so that
    `needed` bytes are freed for a load of `namespace` that adds `claim` on-demand bytes to it
    (0 for an `always` load); `activity_problem`, when set, says why nobody's activity is known
    (then none is evictable: fail closed)."""
    if needed <= 0:
        return Choice()
    candidates = [] if activity_problem else [m for m in held if evictable(m, now, min_idle)]
    in_use = [] if activity_problem else [m for m in held if reclaimable(m, namespace)]
    in_use = [m for m in in_use if m not in candidates]
    always = sum(m.bytes for m in held if not m.on_demand)
    room = max(gpu.capacity - always, 0)
    holders = {m.namespace for m in held if m.on_demand} | {namespace}
    share = room // len(holders)
    loaded: dict[str, int] = {}
    for m in held:
        if m.on_demand:
            loaded[m.namespace] = loaded.get(m.namespace, 0) + m.bytes
    victims: list[Loaded] = []
    reclaimed: set[str] = set()
    freed = 0
    while freed < needed and (candidates or in_use):
        own = [m for m in candidates if m.namespace == namespace]
        over = [m for m in candidates if loaded[m.namespace] > share]
        fair = loaded.get(namespace, 0) + claim <= share
        back = [m for m in in_use if fair and loaded[m.namespace] > share]
        pool = own or over or back or (candidates if fair else [])
        if not pool:
            break
        victim = min(pool, key=lambda m: (m.last_used, m.name))
        if pool is back:
            in_use.remove(victim)
            reclaimed.add(victim.name)
        else:
            candidates.remove(victim)
        victims.append(victim)
        loaded[victim.namespace] -= victim.bytes
        freed += victim.bytes
    if freed >= needed:
        return Choice(tuple(victims), reclaimed=frozenset(reclaimed))
    short = needed - freed
    if candidates and not activity_problem:
        return Choice(problem=_over_share(gpu, namespace, loaded.get(namespace, 0) + claim, share))
    return Choice(problem=_no_room(gpu, held, namespace, short, now, min_idle, activity_problem))


def _over_share(gpu: Gpu, namespace: str, after: int, share: int) -> str:
    """Why the idle models left belong to namespaces this load may not take from."""
    return (
        f"{gpu.label}'s room for on-demand models is shared among the namespaces using it: "
        f"{format_bytes(share)} each; with this load namespace {namespace} would hold "
        f"{format_bytes(after)}, and the idle models left belong to namespaces within their "
        f"share. Let one of your own on-demand models on this GPU go idle, or place this pod "
        f"as residency always"
    )


def _no_room(
    gpu: Gpu,
    held: Sequence[Loaded],
    namespace: str,
    short: int,
    now: float,
    min_idle: float,
    activity_problem: str,
) -> str:
    """Why no room can be made, naming only the loading namespace's own models."""
    always = sum(m.bytes for m in held if not m.on_demand)
    kept = [m for m in held if m.on_demand and not evictable(m, now, min_idle)]
    own = sorted(m.model_id for m in held if m.namespace == namespace)
    said = (
        f"{gpu.label} has {format_bytes(gpu.capacity)} for models: {format_bytes(always)} held "
        f"by models that stay loaded (residency always)"
    )
    if activity_problem:
        on_demand = sum(m.bytes for m in held if m.on_demand)
        said += (
            f" and {format_bytes(on_demand)} by on-demand models, none of which may be put to "
            f"sleep now: {activity_problem}"
        )
    else:
        said += (
            f" and {format_bytes(sum(m.bytes for m in kept))} by on-demand models serving "
            f"requests or used within the last {min_idle:g} s (--evict-min-idle-seconds); even "
            f"with every idle one asleep, {format_bytes(short)} more are needed"
        )
    if own:
        said += f" (your namespace's models on this GPU: {', '.join(own)})"
    return said
