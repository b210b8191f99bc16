"""Without KServe's CRDs the InferenceService controller stays idle: the binder starts, is
ready, and asks for the kinds again later; turned off, it does not ask at all."""

from __future__ import annotations

import kubernetes.client

from sim.apiserver import RunningApiServer
from tests.binder.objects import GI
from tests.binder.simcluster import MakeBinder, add_node, eventually

KINDS = {"inferenceservices", "servingruntimes", "clusterservingruntimes"}


async def test_without_the_crds_the_binder_is_ready_and_the_controller_idle(
    kube_api: kubernetes.client.ApiClient, make_binder: MakeBinder, apiserver: RunningApiServer
) -> None:
    add_node(kube_api, "n1", [16 * GI])
    binder = await make_binder()
    assert binder.not_ready() == []
    absent = {i.kind for i in binder._informers if i.absent}
    assert absent >= KINDS
    asked = {r.resource for r in apiserver.audit if r.user_agent.startswith("tritonshare-binder/")}
    assert asked >= KINDS, "each kind was asked for (404) before the binder was ready"
    await eventually(lambda: binder.role() == "leader", what="scheduling")


async def test_turned_off_it_asks_for_none_of_the_kinds(
    kube_api: kubernetes.client.ApiClient, make_binder: MakeBinder, apiserver: RunningApiServer
) -> None:
    binder = await make_binder(inferenceservices=False)
    assert binder.inferenceservices is None
    assert binder.not_ready() == []
    asked = {r.resource for r in apiserver.audit if r.user_agent.startswith("tritonshare-binder/")}
    assert not KINDS & asked
