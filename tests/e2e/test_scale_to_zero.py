"""Scale to zero end to end on the simulated cluster with the real processes (one real node):
a TritonModel at `minReplicas: 0` is scaled to zero by the built-in autoscaler after its 6 s
window without a request, its replica unloaded, and its model host stays behind its Service,
the model parked there; its next request, sent through the Service's endpoint, waits on the
host, is counted as demand, scales the model to one and is answered, with no failure. The time
that first answer took is printed beside Triton's own load of the model. Requests past the
model's bound are answered 503 with Retry-After at once."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import numpy as np
import pytest
import tritonclient.http as httpclient

from binder.autoscaler.parkedmodels import parked_on
from common.contract import Keys
from common.hosted import loaded_condition, serves_label
from sim.cluster import SimCluster
from sim.demo.scenario import MODELS_DIR, NODES
from sim.processes import wait_until
from sim.service import Endpoints
from sim.triton import TritonInstall
from tests.e2e.test_tritonmodel_hosts import GROUP, PLURAL, VERSION, _host

NAMESPACE = "team-a"
MODEL = "add-one"
KEYS = Keys()
DATA = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
LOAD_METRIC = "tritonshare_agent_load_duration_seconds_sum"
UNLOADS = "tritonshare_agent_unload_duration_seconds_count"
BOUND = 10
"""The requests a parked model holds: its queue, 10 x maxConcurrency."""
BURST = BOUND + 3
BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
).encode()
# The agent's loaded condition of any replica of the model on a host.
LOADED = loaded_condition(KEYS, MODEL, 0).removesuffix("0")


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    with SimCluster(
        tmp_path / "cluster",
        [NODES[0]],
        binders=1,
        webhook=True,
        tenant_code_namespaces=(NAMESPACE,),
    ) as running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


def _model(custom: Any) -> dict[str, Any]:
    return cast(
        dict[str, Any],
        custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, MODEL),
    )


def infer(address: str, timeout: float = 60.0) -> list[float]:
    """[1, 2, 3] through REST at `address` (HTTP errors raised as tritonclient raises them)."""
    with httpclient.InferenceServerClient(
        f"{address}:9000", network_timeout=timeout, connection_timeout=timeout
    ) as http:
        tensor = httpclient.InferInput("INPUT0", list(DATA.shape), "FP32")
        tensor.set_data_from_numpy(DATA)
        answer: list[float] = http.infer(MODEL, [tensor]).as_numpy("OUTPUT0").reshape(-1).tolist()
        return answer


def post(address: str, started: float) -> tuple[int, str | None, float]:
    """One REST inference: its status, Retry-After and seconds since `started` when answered."""
    request = urllib.request.Request(
        f"http://{address}:9000/v2/models/{MODEL}/infer", data=BODY, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            assert json.loads(answer.read())["outputs"][0]["data"] == [2.0, 3.0, 4.0]
            return answer.status, None, time.monotonic() - started
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Retry-After"), time.monotonic() - started


def agent_metric(cluster: SimCluster, name: str) -> float:
    """A series of the node's agent without labels (0 while it has none)."""
    agent = cluster.agents[NODES[0].name]
    with urllib.request.urlopen(f"http://{agent.http}/metrics", timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def loaded_here(core: Any) -> bool:
    """Whether the agent's condition on the host says the model is loaded there."""
    host = _host(core, NAMESPACE)
    return host is not None and any(
        c.type.startswith(LOADED) and c.status == "True" for c in host.status.conditions or []
    )


def load_seconds(cluster: SimCluster) -> float:
    """The agent's total of Triton's model loads, seconds."""
    return agent_metric(cluster, LOAD_METRIC)


def scale_to_zero_model(uri: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TritonModel",
        "metadata": {"name": MODEL},
        "spec": {
            "storageUri": uri,
            "gpuMemory": "1Gi",
            "replicas": 1,
            "maxConcurrency": 1,
            "autoscaling": {"target": 1, "minReplicas": 0, "maxReplicas": 1, "window": "6s"},
        },
    }


@pytest.mark.slow
@pytest.mark.triton
def test_a_tritonmodel_scaled_to_zero_serves_its_next_request_through_its_service(
    cluster: SimCluster,
) -> None:
    assert cluster.model_store is not None and cluster.kube is not None
    kube = cluster.kube
    core = cast(Any, kubernetes.client.CoreV1Api(kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(kube))
    uri = cluster.model_store.publish(MODEL, MODELS_DIR / "add_one")
    custom.create_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, scale_to_zero_model(uri)
    )

    # No request for a whole window (its first load may not even be over): scaled to zero,
    # unloaded, parked on its host, which stays behind the Service.
    wait_until("scaled to zero", lambda: _model(custom)["spec"]["replicas"] == 0, 120)
    wait_until("no replica", lambda: not _model(custom).get("status", {}).get("replicas"), 60)
    wait_until("parked", lambda: parked_on(_host(core, NAMESPACE).to_dict(), KEYS) == [MODEL], 60)
    host = _host(core, NAMESPACE)
    assert host.metadata.labels[serves_label(KEYS, MODEL)] == "true"
    service = Endpoints(kube, NAMESPACE, f"{serves_label(KEYS, MODEL)}=true")
    with service:
        address = wait_until("the Service's endpoint", service.pick, 60)
        assert address == host.status.pod_ip
        # Its replica drains from the host, is unloaded, and the agent says so on the host.
        wait_until("unloaded", lambda: agent_metric(cluster, UNLOADS) >= 1, 90)
        wait_until("no longer loaded on the host", lambda: not loaded_here(core), 30)

        # The next requests wait on the host, wake the model and are answered; past the
        # model's bound (maxConcurrency 1: a queue of 10) a client gets 503 with Retry-After
        # at once, never a hang.
        before = load_seconds(cluster)
        started = time.monotonic()
        with ThreadPoolExecutor(BURST) as pool:
            answers = list(pool.map(lambda _: post(address, started), range(BURST)))
        load = load_seconds(cluster) - before
        served = sorted(at for status, _, at in answers if status == 200)
        refused = [(status, retry, at) for status, retry, at in answers if status != 200]
        # One may come as the model is served, and take its slot rather than wait.
        assert BOUND <= len(served) <= BOUND + 1, answers
        assert len(refused) >= BURST - BOUND - 1, answers
        assert {(s, r) for s, r, _ in refused} == {(503, "1")}, answers
        assert all(at < 2.0 for _, _, at in refused), "refused at once"
        first = served[0]
        print(
            f"first answer from zero {first:.2f} s = Triton's load {load:.2f} s + "
            f"{first - load:.2f} s"
        )
        assert load > 0, "the model was loaded again for them"
        assert _model(custom)["spec"]["replicas"] >= 1
        assert service.addresses() == [address]
        wait_until("unparked", lambda: parked_on(_host(core, NAMESPACE).to_dict(), KEYS) == [], 30)
        assert infer(address) == [2.0, 3.0, 4.0]


@pytest.mark.slow
@pytest.mark.triton
@pytest.mark.parametrize("after", [5.0, 7.0], ids=["5s", "7s"])
def test_a_request_while_the_last_replica_drains_takes_it_back_and_is_answered_at_once(
    cluster: SimCluster, after: float
) -> None:
    """A request a few seconds after the model reached zero, while its last replica drains
    (out of its host's models file, still loaded), is answered 200 within 5 s. At 5 s, about
    the end of the loader's --unroute-seconds (5 s), the replica may still be routed there; at
    7 s, past it, the host holds the request and the replica is taken back, not unloaded and
    loaded again."""
    assert cluster.model_store is not None and cluster.kube is not None
    kube = cluster.kube
    core = cast(Any, kubernetes.client.CoreV1Api(kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(kube))
    uri = cluster.model_store.publish(MODEL, MODELS_DIR / "add_one")
    body = scale_to_zero_model(uri)
    body["spec"]["autoscaling"]["minReplicas"] = 1  # loaded first, then allowed to zero
    custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)
    wait_until("loaded", lambda: loaded_here(core), 120)
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, MODEL, {"spec": {"autoscaling": {"minReplicas": 0}}}
    )
    wait_until("zero", lambda: not _model(custom).get("status", {}).get("replicas"), 60)
    zero = time.monotonic()
    service = Endpoints(kube, NAMESPACE, f"{serves_label(KEYS, MODEL)}=true")
    with service:
        address = wait_until("the Service's endpoint", service.pick, 10)
        time.sleep(max(0.0, zero + after - time.monotonic()))
        assert loaded_here(core), "still draining on its host"
        started = time.monotonic()
        status, _, at = post(address, started)
        print(f"a request {after:.0f} s after zero answered {status} in {at:.2f} s")
        assert (status, at < 5.0) == (200, True), (status, at)
        if after < 7.0:
            return  # still routed, it may be answered by the draining replica as it goes
        assert agent_metric(cluster, UNLOADS) == 0, "taken back: never unloaded"
        assert _model(custom)["spec"]["replicas"] == 1
        wait_until("ready again", lambda: _model(custom)["status"].get("readyReplicas") == 1, 30)
        placed = {c["type"]: c for c in _model(custom)["status"]["conditions"]}["Placed"]
        assert placed["status"] == "True", placed


AT_ZERO_SECONDS = 60.0
"""How long the model stays at zero, unloaded, before its next request: past the node gateway's
forgetting the host (which then has nothing loaded in Triton) and past the host's readiness
probe's failure threshold."""


@pytest.mark.slow
@pytest.mark.triton
def test_a_host_at_zero_stays_in_the_service_and_a_request_a_minute_later_wakes_the_model(
    cluster: SimCluster,
) -> None:
    """The host of a lone TritonModel parked at zero has nothing loaded in Triton, yet stays
    Ready and behind the model's Service for as long as the model is at zero: its readiness is
    its own (every model it serves is parked), not Triton's. A request through the Service a
    minute later wakes the model and is answered."""
    assert cluster.model_store is not None and cluster.kube is not None
    kube = cluster.kube
    core = cast(Any, kubernetes.client.CoreV1Api(kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(kube))
    uri = cluster.model_store.publish(MODEL, MODELS_DIR / "add_one")
    custom.create_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, scale_to_zero_model(uri)
    )
    wait_until("scaled to zero", lambda: _model(custom)["spec"]["replicas"] == 0, 120)
    wait_until("no replica", lambda: not _model(custom).get("status", {}).get("replicas"), 60)
    wait_until("parked", lambda: parked_on(_host(core, NAMESPACE).to_dict(), KEYS) == [MODEL], 60)
    service = Endpoints(kube, NAMESPACE, f"{serves_label(KEYS, MODEL)}=true")
    with service:
        address = wait_until("the Service's endpoint", service.pick, 60)
        wait_until("unloaded", lambda: agent_metric(cluster, UNLOADS) >= 1, 90)
        wait_until("no longer loaded on the host", lambda: not loaded_here(core), 30)
        zero = time.monotonic()
        while (waited := time.monotonic() - zero) < AT_ZERO_SECONDS:
            routed = service.addresses()
            assert routed == [address], (
                f"{waited:.0f} s after its model was unloaded, the host is no longer behind the "
                f"Service (routed: {routed}; Ready: {_ready(core)})"
            )
            time.sleep(1.0)
        assert _model(custom)["spec"]["replicas"] == 0, "still at zero: nothing asked for it"
        target = service.pick()
        assert target is not None and target == address
        started = time.monotonic()
        status, _, at = post(target, started)
        print(f"a request {AT_ZERO_SECONDS:.0f} s after the unload answered {status} in {at:.2f} s")
        assert status == 200 and at < 30.0, (status, at)  # the wake's bound: --wake-timeout
        assert service.addresses() == [address]
        wait_until("unparked", lambda: parked_on(_host(core, NAMESPACE).to_dict(), KEYS) == [], 30)


def _ready(core: Any) -> str:
    """The host's Ready condition, for a failure's message."""
    host = _host(core, NAMESPACE)
    conditions = (host.status.conditions or []) if host is not None else []
    return next((f"{c.status} ({c.reason})" for c in conditions if c.type == "Ready"), "none")
