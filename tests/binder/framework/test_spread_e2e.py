"""Topology spread end to end: the binder against the simulated API server, pods created with the
official client, as kube-scheduler's PodTopologySpread would place them."""

from __future__ import annotations

from collections import Counter
from typing import Any

import kubernetes.client

from binder.framework.spread import REASON_SPREAD
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

ZONE = "topology.kubernetes.io/zone"
TAINT = {"key": "k", "value": "v", "effect": "NoSchedule"}


def spread_over_zones(app: str) -> dict[str, Any]:
    constraint = {
        "maxSkew": 1,
        "topologyKey": ZONE,
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": app}},
    }
    return {"topologySpreadConstraints": [constraint]}


async def test_replicas_created_together_end_balanced_across_zones(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    zones = {"gpu-a1": "a", "gpu-a2": "a", "gpu-a3": "a", "gpu-b1": "b"}
    for name, zone in zones.items():
        add_node(kube_api, name, [16 * GI], labels={ZONE: zone})
    await make_binder()
    replicas = [f"web-{i}" for i in range(4)]
    for name in replicas:
        add_pod(core, name, labels={"app": "web"}, spec_extra=spread_over_zones("web"))
    await eventually(lambda: len(bound(core, replicas)) == 4, what="four bound")
    # Zone a has three nodes and b one, yet each zone holds two replicas.
    assert Counter(zones[node] for node in bound(core, replicas).values()) == {"a": 2, "b": 2}


async def test_a_replica_that_would_break_max_skew_waits_until_its_zone_has_room(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "gpu-a", [16 * GI], labels={ZONE: "a"})
    # Zone b's only node is tainted: nodeTaintsPolicy Ignore keeps it a domain holding none.
    add_node(kube_api, "gpu-b", [16 * GI], labels={ZONE: "b"}, taints=[TAINT])
    await make_binder()
    add_pod(core, "web-0", labels={"app": "web"}, spec_extra=spread_over_zones("web"))
    assert await eventually(lambda: node_of(core, "web-0"), what="web-0 bound") == "gpu-a"
    add_pod(core, "web-1", labels={"app": "web"}, spec_extra=spread_over_zones("web"))
    message = await eventually(lambda: failure(core, "web-1"), what="FailedScheduling")
    assert f"1 {REASON_SPREAD}" in message
    assert node_of(core, "web-1") == ""
    add_node(kube_api, "gpu-b2", [16 * GI], labels={ZONE: "b"})
    assert await eventually(lambda: node_of(core, "web-1"), what="web-1 bound") == "gpu-b2"
