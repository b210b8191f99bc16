"""The binder outlives API server faults, against the simulated API server taken down and armed
with faults: caches survive an outage and catch up, /readyz says when a watch has failed too
long, writes ride out 429 (honouring Retry-After), 5xx and refused connections, a Binding whose
answer was lost is checked instead of sent blindly again, and a leader that cannot renew steps
down and leads again when the server is back."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from binder.api.kube import Kube
from common.kubeapi.errors import ConflictError, UnavailableError
from common.kubeapi.session import RetryPolicy
from sim.apiserver import Fault, RunningApiServer
from tests.binder.objects import GI, KEYS
from tests.binder.simcluster import MakeBinder, add_node, add_pod, eventually, node_of

BINDER = "tritonshare-binder/"


@pytest.fixture
def kube(kubeconfig: Path) -> Iterator[Kube]:
    client = Kube(str(kubeconfig), retry=RetryPolicy(initial_seconds=0.05, budget_seconds=5.0))
    try:
        yield client
    finally:
        client.close()


def calls(apiserver: RunningApiServer, name: str) -> list[tuple[str, str, int]]:
    """The binder's requests about one pod: (verb, subresource, code)."""
    return [
        (r.verb, r.subresource, r.code)
        for r in apiserver.audit
        if r.user_agent.startswith(BINDER) and r.resource == "pods" and r.name == name
    ]


async def test_the_caches_outlive_an_outage_and_readyz_says_when_they_fail_too_long(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    core: Any,
    make_binder: MakeBinder,
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    binder = await make_binder(watch_failure_grace_seconds=0.5)
    assert binder.not_ready() == []
    apiserver.pause()
    problems = await eventually(binder.not_ready, within=15, what="/readyz to report the outage")
    assert any("watch has been failing for" in p for p in problems), problems
    threads = {t.name for t in threading.enumerate()}
    assert {"watch-nodes", "watch-pods", "watch-leases"} <= threads
    apiserver.resume()
    add_node(kube_api, "gpu-2", [16 * GI])
    add_pod(core, "after", mem="12Gi")
    add_pod(core, "after-2", mem="12Gi")
    await eventually(lambda: node_of(core, "after") and node_of(core, "after-2"), within=40)
    assert {node_of(core, "after"), node_of(core, "after-2")} == {"gpu-1", "gpu-2"}
    await eventually(lambda: binder.not_ready() == [], what="ready again")
    assert all(i.failures > 0 for i in binder._informers if not i.absent)


OUTAGE_SECONDS = 20.0


async def test_after_a_20_s_outage_new_pods_are_bound_within_2_s_of_the_server_answering(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    core: Any,
    make_binder: MakeBinder,
) -> None:
    """While the server is unreachable, the watches try again about every second (jittered), not
    on a back-off doubling to 30 s: a 20 s outage used to leave the pod watch asleep for another
    11 s after the server answered, and new pods Pending meanwhile."""
    add_node(kube_api, "gpu-1", [16 * GI])
    binder = await make_binder()
    apiserver.pause()
    down = await eventually(
        lambda: all(i.failing_for() > 0 for i in binder._informers if not i.absent),
        within=10,
        what="the outage",
    )
    assert down
    await asyncio.sleep(OUTAGE_SECONDS)  # the outage itself: the thing under test is its length
    apiserver.resume()
    answering = time.monotonic()
    add_pod(core, "after-outage", mem="1Gi")
    await eventually(lambda: node_of(core, "after-outage"), within=15, what="the pod bound")
    assert time.monotonic() - answering < 2.0


def test_a_write_rides_out_429_with_its_retry_after_and_5xx(
    apiserver: RunningApiServer, core: Any, kube: Kube
) -> None:
    add_pod(core, "m", mem="1Gi")
    apiserver.faults.arm(Fault(429, times=1, user_agent=BINDER, verb="patch", retry_after=1))
    apiserver.faults.arm(Fault(503, times=1, user_agent=BINDER, verb="patch"))
    started = time.monotonic()
    kube.patch_pod_annotations("default", "m", {"example.com/gpu": "GPU-1"})
    assert time.monotonic() - started >= 1.0  # the server's Retry-After, not our 0.05 s
    assert calls(apiserver, "m") == [("patch", "", 429), ("patch", "", 503), ("patch", "", 200)]
    pod = core.read_namespaced_pod("m", "default")
    assert pod.metadata.annotations["example.com/gpu"] == "GPU-1"


def test_a_write_rides_out_connection_refused_until_the_server_is_back(
    apiserver: RunningApiServer, core: Any, kube: Kube
) -> None:
    add_pod(core, "m", mem="1Gi")
    apiserver.pause()
    back = threading.Timer(1.0, apiserver.resume)
    back.start()
    try:
        kube.patch_pod_annotations("default", "m", {"example.com/gpu": "GPU-1"})
    finally:
        back.join()
    assert core.read_namespaced_pod("m", "default").metadata.annotations["example.com/gpu"]


def test_a_write_gives_up_at_its_budget_or_when_it_may_no_longer_retry(
    apiserver: RunningApiServer, core: Any, kubeconfig: Path
) -> None:
    add_pod(core, "m", mem="1Gi")
    apiserver.faults.arm(Fault(503, times=1000, user_agent=BINDER))
    kube = Kube(str(kubeconfig), retry=RetryPolicy(initial_seconds=0.05, budget_seconds=0.5))
    try:
        started = time.monotonic()
        with pytest.raises(UnavailableError) as failed:
            kube.patch_pod_annotations("default", "m", {"example.com/gpu": "GPU-1"})
        assert failed.value.status == 503
        assert 0.3 < time.monotonic() - started < 2.0
        tried = len(calls(apiserver, "m"))
        assert tried >= 3
        kube.session.retry_while = lambda: False  # no longer leading: one attempt only
        with pytest.raises(UnavailableError):
            kube.patch_pod_annotations("default", "m", {"example.com/gpu": "GPU-1"})
        assert len(calls(apiserver, "m")) == tried + 1
    finally:
        kube.close()


def test_a_binding_whose_answer_was_lost_is_checked_not_sent_again(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient, core: Any, kube: Kube
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    add_pod(core, "m", mem="1Gi")
    uid = core.read_namespaced_pod("m", "default").metadata.uid
    # The server binds the pod, but the answer is lost on the way back.
    apiserver.faults.arm(Fault(503, times=1, user_agent=BINDER, verb="create", committed=True))
    kube.bind("default", "m", uid, "gpu-1")
    assert calls(apiserver, "m") == [("create", "binding", 503), ("get", "", 200)]
    assert node_of(core, "m") == "gpu-1"


def test_a_pod_maybe_bound_is_never_annotated_anew(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient, core: Any, kube: Kube
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    add_pod(core, "m", mem="1Gi", gpu="GPU-1")
    uid = core.read_namespaced_pod("m", "default").metadata.uid
    apiserver.faults.arm(Fault(503, times=1, user_agent=BINDER, verb="create", committed=True))
    kube.session.retry_while = lambda: False  # leadership lost: no time to find out
    with pytest.raises(UnavailableError):
        kube.bind("default", "m", uid, "gpu-1")
    kube.session.retry_while = lambda: True
    # A later placement of the same pod must not move the GPU of a pod that is in fact bound.
    with pytest.raises(ConflictError):
        kube.patch_pod_annotations("default", "m", {KEYS.gpu: "GPU-2"})
    assert core.read_namespaced_pod("m", "default").metadata.annotations[KEYS.gpu] == "GPU-1"


async def test_a_leader_that_loses_the_api_server_steps_down_then_leads_again(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    core: Any,
    make_binder: MakeBinder,
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    binder = await make_binder(leader_elect=True, identity="replica-a")
    await eventually(lambda: binder.elector.is_leader, what="leadership")
    apiserver.pause()
    lost = time.monotonic()
    await eventually(lambda: not binder.elector.is_leader, within=10, what="stepping down")
    # Within the renew deadline (1.5 s) plus a retry period, well before the 2 s lease expires
    # for a follower that saw it last renewed.
    assert time.monotonic() - lost < 2.0
    assert binder.metrics.registry.get_sample_value("tritonshare_binder_is_leader") == 0.0
    await asyncio.sleep(0)
    apiserver.resume()
    await eventually(lambda: binder.elector.is_leader, within=15, what="leading again")
    add_pod(core, "after", mem="1Gi")
    assert await eventually(lambda: node_of(core, "after"), within=15) == "gpu-1"


async def test_a_leader_whose_renewals_hang_steps_down_at_the_renew_deadline(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    binder = await make_binder(leader_elect=True, identity="replica-a")
    await eventually(lambda: binder.elector.is_leader, what="leadership")
    # Every lease call now hangs for 10 s before failing: longer than the 2 s lease.
    hang = Fault(503, times=1000, user_agent=BINDER, resource="leases", delay_seconds=10)
    apiserver.faults.arm(hang)
    hung = time.monotonic()
    await eventually(lambda: not binder.elector.is_leader, within=10, what="stepping down")
    # The renew deadline (1.5 s) after the last renewal, not when a 10 s call gives up.
    assert time.monotonic() - hung < 1.5 + 0.5
    hang.times = 0
    apiserver.faults.clear()
    await eventually(lambda: binder.elector.is_leader, within=15, what="leading again")
