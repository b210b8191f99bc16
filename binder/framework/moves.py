"""Carrying out a consolidation plan or a preemption: evict the pods through the Eviction API and
say why.

Each pod is evicted with its uid as a precondition, so a replacement of the same name is never
hit. The API server applies the pod's PodDisruptionBudget: a 429 stops the plan there (the pods
after it stay; the pending pod waits, and the controller does not plan for it again until its
cooldown ends). Every moved pod gets an Event saying for which pod it moved, and the pending pod
one saying what was moved for it. Runs on a worker thread, as the controller's other writes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from binder.api.kube import Kube
from binder.cluster.objects import PodInfo
from binder.errors import BinderError
from binder.framework.consolidation import Plan
from binder.framework.preemption import Preemption
from common.kubeapi.errors import NotFoundError, UnavailableError
from common.logs import subject

log = logging.getLogger(__name__)


REASON = "Consolidation"
"""The Events' reason, on the moved pods and on the pod they made room for."""


def _evict(kube: Kube, pod: PodInfo) -> bool:
    """Evict one pod (that uid only): True when evicted, False when it is gone already. A
    refusal for its PodDisruptionBudget raises EvictionRefusedError; other failures raise as
    they come."""
    try:
        kube.evict_pod(pod.namespace, pod.name, pod.uid)
    except NotFoundError:
        return False
    except UnavailableError as e:
        if e.status != 429:
            raise
        raise EvictionRefusedError(f"the eviction of pod {pod.key} was refused ({e})") from e
    return True


class EvictionRefusedError(BinderError):
    """The API server refused an eviction (429): the pod's PodDisruptionBudget forbids it."""


def carry_out(
    kube: Kube, plan: Plan, pod: PodInfo, identity: str, count: Callable[[str], None]
) -> int:
    """Evict the plan's pods in order until one is refused; returns how many were evicted."""
    moved = 0
    for other in plan.moves:
        try:
            if not _evict(kube, other):
                continue  # gone already: its memory is free
        except EvictionRefusedError as e:
            log.info(
                "Pod %s was not moved to make room for pod %s: the API server refused its "
                "eviction (%s). The plan stops here; %s waits.",
                other.key,
                pod.key,
                e,
                pod.key,
                extra=subject(pod=other.key, node=plan.node),
            )
            break
        count("eviction")
        moved += 1
        log.info(
            "Pod %s (%s) is moved off GPU %s on node %s to make room for pod %s.",
            other.key,
            other.model_id,
            plan.gpu.uuid,
            plan.node,
            pod.key,
            extra=subject(pod=other.key, node=plan.node, model=other.model_id),
        )
        kube.record_event(
            other.namespace,
            other.name,
            other.uid,
            reason=REASON,
            message=plan.reason(pod),
            reporting_instance=identity,
            event_type="Normal",
        )
        count("event")
    if moved:
        names = ", ".join(p.key for p in plan.moves[:moved])
        kube.record_event(
            pod.namespace,
            pod.name,
            pod.uid,
            reason=REASON,
            message=f"moving {moved} smaller pod(s) off GPU {plan.gpu.uuid} on node "
            f"{plan.node} to make room for this pod, whose nodes have the memory only split "
            f"across GPUs: {names}",
            reporting_instance=identity,
            event_type="Normal",
        )
        count("event")
    return moved


PREEMPTED = "Preempted"
PREEMPTING = "Preempting"


def evict_victims(
    kube: Kube,
    victims: Sequence[PodInfo],
    by: str,
    node: str,
    identity: str,
    count: Callable[[str], None],
) -> list[str]:
    """Evict the victims in order (those whose budget the preemption breaks first: a refusal
    stops it before the others are evicted for nothing), each with a `Preempted` Event as
    kube-scheduler writes it ("Preempted by pod <uid> on node <node>", `by` naming the
    preemptor); returns the keys of those evicted. A refused eviction (429, its
    PodDisruptionBudget) raises EvictionRefusedError."""
    evicted = []
    for victim in victims:
        if not _evict(kube, victim):  # a refusal raises: the victim stays, the preemptor waits
            continue  # gone already: its room is free
        count("eviction")
        evicted.append(victim.key)
        kube.record_event(
            victim.namespace,
            victim.name,
            victim.uid,
            reason=PREEMPTED,
            message=f"Preempted by {by} on node {node}",
            reporting_instance=identity,
            event_type="Normal",
        )
        count("event")
    return evicted


def carry_out_preemption(
    kube: Kube,
    pod: PodInfo,
    preemption: Preemption,
    identity: str,
    count: Callable[[str], None],
    drained: Sequence[str] = (),
) -> None:
    """Set the pod's nominatedNodeName, then evict the victims that are pods
    (`evict_victims`), and tell the pod which pods it preempted and which TritonModel replicas
    (`drained`, drained by the model controller)."""
    node = preemption.node
    kube.set_nominated_node(pod.namespace, pod.name, node)
    count("condition")
    pods = [v for v in preemption.victims if v.host is None]
    evicted = evict_victims(kube, pods, f"pod {pod.uid}", node, identity, count) + list(drained)
    if evicted:
        kube.record_event(
            pod.namespace,
            pod.name,
            pod.uid,
            reason=PREEMPTING,
            message=f"Preempting {len(evicted)} lower-priority pod(s) on node {node}: "
            + ", ".join(evicted),
            reporting_instance=identity,
            event_type="Normal",
        )
        count("event")
