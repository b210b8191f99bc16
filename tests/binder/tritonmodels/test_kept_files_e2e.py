"""The binder against the simulated API server: a new replica of a model revision goes to the node
a replica of that revision left (its agent may keep the files), where GPU packing alone would
send it elsewhere; another revision is placed as packing says."""

from __future__ import annotations

from typing import Any

import kubernetes.client

from tests.binder.objects import GI
from tests.binder.simcluster import MakeBinder, add_node, add_pod, eventually, node_of


async def test_a_new_replica_goes_where_its_revision_left_its_files(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "gpu-a", [16 * GI], labels={"pool": "a"})
    add_node(kube_api, "gpu-b", [16 * GI], labels={"pool": "b"})
    await make_binder()
    # Packing prefers gpu-a once it holds another model (a used GPU before an empty one).
    add_pod(core, "filler", mem="4Gi", model="other")
    assert await eventually(lambda: node_of(core, "filler"), what="filler bound") == "gpu-a"
    revision = {"app": "m", "pod-template-hash": "5d4f8b"}
    add_pod(core, "old", model="m", labels=revision, spec_extra={"nodeSelector": {"pool": "b"}})
    assert await eventually(lambda: node_of(core, "old"), what="old bound") == "gpu-b"
    core.delete_namespaced_pod("old", "default", grace_period_seconds=0)

    def gone() -> bool:
        return not any(p.metadata.name == "old" for p in core.list_namespaced_pod("default").items)

    await eventually(gone, what="old deleted")
    add_pod(core, "new", model="m", labels=revision)
    assert await eventually(lambda: node_of(core, "new"), what="new bound") == "gpu-b"
    other = {"app": "m", "pod-template-hash": "7c9f2d"}
    add_pod(core, "next", model="m", labels=other)
    assert await eventually(lambda: node_of(core, "next"), what="next bound") == "gpu-a"
