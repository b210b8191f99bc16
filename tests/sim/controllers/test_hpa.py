"""The simulated KEDA operator and HPA controller through the official client, with a real
Prometheus: a ScaledObject becomes KEDA's HPA, the trigger's PromQL is run against Prometheus, and
the Deployment is scaled through /scale with upstream's Events and status; the API server's clock
is moved forward past the scale-down window instead of waiting for it."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from sim.apiserver import RunningApiServer
from sim.controllers.hpa import Autoscalers, Prometheus, hpa_for
from sim.controllers.manager import ControllerManager
from sim.demo import autoscale
from sim.node.kubelet import HollowKubelet
from sim.processes import wait_until
from sim.triton import free_port
from tests.conftest import require_executable
from tests.deploy.rendering import chart_crds
from tests.fixtures_sim import apps_v1, core_v1

NS = "default"
QUERY = "sum(test_in_flight)"


class Exporter:
    """A scrape target whose in-flight gauge the test sets."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.gauge = Gauge("test_in_flight", "requests in flight", registry=self.registry)
        self.port = free_port()
        self.server, self.thread = start_http_server(self.port, "127.0.0.1", self.registry)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    running = Exporter()
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
def prometheus(exporter: Exporter, tmp_path: Path) -> Iterator[str]:
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps([{"targets": [f"127.0.0.1:{exporter.port}"]}]))
    with autoscale.prometheus(require_executable("prometheus"), tmp_path, targets, "1s") as at:
        yield at


def _value(prometheus: str) -> float | None:
    url = f"http://{prometheus}/api/v1/query?{urllib.parse.urlencode({'query': QUERY})}"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            result = json.loads(response.read())["data"]["result"]
    except OSError:
        return None
    return float(result[0]["value"][1]) if result else None


def seen(prometheus: str, value: float) -> None:
    wait_until(f"Prometheus reading {value}", lambda: _value(prometheus) == value, 60)


@pytest.fixture
def cluster(apiserver: RunningApiServer) -> Iterator[kubernetes.client.ApiClient]:
    api = apiserver.api_client()
    core_v1(api).create_node({"metadata": {"name": "auto"}})
    manager = ControllerManager(api, clock=apiserver.clock.now)
    manager.start()
    try:
        assert manager.wait_synced(10)
        with HollowKubelet(api, ["auto"]):
            yield api
    finally:
        manager.stop()
        api.close()  # type: ignore[no-untyped-call]


def deployment(name: str) -> Any:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"nodeName": "auto", "containers": [{"name": "c", "image": "x"}]},
            },
        },
    }


def scaled_object(name: str, **spec: Any) -> Any:
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "scaleTargetRef": {"name": name},
            "minReplicaCount": 1,
            "maxReplicaCount": 5,
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {
                        "serverAddress": "http://prometheus-operated.monitoring.svc:9090",
                        "query": QUERY,
                        "threshold": "1",
                    },
                }
            ],
            **spec,
        },
    }


def replicas(api: kubernetes.client.ApiClient, name: str) -> int:
    return int(apps_v1(api).read_namespaced_deployment_scale(name, NS).spec.replicas)


def events(api: kubernetes.client.ApiClient, hpa: str) -> list[str]:
    listed = core_v1(api).list_namespaced_event(NS, field_selector=f"involvedObject.name={hpa}")
    return [f"{e.reason}: {e.message}" for e in listed.items]


@pytest.mark.slow
def test_keda_scales_a_deployment_up_on_prometheus_and_down_after_the_window(
    apiserver: RunningApiServer,
    cluster: kubernetes.client.ApiClient,
    exporter: Exporter,
    prometheus: str,
) -> None:
    apps_v1(cluster).create_namespaced_deployment(NS, deployment("add-one"))
    custom: Any = kubernetes.client.CustomObjectsApi(cluster)
    custom.create_namespaced_custom_object(
        "keda.sh", "v1alpha1", NS, "scaledobjects", scaled_object("add-one")
    )
    autoscalers = Autoscalers(cluster, Prometheus(prometheus), apiserver.clock.now)

    exporter.gauge.set(5)
    seen(prometheus, 5.0)
    autoscalers.sync_once()
    hpa = custom.get_namespaced_custom_object(
        "autoscaling", "v2", NS, "horizontalpodautoscalers", "keda-hpa-add-one"
    )
    assert hpa["spec"]["metrics"][0]["external"]["target"] == {
        "type": "AverageValue",
        "averageValue": "1",
    }
    # No behavior in the ScaledObject: the older rules let 1 replica grow to max(2, 4) at once.
    assert replicas(cluster, "add-one") == 4
    assert events(cluster, "keda-hpa-add-one") == [
        "SuccessfulRescale: New size: 4; reason: external metric s0-prometheus above target"
    ]
    status = custom.get_namespaced_custom_object_status(
        "autoscaling", "v2", NS, "horizontalpodautoscalers", "keda-hpa-add-one"
    )["status"]
    assert status["desiredReplicas"] == 4
    limited = [c for c in status["conditions"] if c["type"] == "ScalingLimited"]
    assert limited[0]["reason"] == "ScaleUpLimit"

    apiserver.clock.advance(15)
    autoscalers.sync_once()
    assert replicas(cluster, "add-one") == 5

    exporter.gauge.set(0)
    seen(prometheus, 0.0)
    apiserver.clock.advance(15)
    autoscalers.sync_once()
    assert replicas(cluster, "add-one") == 5  # the 300 s window holds the recent 5
    apiserver.clock.advance(300)
    autoscalers.sync_once()
    assert replicas(cluster, "add-one") == 1
    assert "SuccessfulRescale: New size: 1; reason: All metrics below target" in events(
        cluster, "keda-hpa-add-one"
    )


@pytest.mark.slow
def test_an_unreachable_prometheus_scales_nothing_and_says_why(
    apiserver: RunningApiServer, cluster: kubernetes.client.ApiClient
) -> None:
    apps_v1(cluster).create_namespaced_deployment(NS, deployment("add-one"))
    custom: Any = kubernetes.client.CustomObjectsApi(cluster)
    custom.create_namespaced_custom_object(
        "keda.sh", "v1alpha1", NS, "scaledobjects", scaled_object("add-one")
    )
    nobody = f"127.0.0.1:{free_port()}"
    Autoscalers(cluster, Prometheus(nobody, timeout=2), apiserver.clock.now).sync_once()
    assert replicas(cluster, "add-one") == 1
    status = custom.get_namespaced_custom_object_status(
        "autoscaling", "v2", NS, "horizontalpodautoscalers", "keda-hpa-add-one"
    )["status"]
    active = next(c for c in status["conditions"] if c["type"] == "ScalingActive")
    assert (active["status"], active["reason"]) == ("False", "FailedGetExternalMetric")
    assert "did not answer" in active["message"]


def test_kedas_hpa_keeps_the_behavior_and_at_least_one_replica() -> None:
    obj = scaled_object(
        "m",
        minReplicaCount=0,
        advanced={"horizontalPodAutoscalerConfig": {"behavior": {"scaleDown": {}}}},
    )
    obj["metadata"]["uid"] = "u"
    hpa = hpa_for(obj)
    assert hpa["spec"]["minReplicas"] == 1
    assert hpa["spec"]["behavior"] == {"scaleDown": {}}
    assert hpa["metadata"]["ownerReferences"][0]["uid"] == "u"
    obj["spec"]["triggers"] = [{"type": "cpu", "metadata": {}}]
    with pytest.raises(ValueError, match="only prometheus triggers"):
        hpa_for(obj)


@pytest.mark.slow
def test_keda_scales_a_tritonmodel_through_its_scale_subresource(
    apiserver: RunningApiServer, exporter: Exporter, prometheus: str
) -> None:
    """Any target with a scale subresource is scaled: the chart's TritonModel, found through
    discovery, read and written through /scale (its spec.replicas by the CRD's paths)."""
    api = apiserver.api_client()
    try:
        extensions: Any = kubernetes.client.ApiextensionsV1Api(api)
        (crd,) = chart_crds()
        extensions.create_custom_resource_definition(crd)
        custom: Any = kubernetes.client.CustomObjectsApi(api)
        model = ("tritonshare.io", "v1alpha1", NS, "tritonmodels", "resnet")
        custom.create_namespaced_custom_object(
            *model[:4],
            {
                "apiVersion": "tritonshare.io/v1alpha1",
                "kind": "TritonModel",
                "metadata": {"name": "resnet"},
                "spec": {"storageUri": "s3://models/resnet", "gpuMemory": "1Gi"},
            },
        )
        target = {"apiVersion": "tritonshare.io/v1alpha1", "kind": "TritonModel", "name": "resnet"}
        so = scaled_object("resnet")
        so["spec"]["scaleTargetRef"] = target
        custom.create_namespaced_custom_object("keda.sh", "v1alpha1", NS, "scaledobjects", so)
        autoscalers = Autoscalers(api, Prometheus(prometheus), apiserver.clock.now)
        exporter.gauge.set(3)
        seen(prometheus, 3.0)
        autoscalers.sync_once()
        assert custom.get_namespaced_custom_object(*model)["spec"]["replicas"] == 3
        assert custom.get_namespaced_custom_object_scale(*model)["spec"]["replicas"] == 3
        assert events(api, "keda-hpa-resnet") == [
            "SuccessfulRescale: New size: 3; reason: external metric s0-prometheus above target"
        ]
        # A kind without a scale subresource is refused with the reason, and nothing scales.
        so = scaled_object("no-scale")
        so["spec"]["scaleTargetRef"] = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject"}
        so["spec"]["scaleTargetRef"]["name"] = "resnet"
        custom.create_namespaced_custom_object("keda.sh", "v1alpha1", NS, "scaledobjects", so)
        autoscalers.sync_once()
        assert events(api, "keda-hpa-no-scale") == [
            "FailedGetScale: the HPA controller was unable to get the target's current scale:"
            " scaledobjects.keda.sh has no scale subresource"
        ]
    finally:
        api.close()  # type: ignore[no-untyped-call]
