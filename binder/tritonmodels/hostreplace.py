"""When a namespace's model host no longer matches what the binder would create, and when it may
be replaced; the stand-in replicas that serve for a host that goes.

A pod's spec cannot change, so a host made from another template (another --host-image, ports or
pod settings: another binder's), or without a storage Secret its replicas need, is deleted and
created anew (`binder.tritonmodels.hostwriter`). Replacements go one host of a namespace at a
time, so its models stay served by their replicas on other nodes: the next waits until no host
of the namespace is being deleted and every other one serves its replicas, or
--host-drain-seconds after the last replacement at most. A model the host serves and no other
does, or parks at zero, first gets a stand-in: one replica more (the replica book's, placed by the
replica placer on another node), and the host waits until it is served (and the model unparked),
or --host-drain-seconds (no room for it); no other host of the namespace goes meanwhile. The
stand-in leaves once the new host serves the model (a parked one: once the new host is there).
So too a model served alone on a node whose node pod stops, until that node serves it again.
This module decides; the host writer deletes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping

from binder.cluster.modelviews import ModelInfo
from binder.cluster.objects import PodInfo
from binder.tritonmodels.hostpod import host_image, mounted_secrets
from binder.tritonmodels.replicabook import ReplicaBook
from binder.tritonmodels.rolling import Loaded
from common.contract import Keys
from common.hosted import NODE_STOPPING_REASON, host_template_annotation
from common.kubeapi.session import JsonObject

log = logging.getLogger(__name__)

Replicas = list[tuple[ModelInfo, int, PodInfo]]
"""The replicas of a namespace charged on one node: (model, ordinal, replica)."""
Where = tuple[str, str]
"""A host of a namespace: its node and its storage Secret ("": none)."""


class HostReplacements:
    """Which hosts are outdated, and whether a namespace's may be replaced now; the book's
    drains and `served` are read as they change."""

    def __init__(
        self,
        keys: Keys,
        *,
        drain_seconds: float,
        clock: Callable[[], float],
        book: ReplicaBook,
        served: Callable[[ModelInfo, PodInfo], Loaded],
        models: Mapping[str, ModelInfo],
        changed: Callable[[str], None],
    ) -> None:
        """`book`: the replicas' drains, read, and the models' stand-ins, asked and released
        here alone (the placer reads them); `models`: the ledger's, by uid; `changed(uid)`: the
        model's turn, to place or drain its stand-in."""
        self._keys = keys
        self._drain_seconds = drain_seconds
        self._clock = clock
        self._book = book
        self._served = served
        self._replaced_at: dict[str, float] = {}
        """Namespace -> when one of its outdated hosts was last replaced (`clock`)."""
        self._replacing: dict[str, str] = {}
        """Namespace -> the uid of the host it replaced last."""
        self._models = models
        self._changed = changed
        self._asked: dict[str, dict[str, tuple[str, float]]] = {}
        """Namespace -> model uid -> the outdated host its stand-in was asked for (uid), and
        when."""

    def outdated(self, there: JsonObject, body: JsonObject) -> str:
        """Why the host `there` no longer matches the host the binder would create now, `body`
        ("" when it does)."""
        key = host_template_annotation(self._keys)
        made = ((there.get("metadata") or {}).get("annotations") or {}).get(key)
        if made != body["metadata"]["annotations"][key]:
            old, new = host_image(there.get("spec") or {}), host_image(body["spec"])
            if old != new:
                return f"its image is {old}, and --host-image is {new}"
            return "it was made from another pod template (ports, arguments or settings)"
        missing = mounted_secrets(body["spec"]) - mounted_secrets(there.get("spec") or {})
        if missing:
            return f"it does not mount Secret {', '.join(sorted(missing))}"
        return ""

    def may_replace(
        self,
        namespace: str,
        where: Where,
        wanted: Mapping[Where, Replicas],
        there_now: Mapping[Where, JsonObject],
    ) -> bool:
        """Whether the namespace's host `where` may be replaced now: not while another host's
        stand-ins are asked (that host goes first, so no stand-in is placed on a host that
        goes), nor while one is being deleted; then once every other host serves its replicas,
        or --host-drain-seconds after the last replacement."""
        there = there_now.get(where) or {}
        uid = str((there.get("metadata") or {}).get("uid"))
        if any(host and host != uid for host, _ in self._asked.get(namespace, {}).values()):
            return False  # another host's stand-ins were asked: that host goes first
        deleted = self._replacing.get(namespace)
        for host in there_now.values():
            meta = host.get("metadata") or {}
            if meta.get("deletionTimestamp") or meta.get("uid") == deleted:
                return False  # one is going (or its deletion is not in the cache yet)
        if self._clock() >= self._replaced_at.get(namespace, -math.inf) + self._drain_seconds:
            return True
        for other, replicas in wanted.items():
            if other == where:
                continue
            if other not in there_now:
                return False
            for model, _, replica in replicas:
                if not self._book.draining(replica.uid) and not self._served(model, replica).ready:
                    return False
        return True

    def replacing(self, namespace: str, node: str, there: JsonObject, why: str) -> None:
        """The outdated host `there` on `node` is being deleted now: the namespace's next
        replacement waits for it."""
        meta = there.get("metadata") or {}
        log.info(
            "Replacing the model host %s/%s on node %s (%s): its replicas there are served "
            "again once its successor has loaded them.",
            namespace,
            meta.get("name"),
            node,
            why,
        )
        self._replaced_at[namespace] = self._clock()
        self._replacing[namespace] = str(meta.get("uid"))

    def stood_in(
        self,
        where: Where,
        there: JsonObject,
        wanted: Mapping[Where, Replicas],
        parked: Iterable[ModelInfo] = (),
    ) -> bool:
        """Whether the outdated host `there` at `where` may go as far as its models are
        concerned: each it serves that no other host does, and each at zero replicas it holds
        the requests of (`parked` there), has a stand-in served elsewhere, or was asked one
        --host-drain-seconds ago (none came: no room). Asks for those missing."""
        host_uid = str((there.get("metadata") or {}).get("uid"))
        now = self._clock()
        ready = True
        elsewhere = self._served_elsewhere(where, wanted)
        alone = [
            model
            for model, _, replica in wanted.get(where, [])
            if model.replicas and not self._book.draining(replica.uid)
        ]
        parked = list(parked)
        parked_here = {model.uid for model in parked}
        for model in [*alone, *parked]:
            if model.uid in elsewhere:
                # Parked here still: its turn unparks it (its stand-in serves), then the host's
                # write takes the park off before it goes (its held requests answered).
                ready = ready and model.uid not in parked_here
                continue
            asked = self._asked.get(model.namespace, {}).get(model.uid)
            if asked is None or asked[0] != host_uid:
                self._ask(model, where[0], host_uid, "before that host is replaced")
                ready = False
            elif now < asked[1] + self._drain_seconds:
                ready = False
        return ready

    def stopping(self, namespace: str, where: Where, wanted: Mapping[Where, Replicas]) -> None:
        """Each replica on `where` whose node pod stops (the agent's NodePodStopping) and that
        alone serves its model gets a stand-in on another node, so the model stays served once
        the node's Triton stops (the agent waits for its host to leave the Service, which it
        does once the stand-in serves); the stand-in leaves once the replica there serves again
        (`release`)."""
        stops = [
            (model, replica)
            for model, _, replica in wanted.get(where, [])
            if model.replicas
            and not self._book.draining(replica.uid)
            and self._book.stand_in(model.uid) is None
            and self._served(model, replica).reason == NODE_STOPPING_REASON
        ]
        if not stops:
            return
        elsewhere = self._served_elsewhere(where, wanted)
        for model, _ in stops:
            if model.uid in elsewhere:
                continue
            # No host uid: released once a replica on that node serves again (`release`).
            self._ask(model, where[0], "", "its node pod stops, until it serves there again")

    def settled(self, namespace: str, where: Where, there: JsonObject) -> None:
        """The namespace's host `there` at `where` is up to date: a stand-in asked for it while
        it was outdated (its template changed back before it was replaced) is not needed."""
        host_uid = (there.get("metadata") or {}).get("uid")
        for uid, (asked_for, _) in list(self._asked.get(namespace, {}).items()):
            if asked_for == host_uid and self._book.stand_in(uid) == where[0]:
                self._drop(namespace, uid)

    def release(
        self,
        namespace: str,
        wanted: Mapping[Where, Replicas],
        there_now: Mapping[Where, JsonObject],
    ) -> bool:
        """The namespace's stand-ins no longer needed leave: their model is served by the host
        that replaced the one they stood in for (or has no replica on its node any more, or is
        gone). Returns whether one of the namespace's stays."""
        kept = False
        for uid, (asked_for, _) in list(self._asked.get(namespace, {}).items()):
            model, node = self._models.get(uid), self._book.stand_in(uid) or ""
            if model is not None:
                where = (node, model.storage_secret)
                there = there_now.get(where)
                meta = (there or {}).get("metadata") or {}
                mine = [r for m, _, r in wanted.get(where, []) if m.uid == uid]
                replaced = (
                    there is not None
                    and meta.get("uid") != asked_for
                    and not meta.get("deletionTimestamp")
                )
                if mine and not (replaced and any(self._served(model, r).ready for r in mine)):
                    kept = True
                    continue
                if not mine and not model.replicas and not replaced:
                    # At zero: it holds the model's requests until the host is replaced; then
                    # it drains and the model is parked on the stand-in's host.
                    kept = True
                    continue
            self._drop(namespace, uid)
        return kept

    def _ask(self, model: ModelInfo, node: str, host_uid: str, when: str) -> None:
        """A stand-in of `model` is wanted away from `node`, for the host `host_uid` there ("":
        until a replica on that node serves again); the model's turn places it."""
        log.info(
            "TritonModel %s is served on node %s alone: a stand-in replica is placed on another "
            "node (%s).",
            model.key,
            node,
            when,
        )
        self._asked.setdefault(model.namespace, {})[model.uid] = (host_uid, self._clock())
        self._book.ask_stand_in(model.uid, node)
        self._changed(model.uid)

    def _drop(self, namespace: str, uid: str) -> None:
        """Model `uid`'s stand-in is no longer wanted: its next turn drains it."""
        asked = self._asked.get(namespace, {})
        asked.pop(uid, None)
        if not asked:
            self._asked.pop(namespace, None)
        self._book.release_stand_in(uid)
        self._changed(uid)

    def _served_elsewhere(self, where: Where, wanted: Mapping[Where, Replicas]) -> set[str]:
        """The models another host than `where` serves a replica of now (one pass over the
        namespace's replicas, whatever their number)."""
        return {
            model.uid
            for other, replicas in wanted.items()
            if other != where
            for model, _, replica in replicas
            if not self._book.draining(replica.uid) and self._served(model, replica).ready
        }
