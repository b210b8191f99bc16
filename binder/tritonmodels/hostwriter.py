"""A namespace's model hosts: the pod each node with a replica of the namespace's TritonModels
gets, and the API writes that keep it so.

`reconcile(namespace, nodes)` makes the hosts on `nodes` what the binder's ledger says: one pod
per node and storage Secret (none is one) with a replica of the namespace's placed (or a model of
it parked there at zero replicas, `binder.autoscaler.parkedmodels`), named `tritonshare-host-<hash
of the node and the Secret>` and mounting that Secret alone, so a model that needs a new Secret gets
a host of its own and its neighbours' hosts are never replaced for it; created on its node
(`spec.nodeName`) as a model pod that serves many models (`binder.tritonmodels.hostpod`), owned
by every TritonModel with a replica there, naming its replicas in `<prefix>hosted-models` and
labelled `<prefix>serves-<model>` as the model writer says (`binder.tritonmodels.controller`:
loaded, awake first, draining); deleted when its last replica leaves. A host made from another
template (another --host-image) is replaced one per namespace at a time; a host the API server
refuses (a quota on pods, a LimitRange, a policy) is tried again every second, and its models'
Ready condition and a `FailedCreate` Event say why. The namespace's PodDisruptionBudget on its
hosts follows its models' `minAvailable` (`binder.tritonmodels.hostbudget`).

What it reads of the models (their drains, parkings, loaded and serving state, files) it is
given by the model writer; it decides no placement.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Any

from binder.api.kube import Kube
from binder.cluster.budgets import Budget
from binder.cluster.ledger import Ledger
from binder.cluster.modelviews import ModelInfo, event_object, owner_reference
from binder.cluster.objects import PodInfo
from binder.cluster.podterms import NOTHING
from binder.tritonmodels.hostbudget import BUDGET_NAME, budget, min_available
from binder.tritonmodels.hostpod import host_spec, template_hash
from binder.tritonmodels.hostreplace import HostReplacements, Replicas, Where
from binder.tritonmodels.replicabook import ReplicaBook
from binder.tritonmodels.rolling import Loaded
from binder.tritonmodels.serving import node_lost
from common.contract import RESIDENCY_ALWAYS, RESIDENCY_ON_DEMAND, Keys
from common.hosted import (
    HostedError,
    HostedReplica,
    Parked,
    decode_hosted,
    encode_hosted,
    encode_parked,
    group_namespace,
    host_label,
    host_name,
    host_secret_annotation,
    host_template_annotation,
    hosted_models_annotation,
    parked_models_annotation,
    serves_label,
)
from common.kubeapi.errors import ApiError, ConflictError, NotFoundError
from common.kubeapi.session import JsonObject
from common.modelpod import NodeAccess

log = logging.getLogger(__name__)


class HostWriter:
    """Keeps a binder's model hosts: what they should be, and the writes that make them so."""

    def __init__(
        self,
        kube: Kube,
        ledger: Ledger,
        *,
        keys: Keys,
        executor: Executor,
        identity: str,
        scheduler_name: str,
        host_image: str,
        access: NodeAccess,
        drain_seconds: float,
        clock: Callable[[], float],
        book: ReplicaBook,
        loaded: Callable[[ModelInfo, PodInfo], Loaded],
        served: Callable[[ModelInfo, PodInfo], Loaded],
        serves_value: Callable[[ModelInfo, str], str],
        uri: Callable[[ModelInfo, int], str],
        changed: Callable[[str], None],
    ) -> None:
        """`book`: the replicas' drains and the models' parks, read as they change; the hosts'
        refusals, written here; the stand-ins asked for a replaced host
        (`binder.tritonmodels.hostreplace`); `loaded`, `served` and `serves_value` say whether
        a replica is loaded on its host, served through its Service, and its host's `serves-`
        label; `uri` the files a replica was placed with; `changed(uid)` queues a model whose
        Ready condition a host's refusal changes, or whose stand-in comes or goes."""
        self._kube = kube
        self._ledger = ledger
        self._keys = keys
        self._executor = executor
        self._identity = identity
        self._scheduler_name = scheduler_name
        self._host_image = host_image
        self._access = access
        self._book = book
        self._loaded = loaded
        self._served = served
        self._serves_value = serves_value
        self._uri = uri
        self._changed = changed
        self.waiting: set[str] = set()
        """Namespaces with a replica on a node whose old host is still terminating, or whose
        host the API server refuses: tried again every second."""
        self._host_refusals: dict[str, str] = {}
        """Model uid -> the refusal of one of its hosts last reported (an Event on change)."""
        self._templates: dict[str, str] = {}
        """Node -> `template_hash` of the hosts this binder makes there."""
        self._replacements = HostReplacements(
            keys,
            drain_seconds=drain_seconds,
            clock=clock,
            book=book,
            served=served,
            models=ledger.models,
            changed=changed,
        )
        self._budgets: dict[str, int] = {}
        """Namespace -> the minAvailable of the budget on its hosts this binder wrote last."""

    def forget(self, model_uid: str) -> None:
        """A deleted model: its hosts' refusal is no longer reported to it."""
        self._host_refusals.pop(model_uid, None)

    def _parked_on(self, namespace: str, where: Where) -> list[ModelInfo]:
        """The namespace's models parked on its host `where`."""
        models, book = self._ledger.models, self._book
        return sorted(
            (
                models[uid]
                for uid in self._ledger.by_namespace.get(namespace, ())
                if uid in models and (book.parked_at(uid), models[uid].storage_secret) == where
            ),
            key=lambda m: m.name,
        )

    def _hosted(self, namespace: str) -> dict[Where, Replicas]:
        """(node, Secret) -> the replicas of the namespace charged on that node whose model
        fetches with that storage Secret (model, ordinal, replica), draining ones too."""
        state = self._ledger.state
        hosts: dict[Where, Replicas] = {}
        for uid in self._ledger.by_namespace.get(namespace, ()):
            model = self._ledger.models[uid]
            for rid in self._ledger.replica_uids(uid):
                replica = state.charged_pod(rid)
                if replica is not None:
                    ordinal = int(rid.rpartition("/")[2])
                    where = (replica.node_name, model.storage_secret)
                    hosts.setdefault(where, []).append((model, ordinal, replica))
        return hosts

    def _there(self, namespace: str) -> dict[Where, JsonObject]:
        """(node, Secret) -> the namespace's hosts as the cache shows them."""
        found: dict[Where, JsonObject] = {}
        for group, hosts in list(self._ledger.hosts.items()):
            if group_namespace(group) == namespace:
                secret = group.partition("/")[2]
                found.update(((node, secret), host) for node, host in hosts.items())
        return found

    async def reconcile(self, namespace: str, nodes: set[str] | None) -> None:
        """Create, update or delete the namespace's hosts on `nodes` (None: every node) to
        serve the replicas charged there."""
        wanted = self._hosted(namespace)
        for uid in self._ledger.by_namespace.get(namespace, ()):
            parked = self._book.parked_at(uid)
            if parked is not None:
                secret = self._ledger.models[uid].storage_secret
                wanted.setdefault((parked, secret), [])
        label = host_label(self._keys)
        there_now = self._there(namespace)
        listed = self._listed(there_now)
        for where, replicas in sorted(wanted.items()):
            node = where[0]
            if nodes is not None and node not in nodes:
                continue
            moving = [r for r in replicas if listed.get(r[2].uid, where) != where]
            if moving:
                # Its model's storageSecret changed: the old host lets it go first, as the
                # agent acts for a replica named by one host at a time.
                self.waiting.add(namespace)
                replicas = [r for r in replicas if r not in moving]
            body = self._host(namespace, where, replicas)
            there = there_now.get(where)
            if there is not None and (there.get("metadata") or {}).get("deletionTimestamp"):
                # The last one is going away: a new host once it is gone.
                self.waiting.add(namespace)
                continue
            if there is None:
                try:
                    # A 409: made already, and its watch event is on the way.
                    with contextlib.suppress(ConflictError):
                        await self._call(self._kube.create_pod, namespace, body)
                except ApiError as e:
                    if e.status not in (403, 422):
                        raise
                    await self._host_refused(namespace, where, replicas, e)
                else:
                    self._host_accepted(namespace, where, replicas)
                continue
            outdated = self._replacements.outdated(there, body)
            replacements = self._replacements
            replacements.stopping(namespace, where, wanted)
            if (
                outdated
                and replacements.may_replace(namespace, where, wanted, there_now)
                and replacements.stood_in(where, there, wanted, self._parked_on(namespace, where))
            ):
                # Its labels and parks first: a model parked here and now served elsewhere has
                # its held requests answered (503, Retry-After) rather than left to the end.
                await self._write(namespace, there, body)
                await self._replace(namespace, node, there, outdated)
                continue
            if outdated:
                self.waiting.add(namespace)  # its turn comes once the namespace's hosts settle
            else:
                replacements.settled(namespace, where, there)
            await self._write(namespace, there, body)
        for unwanted in [w for w in self._book.refused_hosts(namespace) if w not in wanted]:
            self._book.accept_host(namespace, unwanted)  # no replica of the namespace there now
        if self._replacements.release(namespace, wanted, there_now):
            self.waiting.add(namespace)  # checked again until the new host serves its model
        await self._keep_budget(namespace, wanted)
        for where, there in list(there_now.items()):
            meta = there.get("metadata") or {}
            gone = meta.get("deletionTimestamp") or (nodes and where[0] not in nodes)
            if where in wanted or gone:
                continue
            if (meta.get("labels") or {}).get(label) != "true":
                continue
            with contextlib.suppress(NotFoundError, ConflictError):
                await self._call(
                    self._kube.delete_pod, namespace, str(meta["name"]), str(meta["uid"])
                )

    async def _keep_budget(self, namespace: str, wanted: Mapping[Where, Replicas]) -> None:
        """Write the namespace's budget on its hosts (`binder.tritonmodels.hostbudget`) when it
        changes: from its Ready hosts and its models' ready replicas on each, now."""
        served: dict[str, dict[str, int]] = {}
        minimums: dict[str, int] = {}
        for where, replicas in wanted.items():
            for model, _, replica in replicas:
                if not model.min_available:
                    continue
                minimums[model.uid] = model.min_available
                counts = served.setdefault(model.uid, {})
                if not self._book.draining(replica.uid) and self._served(model, replica).ready:
                    host = host_name(*where)
                    counts[host] = counts.get(host, 0) + 1
        for uid in self._ledger.by_namespace.get(namespace, ()):
            other = self._ledger.models.get(uid)
            if other is not None and other.min_available and uid not in minimums:
                minimums[uid] = other.min_available  # no replica charged: none ready
                served[uid] = {}
        ready = sum(
            1
            for host in self._there(namespace).values()
            if not (host.get("metadata") or {}).get("deletionTimestamp") and _ready(host)
        )
        kept = self._ledger.model_budgets
        for uid in [u for u, b in kept.items() if b.namespace == namespace and u not in minimums]:
            del kept[uid]
        for uid, least in minimums.items():
            name = self._ledger.models[uid].name if uid in self._ledger.models else uid
            allowed = sum(served[uid].values()) - least
            kept[uid] = Budget(namespace, f"tritonmodel/{name}", NOTHING, allowed, model_uid=uid)
        minimum = min_available(ready, [(served[uid], minimums[uid]) for uid in minimums])
        key = f"{namespace}/{BUDGET_NAME}"
        if minimum is None:
            if self._budgets.pop(namespace, None) is not None or key in self._ledger.budgets:
                await self._call(self._kube.delete_budget, namespace, BUDGET_NAME)
            return
        if self._budgets.get(namespace) != minimum:
            body = budget(namespace, host_label(self._keys), minimum)
            await self._call(self._kube.put_budget, body)
            self._budgets[namespace] = minimum

    def _listed(self, there_now: Mapping[Where, JsonObject]) -> dict[str, Where]:
        """Replica uid -> the host that lists it now (one being deleted too, until it is
        gone: the agent acts for its replicas while its proxy drains; but not one evicted from
        a lost node, `node_lost`: nothing acts there, and it is gone only once the node is
        back)."""
        listed: dict[str, Where] = {}
        key = hosted_models_annotation(self._keys)
        for where, host in there_now.items():
            meta = host.get("metadata") or {}
            if meta.get("deletionTimestamp") and node_lost(self._ledger, where[0]):
                continue
            try:
                entries = decode_hosted(str((meta.get("annotations") or {}).get(key) or ""))
            except HostedError:
                continue  # not the binder's writing: rewritten below
            listed.update((entry.replica_uid, where) for entry in entries)
        return listed

    async def _write(self, namespace: str, there: JsonObject, body: JsonObject) -> None:
        """Patch the host `there` to the labels, replicas, parks and owners of `body` (the
        host the binder would create now), when any differ: one write."""
        meta = there.get("metadata") or {}
        labels = meta.get("labels") or {}
        patch_labels: dict[str, Any] = dict(body["metadata"]["labels"])
        for key in labels:
            if key.startswith(f"{self._keys.prefix}serves-") and key not in patch_labels:
                patch_labels[key] = None
        # The template annotation is written at creation only: it says what made the host.
        annotations = {
            key: body["metadata"]["annotations"].get(key)
            for key in (
                hosted_models_annotation(self._keys),
                parked_models_annotation(self._keys),
            )
        }
        if (
            any(labels.get(k) != v for k, v in patch_labels.items())
            or any((meta.get("annotations") or {}).get(k) != v for k, v in annotations.items())
            or meta.get("ownerReferences") != body["metadata"]["ownerReferences"]
        ):
            # One write: a replica leaves its Service as it is marked draining.
            patch = {
                "metadata": {
                    "labels": patch_labels,
                    "annotations": annotations,
                    "ownerReferences": body["metadata"]["ownerReferences"],
                }
            }
            await self._call(self._kube.merge_patch_pod, namespace, str(meta["name"]), patch)

    async def _replace(self, namespace: str, node: str, there: JsonObject, why: str) -> None:
        """Delete the outdated host on `node`: its proxy drains as a model pod's does (out of
        its Services as it terminates), and the host is created anew once it is gone."""
        self._replacements.replacing(namespace, node, there, why)
        self.waiting.add(namespace)
        meta = there.get("metadata") or {}
        with contextlib.suppress(NotFoundError, ConflictError):
            await self._call(self._kube.delete_pod, namespace, str(meta["name"]), str(meta["uid"]))

    async def _host_refused(
        self,
        namespace: str,
        where: Where,
        replicas: Replicas,
        error: ApiError,
    ) -> None:
        """The API server refuses the host (403: a ResourceQuota on pods, CPU or memory, a
        policy; 422: a LimitRange): each model placed there gets a Warning Event with its words,
        once per message, and its Ready condition False with them; the namespace's hosts are
        tried again every RETRY_SECONDS."""
        self.waiting.add(namespace)
        node, secret = where
        message = f"the binder cannot create model host {host_name(node, secret)} on node "
        message += f"{node}: {error.message}"
        if self._book.refuse_host(namespace, where, message):
            for model, _, _ in replicas:
                self._changed(model.uid)  # its Ready condition says so
        for model in {model.uid: model for model, _, _ in replicas}.values():
            if self._host_refusals.get(model.uid) == message:
                continue
            self._host_refusals[model.uid] = message
            await self._call(
                self._kube.record_object_event,
                event_object(model),
                reason="FailedCreate",
                message=message,
                reporting_instance=self._identity,
            )

    def _host_accepted(self, namespace: str, where: Where, replicas: Replicas) -> None:
        """The host refused before is created: its models' conditions no longer say so."""
        if self._book.accept_host(namespace, where):
            for model, _, _ in replicas:
                self._host_refusals.pop(model.uid, None)
                self._changed(model.uid)

    def _host(self, namespace: str, where: Where, replicas: Replicas) -> JsonObject:
        """The host pod of `namespace` on node `where[0]` serving `replicas`, whose models fetch
        with the storage Secret `where[1]` (mounted): labelled to serve each model whose replica
        there is loaded (the agent's condition on the host) and not draining."""
        node, secret = where
        labels = {host_label(self._keys): "true"}
        owners: dict[str, JsonObject] = {}
        hosted = []
        for model, ordinal, replica in sorted(replicas, key=lambda r: (r[0].name, r[1])):
            draining = self._book.draining(replica.uid)
            if not draining and self._loaded(model, replica).ready:
                labels[serves_label(self._keys, model.name)] = self._serves_value(model, node)
            owners.setdefault(model.uid, owner_reference(model, controller=False))
            hosted.append(
                HostedReplica(
                    model=model.name,
                    model_id=replica.model_id,
                    uid=model.uid,
                    replica=ordinal,
                    gpu=replica.gpu_uuid,
                    residency=RESIDENCY_ON_DEMAND if replica.on_demand else RESIDENCY_ALWAYS,
                    proof=replica.placement,
                    storage_uri=self._uri(model, ordinal),
                    concurrency=model.concurrency,
                    idle_seconds=model.idle_seconds,
                    idempotent=model.idempotent,
                    draining=draining,
                    storage_secret=model.storage_secret,
                    storage_options=model.storage_options,
                )
            )
        annotations = {
            hosted_models_annotation(self._keys): encode_hosted(hosted),
            host_template_annotation(self._keys): self._template(node),
        }
        if secret:
            annotations[host_secret_annotation(self._keys)] = secret
        parked = self._parked_on(namespace, where)
        for model in parked:
            # The Service reaches the parked model's host, whose proxy holds its requests.
            labels[serves_label(self._keys, model.name)] = "true"
            owners.setdefault(model.uid, owner_reference(model, controller=False))
        if parked:
            annotations[parked_models_annotation(self._keys)] = encode_parked(
                Parked(m.name, m.template.model_id, m.concurrency) for m in parked
            )
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": host_name(node, secret),
                "namespace": namespace,
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": list(owners.values()),
            },
            "spec": host_spec(
                node,
                self._scheduler_name,
                self._host_image,
                self._access,
                self._keys,
                len(replicas),
                [secret] if secret else [],
            ),
        }

    def _template(self, node: str) -> str:
        """The template hash of this binder's hosts on `node` (computed once per node)."""
        found = self._templates.get(node)
        if found is None:
            found = self._templates[node] = template_hash(
                node, self._scheduler_name, self._host_image, self._access, self._keys
            )
        return found

    async def _call(self, fn: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))


def _ready(host: JsonObject) -> bool:
    """Whether the host pod is Ready (in its Services' endpoints)."""
    return any(
        isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in (host.get("status") or {}).get("conditions") or []
    )
