"""The binder reuses its API connections: the simulated API server's audit log names the client
end of the TCP connection that carried each request, so the distinct peers of the binder's writes
are the connections it opened for them. An answer left unread would keep its connection out of
the pool and make every write open a new one (and leave a socket in TIME_WAIT)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes.client

from binder.api.kube import Kube
from common.kubeapi.session import RetryPolicy
from sim.apiserver import RunningApiServer
from tests.binder.objects import GI, KEYS
from tests.binder.simcluster import (
    MakeBinder,
    add_node,
    add_pod,
    binder_writes,
    eventually,
    node_of,
)

PODS = 100  # two writes each: the binding, then the Scheduled Event


def test_a_hundred_writes_in_a_row_use_one_connection(
    apiserver: RunningApiServer, core: Any, kubeconfig: Path
) -> None:
    add_pod(core, "m", mem="1Gi")
    kube = Kube(str(kubeconfig), retry=RetryPolicy())
    try:
        for i in range(100):
            kube.patch_pod_annotations("default", "m", {KEYS.gpu: f"GPU-{i}"})
    finally:
        kube.close()
    writes = binder_writes(apiserver)
    assert len(writes) == 100
    assert len({w.peer for w in writes}) == 1


async def test_a_hundred_binder_writes_open_a_handful_of_connections(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    core: Any,
    make_binder: MakeBinder,
) -> None:
    for n in range(4):
        add_node(kube_api, f"gpu-{n}", [80 * GI] * 8)
    binder = await make_binder()
    for i in range(PODS):
        add_pod(core, f"m-{i}", mem="1Gi")
    await eventually(
        lambda: all(node_of(core, f"m-{i}") for i in range(PODS)), within=60, what="every bind"
    )
    writes = binder_writes(apiserver)
    assert len([w for w in writes if w.subresource == "binding"]) == PODS
    connections = {w.peer for w in writes}
    # At most one per write in flight at once, however many writes: the bind workers', and on a
    # busy machine a write of the binder's own beside all of them (a status, an Event) or one
    # connection the server closed opened again.
    assert len(connections) <= binder.settings.bind_workers + 2, sorted(connections)
    assert len(connections) < PODS // 5, "a handful, not one per write"
