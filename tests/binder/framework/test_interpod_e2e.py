"""Pod affinity and anti-affinity end to end: the binder against the simulated API server, pods
created with the official client, as kube-scheduler's InterPodAffinity would place them."""

from __future__ import annotations

from functools import partial
from typing import Any

import kubernetes.client

from tests.binder.objects import GI
from tests.binder.simcluster import (
    MakeBinder,
    add_node,
    add_pod,
    bound,
    eventually,
    failure,
    node_of,
)

HOSTNAME = "kubernetes.io/hostname"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def keep_apart_from(app: str) -> dict[str, Any]:
    term = {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": HOSTNAME}
    return {"affinity": {"podAntiAffinity": {REQUIRED: [term]}}}


def keep_with(app: str) -> dict[str, Any]:
    term = {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": HOSTNAME}
    return {"affinity": {"podAffinity": {REQUIRED: [term]}}}


async def test_replicas_with_anti_affinity_on_hostname_spread_and_the_extra_one_waits(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    for name in ("gpu-1", "gpu-2", "gpu-3"):
        add_node(kube_api, name, [16 * GI])
    await make_binder()
    replicas = [f"web-{i}" for i in range(4)]
    for name in replicas:
        add_pod(core, name, labels={"app": "web"}, spec_extra=keep_apart_from("web"))
    placed = await eventually(lambda: len(bound(core, replicas)) == 3, what="three bound")
    assert placed
    assert sorted(bound(core, replicas).values()) == ["gpu-1", "gpu-2", "gpu-3"]
    (waiting,) = set(replicas) - set(bound(core, replicas))
    message = await eventually(lambda: failure(core, waiting), what="FailedScheduling")
    assert "node(s) didn't match pod anti-affinity rules" in message


async def test_a_pod_with_required_affinity_joins_the_pod_it_names(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    for name in ("gpu-1", "gpu-2", "gpu-3"):
        add_node(kube_api, name, [16 * GI])
    await make_binder()
    add_pod(core, "db", labels={"app": "db"})
    db_node = await eventually(lambda: node_of(core, "db"), what="db bound")
    for i in range(3):
        add_pod(core, f"cache-{i}", labels={"app": "cache"}, spec_extra=keep_with("db"))
    for i in range(3):
        assert await eventually(partial(node_of, core, f"cache-{i}")) == db_node
    add_pod(core, "orphan", labels={"app": "orphan"}, spec_extra=keep_with("nothing"))
    message = await eventually(lambda: failure(core, "orphan"), what="FailedScheduling")
    assert "node(s) didn't match pod affinity rules" in message
    assert node_of(core, "orphan") == ""


async def test_an_existing_pods_anti_affinity_keeps_the_pods_it_names_away(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    await make_binder()
    add_pod(core, "loner", labels={"app": "loner"}, spec_extra=keep_apart_from("noisy"))
    assert await eventually(lambda: node_of(core, "loner")) == "gpu-1"
    add_pod(core, "noisy", labels={"app": "noisy"})
    message = await eventually(lambda: failure(core, "noisy"), what="FailedScheduling")
    assert "node(s) didn't satisfy existing pods anti-affinity rules" in message
    add_node(kube_api, "gpu-2", [16 * GI])
    assert await eventually(lambda: node_of(core, "noisy")) == "gpu-2"
