"""High availability against the simulated API server: one leader binds, followers keep warm
caches and take over within the lease duration, after a crash or a clean release."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import kubernetes.client

from binder.app import Binder
from sim.apiserver import RunningApiServer
from tests.binder.objects import GI
from tests.binder.simcluster import SYSTEM, MakeBinder, add_node, add_pod, eventually, node_of
from tests.fixtures_sim import coordination_v1

LEASE_SECONDS = 2.0


def holder(kube_api: kubernetes.client.ApiClient) -> str:
    lease = coordination_v1(kube_api).read_namespaced_lease("tritonshare-binder", SYSTEM)
    return str(lease.spec.holder_identity or "")


async def two_replicas(make: MakeBinder) -> tuple[Binder, Binder]:
    first = await make(leader_elect=True, identity="replica-a")
    second = await make(leader_elect=True, identity="replica-b")
    await eventually(lambda: first.elector.is_leader or second.elector.is_leader, what="a leader")
    return (first, second) if first.elector.is_leader else (second, first)


async def test_only_one_replica_leads_and_the_follower_keeps_warm_caches(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    core: Any,
    make_binder: MakeBinder,
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    leader, follower = await two_replicas(make_binder)
    assert not follower.elector.is_leader
    assert holder(kube_api) == leader.settings.identity
    add_pod(core, "m", mem="2Gi")
    await eventually(lambda: node_of(core, "m"))
    # The follower saw the same cluster through its own watches.
    await eventually(lambda: follower.cache.state.memory.allocated("gpu-1") == [2 * GI])
    assert follower.controller.bound == 0
    assert leader.controller.bound == 1
    assert follower.role() == "follower"


async def test_a_follower_takes_over_within_the_lease_duration_after_a_crash(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    leader, follower = await two_replicas(make_binder)
    crashed = time.monotonic()
    await make_binder.stop(leader, release=False)  # the lease is left to expire, as after a crash
    add_pod(core, "after-crash", mem="2Gi")
    await eventually(lambda: follower.elector.is_leader, within=10, what="the takeover")
    took = time.monotonic() - crashed
    # Expiry by the follower's own observation: the lease duration plus one retry period,
    # with slack for a busy machine.
    assert took < LEASE_SECONDS + 3.0, took
    assert took >= LEASE_SECONDS * 0.5, took
    assert await eventually(lambda: node_of(core, "after-crash")) == "gpu-1"
    assert holder(kube_api) == follower.settings.identity
    lease = coordination_v1(kube_api).read_namespaced_lease("tritonshare-binder", SYSTEM)
    assert lease.spec.lease_transitions == 1


async def test_a_clean_stop_releases_the_lease_for_an_immediate_takeover(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    leader, follower = await two_replicas(make_binder)
    stopped = time.monotonic()
    await make_binder.stop(leader)
    await eventually(lambda: follower.elector.is_leader, within=10, what="the takeover")
    # Released: the follower need not wait out the lease (1 s left after release, plus a retry).
    assert time.monotonic() - stopped < LEASE_SECONDS + 1.5
    add_pod(core, "after-release", mem="2Gi")
    assert await eventually(lambda: node_of(core, "after-release")) == "gpu-1"


async def test_a_leader_that_cannot_renew_steps_down_and_stops_binding(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    binder = await make_binder(leader_elect=True, identity="replica-a")
    await eventually(lambda: binder.elector.is_leader, what="leadership")
    # Another replica (with a skewed view, say) overwrites the lease: renewals now fail.
    leases = coordination_v1(kube_api)
    lease = leases.read_namespaced_lease("tritonshare-binder", SYSTEM)
    lease.spec.holder_identity = "usurper"
    lease.spec.lease_duration_seconds = 3600
    leases.replace_namespaced_lease("tritonshare-binder", SYSTEM, lease)
    await eventually(lambda: not binder.elector.is_leader, within=10, what="stepping down")
    add_pod(core, "orphan", mem="1Gi")
    await eventually(lambda: binder.cache.pending, what="the pod in the follower's cache")
    await asyncio.sleep(0.5)  # give a (wrongly) still-leading replica time to bind
    assert node_of(core, "orphan") == ""
    assert binder.metrics.registry.get_sample_value("tritonshare_binder_is_leader") == 0.0
