"""The TritonModel side of the cluster cache: TritonModels, the model hosts that serve their
replicas, and the PriorityClasses the replicas take their priority from, applied to the ledger
(binder.cluster.ledger) on the event loop thread.

A model's replicas placed in its status are charged when their proofs verify; a replica gone from
the status is freed unless the binder has just placed it. `ModelCache` is part of
binder.cluster.cache's ClusterCache, which routes host pods here and shares its key ring; it tells
the model controller which model changed. It must not decide placements nor write to the API.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace
from typing import Any

from binder.cluster.chargedpods import proven, same_proof
from binder.cluster.ledger import Ledger
from binder.cluster.modelsizes import ESTIMATE
from binder.cluster.modelviews import ModelInfo, is_replica, model_from_api
from binder.cluster.objects import NodeInfo, PodInfo
from binder.cluster.priorities import priority_class_from_api, resolve
from common.contract import Keys
from common.hosted import (
    host_group,
    host_label,
    host_name,
    host_secret_annotation,
    hosted_models_annotation,
)
from common.kubeapi.session import JsonObject
from common.proofs import KeyRing


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


class ModelCache:
    """Applies TritonModels, model hosts and PriorityClasses to the ledger, on the event loop
    thread."""

    def __init__(
        self,
        keys: Keys,
        ledger: Ledger,
        *,
        scheduler_name: str,
        changed: Callable[[str], None],
        ring: Callable[[], KeyRing | None],
        tenant_code: Collection[str],
        min_gpu_mem: int,
        allowance: int,
        estimate: int = ESTIMATE,
        on_model: Callable[[str], None],
        on_host_gone: Callable[[str], None],
        on_host: Callable[[str, str], None],
    ) -> None:
        """`changed(why)`: the cluster changed in a way that could help unschedulable pods;
        `ring()`: the key ring in force, the cache's, after following a rotation; the others as
        ClusterCache's; `estimate`: the first estimate of a model that declares no GPU memory
        (`binder.cluster.modelsizes`)."""
        self.keys = keys
        self.ledger = ledger
        self.state = ledger.state
        self.scheduler_name = scheduler_name
        self.tenant_code = tenant_code
        self.min_gpu_mem = min_gpu_mem
        self.allowance = allowance
        self.estimate = estimate
        self._changed = changed
        self._ring = ring
        self._on_model = on_model
        self._on_host_gone = on_host_gone
        self._on_host = on_host
        self._host_label = host_label(keys)

    # ---- model hosts ---------------------------------------------------------------------------

    def is_host(self, pod: PodInfo, obj: JsonObject) -> bool:
        """A model host the binder made: its label, on a node, under the name the binder gives
        the host of its storage Secret (its annotation; none is one) there. Its pod slot and
        requests are charged as its host group's host while the group has a replica on the node
        (`binder.cluster.podindex`), so it is not also counted as a pod then. A tenant can write
        the label, annotation and name on a pod of its own: where its group has no replica on
        the node the pod counts as any pod (`apply_host`); where it has one, the name is the
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

    def apply_host(self, event: str, pod: PodInfo, obj: JsonObject) -> None:
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
        self._changed(f"model host {pod.key} changed")

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
            self.estimate,
        )
        model = resolve(model, self.ledger.priority_classes)
        if not model.uid:
            return
        ledger = self.ledger
        if event == "DELETED":
            old = ledger.models.pop(model.uid, None)
            if self._free_replicas(model.uid, keep=set(), assumed_too=True):
                self._changed(f"TritonModel {model.key} was deleted")
            ledger.spans.pop(model.uid, None)
            if old is not None:
                ledger.by_namespace.get(old.namespace, set()).discard(model.uid)
                _unindex(ledger.by_model_id, old)
            self._on_model(model.uid)
            return
        ring = self._ring()
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
            self._account_replica(replica, ring)
        # Past the highest ordinal charged, not spec.replicas: a scale to 10^9 walks nothing.
        charged = [o for o in model.placed if self.state.is_accounted(f"{model.uid}/{o}")]
        ledger.spans[model.uid] = max(ledger.spans.get(model.uid, 0), max(charged, default=-1) + 1)
        if self._free_replicas(model.uid, keep=shown, assumed_too=False):
            self._changed(f"replicas of TritonModel {model.key} were freed")
        self._on_model(model.uid)

    def _account_replica(self, replica: PodInfo, ring: KeyRing | None) -> None:
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
        verdict = proven(replica, ring) if replica.node_name else None
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

    def measured(self, old: NodeInfo | None, node: NodeInfo) -> None:
        """The node's agent published new figures (`NodeInfo.measured`): each model with a
        replica there whose figure changed is reconciled, so its status shows it and, when it
        declares no GPU memory, its next replica is booked by it (`binder.cluster.modelsizes`)."""
        before = old.measured if old is not None else {}
        if before == node.measured:
            return
        changed = {
            n for n in before.keys() | node.measured.keys() if before.get(n) != node.measured.get(n)
        }
        models = {
            pod.uid.partition("/")[0]
            for pod, _ in self.state.pods_on(node.name)
            if is_replica(pod.uid) and pod.triton_name in changed
        }
        for uid in sorted(models):
            self._on_model(uid)

    def place_again(self, uid: str) -> None:
        """A replica whose place is lost (its node is gone, or its proof's key): freed, and its
        model controller places it again."""
        self.state.remove_pod(uid)
        self.state.untrack_pod(uid)
        self._on_model(uid.partition("/")[0])

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


def _unindex(index: dict[tuple[str, str], set[str]], model: ModelInfo) -> None:
    """Take `model` out of the ledger's model-id index (the key goes with its last model)."""
    key = (model.namespace, model.template.model_id)
    uids = index.get(key)
    if uids is not None:
        uids.discard(model.uid)
        if not uids:
            del index[key]
