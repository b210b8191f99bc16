"""Awake first, end to end on two real nodes of the simulated cluster (each its own Triton,
agent, gateway and kubelet): an on-demand TritonModel with a replica on each node, both asleep,
has both hosts behind its Service; once one is woken, the other, still asleep, leaves the
Service (`serves-<model>: asleep`), so requests sent through the Service all go to the awake
one and none wakes the sleeping one while the awake one has room (its maxConcurrency). Once
a burst fills the awake one (requests held at its proxy, read by the binder's autoscaler each
second), the sleeping one joins the Service, a request wakes it, and none fails; with room again
for a while, the woken one, asleep once idle, leaves the Service again."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import pytest

from binder.autoscaler.room import ROOM_SECONDS
from common.contract import Keys
from common.hosted import loaded_condition, serves_label
from sim.cluster import NodeSpec, SimCluster
from sim.demo.autoscale import slow_model
from sim.demo.scenario import MODELS_DIR
from sim.processes import wait_until
from sim.service import Endpoints
from sim.triton import TritonInstall
from tests.e2e.test_on_demand import _count, _state
from tests.e2e.test_scale_to_zero import infer
from tests.e2e.test_tritonmodel_hosts import GROUP, PLURAL, VERSION

NODES = (NodeSpec("gpu-a", "1xT4", real=True), NodeSpec("gpu-b", "1xT4", real=True))
NAMESPACE = "team-a"
MODEL = "add-one"
KEYS = Keys()
SERVES = serves_label(KEYS, MODEL)
# The agent's loaded condition of any replica of the model on a host.
LOADED = loaded_condition(KEYS, MODEL, 0).removesuffix("0")


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    with SimCluster(
        tmp_path / "cluster", NODES, binders=1, webhook=True, tenant_code_namespaces=(NAMESPACE,)
    ) as running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


def _hosts(core: Any) -> dict[str, Any]:
    """The namespace's hosts by address."""
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=f"{KEYS.prefix}model-host=true")
    return {p.status.pod_ip: p for p in pods.items if p.status.pod_ip}


def _asleep(host: Any) -> bool:
    return any(
        c.type.startswith(LOADED) and c.reason == "ModelSleeping"
        for c in host.status.conditions or []
    )


@contextlib.contextmanager
def _one_awake(
    cluster: SimCluster, source: Path, spec: dict[str, Any]
) -> Iterator[tuple[Any, Endpoints, str, str]]:
    """The model from `source` on both nodes, both asleep and both in the Service, then one
    woken (and kept busy) until the other, asleep, is out: (core, the Service, the awake
    host's address, the sleeping one's)."""
    assert cluster.model_store is not None and cluster.kube is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    uri = cluster.model_store.publish(MODEL, source)
    spec = {"storageUri": uri, "gpuMemory": "1Gi", "replicas": 2, "residency": "on-demand"} | spec
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TritonModel"}
    custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        NAMESPACE,
        PLURAL,
        body | {"metadata": {"name": MODEL}, "spec": spec | {"idleSeconds": 3}},
    )
    with Endpoints(cluster.kube, NAMESPACE, f"{SERVES}=true") as service:
        # Both asleep: both behind the Service (a request may wake either).
        wait_until(
            "both replicas asleep",
            lambda: len(hosts := _hosts(core)) == 2 and all(map(_asleep, hosts.values())),
            240,
        )
        wait_until("both in the Service", lambda: len(service.addresses()) == 2, 30)
        awake, asleep = sorted(_hosts(core))

        # One woken (and kept busy): the other leaves the Service while it sleeps.
        def only_the_awake_one() -> bool:
            assert infer(awake) == [2.0, 3.0, 4.0]
            return _out(core, service, awake, asleep)

        wait_until("the sleeping one out of the Service", only_the_awake_one, 60)
        yield core, service, awake, asleep


def _out(core: Any, service: Endpoints, awake: str, asleep: str) -> bool:
    label = _hosts(core)[asleep].metadata.labels.get(SERVES)
    return bool(label == "asleep" and service.addresses() == [awake])


@pytest.mark.slow
@pytest.mark.triton
def test_requests_avoid_a_sleeping_replica_while_an_awake_one_has_room(
    cluster: SimCluster,
) -> None:
    # Room for 4 at a time: one client's requests, one after the other, never fill it.
    spec = {"maxConcurrency": 4}
    with _one_awake(cluster, MODELS_DIR / "add_one", spec) as (core, service, awake, asleep):
        # Long enough for the binder to read the hosts' counts several times over.
        until = time.monotonic() + ROOM_SECONDS + 2
        while time.monotonic() < until:
            address = service.pick()
            assert address == awake
            assert infer(address) == [2.0, 3.0, 4.0]
        assert _hosts(core)[asleep].metadata.labels.get(SERVES) == "asleep"
        assert _state(asleep) == "idle-unloaded"
        assert _count(asleep, "tritonshare_proxy_model_wakes", "ok") == 0, "never woken"


class Burst:
    """`clients` callers sending back-to-back requests through the Service until stopped;
    the answers each address gave, and the failures."""

    def __init__(self, service: Endpoints, clients: int) -> None:
        self.service = service
        self.answered: Counter[str] = Counter()
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._call, name=f"burst-{i}") for i in range(clients)
        ]

    def _call(self) -> None:
        while not self._stop.is_set():
            address = self.service.pick()
            if address is None:
                self.failures.append("no endpoint")
                continue
            try:
                assert infer(address) == [2.0, 3.0, 4.0]
            except Exception as e:  # every failure is the test's, with its cause
                self.failures.append(f"{address}: {e!r}")
            else:
                self.answered[address] += 1

    def __enter__(self) -> Burst:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


@pytest.mark.slow
@pytest.mark.triton
def test_a_burst_that_fills_the_awake_replica_wakes_the_sleeping_one_through_the_service(
    cluster: SimCluster, tmp_path: Path
) -> None:
    # 0.3 s a request and room for 2: six callers queue at the awake replica's proxy.
    source = slow_model(MODELS_DIR / "add_one", tmp_path / "slow", 0.3)
    with _one_awake(cluster, source, {"maxConcurrency": 2}) as (core, service, awake, asleep):
        with Burst(service, clients=6) as burst:
            wait_until(
                "the sleeping one in the Service, woken by a request",
                lambda: burst.failures or burst.answered[asleep] >= 3,
                60,
            )
        assert burst.failures == []
        assert burst.answered[awake] > 0
        assert _count(asleep, "tritonshare_proxy_model_wakes", "ok") == 1

        # Room again (one caller, one request at a time, to the first one only): the woken
        # one, asleep once idle, leaves the Service again.
        def out_again() -> bool:
            assert infer(awake) == [2.0, 3.0, 4.0]
            return _out(core, service, awake, asleep)

        wait_until("the woken one out of the Service again", out_again, 60)
        assert _state(asleep) == "idle-unloaded"
