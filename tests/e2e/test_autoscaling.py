"""The binder's built-in autoscaler on the simulated cluster with the real processes (five real
nodes, each its own Triton, agent, gateway and kubelet): the seed's experiment (target
concurrency 1, five callers back to back) scales a TritonModel 1 -> 5 -> 1 through its `scale`
subresource with a 6 s stable window, and not one request fails, up or down. A TritonModel an
HPA targets keeps the built-in autoscaler off, and its `Autoscaling` condition says why."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import pytest

from sim.cluster import NodeSpec, SimCluster
from sim.demo import autoscale
from sim.demo.scenario import MODELS_DIR
from sim.processes import wait_until
from sim.triton import TritonInstall

NODES = tuple(NodeSpec(f"gpu-{i}", "1xT4", real=True) for i in range(5))
NAMESPACE = "team-a"
GROUP, VERSION, PLURAL = "tritonshare.io", "v1alpha1", "tritonmodels"
PINNED = "pinned"


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    # The test's model is Python (tenant code): the team is let run it.
    with SimCluster(
        tmp_path / "cluster", NODES, binders=1, webhook=True, tenant_code_namespaces=(NAMESPACE,)
    ) as running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


def _model(custom: Any, name: str) -> dict[str, Any]:
    found: dict[str, Any] = custom.get_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, name
    )
    return found


def _condition(custom: Any, name: str) -> dict[str, Any]:
    conditions = (_model(custom, name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Autoscaling"), {})


@pytest.mark.slow
@pytest.mark.triton
def test_the_builtin_autoscaler_scales_a_tritonmodel_1_5_1_and_yields_to_an_hpa(
    cluster: SimCluster, tmp_path: Path
) -> None:
    assert cluster.kube is not None and cluster.model_store is not None
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))

    # A model an HPA scales: at 0 replicas and minReplicas 2, the built-in autoscaler would
    # ask for 2 at once if it acted on it.
    uri = cluster.model_store.publish(PINNED, MODELS_DIR / "add_one")
    spec = {"storageUri": uri, "gpuMemory": "1Gi", "replicas": 0}
    spec["autoscaling"] = {"target": 1, "minReplicas": 2, "maxReplicas": 2}
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TritonModel"}
    custom.create_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, body | {"metadata": {"name": PINNED}, "spec": spec}
    )
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "pinned-hpa"},
        "spec": {
            "scaleTargetRef": {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TritonModel"}
            | {"name": PINNED},
            "minReplicas": 1,
            "maxReplicas": 2,
        },
    }
    custom.create_namespaced_custom_object(
        "autoscaling", "v2", NAMESPACE, "horizontalpodautoscalers", hpa
    )
    yielded = wait_until(
        "the pinned model's Autoscaling condition",
        lambda: (
            _condition(custom, PINNED).get("reason") == "HorizontalPodAutoscaler"
            and _condition(custom, PINNED)
        ),
        60,
    )
    assert yielded["status"] == "False"
    assert "HorizontalPodAutoscaler pinned-hpa scales it" in yielded["message"]

    result = autoscale.run(
        cluster,
        MODELS_DIR / "add_one",
        tmp_path / "run",
        NAMESPACE,
        None,
        clients=5,
        duration=15.0,
        max_replicas=5,
        window="6s",
        settle=0.0,
        deadline=120.0,
        target="tritonmodel",
    )
    assert result.peak_ready == 5, result.timeline
    assert result.failed == [] and result.requests > 0
    assert result.scaled_down_to == 1, result.timeline
    assert result.scale_down_failed == [] and result.scale_down_requests > 0
    asked = [replicas for _, replicas, _ in result.timeline]
    assert asked[0] == 1 and max(asked) == 5 and asked[-1] == 1, result.timeline
    events = core.list_namespaced_event(
        NAMESPACE, field_selector=f"involvedObject.name={autoscale.NAME}"
    ).items
    rescales = [e.message for e in events if e.reason == "SuccessfulRescale"]
    assert any(m.startswith("New size: 5;") for m in rescales), rescales
    assert any(m.startswith("New size: 1;") for m in rescales), rescales

    # The HPA's model was never scaled by the built-in autoscaler meanwhile.
    assert _model(custom, PINNED)["spec"]["replicas"] == 0
    assert _condition(custom, PINNED)["reason"] == "HorizontalPodAutoscaler"
