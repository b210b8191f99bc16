"""ResourceQuotas on GPU memory, as they bind a namespace's pods and TritonModel replicas together.

A replica is no pod, so the API server's quota admission never sees it, and it admits a pod
counting pods only; the binder applies the rule to both before it places one. A quota binds
through `requests.<prefix>gpu-mem` in its `status.hard` (what the API server's admission reads),
`limits.<prefix>gpu-mem` (to which the API server counts no pod: the pods the binder placed
count), and `<prefix>gpu-mem` alone, which binds replicas only.

A quota counts what the binder books: a pod's or replica's request plus the per-process allowance
booked with it (`common.backends`), as Kubernetes counts a pod's RuntimeClass overhead against
its namespace's quota; otherwise a namespace's models that declare no backend would take from
the GPU many times their quota. The namespace's use is its pods' (for the `requests.` key the
larger of the quota's `status.used`, the requests the quota controller counts, and the requests
of the pods the binder has placed there, so a status not yet updated hides none; plus the
allowance booked for the pods it placed, which no status counts) plus what the binder booked for
every replica it has charged in the namespace; a pod being placed is counted by the API server
already (its request, not its allowance), and is not counted twice. The binder decides one pod or
replica at a time, so two created at once cannot both pass. One that would take the use past a
hard limit is refused in the API server's words
(`exceeded quota: NAME, requested: ..., used: ..., limited: ...`), followed, when the charge
includes an allowance, by how much and how a model that runs in Triton's process declares its
backend so that none is booked; a quota whose status does not yet count a key it limits refuses a
replica too (`status unknown for quota`), as admission does for pods.
A pod or replica already placed is never taken back: lowering a quota only stops new placements.
A quota's scopes select replicas as the API server's select pods: `Terminating` and `BestEffort`
none, `PriorityClass` by the class the model's replicas take (`binder.cluster.priorities`, its name
matched as upstream's pod evaluator matches a pod's `priorityClassName`), the others all; such a
quota's use counts only the replicas it selects (and its pods by its `status.used` alone).

Pure: the quotas and the charges come from the cache's ledger.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from binder.cluster.ledger import Ledger
from binder.cluster.modelviews import ModelInfo
from binder.cluster.objects import PodInfo
from binder.cluster.priorities import class_of
from common.backends import IN_PROCESS_BACKENDS
from common.contract import Keys
from common.quantity import (
    BINARY_SI,
    DECIMAL_SI,
    QuantityError,
    format_quantity,
    parse_quantity,
    quantity_format,
)

EXCEEDED_QUOTA = "ExceededQuota"
"""The reason of a model's `Placed` condition when a quota refuses a replica."""

JsonObject = dict[str, Any]


@dataclass(frozen=True)
class Limit:
    """One key of one quota that binds replicas: its hard limit and its pods' use, in bytes
    (`used` None while the quota controller has not counted it), and how the API writes each."""

    quota: str
    key: str
    hard: int
    hard_text: str
    used: int | None
    used_form: str


def _bytes(raw: Any) -> int | None:
    try:
        return parse_quantity(raw if isinstance(raw, int) else str(raw))
    except QuantityError:
        return None


_NEVER_A_REPLICA = frozenset({"Terminating", "BestEffort"})
"""Quota scopes no replica is in: it has no activeDeadlineSeconds, and it requests memory."""
PRIORITY_CLASS = "PriorityClass"


def _expressions(quota: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The quota's scopes as expressions: a name in `scopes` is Exists (upstream's
    getScopeSelectorsFromQuota), then the scopeSelector's."""
    spec = quota.get("spec") or {}
    found: list[Mapping[str, Any]] = [
        {"scopeName": str(name), "operator": "Exists"} for name in spec.get("scopes") or []
    ]
    selector = spec.get("scopeSelector") or {}
    found += [e for e in selector.get("matchExpressions") or [] if isinstance(e, Mapping)]
    return found


def _class_matches(expression: Mapping[str, Any], priority_class: str) -> bool:
    """Upstream's PriorityClass match: Exists is a non-empty class name; In and NotIn match the
    name as the value of a label always there, so DoesNotExist never matches."""
    operator = expression.get("operator")
    if operator == "Exists":
        return priority_class != ""
    values = [str(v) for v in expression.get("values") or []]
    if operator in ("In", "NotIn"):
        return bool((priority_class in values) == (operator == "In"))
    return False


def selects(quota: Mapping[str, Any], priority_class: str | None) -> bool:
    """Whether the quota's scopes can select a replica of the class (None: of any class, then a
    PriorityClass scope is taken to select it: fail closed)."""
    for expression in _expressions(quota):
        name = str(expression.get("scopeName", ""))
        if name in _NEVER_A_REPLICA:
            return False
        if (
            name == PRIORITY_CLASS
            and priority_class is not None
            and not _class_matches(expression, priority_class)
        ):
            return False
    return True


def class_scoped(quota: Mapping[str, Any]) -> bool:
    """Whether a PriorityClass scope narrows the quota (its use is then per class)."""
    return any(e.get("scopeName") == PRIORITY_CLASS for e in _expressions(quota))


def limits_from_api(
    quotas: Iterable[Mapping[str, Any]], keys: Keys, priority_class: str | None = None
) -> list[Limit]:
    """The GPU memory limits of the namespace's quotas (API dicts) whose scopes can select a
    replica of `priority_class` (`selects`), by quota name then key; a hard limit that does not
    parse binds as zero (fail closed)."""
    names = (f"requests.{keys.gpu_mem}", f"limits.{keys.gpu_mem}", keys.gpu_mem)
    found: list[Limit] = []
    for quota in quotas:
        if not selects(quota, priority_class):
            continue
        status = quota.get("status") or {}
        hard, used = status.get("hard") or {}, status.get("used") or {}
        name = str((quota.get("metadata") or {}).get("name", ""))
        for key in names:
            if key not in hard:
                continue
            # The API server charges pods to the `requests.` key only.
            counted = key in used or not key.startswith("requests.")
            raw_used = used.get(key, "0")
            found.append(
                Limit(
                    quota=name,
                    key=key,
                    hard=_bytes(hard[key]) or 0,
                    hard_text=str(hard[key]),
                    used=(_bytes(raw_used) or 0) if counted else None,
                    used_form=quantity_format(str(raw_used)),
                )
            )
    return sorted(found, key=lambda limit: (limit.quota, limit.key))


def _form(value: int) -> str:
    """How a byte count the binder adds is written: binary when it is a whole number of KiB."""
    return BINARY_SI if value >= 1024 and value % 1024 == 0 else DECIMAL_SI


def _charged_replicas(
    ledger: Ledger, namespace: str, counted: Callable[[ModelInfo], bool]
) -> Iterator[PodInfo]:
    """The namespace's replicas the binder has charged, of the models `counted` selects: every
    replica that is not draining (a roll's surge replica too)."""
    for uid in ledger.by_namespace.get(namespace, ()):
        model = ledger.models[uid]
        if not counted(model):
            continue
        for rid in ledger.replica_uids(uid):
            replica = ledger.state.charged_pod(rid)
            if replica is not None and rid not in ledger.draining:
                yield replica


def charged_in(
    ledger: Ledger, namespace: str, counted: Callable[[ModelInfo], bool] = lambda _: True
) -> int:
    """The GPU memory the binder booked for the namespace's charged replicas of the models
    `counted` selects, in bytes, the allowance included."""
    return sum(replica.request for replica in _charged_replicas(ledger, namespace, counted))


def pods_allowance_in(ledger: Ledger, namespace: str, quota: Mapping[str, Any]) -> int:
    """The allowance booked for the namespace's placed pods that the quota's scopes select, in
    bytes: what the binder adds to the requests the quota's status counts."""
    by_class = ledger.state.tallies.pods_allowance.get(namespace)
    if not by_class:
        return 0
    return sum(booked for name, booked in by_class.items() if selects(quota, name))


def allowance_advice(request: int, allowance: int, key: str) -> str:
    """What a refusal adds when `allowance` of the `request` bytes charged is the per-process
    allowance: how much, and how a model declares that it runs in Triton's process (`key`)."""
    *others, last = sorted(IN_PROCESS_BACKENDS)
    return (
        f"; {format_quantity(allowance, _form(allowance))} of the"
        f" {format_quantity(request, _form(request))} requested is the process allowance,"
        " booked for a model that may run in a process of its own (the Python backend): a model"
        " that runs in Triton's process books none once its pod or TritonModel declares its"
        f" backend in the annotation {key} ({', '.join(others)} or {last})"
    )


@dataclass
class QuotaCheck:
    """The namespace's GPU memory limits during one reconcile: `refusal` before placing a
    replica, `charge` once it is placed."""

    limits: list[Limit]
    charged: int
    """Bytes booked for the namespace's replicas charged so far, their allowance included."""
    charged_by_quota: dict[str, int] = field(default_factory=dict)
    """For a quota scoped by PriorityClass: bytes of the replicas it selects charged so far
    (instead of `charged`)."""
    refused: bool = field(default=False)
    """Whether a replica was refused (the condition's reason is then EXCEEDED_QUOTA)."""
    pods_leaving: int = 0
    """Bytes the namespace's pods gone from the API still hold: their node still reports their
    models loaded (`PodTallies.leave`); no quota's status counts them."""
    pods_placed: int = 0
    """Bytes the namespace's pods the binder has placed ask (`PodTallies.pods_memory`): a
    floor on its pods' use, which a quota's status may not count yet."""
    pod: int = 0
    """Bytes the pod being decided asks, which the API server admitted and counts (0: a
    replica)."""
    pods_allowance: dict[str, int] = field(default_factory=dict)
    """Per quota, bytes of allowance booked for the namespace's placed pods it selects
    (`pods_allowance_in`), which its status does not count."""
    backend_key: str = Keys().backend
    """The annotation that declares a model's backend, named by a refusal's advice."""

    def refusal(self, request: int, allowance: int = 0) -> str:
        """Why a pod or replica booking `request` bytes, `allowance` of them the per-process
        allowance, may not be placed ("" when every quota allows it), in the API server's
        words: the first quota (by name) it would exceed, with each of that quota's keys it
        would exceed; then, with an allowance, `allowance_advice`."""
        for name, limits in self._by_quota().items():
            unknown = [limit.key for limit in limits if limit.used is None]
            if unknown and not self.pod:  # a pod was admitted: its use is known to be counted
                self.refused = True
                return f"status unknown for quota: {name}, resources: {','.join(unknown)}"
            charged = self.charged_by_quota.get(name, self.charged)
            use = {limit.key: self.pods_use(limit, name) + charged for limit in limits}
            exceeded = [limit for limit in limits if use[limit.key] + request > limit.hard]
            if not exceeded:
                continue
            self.refused = True
            advice = allowance_advice(request, allowance, self.backend_key) if allowance else ""
            requested, used, limited = [], [], []
            for limit in exceeded:
                total = use[limit.key]
                form = limit.used_form if limit.used else _form(total)
                requested.append(f"{limit.key}={format_quantity(request, _form(request))}")
                used.append(f"{limit.key}={format_quantity(total, form)}")
                hard = format_quantity(limit.hard, quantity_format(limit.hard_text))
                limited.append(f"{limit.key}={hard}")
            return (
                f"exceeded quota: {name}, requested: {','.join(requested)},"
                f" used: {','.join(used)}, limited: {','.join(limited)}{advice}"
            )
        return ""

    def _by_quota(self) -> dict[str, list[Limit]]:
        """The limits, by the quota they are a key of (in the order of `limits`)."""
        by_quota: dict[str, list[Limit]] = {}
        for limit in self.limits:
            by_quota.setdefault(limit.quota, []).append(limit)
        return by_quota

    def pods_use(self, limit: Limit, quota: str) -> int:
        """The pods' use of the limit's key but the pod being decided's, their allowance
        included."""
        allowance = self.pods_allowance.get(quota, 0)
        if limit.key.startswith("limits."):
            # No pod is charged to it: the binder's count.
            return self.pods_placed + self.pods_leaving + allowance
        if not limit.key.startswith("requests."):
            return limit.used or 0  # the bare key binds replicas only
        counted = max(0, (limit.used or 0) - self.pod)
        if quota in self.charged_by_quota:
            return counted + allowance  # scoped by PriorityClass: the quota controller's count
        return max(counted, self.pods_placed) + self.pods_leaving + allowance

    def charge(self, request: int) -> None:
        """A replica placed: every quota checked selects it."""
        self.charged += request
        for name in self.charged_by_quota:
            self.charged_by_quota[name] += request

    def refusal_after(self, booked: int, request: int, allowance: int = 0) -> str:
        """`refusal` once `booked` more bytes are charged (fewer when negative)."""
        self.charge(booked)
        try:
            return self.refusal(request, allowance)
        finally:
            self.charge(-booked)

    def room(self, request: int, allowance: int = 0) -> tuple[int, str]:
        """How many more replicas booking `request` bytes each (`allowance` of them the
        per-process allowance) every quota allows, charged one after another, and the refusal
        of the one past them, in `refusal`'s words once those are charged; (0, why) when a
        quota's status does not count a key yet."""
        count = sys.maxsize
        for name, limits in self._by_quota().items():
            if not self.pod and any(limit.used is None for limit in limits):
                count = 0
                break
            charged = self.charged_by_quota.get(name, self.charged)
            for limit in limits:
                spare = limit.hard - self.pods_use(limit, name) - charged
                if spare < 0:
                    count = 0
                elif request > 0:
                    count = min(count, spare // request)
        if count == sys.maxsize:
            return count, ""
        refused = self.refused
        exceeded = self.refusal_after(count * request, request, allowance)
        self.refused = refused
        return count, exceeded


def replica_class(ledger: Ledger, model: ModelInfo) -> str:
    """The PriorityClass the model's replicas take (its name, as admission writes a pod's
    `priorityClassName`; "" for none)."""
    chosen, _ = class_of(model.priority_class, ledger.priority_classes)
    return chosen.name if chosen is not None else model.priority_class


def check_for(
    ledger: Ledger,
    keys: Keys,
    namespace: str,
    priority_class: str | None,
    pod: int = 0,
) -> QuotaCheck | None:
    """The namespace's GPU memory limits (its quotas as the cache holds them) for a pod asking
    `pod` bytes (as the API server counts it: its allowance aside), or a replica (`pod` 0), of
    `priority_class`, with what its pods and replicas use; None when no quota binds it."""
    quotas = list(ledger.quotas.get(namespace, {}).values())
    limits = limits_from_api(quotas, keys, priority_class)
    if not limits:
        return None
    bound = {limit.quota for limit in limits}
    by_quota, pods_allowance = {}, {}
    for quota in quotas:
        name = str((quota.get("metadata") or {}).get("name", ""))
        if name in bound:
            pods_allowance[name] = pods_allowance_in(ledger, namespace, quota)
        if class_scoped(quota) and name in bound:

            def selected(model: ModelInfo, quota: Mapping[str, Any] = quota) -> bool:
                return selects(quota, replica_class(ledger, model))

            by_quota[name] = charged_in(ledger, namespace, selected)
    return QuotaCheck(
        limits,
        charged_in(ledger, namespace),
        by_quota,
        pods_placed=ledger.state.tallies.pods_memory.get(namespace, 0),
        pods_leaving=ledger.state.tallies.leaving_memory.get(namespace, 0),
        pod=pod,
        pods_allowance=pods_allowance,
        backend_key=keys.backend,
    )


class ReplicaQuota(NamedTuple):
    """The namespace's GPU memory quotas as they bind one model's replicas in its turn."""

    check: QuotaCheck
    room: int
    """How many more replicas of the model they allow (`QuotaCheck.room`)."""
    exceeded: str
    """Their refusal of the one past `room`."""


def replica_quota(ledger: Ledger, keys: Keys, model: ModelInfo) -> ReplicaQuota | None:
    """The namespace's GPU memory quotas on `model`'s replicas, with the room they leave for
    them; None when no quota binds them."""
    check = check_for(ledger, keys, model.namespace, replica_class(ledger, model))
    if check is None:
        return None
    template = model.template
    return ReplicaQuota(check, *check.room(template.request, template.allowance))


@dataclass(frozen=True)
class Usage:
    """What one key of one quota binds, as `tritonshare quota` shows it, in bytes."""

    namespace: str
    quota: str
    key: str
    hard: int
    pods: int
    """The namespace's pods' use (`QuotaCheck`'s: counted or placed, the larger)."""
    replicas: int
    """The GPU memory booked for the namespace's replicas the quota selects, charged."""
    allowance: int = 0
    """The part of `used` that is the per-process allowance (pods' and replicas')."""

    @property
    def used(self) -> int:
        return self.pods + self.replicas


def usage(ledger: Ledger, keys: Keys, namespace: str | None = None) -> list[Usage]:
    """Each GPU memory limit of the quotas (of `namespace`, or every one) with what the
    namespace's pods and replicas use of it, by namespace, quota and key."""
    rows = []
    for where, quotas in sorted(ledger.quotas.items()):
        if namespace is not None and where != namespace:
            continue
        for quota in (quotas[name] for name in sorted(quotas)):
            scoped = class_scoped(quota)

            def selected(model: ModelInfo, quota: Mapping[str, Any] = quota) -> bool:
                return selects(quota, replica_class(ledger, model))

            charged = list(_charged_replicas(ledger, where, selected))
            replicas = sum(replica.request for replica in charged)
            replicas_allowance = sum(replica.allowance for replica in charged)
            pods_allowance = pods_allowance_in(ledger, where, quota)
            for limit in limits_from_api([quota], keys):
                check = QuotaCheck(
                    [limit],
                    replicas,
                    {limit.quota: replicas} if scoped else {},
                    pods_placed=ledger.state.tallies.pods_memory.get(where, 0),
                    pods_leaving=ledger.state.tallies.leaving_memory.get(where, 0),
                    pods_allowance={limit.quota: pods_allowance},
                )
                pods = check.pods_use(limit, limit.quota)
                counts_pods = limit.key.startswith(("requests.", "limits."))
                allowance = replicas_allowance + (pods_allowance if counts_pods else 0)
                rows.append(
                    Usage(where, limit.quota, limit.key, limit.hard, pods, replicas, allowance)
                )
    return rows
