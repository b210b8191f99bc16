"""Nodes dedicated to tenant code, end to end: the binder against the simulated API server, pods
created with the official client. A namespace allowed to run its own code in Triton (the
binder's --tenant-code-namespaces, as the agents') has its model pods placed only on nodes
labelled `tritonshare.io/tenant-code: "true"`, and no other namespace's pod is ever placed on
one: tenant code shares a Triton only with the models of namespaces allowed to run it."""

from __future__ import annotations

import io
from functools import partial
from pathlib import Path
from typing import Any

import kubernetes.client

from binder.cli.main import main as cli
from binder.framework.noderules import REASON_DEDICATED, REASON_NOT_DEDICATED
from tests.binder.objects import GI, KEYS, pod_obj
from tests.binder.simcluster import MakeBinder, add_node, eventually

LAB = "lab"
"""The namespace allowed to run its own code in Triton."""
DEDICATED = {KEYS.tenant_code: "true"}


def create(core: Any, namespace: str, name: str, **kw: Any) -> None:
    obj = pod_obj(name, namespace=namespace, **kw)
    del obj["metadata"]["uid"], obj["metadata"]["creationTimestamp"]
    core.create_namespaced_pod(namespace, obj)


def node_of(core: Any, namespace: str, name: str) -> str:
    return str(core.read_namespaced_pod(name, namespace).spec.node_name or "")


def unschedulable(core: Any, namespace: str, name: str) -> str:
    """The PodScheduled=False message the binder wrote, or ""."""
    for condition in core.read_namespaced_pod(name, namespace).status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return str(condition.message or "")
    return ""


async def test_tenant_code_and_other_models_never_share_a_node(
    kubeconfig: Path, kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    core.create_namespace({"metadata": {"name": LAB}})
    add_node(kube_api, "gpu-shared-1", [16 * GI])
    add_node(kube_api, "gpu-shared-2", [16 * GI])
    add_node(kube_api, "gpu-code", [32 * GI], labels=DEDICATED)
    # Elected, so that it publishes its namespaces on the leader Lease for `explain`.
    await make_binder(tenant_code_namespaces=(LAB,), leader_elect=True)

    # Every pod would fit anywhere by memory; only the dedication decides.
    for i in range(3):
        create(core, LAB, f"code-{i}")
        create(core, "default", f"web-{i}")
    for i in range(3):
        assert await eventually(partial(node_of, core, LAB, f"code-{i}")) == "gpu-code"
        web = await eventually(partial(node_of, core, "default", f"web-{i}"))
        assert web.startswith("gpu-shared"), web

    # A pod that fits only on a node of the other kind waits, saying why as kube-scheduler
    # says it.
    create(core, LAB, "code-big", mem="30Gi")
    create(core, "default", "web-big", mem="20Gi")
    message = await eventually(lambda: unschedulable(core, LAB, "code-big"))
    assert message.startswith("0/3 nodes are available: "), message
    assert f"2 {REASON_NOT_DEDICATED}" in message, message
    assert REASON_DEDICATED not in message, message
    message = await eventually(lambda: unschedulable(core, "default", "web-big"))
    assert f"1 {REASON_DEDICATED}" in message, message

    # `tritonshare explain` judges as the binder does: it reads the binder's namespaces from
    # the leader Lease.
    out = io.StringIO()
    assert cli(["--kubeconfig", str(kubeconfig), "explain", f"{LAB}/code-big"], out=out) == 0
    rows = {line.split()[0]: line for line in out.getvalue().splitlines() if line}
    assert REASON_NOT_DEDICATED in rows["gpu-shared-1"], out.getvalue()
    assert REASON_NOT_DEDICATED not in rows["gpu-code"], out.getvalue()

    # The operator dedicates another node: the waiting tenant-code pod goes there.
    add_node(kube_api, "gpu-code-2", [32 * GI], labels=DEDICATED)
    assert await eventually(lambda: node_of(core, LAB, "code-big")) == "gpu-code-2"
    assert node_of(core, "default", "web-big") == ""


async def test_a_binder_that_allows_no_tenant_code_keeps_every_model_pod_off_dedicated_nodes(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    """A binder whose flag does not list the namespace that the dedicated node's agent allows
    places that namespace with everyone else's, where agents refuse its code: a mismatch
    fails closed."""
    core.create_namespace({"metadata": {"name": LAB}})
    add_node(kube_api, "gpu-code", [16 * GI], labels=DEDICATED)
    await make_binder()
    create(core, LAB, "code")
    create(core, "default", "web")
    for namespace, name in ((LAB, "code"), ("default", "web")):
        message = await eventually(partial(unschedulable, core, namespace, name))
        assert f"1 {REASON_DEDICATED}" in message, message
        assert node_of(core, namespace, name) == ""
