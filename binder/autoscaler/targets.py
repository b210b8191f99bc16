"""What the built-in autoscaler scales, as `Target`s: TritonModels with spec.autoscaling (from the
ledger, their hosts as sources) and Deployments of model pods with Knative's
`autoscaling.knative.dev/target` annotation (from this module's own index of Deployments, HPAs
and each Deployment's own running pods, fed by informers), each with the proxies to read and
who owns its `scale`. A source is read only for the models it serves: a host for its
namespace's replicas placed (or parked) on it, a Deployment's model pod (placed by the binder,
its proof verified) for its own model id.

A TritonModel is kept at one replica or more until its current files have loaded once, or failed
to (`first_load_pending`, as Knative keeps a new revision at its initial scale until it is ready
once): a model at `minReplicas: 0` is Ready before it first reaches zero, and one whose files
cannot load says so rather than reading Ready at zero.

A Deployment of model pods is never scaled below one pod (`deployment_floor`): with none, its
Service has no endpoint and its next request nothing to wait on. At min-scale 0 its zero is one
pod whose model sleeps while idle (residency on-demand, read from its pod template); for pods
that keep their model loaded, min-scale 0 is refused.

It converts API objects once, where they enter; it does no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from binder.autoscaler.kpa import (
    KNATIVE,
    Scaling,
    ScalingError,
    scaling_from,
    scaling_from_annotations,
)
from binder.autoscaler.parkedmodels import parked_on
from binder.cluster.modelviews import ModelInfo
from common.contract import RESIDENCY_ALWAYS, RESIDENCY_ON_DEMAND, Keys

KEDA_LABEL = "scaledobject.keda.sh/name"
TEMPLATE_HASH_LABEL = "pod-template-hash"
INVALID_SETTINGS = "InvalidSettings"
DEFAULT_KEYS = Keys()
JsonObject = dict[str, Any]
Owner = tuple[str, str]
"""(reason, message) of another autoscaler that owns an object's `scale`."""


@dataclass(frozen=True)
class Target:
    """One object the autoscaler may scale."""

    uid: str
    kind: str
    """TritonModel or Deployment."""
    namespace: str
    name: str
    generation: int
    replicas: int
    ready: int
    scaling: Scaling | None
    problem: str = ""
    """Why its settings cannot be acted on ("" when they can)."""
    reason: str = INVALID_SETTINGS
    """The reason reported with `problem`."""
    note: str = ""
    """What the report adds to the description of its settings ("" for nothing)."""
    sources: tuple[tuple[str, str, str], ...] = ()
    """(source, address, model): the proxies to read and the model id (the one its clients
    send, spec.modelName) whose counts count there: a source answers only for its own
    models."""
    status: Mapping[str, Any] = field(default_factory=dict)
    """A TritonModel's status as the cache has it (its conditions)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def hpa_owner(hpa: Mapping[str, Any]) -> tuple[tuple[str, str, str, str], str, str] | None:
    """((namespace, API group, kind, name) of the HPA's target, reason, message); None for an
    HPA without a target."""
    meta, spec = hpa.get("metadata") or {}, hpa.get("spec") or {}
    target = spec.get("scaleTargetRef") or {}
    if not target.get("name") or not target.get("kind"):
        return None
    group = str(target.get("apiVersion") or "").rpartition("/")[0]
    key = (str(meta.get("namespace", "")), group, str(target["kind"]), str(target["name"]))
    scaled_object = (meta.get("labels") or {}).get(KEDA_LABEL)
    if scaled_object:
        return key, "KEDAScaledObject", f"KEDA ScaledObject {scaled_object} scales it"
    return key, "HorizontalPodAutoscaler", f"HorizontalPodAutoscaler {meta.get('name')} scales it"


def model_target(
    model: ModelInfo, hosts: Mapping[str, JsonObject], keys: Keys = DEFAULT_KEYS
) -> Target | None:
    """A TritonModel with spec.autoscaling (`hosts`: its namespace's host pods by node); None
    without it. A host its model is parked on (`binder.autoscaler.parkedmodels`, at zero replicas)
    is a source too: the requests it holds are the model's demand, which scales it up and keeps it
    up."""
    if model.autoscaling is None:
        return None
    scaling, problem = None, ""
    try:
        scaling = scaling_from(model.autoscaling)
    except ScalingError as e:
        problem = f"spec.autoscaling: {e}"
    note = ""
    if scaling is not None and scaling.min_replicas == 0 and first_load_pending(model):
        scaling = replace(scaling, min_replicas=1)
        note = "kept at one replica until its files have loaded once"
    sources = list(host_sources(model, hosts))
    model_id = model.template.model_id  # the hosts count requests by the id clients send
    ready = model.status.get("readyReplicas")
    if not ready:  # parked only while no replica is served: the annotation read then alone
        placed = {node for node, _, _ in model.placed.values()}
        for node, host in sorted(hosts.items()):
            address = _address(host)
            if address and node not in placed and model.name in parked_on(host, keys):
                sources.append((node, address, model_id))
    return Target(
        uid=model.uid,
        kind="TritonModel",
        namespace=model.namespace,
        name=model.name,
        generation=model.generation,
        replicas=model.replicas,
        ready=ready if isinstance(ready, int) else 0,
        scaling=scaling,
        problem=problem,
        note=note,
        sources=tuple(sources),
        status=model.status,
    )


def first_load_pending(model: ModelInfo) -> bool:
    """Whether no replica of the model's current files has been ready, nor failed to load
    (its status's `loadedStorageUri` and `failedStorageUri`, the model controller's)."""
    status = model.status
    uri = model.storage_uri
    return status.get("loadedStorageUri") != uri and status.get("failedStorageUri") != uri


def host_sources(
    model: ModelInfo, hosts: Mapping[str, JsonObject]
) -> Iterator[tuple[str, str, str]]:
    """(node, address, model id) of each host with a replica of `model` placed, once a node:
    the hosts count requests by the id clients send."""
    for node in sorted({node for node, _, _ in model.placed.values()}):
        address = _address(hosts.get(node))
        if address:
            yield node, address, model.template.model_id


def _address(pod: Mapping[str, Any] | None) -> str:
    return str(((pod or {}).get("status") or {}).get("podIP") or "")


KEEPS_ONE_POD = (
    f"{KNATIVE}min-scale 0 on a Deployment of model pods keeps one pod: its model is unloaded "
    "while idle (residency on-demand) and its next request wakes it"
)


def deployment_floor(scaling: Scaling, residency: str, residency_key: str) -> tuple[Scaling, str]:
    """A Deployment's settings as the autoscaler acts on them, and what its report adds to
    them. At min-scale 0 its pods' `residency` (the pod template's `residency_key` annotation)
    decides: on-demand, one pod is kept, whose model is unloaded while idle and whose proxy
    holds the next request while it wakes; any other, ScalingError saying what to do."""
    if scaling.min_replicas > 0:
        return scaling, ""
    if residency == RESIDENCY_ON_DEMAND:
        return replace(scaling, min_replicas=1), KEEPS_ONE_POD
    raise ScalingError(
        f"{KNATIVE}min-scale 0 would leave a Deployment of model pods no pod, its Service no "
        "endpoint and its next request nothing to wait on; its pods keep their model loaded "
        f"(residency {residency or RESIDENCY_ALWAYS}), holding its GPU memory all the time: set "
        f"residency on-demand on its pods ({residency_key}: {RESIDENCY_ON_DEMAND} in its pod "
        "template: the last pod stays and frees its GPU memory while idle), or use a "
        "TritonModel with minReplicas 0"
    )


@dataclass(frozen=True)
class _Deployment:
    uid: str
    namespace: str
    name: str
    generation: int
    replicas: int
    ready: int
    annotations: Mapping[str, str]
    residency: str
    """Its pod template's residency annotation ("" without one)."""


@dataclass(frozen=True)
class _OwnPod:
    """A running pod of a Deployment (through its ReplicaSet)."""

    name: str
    address: str
    model_id: str
    """Its model id annotation ("" for a pod that is no model pod)."""


NOT_MODEL_PODS = "NotModelPods"
"""Report reason: a Deployment whose own pods are not all model pods the binder placed."""


def deployment_of(meta: Mapping[str, Any]) -> str:
    """The name of the Deployment whose ReplicaSet controls a pod ("" for none): the
    ReplicaSet's name is the Deployment's and the pod's `pod-template-hash` label, as the
    Deployment controller names it."""
    template_hash = str((meta.get("labels") or {}).get(TEMPLATE_HASH_LABEL) or "")
    if not template_hash:
        return ""
    for owner in meta.get("ownerReferences") or []:
        if not isinstance(owner, Mapping) or not owner.get("controller"):
            continue
        name = str(owner.get("name") or "")
        if owner.get("kind") == "ReplicaSet" and name.endswith(f"-{template_hash}"):
            return name[: -len(template_hash) - 1]
    return ""


class Index:
    """The HPAs' targets, annotated Deployments and their running pods' addresses, kept from
    watch events (`apply_*`, `replace_*`) on the loop."""

    def __init__(self, keys: Keys) -> None:
        self._model_id_key = keys.model_id
        self._residency_key = keys.residency
        self.owners: dict[tuple[str, str, str, str], Owner] = {}
        self._by_hpa: dict[str, tuple[str, str, str, str]] = {}
        self.deployments: dict[str, _Deployment] = {}
        self._pods: dict[tuple[str, str], dict[str, _OwnPod]] = {}
        """(namespace, Deployment) -> pod uid -> the pod, for its running pods only: a
        Deployment finds its own pods in O(its pods), whatever else its namespace runs."""
        self._pod_keys: dict[str, tuple[str, str]] = {}
        """Pod uid -> its key in `_pods`."""
        self.listed: set[str] = set()
        """The kinds listed at least once."""

    def owner(self, namespace: str, group: str, kind: str, name: str) -> Owner | None:
        return self.owners.get((namespace, group, kind, name))

    # ---- HPAs ----

    def replace_hpas(self, items: list[JsonObject]) -> None:
        self.owners.clear()
        self._by_hpa.clear()
        for item in items:
            self.apply_hpa("ADDED", item)
        self.listed.add("horizontalpodautoscalers")

    def apply_hpa(self, event: str, obj: JsonObject) -> None:
        uid = str((obj.get("metadata") or {}).get("uid", ""))
        old = self._by_hpa.pop(uid, None)
        if old is not None:
            self.owners.pop(old, None)
        found = hpa_owner(obj)
        if event != "DELETED" and found is not None:
            key, reason, message = found
            self.owners[key] = (reason, message)
            self._by_hpa[uid] = key

    # ---- Deployments ----

    def replace_deployments(self, items: list[JsonObject]) -> None:
        self.deployments.clear()
        for item in items:
            self.apply_deployment("ADDED", item)
        self.listed.add("deployments")

    def apply_deployment(self, event: str, obj: JsonObject) -> None:
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        annotations = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
        if event == "DELETED" or not any(
            k.startswith("autoscaling.knative.dev/") for k in annotations
        ):
            self.deployments.pop(uid, None)
            return
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        replicas = spec.get("replicas", 1)
        template = (spec.get("template") or {}).get("metadata") or {}
        residency = (template.get("annotations") or {}).get(self._residency_key)
        self.deployments[uid] = _Deployment(
            uid=uid,
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            generation=int(meta.get("generation") or 0),
            replicas=replicas if isinstance(replicas, int) else 1,
            ready=int(status.get("readyReplicas") or 0),
            annotations=annotations,
            residency=residency if isinstance(residency, str) else "",
        )

    # ---- Deployments' pods ----

    def replace_pods(self, items: list[JsonObject]) -> None:
        self._pods.clear()
        self._pod_keys.clear()
        for item in items:
            self.apply_pod("ADDED", item)

    def apply_pod(self, event: str, obj: JsonObject) -> None:
        meta, status = obj.get("metadata") or {}, obj.get("status") or {}
        uid = str(meta.get("uid", ""))
        old = self._pod_keys.pop(uid, None)
        if old is not None:
            pods = self._pods[old]
            del pods[uid]
            if not pods:
                del self._pods[old]
        address = str(status.get("podIP") or "")
        deployment = deployment_of(meta)
        if (
            event == "DELETED"
            or not deployment
            or not address
            or meta.get("deletionTimestamp")
            or status.get("phase") != "Running"
        ):
            return
        key = (str(meta.get("namespace", "")), deployment)
        model_id = (meta.get("annotations") or {}).get(self._model_id_key)
        self._pods.setdefault(key, {})[uid] = _OwnPod(
            name=str(meta.get("name", "")),
            address=address,
            model_id=model_id if isinstance(model_id, str) else "",
        )
        self._pod_keys[uid] = key

    def deployment_targets(self, placed: Callable[[str], bool]) -> Iterator[Target]:
        """The annotated Deployments; each reads its own running pods (`placed`: whether the
        binder placed the pod of a uid, its proof verified), each for its own model id only.
        One whose own pods are not all model pods the binder placed is not scaled: such a pod
        may answer for anything. None is scaled below one pod (`deployment_floor`)."""
        for deployment in list(self.deployments.values()):
            scaling, problem, reason, note = None, "", INVALID_SETTINGS, ""
            try:
                scaling = scaling_from_annotations(deployment.annotations)
                if scaling is not None:
                    scaling, note = deployment_floor(
                        scaling, deployment.residency, self._residency_key
                    )
            except ScalingError as e:
                scaling, problem = None, str(e)
            if scaling is None and not problem:
                continue  # Knative keys without a target: not ours
            pods = self._pods.get((deployment.namespace, deployment.name)) or {}
            foreign = sorted(
                pod.name for uid, pod in pods.items() if not pod.model_id or not placed(uid)
            )
            if foreign and scaling is not None:
                scaling, reason = None, NOT_MODEL_PODS
                problem = (
                    f"its pod {deployment.namespace}/{foreign[0]}"
                    + (f" and {len(foreign) - 1} more" if len(foreign) > 1 else "")
                    + " is not a model pod placed by the tritonshare binder (no model id, or no "
                    "proof of placement), so its counts cannot be believed; the built-in "
                    "autoscaler scales only Deployments of model pods"
                )
            sources = tuple(
                (uid, pod.address, pod.model_id)
                for uid, pod in sorted(pods.items())
                if pod.model_id
            )
            yield Target(
                uid=deployment.uid,
                kind="Deployment",
                namespace=deployment.namespace,
                name=deployment.name,
                generation=deployment.generation,
                replicas=deployment.replicas,
                ready=deployment.ready,
                scaling=scaling,
                problem=problem,
                reason=reason,
                note=note,
                sources=sources if scaling is not None else (),
            )
