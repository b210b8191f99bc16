"""A Deployment of model pods at `autoscaling.knative.dev/min-scale: "0"`, scaled by the binder's
built-in autoscaler, on the simulated cluster with the real processes (one real node): its pods
are `on-demand` with a three-second idle time, written in the short form. A 6 s window without a
request leaves it one pod, Ready behind its Service, whose model the agent has unloaded (the
pod's ModelLoaded condition reads ModelSleeping) rather than no pod and no endpoint; a REST and
a gRPC request sent 5 s later through the Service's endpoint wake the model and are answered
within 5 s."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar, cast

import kubernetes.client
import pytest

from common.contract import Keys
from common.tritonname import private_triton_name
from sim.cluster import SimCluster
from sim.demo.rollout import deployment_manifest
from sim.demo.scenario import MODELS_DIR
from sim.processes import wait_until
from sim.service import Endpoints
from tests.e2e.test_on_demand import NAMESPACE, _condition_reason, _grpc, _raw_infer, cluster
from tests.e2e.test_short_form import _loaded

__all__ = ["cluster"]  # one real node and the namespace, as the on-demand test's
KEYS = Keys()
KNATIVE = "autoscaling.knative.dev/"
NAME = "add-one"
MODEL_ID = "add_one"
"""The id its clients call (the on-demand test's clients' one)."""
WINDOW = 6.0
LATER = 5.0
"""Seconds after the idle window that the request is sent."""
ANSWERED_WITHIN = 5.0
T = TypeVar("T")


def manifest(uri: str) -> dict[str, Any]:
    body = deployment_manifest(uri, name=NAME)
    body["metadata"]["annotations"] = {
        f"{KNATIVE}target": "1",
        f"{KNATIVE}min-scale": "0",
        f"{KNATIVE}max-scale": "1",
        f"{KNATIVE}window": f"{WINDOW:g}s",
    }
    body["spec"]["template"]["metadata"]["annotations"] |= {
        KEYS.model_id: MODEL_ID,
        KEYS.residency: "on-demand",
        f"{KEYS.prefix}idle-seconds": "3",
    }
    return body


def said(core: Any) -> str:
    """The Deployment's Events, for a failure's message."""
    events = core.list_namespaced_event(
        NAMESPACE, field_selector=f"involvedObject.kind=Deployment,involvedObject.name={NAME}"
    ).items
    return "; ".join(f"{e.reason}: {e.message}" for e in events)


def one_ready_pod(apps: Any, core: Any) -> Any:
    """The Deployment's one pod once it is Ready (None before); fails at once when the
    Deployment is asked for another count."""
    replicas = apps.read_namespaced_deployment(NAME, NAMESPACE).spec.replicas
    assert replicas == 1, f"{NAME} was scaled to {replicas} pods. Its Events: {said(core)}"
    pods = [
        pod
        for pod in core.list_namespaced_pod(NAMESPACE, label_selector=f"app={NAME}").items
        if pod.metadata.deletion_timestamp is None
    ]
    ready = [
        pod
        for pod in pods
        if any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
    ]
    return ready[0] if len(pods) == 1 and ready else None


def timed(call: Callable[[], T]) -> tuple[T, float]:
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


@pytest.mark.slow
@pytest.mark.triton
def test_a_deployment_at_min_scale_0_keeps_one_sleeping_pod_that_answers_through_its_service(
    cluster: SimCluster,
) -> None:
    assert cluster.model_store is not None and cluster.kube is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    apps = cast(Any, kubernetes.client.AppsV1Api(cluster.kube))
    uri = cluster.model_store.publish(MODEL_ID, MODELS_DIR / "add_one")
    apps.create_namespaced_deployment(NAMESPACE, manifest(uri))
    pod = wait_until(
        f"a Ready pod of {NAME}", partial(one_ready_pod, apps, core), 150, partial(said, core)
    )
    name, address = pod.metadata.name, pod.status.pod_ip
    private = private_triton_name(NAMESPACE, MODEL_ID, pod.metadata.uid)

    with Endpoints(cluster.kube, NAMESPACE, f"app={NAME}") as service:
        # Idle: the agent unloads the model and says so on the pod, which stays.
        wait_until(
            "its model asleep",
            lambda: one_ready_pod(apps, core) and _condition_reason(core, name) == "ModelSleeping",
            60,
            partial(said, core),
        )
        # A whole window more without a request, then 5 s: the autoscaler would have asked
        # for zero pods by then. The pod stays, Ready, throughout.
        send_at = time.monotonic() + WINDOW + LATER
        while time.monotonic() < send_at:
            kept = one_ready_pod(apps, core)
            assert kept is not None and kept.metadata.name == name, f"{name} not Ready"
            time.sleep(0.5)
        assert _condition_reason(core, name) == "ModelSleeping"
        assert private not in _loaded(cluster), "its GPU memory freed while idle"
        assert service.addresses() == [address]
        assert f"{KNATIVE}min-scale 0 on a Deployment of model pods keeps one pod" in said(core)

        with ThreadPoolExecutor(2) as pool:
            rest = pool.submit(timed, partial(_raw_infer, str(service.pick()), MODEL_ID))
            grpc = pool.submit(timed, partial(_grpc, str(service.pick())))
            (status, _, body), rest_seconds = rest.result()
            answer, grpc_seconds = grpc.result()
    print(f"from a sleeping pod: REST {rest_seconds:.2f} s, gRPC {grpc_seconds:.2f} s")
    assert status == 200, body
    assert answer == [[2.0, 3.0, 4.0]]
    assert rest_seconds < ANSWERED_WITHIN and grpc_seconds < ANSWERED_WITHIN
    assert private in _loaded(cluster)
    assert apps.read_namespaced_deployment(NAME, NAMESPACE).spec.replicas == 1
