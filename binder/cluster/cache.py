"""The cluster cache: API objects folded into the ledger (binder.cluster.ledger), on the loop.

The informers (binder.api.informer) hand every list and watch event to the event loop, where
`ClusterCache` applies pods, nodes, namespaces, PodDisruptionBudgets, ResourceQuotas and agent
Leases to the ClusterState and the set of pending pods (TritonModels, their hosts and the
PriorityClasses through its part binder.cluster.modelcache), and tells its listener what changed:
a pending pod appeared or changed, a pending pod left, or the cluster changed in a way that could
help unschedulable pods (memory freed, a node added or changed, an agent came alive). A bound
pod is charged only while its placement's proof verifies under the key ring in force. Decisions
never list: they read this cache.

It must not decide placements nor write to the API.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import Any, Protocol

from binder.cluster.budgets import budget_from_api
from binder.cluster.chargedpods import Unproven, proven, same_proof
from binder.cluster.ledger import Ledger
from binder.cluster.modelcache import ModelCache
from binder.cluster.modelsizes import ESTIMATE
from binder.cluster.modelviews import is_replica
from binder.cluster.objects import PodInfo, lease_expiry, node_from_api, pod_from_api
from common.contract import AGENT_LEASE_PREFIX, MIN_GPU_MEM, Keys
from common.kubeapi.session import JsonObject
from common.proofs import KeyRing

log = logging.getLogger(__name__)


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
    return (
        pod.constraints,
        pod.request,
        pod.model_key,
        pod.replica_spread,
        pod.triton_version,
        pod.problem,
        pod.scheduler_name,
    )


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
        estimate: int = ESTIMATE,
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
        proofs for form only, for a CLI user who cannot read the key (`binder.cluster.chargedpods`).
        `tenant_code`: the namespaces allowed to run their own code in Triton; `min_gpu_mem`:
        the least GPU memory a model may ask (`--min-gpu-mem`); `allowance`: the per-process
        allowance booked with a model's request (`common.backends`); `estimate`: the first
        estimate of a TritonModel that declares no GPU memory (`binder.cluster.modelsizes`)."""
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
        self._clock = clock
        self._placement_keys = placement_keys
        self._ring = placement_keys() if placement_keys is not None else None
        self.models = ModelCache(
            keys,
            ledger,
            scheduler_name=scheduler_name,
            changed=listener.cluster_changed,
            ring=self._ring_in_force,
            tenant_code=self.tenant_code,
            min_gpu_mem=min_gpu_mem,
            allowance=allowance,
            estimate=estimate,
            on_model=on_model,
            on_host_gone=on_host_gone,
            on_host=on_host,
        )
        """TritonModels, their hosts and the PriorityClasses they resolve against."""

    # ---- pods ----------------------------------------------------------------------------------

    def apply_pod(self, event: str, obj: JsonObject) -> None:
        pod = pod_from_api(obj, self.keys, self.tenant_code, self.min_gpu_mem, self.allowance)
        if not pod.uid:
            return
        if self.models.is_host(pod, obj):
            self.models.apply_host(event, pod, obj)
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
                if is_replica(pod.uid):
                    self.models.place_again(pod.uid)
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

    def _ring_in_force(self) -> KeyRing | None:
        """The key ring to judge proofs with, after following a rotation (`_follow_ring`)."""
        self._follow_ring()
        return self._ring

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
                    self.models.place_again(pod.uid)
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
            self.models.measured(old, node)
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
