"""The informer-style cache: list+watch of nodes, pods and leases, folded into the cluster state.

One daemon thread per watched kind lists once, then watches from the last resourceVersion (kept
across reconnects, advanced by bookmarks) and relists only on 410 Gone. The thread ends only when
asked to: an unreachable API server (refused, reset, timed out) is tried again about every second,
jittered, for a connection attempt costs a server that is down nothing and the caches must be back
in touch within a second of it answering again; 429 and 5xx, from a server that answers but is
overloaded, mean backing off (doubling from 1 s to 30 s, jittered, or the server's Retry-After);
even an unexpected error is logged and retried. Each informer says since when it has been failing,
for /readyz. Events are handed to the event loop, where `ClusterCache` applies them to the
ClusterState and the set of pending pods and tells its listener what changed: a pending pod
appeared or changed, a pending pod left, or the cluster changed in a way that could help
unschedulable pods (memory freed, a node added or changed, an agent came alive). Decisions never
list: they read this cache.

It must not decide placements nor write to the API.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from binder.api.inbox import Inbox
from binder.api.kube import Kube
from binder.api.listwatch import Kind
from binder.api.session import JsonObject
from binder.cluster.budgets import Budget, budget_from_api
from binder.cluster.clusterstate import ClusterState
from binder.cluster.modelviews import ModelInfo, is_replica, model_from_api
from binder.cluster.objects import PodInfo, lease_expiry, node_from_api, pod_from_api
from binder.cluster.priorities import PriorityClassInfo, priority_class_from_api, resolve
from binder.cluster.proofs import Unproven, proven, same_proof
from binder.errors import ApiError, GoneError, NotFoundError, UnavailableError
from common.contract import AGENT_LEASE_PREFIX, MIN_GPU_MEM, Keys
from common.hosted import (
    host_group,
    host_label,
    host_name,
    host_secret_annotation,
    hosted_models_annotation,
)
from common.proofs import KeyRing

log = logging.getLogger(__name__)

RETRY_SECONDS = 1.0
RETRY_MAX_SECONDS = 30.0
UNREACHABLE_RETRY_SECONDS = 1.0
"""While the API server cannot be reached, each watch tries again after 50-100 % of this."""
FAILURE_LOG_SECONDS = 30.0
"""While a watch keeps failing, it says so once in this many seconds."""


class Listener(Protocol):
    def pending_changed(self, pod: PodInfo, relevant: bool) -> None:
        """A pending pod of ours appeared (relevant=True) or changed."""

    def pending_gone(self, uid: str) -> None:
        """A pending pod was bound, deleted, or is no longer ours."""

    def cluster_changed(self, why: str) -> None:
        """Something changed that could make an unschedulable pod fit."""

    def unproven_seen(self, verdict: Unproven) -> None:
        """A bound pod on a tritonshare node proves nothing (first seen, or for a new reason)."""


def _placement_inputs(pod: PodInfo) -> tuple[Any, ...]:
    return (pod.constraints, pod.request, pod.model_key, pod.problem, pod.scheduler_name)


def _host_view(obj: JsonObject, keys: Keys) -> tuple[Any, ...]:
    """What of a model host its controller acts on: its labels, its hosted-models annotation,
    its loaded conditions (`common.hosted.loaded_condition`), its Ready condition (whether its
    Service endpoints are ready) and whether it is going away."""
    meta = obj.get("metadata") or {}
    loaded = f"{keys.prefix}loaded-"
    conditions = sorted(
        (str(c.get("type")), str(c.get("status")), str(c.get("message") or ""))
        for c in (obj.get("status") or {}).get("conditions") or []
        if isinstance(c, dict)
        and (str(c.get("type", "")).startswith(loaded) or c.get("type") == "Ready")
    )
    return (
        meta.get("labels"),
        (meta.get("annotations") or {}).get(hosted_models_annotation(keys)),
        conditions,
        meta.get("deletionTimestamp"),
    )


@dataclass(frozen=True)
class Ledger:
    """What the cache keeps and others read on the loop: made first, then given to the cache
    (which alone changes it) and to the controller and the metrics (which read it), so that
    none of them is wired to another after construction."""

    state: ClusterState
    pending: dict[str, PodInfo] = field(default_factory=dict)
    """Pods with our scheduler name that are not bound yet, by uid."""
    budgets: dict[str, Budget] = field(default_factory=dict)
    """PodDisruptionBudgets by namespace/name."""
    model_budgets: dict[str, Budget] = field(default_factory=dict)
    """TritonModel uid -> its spec.minAvailable as a budget over its replicas (kept by the
    model host writer), which a preemption spares as a PodDisruptionBudget."""

    def all_budgets(self) -> list[Budget]:
        """The PodDisruptionBudgets and the TritonModels' budgets."""
        return [*self.budgets.values(), *self.model_budgets.values()]

    unproven: dict[str, Unproven] = field(default_factory=dict)
    """Bound, non-terminated pods carrying tritonshare resources or annotations whose proof
    does not verify: never charged. At most one entry per such pod in the cluster."""
    models: dict[str, ModelInfo] = field(default_factory=dict)
    """TritonModels by uid; their placed replicas are charged in `state` (uid "<model>/<n>")."""
    hosts: dict[str, dict[str, JsonObject]] = field(default_factory=dict)
    """The model host pods there are, by group (`common.hosted.host_group`: the namespace, or
    `<namespace>/<Secret>` for the hosts of the replicas fetched with a storage Secret) and
    node, as the API shows them."""
    spans: dict[str, int] = field(default_factory=dict)
    """Model uid -> one past the highest ordinal of it ever charged, so its replicas are found
    without scanning every charge (nor spec.replicas ordinals)."""
    by_namespace: dict[str, set[str]] = field(default_factory=dict)
    """Namespace -> the uids of its TritonModels."""
    quotas: dict[str, dict[str, JsonObject]] = field(default_factory=dict)
    """Namespace -> its ResourceQuotas by name, as the API shows them (`binder.framework.quota`)."""
    by_model_id: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    """(namespace, model id) -> the uids of the TritonModels with that id (`name_clash`)."""
    priority_classes: dict[str, PriorityClassInfo] = field(default_factory=dict)
    """PriorityClasses by name: the TritonModels' replicas take their priority from them."""
    draining: set[str] = field(default_factory=set)
    """Replicas past their model's spec.replicas still charged while they drain from their
    host: the model controller (`binder.tritonmodels.controller`) alone adds and removes them; a
    status that no longer lists them does not free them."""

    def replica_uids(self, model_uid: str) -> list[str]:
        """The model's charged replicas (uids "<model uid>/<ordinal>")."""
        return [
            uid
            for ordinal in range(self.spans.get(model_uid, 0))
            if self.state.is_accounted(uid := f"{model_uid}/{ordinal}")
        ]

    def name_clash(self, model: ModelInfo) -> str:
        """Why `model` is not placed because another TritonModel of its namespace, created
        before it (then first by name), has its model id ("" when none has): one host serves a
        namespace's replicas by model id, so two of one id would answer for each other."""
        model_id = model.template.model_id
        mine = (model.template.created, model.name)
        for uid in self.by_model_id.get((model.namespace, model_id), ()):
            other = self.models.get(uid)
            if (
                other is not None
                and other.uid != model.uid
                and other.template.model_id == model_id
                and (other.template.created, other.name) < mine
            ):
                return (
                    f'model id "{model_id}" is already served by tritonmodel "{other.name}" of '
                    f"namespace {model.namespace} (created first); one namespace's models share "
                    f"their hosts by model id, so give this one another spec.modelName (or "
                    f"delete one of the two)"
                )
        return ""

    def on_tritonshare_node(self, pod: PodInfo) -> bool:
        """Whether the pod's node is one the agent publishes (its GPU annotation is there)."""
        info = self.state.nodes.get(pod.node_name)
        return info is not None and bool(info.gpus or info.gpu_problem)

    def unproven_reasons(self) -> list[str]:
        """Why each unproven pod on a tritonshare node is unproven (one entry per pod)."""
        return [v.reason for v in list(self.unproven.values()) if self.on_tritonshare_node(v.pod)]


class ClusterCache:
    """Applies API objects to the ClusterState and the pending pods, on the event loop thread."""

    def __init__(
        self,
        keys: Keys,
        ledger: Ledger,
        *,
        scheduler_name: str,
        listener: Listener,
        placement_keys: Callable[[], KeyRing] | None,
        tenant_code: Collection[str] = (),
        min_gpu_mem: int = MIN_GPU_MEM,
        allowance: int = 0,
        clock: Callable[[], float] = time.time,
        on_model: Callable[[str], None] = lambda uid: None,
        on_host_gone: Callable[[str], None] = lambda namespace: None,
        on_host: Callable[[str, str], None] = lambda namespace, node: None,
    ) -> None:
        """`on_model(uid)`: a TritonModel or its placed replicas changed (the binder's model
        controller reconciles it); `on_host_gone(namespace)`: a model host pod was deleted;
        `on_host(namespace, node)`: a model host's labels, hosted-models annotation or loaded
        conditions changed, or it was deleted.
        `placement_keys` gives the ring in force (reread as the Secret rotates); None checks
        proofs for form only, for a CLI user who cannot read the key (`binder.cluster.proofs`).
        `tenant_code`: the namespaces allowed to run their own code in Triton; `min_gpu_mem`:
        the least GPU memory a model may ask (`--min-gpu-mem`); `allowance`: the per-process
        allowance booked with a model's request (`common.backends`)."""
        self.keys = keys
        self.tenant_code = frozenset(tenant_code)
        self.min_gpu_mem = min_gpu_mem
        self.allowance = allowance
        self.scheduler_name = scheduler_name
        self.ledger = ledger
        # The ledger's parts under short names: read on every event, and never replaced.
        self.state = ledger.state
        self.pending = ledger.pending
        self.unproven = ledger.unproven
        self._listener = listener
        self._on_model = on_model
        self._on_host_gone = on_host_gone
        self._on_host = on_host
        self._host_label = host_label(keys)
        self._clock = clock
        self._placement_keys = placement_keys
        self._ring = placement_keys() if placement_keys is not None else None

    # ---- pods ----------------------------------------------------------------------------------

    def apply_pod(self, event: str, obj: JsonObject) -> None:
        pod = pod_from_api(obj, self.keys, self.tenant_code, self.min_gpu_mem, self.allowance)
        if not pod.uid:
            return
        if self._is_host(pod, obj):
            self._apply_host(event, pod, obj)
            return
        if event == "DELETED":
            self._drop_pending(pod.uid)
            self.unproven.pop(pod.uid, None)
            self.state.untrack_pod(pod.uid)
            if self._accounted(pod.uid):
                self.state.remove_pod(pod.uid)
                self._listener.cluster_changed(f"pod {pod.key} was deleted")
            return
        if pod.node_name:
            self._drop_pending(pod.uid)
            self.state.track_pod(pod)
            held = self._accounted(pod.uid)
            self._account(pod)
            if held and not self._accounted(pod.uid):
                why = f"finished ({pod.phase})" if pod.terminated else "no longer proves its place"
                self._listener.cluster_changed(f"pod {pod.key} {why}")
            return
        if pod.scheduler_name != self.scheduler_name or pod.deleting or pod.terminated:
            self._drop_pending(pod.uid)
            return
        old = self.pending.get(pod.uid)
        self.pending[pod.uid] = pod
        relevant = old is None or _placement_inputs(old) != _placement_inputs(pod)
        self._listener.pending_changed(pod, relevant)

    def _is_host(self, pod: PodInfo, obj: JsonObject) -> bool:
        """A model host the binder made: its label, on a node, under the name the binder gives
        the host of its storage Secret (its annotation; none is one) there. Its pod slot and
        requests are charged as its host group's host while the group has a replica on the node
        (`binder.cluster.podindex`), so it is not also counted as a pod then. A tenant can write
        the label, annotation and name on a pod of its own: where its group has no replica on
        the node the pod counts as any pod (`_apply_host`); where it has one, the name is the
        binder's host's (created with the first replica there), so the slot is charged once
        either way (a pod made first under that name would stand in for the host and serve none
        of the group's replicas: a loss to that namespace alone).
        """
        return (
            pod.labels.get(self._host_label) == "true"
            and bool(pod.node_name)
            and pod.name == host_name(pod.node_name, self._host_secret(obj))
        )

    def _host_secret(self, obj: JsonObject) -> str:
        """The storage Secret a host says it mounts ("": none)."""
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        return str(annotations.get(host_secret_annotation(self.keys)) or "")

    def _apply_host(self, event: str, pod: PodInfo, obj: JsonObject) -> None:
        group = host_group(pod.namespace, self._host_secret(obj))
        key = (group, pod.node_name)
        hosts = self.ledger.hosts.setdefault(group, {})
        if event == "DELETED":
            if (hosts.get(pod.node_name) or {}).get("metadata", {}).get("uid") == pod.uid:
                del hosts[pod.node_name]
                if not hosts:
                    del self.ledger.hosts[group]
                self._on_host_gone(pod.namespace)
                self._on_host(pod.namespace, pod.node_name)
            self.state.untrack_pod(pod.uid)
        else:
            before = hosts.get(pod.node_name)
            hosts[pod.node_name] = obj
            if before is None or _host_view(before, self.keys) != _host_view(obj, self.keys):
                self._on_host(pod.namespace, pod.node_name)
            if self.state.pods.has_host(*key):
                self.state.untrack_pod(pod.uid)
            else:
                self.state.track_pod(pod)
        self._listener.cluster_changed(f"model host {pod.key} changed")

    # ---- TritonModels --------------------------------------------------------------------------

    def apply_model(self, event: str, obj: JsonObject) -> None:
        """A TritonModel: its replicas placed in its status are charged when their proofs
        verify (a forged or copied one is not: the model controller places that replica again);
        a replica gone from the status is freed, unless the binder has just placed it and its
        status write is on the way (assumed)."""
        model = model_from_api(
            obj,
            self.keys,
            self.scheduler_name,
            self.tenant_code,
            self.min_gpu_mem,
            self.allowance,
        )
        model = resolve(model, self.ledger.priority_classes)
        if not model.uid:
            return
        ledger = self.ledger
        if event == "DELETED":
            old = ledger.models.pop(model.uid, None)
            if self._free_replicas(model.uid, keep=set(), assumed_too=True):
                self._listener.cluster_changed(f"TritonModel {model.key} was deleted")
            ledger.spans.pop(model.uid, None)
            if old is not None:
                ledger.by_namespace.get(old.namespace, set()).discard(model.uid)
                _unindex(ledger.by_model_id, old)
            self._on_model(model.uid)
            return
        self._follow_ring()
        old = ledger.models.get(model.uid)
        if old is not None and old.template.model_id != model.template.model_id:
            _unindex(ledger.by_model_id, old)
        ledger.models[model.uid] = model
        ledger.by_namespace.setdefault(model.namespace, set()).add(model.uid)
        ledger.by_model_id.setdefault((model.namespace, model.template.model_id), set()).add(
            model.uid
        )
        shown = set()
        for ordinal, (node, gpu, proof) in model.placed.items():
            replica = model.replica(ordinal, node, gpu, proof)
            shown.add(replica.uid)
            self._account_replica(replica)
        # Past the highest ordinal charged, not spec.replicas: a scale to 10^9 walks nothing.
        charged = [o for o in model.placed if self.state.is_accounted(f"{model.uid}/{o}")]
        ledger.spans[model.uid] = max(ledger.spans.get(model.uid, 0), max(charged, default=-1) + 1)
        if self._free_replicas(model.uid, keep=shown, assumed_too=False):
            self._listener.cluster_changed(f"replicas of TritonModel {model.key} were freed")
        self._on_model(model.uid)

    def _account_replica(self, replica: PodInfo) -> None:
        charged = self.state.charged_pod(replica.uid)
        if charged is not None and same_proof(charged, replica):
            # Charged as it was: a preempted replica stays counted as leaving while it drains,
            # and its priority changes only with its class (`_resolve_models`).
            self.state.set_pod(
                replace(
                    replica,
                    request=charged.request,
                    deleting=charged.deleting,
                    priority=charged.priority,
                    preemption_policy=charged.preemption_policy,
                )
            )
            return
        verdict = proven(replica, self._ring) if replica.node_name else None
        if isinstance(verdict, PodInfo):
            self.state.set_pod(verdict)
        elif charged is None or not self.state.is_assumed(replica.uid):
            self.state.remove_pod(replica.uid)
            self.state.untrack_pod(replica.uid)

    def _free_replicas(self, model_uid: str, keep: set[str], assumed_too: bool) -> bool:
        freed = False
        draining = self.ledger.draining
        for uid in self.ledger.replica_uids(model_uid):
            if uid in keep or (not assumed_too and (uid in draining or self.state.is_assumed(uid))):
                continue
            self.state.remove_pod(uid)
            self.state.untrack_pod(uid)
            freed = True
        return freed

    def replace_models(self, items: list[JsonObject]) -> None:
        listed = {str((o.get("metadata") or {}).get("uid", "")) for o in items}
        for uid in list(self.ledger.models):
            if uid not in listed:
                self.apply_model("DELETED", {"metadata": {"uid": uid}})
        for obj in items:
            self.apply_model("ADDED", obj)

    def _accounted(self, uid: str) -> bool:
        return self.state.is_accounted(uid)

    def _account(self, pod: PodInfo) -> None:
        """Charge a bound pod if its placement is proven, else keep it as unproven."""
        self._follow_ring()
        if pod.terminated or not pod.claims_share:
            self.unproven.pop(pod.uid, None)
            self.state.remove_pod(pod.uid)
            return
        charged = self.state.charged_pod(pod.uid)
        verdict: PodInfo | Unproven
        if charged is not None and same_proof(charged, pod):
            # Verified when it was charged, or signed by this binder when it assumed the pod,
            # and nothing the proof covers has changed since.
            verdict = (
                pod if pod.request == charged.request else replace(pod, request=charged.request)
            )
        else:
            verdict = proven(pod, self._ring)
        if isinstance(verdict, Unproven):
            self._set_unproven(verdict)
        else:
            self.unproven.pop(pod.uid, None)
            self.state.set_pod(verdict)

    def _set_unproven(self, verdict: Unproven) -> None:
        pod = verdict.pod
        self.state.remove_pod(pod.uid)
        old = self.unproven.get(pod.uid)
        self.unproven[pod.uid] = verdict
        if (old is None or old.reason != verdict.reason) and self.ledger.on_tritonshare_node(pod):
            self._listener.unproven_seen(verdict)

    @property
    def proofs_checked_for_form_only(self) -> bool:
        return self._placement_keys is None

    def _follow_ring(self) -> None:
        """When the key ring changed (a rotation), judge every bound pod again: a pod signed
        with a key that is gone stops being charged; one whose key arrived starts."""
        if self._placement_keys is None:
            return
        ring = self._placement_keys()
        if ring is self._ring:
            return
        self._ring = ring
        freed = False
        for pod in self.state.bound_pods():
            verdict = proven(pod, ring)
            if isinstance(verdict, Unproven):
                if is_replica(pod.uid):  # placed again by the model controller
                    self.state.remove_pod(pod.uid)
                    self.state.untrack_pod(pod.uid)
                    self._on_model(pod.uid.partition("/")[0])
                else:
                    self._set_unproven(verdict)
                freed = True
        for verdict in list(self.unproven.values()):
            again = proven(verdict.pod, ring)
            if isinstance(again, Unproven):
                if again.reason != verdict.reason:
                    self._set_unproven(again)
            else:
                del self.unproven[again.uid]
                self.state.set_pod(again)
        if freed:
            self._listener.cluster_changed("the placement keys changed")

    def _drop_pending(self, uid: str) -> None:
        if self.pending.pop(uid, None) is not None:
            self._listener.pending_gone(uid)

    def replace_pods(self, items: list[JsonObject]) -> None:
        """A full list: forget pods that are gone, then apply every listed pod."""
        listed = {str((o.get("metadata") or {}).get("uid", "")) for o in items}
        self.ledger.hosts.clear()  # refilled from the list below
        for uid in list(self.pending):
            if uid not in listed:
                self._drop_pending(uid)
        for uid in self.state.account_uids() - listed:
            if not is_replica(uid):
                self.state.remove_pod(uid)
        for uid in self.state.pods.uids() - listed:
            if not is_replica(uid):
                self.state.untrack_pod(uid)
        for uid in set(self.unproven) - listed:
            del self.unproven[uid]
        for obj in items:
            self.apply_pod("ADDED", obj)
        self._listener.cluster_changed("pods were relisted")

    # ---- nodes ---------------------------------------------------------------------------------

    def apply_node(self, event: str, obj: JsonObject) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        if event == "DELETED":
            self.state.remove_node(name)
            # TritonModel replicas placed there are placed again (a pod there is deleted with
            # its node, and its controller replaces it).
            for pod, _ in self.state.pods_on(name):
                if is_replica(pod.uid):
                    self.state.remove_pod(pod.uid)
                    self.state.untrack_pod(pod.uid)
                    self._on_model(pod.uid.partition("/")[0])
            return
        node = node_from_api(obj, self.keys)
        if node.gpu_problem:
            log.warning("Node %s has GPUs the binder cannot read: %s.", name, node.gpu_problem)
        old = self.state.nodes.get(name)
        if node.overcommit_problem and (old is None or old.labels != node.labels):
            log.warning("Node %s: %s.", name, node.overcommit_problem)
        was_ours = old is not None and bool(old.gpus or old.gpu_problem)
        if self.state.set_node(node):
            self._listener.cluster_changed(f"node {name} was added or changed")
        if not was_ours and (node.gpus or node.gpu_problem) and self.unproven:
            # An agent started on a node where unproven pods already ran: report them now.
            for verdict in list(self.unproven.values()):
                if verdict.pod.node_name == name:
                    self._listener.unproven_seen(verdict)

    def replace_nodes(self, items: list[JsonObject]) -> None:
        listed = {str((o.get("metadata") or {}).get("name", "")) for o in items}
        for name in set(self.state.nodes) - listed:
            self.state.remove_node(name)
        for obj in items:
            self.apply_node("ADDED", obj)

    # ---- namespaces ----------------------------------------------------------------------------

    def apply_namespace(self, event: str, obj: JsonObject) -> None:
        """A namespace's labels, for pod affinity terms' namespaceSelector."""
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        labels = meta.get("labels") or {}
        known = self.state.namespace_labels
        if event == "DELETED":
            known.pop(name, None)
            return
        new = {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}
        if known.get(name) != new:
            known[name] = new
            self._listener.cluster_changed(f"namespace {name} was added or relabelled")

    def replace_namespaces(self, items: list[JsonObject]) -> None:
        listed = {str((o.get("metadata") or {}).get("name", "")) for o in items}
        for name in set(self.state.namespace_labels) - listed:
            del self.state.namespace_labels[name]
        for obj in items:
            self.apply_namespace("ADDED", obj)

    # ---- PodDisruptionBudgets ------------------------------------------------------------------

    def apply_budget(self, event: str, obj: JsonObject) -> None:
        """A PodDisruptionBudget, for preemption to prefer victims whose budget allows it."""
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        if event == "DELETED":
            self.ledger.budgets.pop(key, None)
        else:
            self.ledger.budgets[key] = budget_from_api(obj)

    def apply_quota(self, event: str, obj: JsonObject) -> None:
        """A ResourceQuota, which binds the GPU memory of its namespace's pods and replicas
        (`binder.framework.quota`): a new or changed hard limit, or one gone, may let one in."""
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        quotas = self.ledger.quotas.setdefault(namespace, {})
        old = quotas.pop(name, None)
        if event != "DELETED":
            quotas[name] = {"metadata": meta, "spec": obj.get("spec"), "status": obj.get("status")}
        elif not quotas:
            del self.ledger.quotas[namespace]
        hard = ((old or {}).get("status") or {}).get("hard")
        if event == "DELETED" or old is None or hard != (obj.get("status") or {}).get("hard"):
            self._listener.cluster_changed(f"ResourceQuota {namespace}/{name} changed")

    def replace_quotas(self, items: list[JsonObject]) -> None:
        self.ledger.quotas.clear()
        for obj in items:
            self.apply_quota("ADDED", obj)

    def replace_budgets(self, items: list[JsonObject]) -> None:
        self.ledger.budgets.clear()
        for obj in items:
            self.apply_budget("ADDED", obj)

    # ---- PriorityClasses ----------------------------------------------------------------------

    def apply_priority_class(self, event: str, obj: JsonObject) -> None:
        """A PriorityClass: the TritonModels are resolved again (`binder.cluster.priorities`)."""
        found = priority_class_from_api(obj)
        if event == "DELETED":
            self.ledger.priority_classes.pop(found.name, None)
        else:
            self.ledger.priority_classes[found.name] = found
        self._resolve_models()

    def replace_priority_classes(self, items: list[JsonObject]) -> None:
        self.ledger.priority_classes.clear()
        for obj in items:
            found = priority_class_from_api(obj)
            self.ledger.priority_classes[found.name] = found
        self._resolve_models()

    def _resolve_models(self) -> None:
        """Each model's priority from the classes as they now are, its charged replicas
        charged again at it (a model listed before the classes were is put right), unless its
        class is gone."""
        ledger, state = self.ledger, self.state
        for uid, model in list(ledger.models.items()):
            resolved = resolve(model, ledger.priority_classes)
            if resolved is model:
                continue
            ledger.models[uid] = resolved
            if resolved.priority_problem:
                # Its class is gone: placed replicas keep their priority, as pods keep theirs.
                self._on_model(uid)
                continue
            priority = resolved.template.priority
            policy = resolved.template.preemption_policy
            for rid in ledger.replica_uids(uid):
                charged = state.charged_pod(rid)
                if charged is None or charged.priority == priority:
                    continue
                again = replace(charged, priority=priority, preemption_policy=policy)
                assumed = state.is_assumed(rid)
                state.remove_pod(rid)  # its priority is counted where it is charged
                if assumed:
                    state.assume(again, again.node_name, again.gpu_uuid, again.placement)
                else:
                    state.set_pod(again)
            self._on_model(uid)

    # ---- leases --------------------------------------------------------------------------------

    def apply_lease(self, event: str, obj: JsonObject) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        if not name.startswith(AGENT_LEASE_PREFIX):
            return
        node = name[len(AGENT_LEASE_PREFIX) :]
        now = self._clock()
        was_alive = self.state.leases.get(node, 0.0) > now
        expiry = 0.0 if event == "DELETED" else lease_expiry(obj)
        self.state.set_lease(node, expiry)
        if expiry > now and not was_alive:
            self._listener.cluster_changed(f"the agent of node {node} is alive")

    def replace_leases(self, items: list[JsonObject]) -> None:
        listed = {str((o.get("metadata") or {}).get("name", "")) for o in items}
        for node in list(self.state.leases):
            if AGENT_LEASE_PREFIX + node not in listed:
                self.state.set_lease(node, 0.0)
        for obj in items:
            self.apply_lease("ADDED", obj)


class Informer:
    """List+watch of one kind on a daemon thread, delivering to the event loop."""

    def __init__(
        self,
        kube: Kube,
        kind: Kind,
        loop: asyncio.AbstractEventLoop,
        *,
        on_list: Callable[[list[JsonObject]], None],
        on_event: Callable[[str, JsonObject], None],
        monotonic: Callable[[], float] = time.monotonic,
        inbox: Inbox | None = None,
        optional: bool = False,
    ) -> None:
        """`optional`: a kind the cluster may not serve (a CRD not installed): while the list
        answers 404 the cache holds none of it, counts as filled, and asks again every
        RETRY_MAX_SECONDS."""
        self._kube = kube
        self._optional = optional
        self._absent = False
        self._kind = kind.name
        self.kind = kind.name
        self._source = kind
        self._loop = loop
        self._on_list = on_list
        self._on_event = on_event
        self._stop = threading.Event()
        self.synced = asyncio.Event()
        self.relists = 0
        self.failures = 0
        """Failed lists and watches so far."""
        self._monotonic = monotonic
        self._failing_since: float | None = None
        self._logged_failure_at: float | None = None
        self._thread = threading.Thread(target=self._run, name=f"watch-{kind.name}", daemon=True)
        self._inbox = inbox or Inbox(loop)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end; the caller cuts open watches with Kube.close_watches()."""
        self._stop.set()

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _deliver(self, callback: Callable[..., None], *args: Any) -> None:
        """Hand a change to the event loop, in order; a burst of changes (from every informer
        and the API writers sharing the inbox) costs the loop one wake-up, not one per event."""
        if not self._inbox.post(self._guarded, callback, *args):
            self._stop.set()  # the loop is closed: we are shutting down

    def _guarded(self, callback: Callable[..., None], *args: Any) -> None:
        if self._stop.is_set():
            return
        try:
            callback(*args)
        except Exception:
            log.exception("Applying a %s change has failed: the cache may be stale.", self._kind)

    def _listed(self, items: list[JsonObject]) -> None:
        self._on_list(items)
        self.synced.set()

    @property
    def absent(self) -> bool:
        """An optional kind the API server does not serve (its last list answered 404)."""
        return self._absent

    def failing_for(self) -> float:
        """Seconds since the list or watch last failed without a success since; 0 when it works."""
        since = self._failing_since
        return 0.0 if since is None else max(0.0, self._monotonic() - since)

    def _should_log_failure(self) -> bool:
        """Whether this failure is worth a log line: the first of an outage, then one every
        FAILURE_LOG_SECONDS, since an unreachable server is tried about every second."""
        now = self._monotonic()
        if self._logged_failure_at is not None and now - self._logged_failure_at < (
            FAILURE_LOG_SECONDS
        ):
            return False
        self._logged_failure_at = now
        return True

    def _working(self) -> None:
        self._logged_failure_at = None
        if self._failing_since is not None:
            log.info(
                "The %s cache is back in touch with the API server after %.0f s.",
                self._kind,
                self.failing_for(),
            )
            self._failing_since = None

    def _run(self) -> None:
        version = ""
        delay = RETRY_SECONDS
        while not self._stop.is_set():
            try:
                if not version:
                    items, version = self._kube.list_all(self._source)
                    self.relists += 1
                    self._working()
                    self._deliver(self._listed, items)
                self._absent = False
                for event, obj in self._kube.watch(self._source, version, self._working):
                    if self._stop.is_set():
                        return
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if event != "BOOKMARK":
                        self._deliver(self._on_event, event, obj)
                delay = RETRY_SECONDS
            except GoneError:
                log.info("The %s watch is too old to resume: relisting.", self._kind)
                version = ""
            except Exception as e:  # the thread must outlive every failure, even a bug
                if self._stop.is_set():
                    return
                if self._optional and isinstance(e, NotFoundError):
                    if not self._absent:
                        self._absent = True
                        log.info("The API server serves no %s: none are placed.", self._kind)
                        self._deliver(self._listed, [])
                    version = ""
                    self._stop.wait(RETRY_MAX_SECONDS)
                    continue
                self.failures += 1
                if self._failing_since is None:
                    self._failing_since = self._monotonic()
                wait = _retry_wait(e, delay)
                if isinstance(e, ApiError | OSError | ValueError):
                    if self._should_log_failure():
                        log.warning(
                            "Watching %s has failed (%s): the cache keeps what it has and "
                            "retries in %.1f s (failing for %.0f s).",
                            self._kind,
                            e,
                            wait,
                            self.failing_for(),
                        )
                else:
                    log.exception(
                        "Watching %s has failed unexpectedly: the cache keeps what it has and "
                        "retries in %.0f s.",
                        self._kind,
                        wait,
                    )
                self._stop.wait(wait)
                if not _unreachable(e):
                    delay = min(delay * 2, RETRY_MAX_SECONDS)


def _unindex(index: dict[tuple[str, str], set[str]], model: ModelInfo) -> None:
    """Take `model` out of the ledger's model-id index (the key goes with its last model)."""
    key = (model.namespace, model.template.model_id)
    uids = index.get(key)
    if uids is not None:
        uids.discard(model.uid)
        if not uids:
            del index[key]


def _unreachable(e: Exception) -> bool:
    """The API server did not answer at all (status 0: refused, reset, timed out)."""
    return isinstance(e, UnavailableError) and e.status == 0


def _retry_wait(e: Exception, delay: float) -> float:
    """How long a watch waits after `e`, jittered so the informers (and replicas) do not retry
    in step: about a second while the server is unreachable, `delay` (or the server's
    Retry-After, if longer) while it answers with errors."""
    if _unreachable(e):
        return UNREACHABLE_RETRY_SECONDS * random.uniform(0.5, 1.0)  # noqa: S311 (not security)
    if isinstance(e, UnavailableError) and e.retry_after is not None:
        return max(delay, e.retry_after)
    return delay * random.uniform(0.5, 1.0)  # noqa: S311 (jitter, not security)
