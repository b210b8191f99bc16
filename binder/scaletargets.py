"""What the built-in autoscaler scales, as `Target`s: TritonModels with spec.autoscaling (from the
ledger, their hosts as sources) and Deployments of model pods with Knative's
`autoscaling.knative.dev/target` annotation (from this module's own index of Deployments, HPAs
and model pods, fed by informers), each with the proxies to read and who owns its `scale`.

It converts API objects once, where they enter; it does no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from binder.autoscaler import Scaling, ScalingError, scaling_from, scaling_from_annotations
from binder.model import ModelInfo
from binder.parking import parked_on
from binder.podterms import LabelSelector, selector_from_api
from common.contract import Keys

KEDA_LABEL = "scaledobject.keda.sh/name"
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
    sources: tuple[tuple[str, str, str], ...] = ()
    """(source, address, model): the proxies to read and the model id (the one its clients
    send, spec.modelName) whose counts count there ("" for every model of the answer: a model
    pod's)."""
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
    without it. A host its model is parked on (`binder.parking`, at zero replicas) is a source
    too: the requests it holds are the model's demand, which scales it up and keeps it up."""
    if model.autoscaling is None:
        return None
    scaling, problem = None, ""
    try:
        scaling = scaling_from(model.autoscaling)
    except ScalingError as e:
        problem = f"spec.autoscaling: {e}"
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
        sources=tuple(sources),
        status=model.status,
    )


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


@dataclass(frozen=True)
class _Deployment:
    uid: str
    namespace: str
    name: str
    generation: int
    replicas: int
    ready: int
    selector: LabelSelector
    annotations: Mapping[str, str]


class Index:
    """The HPAs' targets, annotated Deployments and model pods' addresses, kept from watch
    events (`apply_*`, `replace_*`) on the loop."""

    def __init__(self, model_id_key: str) -> None:
        self._model_id_key = model_id_key
        self.owners: dict[tuple[str, str, str, str], Owner] = {}
        self._by_hpa: dict[str, tuple[str, str, str, str]] = {}
        self.deployments: dict[str, _Deployment] = {}
        self._pods: dict[str, dict[str, tuple[Mapping[str, str], str]]] = {}
        """Namespace -> model pod uid -> (labels, address), for running model pods only."""
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
        self.deployments[uid] = _Deployment(
            uid=uid,
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            generation=int(meta.get("generation") or 0),
            replicas=replicas if isinstance(replicas, int) else 1,
            ready=int(status.get("readyReplicas") or 0),
            selector=selector_from_api(spec.get("selector")),
            annotations=annotations,
        )

    # ---- model pods ----

    def replace_pods(self, items: list[JsonObject]) -> None:
        self._pods.clear()
        for item in items:
            self.apply_pod("ADDED", item)

    def apply_pod(self, event: str, obj: JsonObject) -> None:
        meta, status = obj.get("metadata") or {}, obj.get("status") or {}
        namespace, uid = str(meta.get("namespace", "")), str(meta.get("uid", ""))
        pods = self._pods.get(namespace)
        address = str(status.get("podIP") or "")
        model_pod = self._model_id_key in (meta.get("annotations") or {})
        if (
            event == "DELETED"
            or not model_pod
            or not address
            or meta.get("deletionTimestamp")
            or status.get("phase") != "Running"
        ):
            if pods is not None and pods.pop(uid, None) is not None and not pods:
                del self._pods[namespace]
            return
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        self._pods.setdefault(namespace, {})[uid] = (labels, address)

    def deployment_targets(self) -> Iterator[Target]:
        for deployment in list(self.deployments.values()):
            scaling, problem = None, ""
            try:
                scaling = scaling_from_annotations(deployment.annotations)
            except ScalingError as e:
                problem = str(e)
            if scaling is None and not problem:
                continue  # Knative keys without a target: not ours
            pods = self._pods.get(deployment.namespace) or {}
            sources = tuple(
                (uid, address, "")
                for uid, (labels, address) in sorted(pods.items())
                if deployment.selector.matches(labels)
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
                sources=sources,
            )
