"""Only proven placements count: a tenant's pods that the binder did not place cannot starve
placement or squat a model id.

A tenant with full rights in its namespace creates pods with `spec.nodeName` and
`schedulerName: default-scheduler` (the admission policy is defence in depth and the simulated
cluster runs without it, as a cluster whose admin skipped it does), copies a proof from one of
its own pods, or edits its own bound pod's annotations. The binder runs as the project's tests
run it, against sim/'s API server; the tenant acts through the official client. The victim's
pods are created after the tenant's, and the binder's one pod watch delivers events in order, so
its decision for the victim sees what the tenant did.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes.client
import pytest

from tests.binder.api.test_leader import two_replicas
from tests.binder.cli.test_cli_and_main import run_cli
from tests.binder.cluster.test_measured_memory import publish_usage
from tests.binder.objects import GI, KEYS, node_obj
from tests.binder.simcluster import (
    SYSTEM,
    MakeBinder,
    add_node,
    add_pod,
    eventually,
    node_of,
    scheduled_condition,
)
from tests.fixtures_sim import PlacementKeys

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
    # A real placement of the tenant's: the least it may ask, model "mine", proven by the binder.
    core.create_namespaced_pod(
        TENANT,
        {
            "metadata": {"name": "mine", "annotations": {KEYS.model_id: "mine"}},
            "spec": {
                "schedulerName": "tritonshare",
                "containers": [
                    {"name": "main", "image": "m", "resources": {"limits": {KEYS.gpu_mem: "64Mi"}}}
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


def events_of(core: Any, namespace: str, name: str) -> list[Any]:
    found = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
    return [e for e in found.items if e.reason != "FailedScheduling"]


async def test_unproven_pods_on_tritonshare_nodes_get_one_warning_event_each(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    core.create_node(node_obj("cpu-1"))  # no agent publishes GPUs here
    tenant_namespace(core)
    binder = await make_binder()
    hog(core, "hog", "gpu-1")
    hog(core, "on-a-cpu-node", "cpu-1", annotations={KEYS.model_id: "resnet"})
    core.create_namespaced_pod(  # the node pod: nothing of tritonshare's contract on it
        SYSTEM,
        {
            "metadata": {"name": "tritonshare-node-gpu-1"},
            "spec": {"nodeName": "gpu-1", "containers": [{"name": "agent", "image": "t"}]},
        },
    )
    [event] = await eventually(lambda: events_of(core, TENANT, "hog"), what="hog's Event")
    assert (event.type, event.reason) == ("Warning", "NotPlacedByBinder")
    assert event.involved_object.uid == core.read_namespaced_pod("hog", TENANT).metadata.uid
    assert event.message == (
        f"Pod {TENANT}/hog on node gpu-1 carries tritonshare resources or annotations, but it "
        "was not placed by the tritonshare binder (no proof of placement): the binder does not "
        "count its GPU memory or its model id, and the node's agent does not serve it. To run "
        "it on tritonshare, create it without spec.nodeName and with schedulerName tritonshare, "
        "and let the binder place it."
    )
    # The tenant touches its pod again and again: still one Event.
    for n in range(5):
        core.patch_namespaced_pod("hog", TENANT, {"metadata": {"labels": {"n": str(n)}}})
    # A proof that does not match gets its own reason. Events are written one at a time in the
    # order the pods were seen, so once this one is there, any second Event for the others
    # would be too.
    forged = {KEYS.placement: "v1.0123456789abcdef.1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}
    hog(core, "forged", "gpu-1", annotations=forged)
    [changed] = await eventually(lambda: events_of(core, TENANT, "forged"), what="an Event")
    assert changed.reason == "PlacementKeyUnknown"
    assert len(events_of(core, TENANT, "hog")) == 1
    assert events_of(core, TENANT, "on-a-cpu-node") == []
    assert events_of(core, SYSTEM, "tritonshare-node-gpu-1") == []
    # And counted for alerts, where the agent runs only.
    url = f"http://127.0.0.1:{binder.http.port}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as answer:
        text = await answer.text()
    for reason, count in [
        ("NotPlacedByBinder", 1),
        ("PlacementChanged", 0),
        ("PlacementKeyUnknown", 1),
    ]:
        assert f'tritonshare_binder_unproven_pods{{reason="{reason}"}} {count}.0' in text


async def test_memory_nvml_shows_used_that_nothing_proven_explains_is_never_handed_out(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    """An unproven pod is not charged, but whatever it (or anything outside tritonshare) really
    holds on the GPU shows in NVML's used memory, and the binder's free figure subtracts it."""
    add_node(kube_api, "gpu-1", [16 * GI])
    tenant_namespace(core)
    publish_usage(core, "gpu-1", 12 * GI, {})  # 12Gi used, no proven model explains it
    await make_binder()
    hog(core, "hog", "gpu-1", mem="15Gi")
    add_pod(core, "big", mem="8Gi", model="big")
    condition = await eventually(lambda: scheduled_condition(core, "big"), what="big's reason")
    # 4Gi: NVML's free; charging the hog would have said 1Gi, ignoring NVML 16Gi.
    assert "Insufficient GPU memory (largest free block 4Gi)" in condition.message
    add_pod(core, "small", mem="3Gi", model="small")
    assert await placed_or_refused(core, "small") == "gpu-1"


async def test_status_and_explain_show_unproven_pods_as_not_charged_and_unattributed_memory(
    kubeconfig: Path,
    kube_api: kubernetes.client.ApiClient,
    core: Any,
    make_binder: MakeBinder,
    placement_keys: PlacementKeys,
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    tenant_namespace(core)
    await make_binder()
    add_pod(core, "resnet", mem="4Gi", model="resnet")
    assert await placed_or_refused(core, "resnet") == "gpu-1"
    # NVML: 14Gi used; the agent measured resnet at 5Gi, the other 9Gi no proven model explains.
    publish_usage(core, "gpu-1", 14 * GI, {"resnet": 5 * GI})
    hog(core, "hog", "gpu-1", annotations={KEYS.model_id: "bert"})
    forged = {KEYS.placement: "v1.0123456789abcdef.1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}
    hog(core, "forged", "gpu-1", mem="1", annotations={**forged, KEYS.model_id: "gpt"})
    key_dir = str(placement_keys.directory)
    code, text = run_cli(kubeconfig, "status", "--placement-key-dir", key_dir)
    assert code == 0, text
    rows = [re.split(r"\s{2,}", line) for line in text.splitlines()]
    [gpu] = [r for r in rows if r[0] == "gpu-1" and len(r) == 12]
    # ALLOCATED, LOADED, SLEEPING, FREE, USED, PODS
    assert gpu[6:12] == [
        "5Gi",
        "5Gi",
        "0",
        "2Gi",
        "14Gi",
        "default/resnet: resnet (asks 4Gi, uses 5Gi)",
    ], gpu
    assert "2 pods on tritonshare nodes prove no placement by the binder: not charged, not " in text
    assert ["team-b/forged", "gpu-1", "1", "gpt", "PlacementKeyUnknown"] in rows
    assert ["team-b/hog", "gpu-1", "16Gi", "bert", "NotPlacedByBinder"] in rows
    assert ["gpu-1", "0", "9Gi"] in rows  # unattributed
    assert "checked for form only" not in text
    # Without the key, a well-formed proof cannot be told from a real one, and the CLI says so.
    _, text = run_cli(kubeconfig, "status")
    rows = [re.split(r"\s{2,}", line) for line in text.splitlines()]
    assert "1 pod on tritonshare nodes proves no placement" in text
    assert not any(r[0] == "team-b/forged" for r in rows)
    assert "Proofs of placement were checked for form only (no --placement-key-dir)" in text
    _, text = run_cli(kubeconfig, "explain", f"{TENANT}/hog")
    assert (
        "It is bound to node gpu-1, GPU (not annotated).\n"
        "The binder does not charge it (NotPlacedByBinder): it was not placed by the tritonshare "
        "binder (no proof of placement). Its GPU memory and model id do not count on the node, "
        "and the node's agent does not serve it.\n"
    ) in text


async def test_only_the_leader_reports_and_a_new_leader_reports_what_it_finds(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI])
    tenant_namespace(core)
    leader, follower = await two_replicas(make_binder)
    hog(core, "hog", "gpu-1")
    [event] = await eventually(lambda: events_of(core, TENANT, "hog"), what="hog's Event")
    assert event.reporting_instance == leader.settings.identity
    await eventually(lambda: "hog" in {v.pod.name for v in follower.cache.unproven.values()})
    # The follower saw it too, and queued nothing: only the leader writes.
    assert not follower.controller._unproven._reported
    assert not follower.controller._unproven._waiting
    await make_binder.stop(leader)  # a clean stop releases the lease: the follower leads at once
    await eventually(lambda: follower.elector.is_leader, what="the takeover")
    events = await eventually(
        lambda: (found := events_of(core, TENANT, "hog")) and len(found) == 2 and found,
        what="the new leader's report",
    )
    assert {e.reporting_instance for e in events} == {
        leader.settings.identity,
        follower.settings.identity,
    }
