"""Only proven placements count: a tenant's pods that the binder did not place cannot starve
placement or squat a model id (issue 23, attacks 1 and 2).

A tenant with full rights in its namespace creates pods with `spec.nodeName` and
`schedulerName: default-scheduler` (the admission policy is defence in depth and the simulated
cluster runs without it, as a cluster whose admin skipped it does), copies a proof from one of
its own pods, or edits its own bound pod's annotations. The binder runs as the project's tests
run it, against sim/'s API server; the tenant acts through the official client. The victim's
pods are created after the tenant's, and the binder's one pod watch delivers events in order, so
its decision for the victim sees what the tenant did.
"""

from __future__ import annotations

from typing import Any

import kubernetes.client
import pytest

from tests.binder.objects import GI, KEYS
from tests.binder.simcluster import (
    MakeBinder,
    add_node,
    add_pod,
    eventually,
    node_of,
    scheduled_condition,
)

TENANT = "team-b"
"""The attacker's namespace; the victim's pods are in `default`."""


def tenant_namespace(core: Any) -> None:
    core.create_namespace({"metadata": {"name": TENANT}})


def hog(
    core: Any,
    name: str,
    node: str,
    *,
    mem: str = "16Gi",
    annotations: dict[str, str] | None = None,
    scheduler: str = "default-scheduler",
) -> Any:
    """A tenant pod created straight onto `node`, asking for `mem` of GPU memory."""
    return core.create_namespaced_pod(
        TENANT,
        {
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {
                "schedulerName": scheduler,
                "nodeName": node,
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "resources": {"limits": {KEYS.gpu_mem: mem}},
                    }
                ],
            },
        },
    )


async def placed_or_refused(core: Any, name: str) -> str:
    """The node the pod was bound to, or fail with the binder's reason for not binding it."""

    def outcome() -> Any:
        node = node_of(core, name)
        if node:
            return node
        condition = scheduled_condition(core, name)
        return condition if condition is not None and condition.status == "False" else None

    result = await eventually(outcome, what=f"pod {name} to be bound or refused")
    if not isinstance(result, str):
        pytest.fail(f"pod {name} was not placed: {result.message}")
    return result


async def test_pods_created_on_every_node_with_a_big_request_do_not_starve_placement(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    add_node(kube_api, "gpu-2", [16 * GI])
    tenant_namespace(core)
    await make_binder()
    for node in ("gpu-1", "gpu-2"):
        hog(core, f"hog-{node}", node)
    add_pod(core, "victim", mem="8Gi", model="resnet")
    assert await placed_or_refused(core, "victim") in ("gpu-1", "gpu-2")


async def test_a_one_byte_pod_with_the_victims_model_id_on_every_node_squats_nothing(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    add_node(kube_api, "gpu-2", [16 * GI])
    tenant_namespace(core)
    await make_binder()
    for node in ("gpu-1", "gpu-2"):
        # Through the tritonshare scheduler name too: spec.nodeName skips the binder either way.
        hog(
            core,
            f"squat-{node}",
            node,
            mem="1",
            annotations={KEYS.model_id: "resnet"},
            scheduler="tritonshare",
        )
    add_pod(core, "victim", mem="4Gi", model="resnet")
    assert await placed_or_refused(core, "victim") in ("gpu-1", "gpu-2")


async def test_a_proof_copied_from_the_tenants_own_pod_proves_nothing(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    add_node(kube_api, "gpu-2", [16 * GI])
    tenant_namespace(core)
    await make_binder()
    # A real placement of the tenant's: 1 byte, model "mine", proven by the binder.
    core.create_namespaced_pod(
        TENANT,
        {
            "metadata": {"name": "mine", "annotations": {KEYS.model_id: "mine"}},
            "spec": {
                "schedulerName": "tritonshare",
                "containers": [
                    {"name": "main", "image": "m", "resources": {"limits": {KEYS.gpu_mem: "1"}}}
                ],
            },
        },
    )
    await eventually(lambda: core.read_namespaced_pod("mine", TENANT).spec.node_name)
    mine = core.read_namespaced_pod("mine", TENANT)
    copied = {k: v for k, v in mine.metadata.annotations.items() if k in (KEYS.gpu, KEYS.placement)}
    assert KEYS.placement in copied
    # Its proof copied onto pods created on every node: 16Gi each, and the victim's model id.
    for node in ("gpu-1", "gpu-2"):
        hog(
            core,
            f"copy-{node}",
            node,
            annotations={**copied, KEYS.model_id: "resnet"},
            scheduler="tritonshare",
        )
    add_pod(core, "victim", mem="15Gi", model="resnet")
    assert await placed_or_refused(core, "victim") in ("gpu-1", "gpu-2")


@pytest.mark.parametrize(
    "edit",
    ["model-id", "gpu", "request"],
)
async def test_a_bound_pod_edited_after_binding_is_not_charged_at_its_edited_values(
    kube_api: kubernetes.client.ApiClient,
    core: Any,
    make_binder: MakeBinder,
    edit: str,
) -> None:
    """The proof names what the binder booked (node, GPU, model id, request). A pod whose GPU,
    model id or proof was edited after binding proves nothing any more: the agent takes its model
    out, and the binder charges it nowhere (not at the edited values, and not at the old ones
    either: every replica, and a restarted binder, must reach the same ledger from the API)."""
    add_node(kube_api, "gpu-1", [16 * GI, 16 * GI])
    tenant_namespace(core)
    await make_binder()
    core.create_namespaced_pod(
        TENANT,
        {
            "metadata": {"name": "mine", "annotations": {KEYS.model_id: "mine"}},
            "spec": {
                "schedulerName": "tritonshare",
                "containers": [
                    {
                        "name": "main",
                        "image": "m",
                        "resources": {"limits": {KEYS.gpu_mem: "12Gi"}},
                    }
                ],
            },
        },
    )
    await eventually(lambda: core.read_namespaced_pod("mine", TENANT).spec.node_name)
    annotations = core.read_namespaced_pod("mine", TENANT).metadata.annotations
    booked_gpu = annotations[KEYS.gpu]
    other_gpu = next(g for g in ("GPU-gpu-1-0", "GPU-gpu-1-1") if g != booked_gpu)
    version, key_id, _booked, signature = annotations[KEYS.placement].split(".")
    changed = {
        "model-id": {KEYS.model_id: "resnet"},
        "gpu": {KEYS.gpu: other_gpu},
        "request": {KEYS.placement: ".".join((version, key_id, str(16 * GI), signature))},
    }[edit]
    core.patch_namespaced_pod("mine", TENANT, {"metadata": {"annotations": changed}})
    # Two victims of a whole GPU each, one of them with the model id the tenant wrote.
    add_pod(core, "victim-1", mem="16Gi", model="resnet")
    add_pod(core, "victim-2", mem="16Gi", model="bert")
    placed = {await placed_or_refused(core, "victim-1"), await placed_or_refused(core, "victim-2")}
    assert placed == {"gpu-1"}
    gpus = {
        core.read_namespaced_pod(n, "default").metadata.annotations[KEYS.gpu]
        for n in ("victim-1", "victim-2")
    }
    assert gpus == {"GPU-gpu-1-0", "GPU-gpu-1-1"}
