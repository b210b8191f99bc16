"""A neighbour scaling on a shared host on the simulated cluster with the real processes (one real
node of four T4s): a steady TritonModel answers every request through its Service while another
TritonModel of its namespace, on the same host pod, scales 0 -> 4 -> 0 replicas.

The steady model's clients keep their connections through its Service (REST keep-alive and a
gRPC channel, as the churn benchmark's do), one request after another, from before the neighbour
is scaled up until after its replicas are drained and unloaded from the node's Triton. A request
fails on an answer other than 200 (gRPC: OK), a connection error or no answer in time. The bar
is that a change pays for itself: none fails, and each phase of the change saw requests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any, cast

import kubernetes.client
import pytest

from common.hosted import host_name, serves_label
from sim.cluster import SimCluster
from sim.demo.scenario import MODELS_DIR
from sim.processes import wait_until
from sim.service import ServiceProxy
from tests.e2e.callers import Client, Request
from tests.e2e.test_node_pod_drain import _create, _listening, _ready, _start
from tests.e2e.test_tritonmodel_one_node import NAMESPACE, NODE, _loaded, cluster
from tests.e2e.test_tritonmodel_two_nodes import GROUP, KEYS, MODEL, PLURAL, VERSION

__all__ = ["cluster"]  # one real node of four T4s and the namespace, as the one-node test's
NEIGHBOUR = "neighbour"
SCALED = 4
ANSWERS_PER_PHASE = 10
"""The fewest answers each client must get in each phase: the test cannot pass without load."""


def _status(custom: Any, model: str) -> dict[str, Any]:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, model)
    found: dict[str, Any] = obj.get("status") or {}
    return found


def _hosts(core: Any) -> list[Any]:
    selector = f"{KEYS.prefix}model-host=true"
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def _replicas_loaded(cluster: SimCluster, model: str) -> set[str]:
    """The private names of `model`'s replicas loaded in the node's Triton."""
    return {n for n in _loaded(cluster.tritons[NODE.name]) if n.startswith(f"{model}-")}


def _answered(requests: list[Request], protocol: str, since: float, until: float) -> int:
    return sum(r.ok for r in list(requests) if r.protocol == protocol and since <= r.start < until)


def _answered_since(requests: list[Request], since: float, count: int) -> bool:
    """Whether each protocol has had `count` answers that started after `since`."""
    return all(_answered(requests, p, since, float("inf")) >= count for p in ("rest", "grpc"))


def _scale(custom: Any, replicas: int) -> None:
    patch = {"spec": {"replicas": replicas}}
    custom.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, NEIGHBOUR, patch)


def _said(custom: Any, model: str) -> Callable[[], str]:
    return lambda: f"{model}'s status: {_status(custom, model)}"


@pytest.mark.slow
@pytest.mark.triton
def test_a_steady_model_answers_every_request_while_a_neighbour_on_its_host_scales_0_4_0(
    cluster: SimCluster,
) -> None:
    assert cluster.model_store is not None and cluster.kube is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    _create(custom, cluster.model_store.publish(MODEL, MODELS_DIR / "add_one"), MODEL, 1)
    neighbour_uri = cluster.model_store.publish(NEIGHBOUR, MODELS_DIR / "add_one")
    _create(custom, neighbour_uri, NEIGHBOUR, 0)
    wait_until("the steady model ready", lambda: _ready(custom) == 1, 150, _said(custom, MODEL))
    [host] = _hosts(core)
    assert host.metadata.name == host_name(NODE.name)
    assert [p["host"] for p in _status(custom, MODEL)["placements"]] == [host.metadata.name]

    address = core.read_namespaced_service(MODEL, NAMESPACE).spec.cluster_ip
    services = ServiceProxy(cluster.kube, period=0.2)
    services.start()
    requests: list[Request] = []
    clients = [Client(MODEL, protocol, address, requests) for protocol in ("rest", "grpc")]
    try:
        wait_until("the Service listening", lambda: _listening(address), 30)
        _start(clients)
        began = time.monotonic()
        wait_until("answers before the change", partial(_answered_since, requests, began, 20), 30)

        # 0 -> 4: the neighbour's replicas join the steady model's host, on its node.
        up = time.monotonic()
        _scale(custom, SCALED)
        wait_until(
            f"{SCALED} neighbour replicas ready",
            lambda: _ready(custom, NEIGHBOUR) == SCALED,
            120,
            _said(custom, NEIGHBOUR),
        )
        at_four = time.monotonic()
        placements = _status(custom, NEIGHBOUR)["placements"]
        assert len(placements) == SCALED, placements
        assert {(p["node"], p["host"]) for p in placements} == {(NODE.name, host.metadata.name)}
        [shared] = _hosts(core)
        assert shared.metadata.uid == host.metadata.uid, "the steady model's host was replaced"
        assert shared.metadata.labels.get(serves_label(KEYS, NEIGHBOUR)) == "true"
        assert len(_replicas_loaded(cluster, NEIGHBOUR)) == SCALED
        wait_until("answers at 4", partial(_answered_since, requests, at_four, 20), 30)

        # 4 -> 0: its replicas drain from the host and are unloaded from Triton.
        down = time.monotonic()
        _scale(custom, 0)
        wait_until(
            "no neighbour replica placed",
            lambda: not _status(custom, NEIGHBOUR).get("placements"),
            120,
            _said(custom, NEIGHBOUR),
        )
        wait_until(
            "the neighbour's replicas unloaded",
            lambda: not _replicas_loaded(cluster, NEIGHBOUR),
            60,
            lambda: f"still loaded: {sorted(_replicas_loaded(cluster, NEIGHBOUR))}",
        )
        at_zero = time.monotonic()
        wait_until("answers after it", partial(_answered_since, requests, at_zero, 20), 30)
        end = time.monotonic()
    finally:
        for client in clients:
            client.stop()
        services.stop()

    failed = [r for r in requests if not r.ok]
    assert failed == [], f"{len(failed)} of {len(requests)} failed, the first: {failed[:3]}"
    phases = {
        "at 0": (began, up),
        "scaling to 4": (up, at_four),
        "at 4": (at_four, down),
        "scaling to 0": (down, at_zero),
        "back at 0": (at_zero, end),
    }
    answered = {
        (phase, protocol): _answered(requests, protocol, since, until)
        for phase, (since, until) in phases.items()
        for protocol in ("rest", "grpc")
    }
    seconds = {phase: round(until - since, 1) for phase, (since, until) in phases.items()}
    print(f"answers by phase: {answered}; phase seconds: {seconds}")
    assert min(answered.values()) >= ANSWERS_PER_PHASE, (answered, seconds)
    # The steady model kept its one replica, on the same host, throughout.
    [after] = _hosts(core)
    assert after.metadata.uid == host.metadata.uid, "the steady model's host was replaced"
    assert len(_replicas_loaded(cluster, MODEL)) == 1
    assert _ready(custom) == 1
