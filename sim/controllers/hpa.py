"""The simulated HorizontalPodAutoscaler controller, with KEDA's operator and metrics adapter.

Three roles of a real cluster, each acting only through the API (the official client), as one
loop that runs every `sync_period` (upstream's --horizontal-pod-autoscaler-sync-period, 15 s):

- **KEDA's operator**: every ScaledObject (keda.sh/v1alpha1) with a `prometheus` trigger gets the
  HPA KEDA makes for it (`keda-hpa-<name>`, owned by the ScaledObject): one External metric per
  trigger named `s<i>-prometheus`, selected by `scaledobject.keda.sh/name`, its target the
  trigger's `threshold` as an AverageValue (or a Value for `metricType: Value`), replicas from
  `minReplicaCount` (at least 1: KEDA itself, not the HPA, takes a target to zero) and
  `maxReplicaCount`, `behavior` from `advanced.horizontalPodAutoscalerConfig`.
- **KEDA's metrics adapter**: an External metric of such an HPA is read by running the trigger's
  `query` against Prometheus, as KEDA's prometheus scaler does: one series or a scalar gives its
  value, no series gives 0 (`ignoreNullValues`, KEDA's default), several are an error. The
  trigger's `serverAddress` names an in-cluster Service that does not exist here; the loop queries
  the Prometheus it is given instead.
- **The HPA controller**: each HPA's target (any kind whose discovery lists a `scale`
  subresource: a Deployment, a TritonModel) is read through its `/scale` subresource, the decision
  is `sim.controllers.autoscaling`'s, a change is written to `/scale` with a `SuccessfulRescale`
  Event, and the HPA's status (current and desired replicas, metrics, conditions, last scale
  time) through `/status`.

Differences from the real ones are listed in `sim.controllers.autoscaling` and docs/sim.md.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from common.conditions import condition_for, find
from sim.apiserver.clock import rfc3339
from sim.controllers.autoscaling import (
    Autoscaler,
    Decision,
    MetricSpec,
    Reading,
    SpecError,
    parse_spec,
)

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]
SCALED_OBJECT_LABEL = "scaledobject.keda.sh/name"
USER_AGENT = "tritonshare-sim-autoscaler"
SYNC_PERIOD_S = 15.0


def _json(response: Any) -> Any:
    return json.loads(response.data)


def hpa_for(scaled_object: JsonObject) -> JsonObject:
    """The HPA KEDA's operator makes for a ScaledObject; ValueError says what KEDA would refuse."""
    meta, spec = scaled_object["metadata"], scaled_object.get("spec") or {}
    name = meta["name"]
    target = spec.get("scaleTargetRef") or {}
    if not target.get("name"):
        raise ValueError("spec.scaleTargetRef.name is required")
    metrics = []
    for index, trigger in enumerate(spec.get("triggers") or ()):
        if trigger.get("type") != "prometheus":
            raise ValueError(f"trigger {index}: only prometheus triggers are simulated")
        metadata = trigger.get("metadata") or {}
        if not metadata.get("query") or not metadata.get("threshold"):
            raise ValueError(f"trigger {index}: metadata.query and metadata.threshold are required")
        kind = trigger.get("metricType") or "AverageValue"
        key = "averageValue" if kind == "AverageValue" else "value"
        metrics.append(
            {
                "type": "External",
                "external": {
                    "metric": {
                        "name": f"s{index}-prometheus",
                        "selector": {"matchLabels": {SCALED_OBJECT_LABEL: name}},
                    },
                    "target": {"type": kind, key: str(metadata["threshold"])},
                },
            }
        )
    if not metrics:
        raise ValueError("spec.triggers needs at least one trigger")
    hpa_spec: JsonObject = {
        "scaleTargetRef": {
            "apiVersion": target.get("apiVersion", "apps/v1"),
            "kind": target.get("kind", "Deployment"),
            "name": target["name"],
        },
        "minReplicas": max(1, int(spec.get("minReplicaCount", 0))),
        "maxReplicas": int(spec.get("maxReplicaCount", 100)),
        "metrics": metrics,
    }
    behavior = ((spec.get("advanced") or {}).get("horizontalPodAutoscalerConfig") or {}).get(
        "behavior"
    )
    if behavior is not None:
        hpa_spec["behavior"] = behavior
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {
            "name": f"keda-hpa-{name}",
            "namespace": meta["namespace"],
            "labels": {SCALED_OBJECT_LABEL: name},
            "ownerReferences": [
                {
                    "apiVersion": "keda.sh/v1alpha1",
                    "kind": "ScaledObject",
                    "name": name,
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": hpa_spec,
    }


class Prometheus:
    """Instant queries against a Prometheus HTTP API, read as KEDA's prometheus scaler reads."""

    def __init__(self, address: str, timeout: float = 5.0) -> None:
        self.base = address if "://" in address else f"http://{address}"
        if urllib.parse.urlsplit(self.base).scheme not in ("http", "https"):
            raise ValueError(f"Prometheus's address must be http(s)://HOST:PORT, not {address!r}")
        self.timeout = timeout

    def read(self, query: str) -> Reading:
        url = f"{self.base}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as response:  # noqa: S310 (http(s) checked)
                body = json.loads(response.read())
        except (OSError, ValueError) as e:
            return Reading(error=f"Prometheus at {self.base} did not answer: {e}")
        if body.get("status") != "success":
            return Reading(error=f"Prometheus refused the query: {body.get('error')}")
        data = body.get("data") or {}
        if data.get("resultType") == "scalar":
            return _number(data["result"][1])
        result = data.get("result") or []
        if not result:
            return Reading((0.0,))
        if len(result) > 1:
            return Reading(error=f"the query returned {len(result)} series; KEDA needs one")
        return _number(result[0]["value"][1])


def _number(text: str) -> Reading:
    value = float(text)
    if math.isnan(value) or math.isinf(value):
        return Reading(error=f"the query's value is {text}")
    return Reading((value,))


class Autoscalers:
    """KEDA's operator and metrics adapter and the HPA controller, as one loop (see the module)."""

    def __init__(
        self,
        api: client.ApiClient,
        prometheus: Prometheus,
        clock: Callable[[], float],
        sync_period: float = SYNC_PERIOD_S,
    ) -> None:
        self.api = api  # its own client: the user agent below is set on it
        self.api.user_agent = USER_AGENT
        self.prometheus = prometheus
        self.clock = clock
        self.sync_period = sync_period
        # Typed as Any: the client's models make every field Optional (see tests/fixtures_sim).
        self.custom: Any = client.CustomObjectsApi(api)
        self.core: Any = client.CoreV1Api(api)
        self._memory: dict[tuple[str, str], Autoscaler] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.syncs = 0
        """Completed passes, for tests that wait for the next one."""

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sim-autoscalers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> Autoscalers:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync_once()
            except Exception:  # the loop outlives one bad pass, as upstream's workers do
                log.exception("The simulated autoscaler's pass has failed; trying again")
            self._stop.wait(self.sync_period)

    def sync_once(self) -> None:
        """One pass: ScaledObjects into HPAs, then every HPA synced."""
        scaled = self._list("keda.sh", "v1alpha1", "scaledobjects")
        by_key = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in scaled}
        for obj in scaled:
            self._ensure_hpa(obj)
        for hpa in self._list("autoscaling", "v2", "horizontalpodautoscalers"):
            self._sync(hpa, by_key)
        self.syncs += 1

    def _list(self, group: str, version: str, plural: str) -> list[JsonObject]:
        body = self.custom.list_cluster_custom_object(group, version, plural)
        return list(body.get("items") or [])

    def _ensure_hpa(self, scaled_object: JsonObject) -> None:
        namespace = scaled_object["metadata"]["namespace"]
        try:
            wanted = hpa_for(scaled_object)
        except ValueError as e:
            log.warning(
                "ScaledObject %s/%s is not acted on: %s",
                namespace,
                scaled_object["metadata"]["name"],
                e,
            )
            return
        name = wanted["metadata"]["name"]
        try:
            current = self.custom.get_namespaced_custom_object(
                "autoscaling", "v2", namespace, "horizontalpodautoscalers", name
            )
        except ApiException as e:
            if e.status != 404:
                raise
            self.custom.create_namespaced_custom_object(
                "autoscaling", "v2", namespace, "horizontalpodautoscalers", wanted
            )
            return
        if current.get("spec") != wanted["spec"]:
            current["spec"] = wanted["spec"]
            self.custom.replace_namespaced_custom_object(
                "autoscaling", "v2", namespace, "horizontalpodautoscalers", name, current
            )

    def _reading(
        self, metric: MetricSpec, namespace: str, scaled: dict[tuple[str, str], JsonObject]
    ) -> Reading:
        labels = metric.selector.get("matchLabels") or {}
        owner = scaled.get((namespace, str(labels.get(SCALED_OBJECT_LABEL))))
        if owner is None or not metric.name.startswith("s"):
            return Reading(error=f"no ScaledObject serves external metric {metric.name}")
        index = int(metric.name[1:].split("-", 1)[0])
        triggers = (owner.get("spec") or {}).get("triggers") or []
        if index >= len(triggers):
            return Reading(error=f"ScaledObject has no trigger {index}")
        return self.prometheus.read(str(triggers[index]["metadata"]["query"]))

    def _sync(self, hpa: JsonObject, scaled: dict[tuple[str, str], JsonObject]) -> None:
        meta = hpa["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        target = hpa["spec"].get("scaleTargetRef") or {}
        try:
            spec = parse_spec(hpa["spec"])
        except SpecError as e:
            self._event(hpa, "Warning", "FailedComputeMetricsReplicas", str(e))
            return
        found = self._scale_target(target)
        if isinstance(found, str):
            self._event(hpa, "Warning", "FailedGetScale", found)
            return
        group, version, plural = found
        scale = self.custom.get_namespaced_custom_object_scale(
            group, version, namespace, plural, target["name"]
        )
        current = int(scale["spec"]["replicas"])
        ready = self._ready_pods(namespace, scale["status"].get("selector") or "")
        readings = [self._reading(m, namespace, scaled) for m in spec.metrics]
        memory = self._memory.setdefault((namespace, name), Autoscaler())
        now = self.clock()
        decision = memory.decide(spec, current, ready, readings, now)
        if decision.desired != current:
            self.custom.patch_namespaced_custom_object_scale(
                group,
                version,
                namespace,
                plural,
                target["name"],
                {"spec": {"replicas": decision.desired}},
            )
            self._event(
                hpa,
                "Normal",
                "SuccessfulRescale",
                f"New size: {decision.desired}; reason: {decision.reason}",
            )
            log.info(
                "HPA %s/%s scales %s from %d to %d replicas: %s",
                namespace,
                name,
                target["name"],
                current,
                decision.desired,
                decision.reason,
            )
        self._write_status(hpa, int(scale["status"]["replicas"]), decision, now)

    def _scale_target(self, target: JsonObject) -> tuple[str, str, str] | str:
        """(group, version, plural) of a scaleTargetRef that has a scale subresource, found
        through discovery as upstream's REST mapper finds it; or why there is none."""
        api_version, kind = str(target.get("apiVersion") or ""), str(target.get("kind") or "")
        group, _, version = api_version.rpartition("/")
        cannot = "the HPA controller was unable to get the target's current scale"
        if not group or not target.get("name"):
            return f"{cannot}: {kind} {api_version!r}: only targets of an API group are scaled here"
        resources = self._discover(api_version)
        plural = next(
            (
                str(r["name"])
                for r in resources
                if r.get("kind") == kind and "/" not in str(r.get("name"))
            ),
            None,
        )
        if plural is None:
            return f'{cannot}: no matches for kind "{kind}" in group "{group}"'
        if not any(r.get("name") == f"{plural}/scale" for r in resources):
            return f"{cannot}: {plural}.{group} has no scale subresource"
        return group, version, plural

    def _discover(self, api_version: str) -> list[JsonObject]:
        """The APIResourceList entries of a group/version (empty if it is not served)."""
        method, url, headers, _, _ = self.api.param_serialize(
            "GET",
            f"/apis/{api_version}",
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response: Any = self.api.call_api(method, url, headers)
        data = response.read()
        if response.status != 200 or not data:
            return []
        return list(json.loads(data).get("resources") or [])

    def _ready_pods(self, namespace: str, selector: str) -> int:
        pods = self.core.list_namespaced_pod(namespace, label_selector=selector)
        return sum(
            1
            for pod in pods.items
            if pod.metadata.deletion_timestamp is None
            and any(
                c.type == "Ready" and c.status == "True"
                for c in ((pod.status and pod.status.conditions) or ())
            )
        )

    def _write_status(
        self, hpa: JsonObject, status_replicas: int, decision: Decision, now: float
    ) -> None:
        meta = hpa["metadata"]
        old = hpa.get("status") or {}
        stamp = rfc3339(now)
        moment = datetime.fromtimestamp(int(now), UTC)
        conditions = [
            condition_for(c, find(old.get("conditions"), c.type), now=moment)
            for c in decision.conditions
        ]
        status: JsonObject = {
            "currentReplicas": status_replicas,
            "desiredReplicas": decision.desired,
            "conditions": conditions,
            "currentMetrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {"name": metric.name},
                        "current": {
                            ("averageValue" if metric.target_kind == "AverageValue" else "value"): (
                                f"{round(value * 1000)}m"
                            )
                        },
                    },
                }
                for metric, value in decision.metrics
                if value is not None
            ],
        }
        if decision.reason:
            status["lastScaleTime"] = stamp
        elif old.get("lastScaleTime"):
            status["lastScaleTime"] = old["lastScaleTime"]
        self.custom.patch_namespaced_custom_object_status(
            "autoscaling",
            "v2",
            meta["namespace"],
            "horizontalpodautoscalers",
            meta["name"],
            {"status": status},
        )

    def _event(self, hpa: JsonObject, kind: str, reason: str, message: str) -> None:
        meta = hpa["metadata"]
        stamp = rfc3339(self.clock())
        body = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": kind,
            "reason": reason,
            "message": message,
            "source": {"component": "horizontal-pod-autoscaler"},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            self.core.create_namespaced_event(meta["namespace"], body)
        except ApiException as e:
            log.warning("Could not record the event %s on HPA %s: %s", reason, meta["name"], e)
