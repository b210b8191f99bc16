"""Whether each TritonModel replica is served, and which of its namespace's hosts its Service
selects.

Read from what the agent writes on the namespace's model hosts (`common.hosted`: each replica's
loaded condition, and the kubelet's Ready), the replicas draining, and the models whose awake
replicas have no room (`binder.autoscaler.room`). A replica is served (`served`) when loaded on its
host (`loaded`: True, or False only as asleep, ModelSleeping) and the host is Ready; a host is
labelled to serve it (`routable`) when loaded, or, for the model's last replica served, while its
node pod stops or its Triton restarts (`RESTORING_REASONS`: its host answers until the node pod
goes, or once the model is back); awake first (`serves_value`): a sleeping replica's label is
`asleep` (outside the Service) while another replica of its model is awake and has room. Reads
only: the controller (`binder.tritonmodels.controller`) and the hosts' writer
(`binder.tritonmodels.hostwriter`) act on the answers.
"""

from __future__ import annotations

from binder.autoscaler.room import Room
from binder.cluster.ledger import Ledger
from binder.cluster.modelviews import ModelInfo
from binder.cluster.objects import PodInfo
from binder.tritonmodels.replicabook import ReplicaView
from binder.tritonmodels.rolling import Loaded
from common.contract import Keys
from common.hosted import RESTORING_REASONS, SERVES_ASLEEP, SLEEPING_REASON, loaded_condition

HOST_REFUSED = "FailedCreate"
"""The Ready condition's reason, and the Warning Event's, while the API server refuses a host of
the model's replicas (a quota on pods, CPU or memory, a LimitRange, a policy)."""


LOST_NODE_TAINTS = frozenset({"node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"})
"""The NoExecute taints kube's node lifecycle controller puts on a node whose kubelet is silent
(Ready Unknown) or reports it not ready."""


def node_lost(ledger: Ledger, node: str) -> bool:
    """Whether `node` is lost: tainted NoExecute `unreachable` or `not-ready` (its kubelet
    silent, or not ready, past kube's grace): nothing of it acts until it is back."""
    info = ledger.state.nodes.get(node)
    return info is not None and any(
        t.effect == "NoExecute" and t.key in LOST_NODE_TAINTS for t in info.taints
    )


def ordinal_of(replica: PodInfo) -> int:
    """The ordinal of a replica, from its uid (`<model uid>/<ordinal>`)."""
    return int(replica.uid.rpartition("/")[2])


class Serving:
    """Answers for the replicas of the models in `ledger`."""

    def __init__(
        self,
        ledger: Ledger,
        keys: Keys,
        book: ReplicaView,
        room: Room,
    ) -> None:
        self._ledger = ledger
        self._keys = keys
        self._book = book
        """Replicas draining (never the replica served elsewhere), and why the namespace's
        host on a node (with a storage secret) was refused, if it was."""
        self._room = room

    def loaded(self, model: ModelInfo, replica: PodInfo) -> Loaded:
        """Whether the namespace's host on the replica's node serves it (the agent's loaded
        condition of the replica True, or False only because the on-demand replica is asleep:
        the host's proxy wakes it on the next request), and why not."""
        node = replica.node_name
        host = self._ledger.hosts.get(model.host_group, {}).get(node)
        refused = self._book.host_refused(model.namespace, (node, model.storage_secret))
        if host is None and refused:
            return Loaded(False, refused, HOST_REFUSED)
        if host is None:
            return Loaded(False, "its model host is not created yet")
        if (host.get("metadata") or {}).get("deletionTimestamp"):
            return Loaded(False, "its model host is being deleted")
        wanted = loaded_condition(self._keys, model.name, ordinal_of(replica))
        for condition in (host.get("status") or {}).get("conditions") or []:
            if isinstance(condition, dict) and condition.get("type") == wanted:
                reason = str(condition.get("reason") or "NotLoaded")
                if condition.get("status") == "True" or reason == SLEEPING_REASON:
                    return Loaded(True, "")
                message = str(condition.get("message") or "")
                return Loaded(False, f"{reason}: {message}" if message else reason, reason)
        return Loaded(False, "not loaded on its model host yet")

    def routable(self, model: ModelInfo, replica: PodInfo) -> Loaded:
        """Whether the replica's host is labelled to serve it: loaded (`loaded`), or loaded
        on a node whose node pod stops, or whose Triton restarts, while no other replica of its
        model is served (`RESTORING_REASONS`: its host answers until the node pod goes, or once
        the model is back: nothing else would)."""
        loaded = self.loaded(model, replica)
        if loaded.ready or loaded.reason not in RESTORING_REASONS:
            return loaded
        return loaded if self.awake_elsewhere(model, replica.node_name) else Loaded(True, "")

    def awake_elsewhere(self, model: ModelInfo, node: str) -> bool:
        """Whether a replica of `model` on another node than `node`, not draining, is awake
        there (`awake`)."""
        for rid in self._ledger.replica_uids(model.uid):
            charged = self._ledger.state.charged_pod(rid)
            if (
                charged is not None
                and charged.node_name != node
                and not self._book.draining(rid)
                and self.awake(model, charged.node_name)
            ):
                return True
        return False

    def awake(self, model: ModelInfo, node: str, ordinal: int | None = None) -> bool:
        """Whether a replica of `model` (replica `ordinal`, when given) is loaded and not asleep
        on the namespace's host on `node`, and that host is Ready (in the Service's
        endpoints)."""
        host = self._ledger.hosts.get(model.host_group, {}).get(node) or {}
        status = {
            c.get("type"): c.get("status")
            for c in (host.get("status") or {}).get("conditions") or []
            if isinstance(c, dict)
        }
        if status.get("Ready") != "True":
            return False
        for rid in self._ledger.replica_uids(model.uid):
            charged = self._ledger.state.charged_pod(rid)
            if charged is not None and charged.node_name == node:
                if ordinal is not None and ordinal_of(charged) != ordinal:
                    continue
                wanted = loaded_condition(self._keys, model.name, ordinal_of(charged))
                if status.get(wanted) == "True":
                    return True
        return False

    def serves_value(self, model: ModelInfo, node: str) -> str:
        """The `serves-<model>` label of a host where `model` is loaded: "true" (selected by
        its Service) when awake there, or when asleep there and no other replica of it is awake
        and not draining, or the awake ones have no room (`binder.autoscaler.room`) (awake first: a
        sleeping replica gets requests, and wakes, only while no awake replica of its model has
        room); else "asleep", outside the Service."""
        if self.awake(model, node) or self._room.admits(model.uid):
            return "true"
        return SERVES_ASLEEP if self.awake_elsewhere(model, node) else "true"

    def served(self, model: ModelInfo, replica: PodInfo) -> Loaded:
        """Whether the replica is served through its Service by the namespace's host on its
        node: loaded there (`loaded`), and the host pod Ready, so that its endpoint is (a new
        host's readiness probe passes seconds after its first model loads)."""
        loaded = self.loaded(model, replica)
        if not loaded.ready:
            return loaded
        host = self._ledger.hosts.get(model.host_group, {}).get(replica.node_name) or {}
        for condition in (host.get("status") or {}).get("conditions") or []:
            if isinstance(condition, dict) and condition.get("type") == "Ready":
                if condition.get("status") == "True":
                    return loaded
                break
        return Loaded(False, "its model host is not Ready yet")
