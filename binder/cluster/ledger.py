"""The ledger: what the cluster cache keeps and the rest of the binder reads on the event loop.

One `Ledger` is made first, then given to the cache (binder.cluster.cache, which alone changes
it) and to the controllers and the metrics (which read it), so that none of them is wired to
another after construction: the ClusterState, the pending pods, the budgets and quotas, the
TritonModels with their replicas' bookkeeping and hosts, the PriorityClasses and the unproven
pods. It does no I/O and reads no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from binder.cluster.budgets import Budget
from binder.cluster.chargedpods import Unproven
from binder.cluster.clusterstate import ClusterState
from binder.cluster.modelviews import ModelInfo
from binder.cluster.objects import PodInfo
from binder.cluster.priorities import PriorityClassInfo
from common.kubeapi.session import JsonObject


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
    host: the replica placer (`binder.tritonmodels.placer`) alone adds and removes them; a
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
