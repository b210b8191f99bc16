"""`tritonshare status|explain` on a cluster of pods and TritonModels, against the binder itself
(the simulated API server serving the chart's CRD, the official client): the CLI counts every
replica the binder charges, says of a pending pod what the binder said, explains a TritonModel
replica by replica as the binder placed or would place it, and narrows to a namespace with
`-n` (`-A` for all)."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from binder.cli.main import main as cli
from binder.cli.views import explain_target
from common.hosted import SLEEPING_REASON, host_label, loaded_condition
from sim.apiserver import ApiServerSettings, RunningApiServer, start_in_thread
from tests.binder.objects import GI, KEYS, pod_obj
from tests.binder.simcluster import MakeBinder, add_node, add_pod, eventually, node_of
from tests.deploy.rendering import CHART
from tests.fixtures_sim import PlacementKeys

GROUP, VERSION, PLURAL = "tritonshare.io", "v1alpha1", "tritonmodels"


@pytest.fixture
def apiserver() -> Iterator[RunningApiServer]:
    """The simulated API server serving the chart's CRDs (overrides tests.fixtures_sim's)."""
    server = start_in_thread(settings=ApiServerSettings(crds=(CHART / "crds",)))
    try:
        yield server
    finally:
        server.stop()


def _model(name: str, replicas: int, gpu_memory: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TritonModel",
        "metadata": {"name": name},
        "spec": {
            "storageUri": "https://models.example.com/big_model.tar.gz",
            "modelName": "big_model",
            "gpuMemory": gpu_memory,
            "replicas": replicas,
        },
    }


def _cli(kubeconfig: Path, keys: PlacementKeys, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    argv = ["--kubeconfig", str(kubeconfig), "--placement-key-dir", str(keys.directory)]
    code = cli([*argv, *args], out=out)
    return code, out.getvalue()


def _gpu_rows(text: str) -> dict[str, list[str]]:
    """`status`'s GPU rows by UUID."""
    rows = [re.split(r"\s{2,}", line) for line in text.splitlines()]
    return {row[3]: row for row in rows if row[0] == "gpu-1" and len(row) == 12}


async def test_status_and_explain_count_every_replica_as_the_binder_does(
    kubeconfig: Path,
    kube_api: kubernetes.client.ApiClient,
    core: Any,
    make_binder: MakeBinder,
    placement_keys: PlacementKeys,
) -> None:
    custom: Any = kubernetes.client.CustomObjectsApi(kube_api)
    add_node(kube_api, "gpu-1", [15 * GI, 15 * GI])
    await make_binder()
    custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, _model("big", 1, "14Gi")
    )

    def placements() -> list[dict[str, Any]]:
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "big")
        found: list[dict[str, Any]] = (obj.get("status") or {}).get("placements") or []
        return found

    [replica] = await eventually(placements, what="the replica placed")
    add_pod(core, "pod-14", mem="14Gi", model="resnet")
    await eventually(lambda: node_of(core, "pod-14"), what="pod-14 bound")
    add_pod(core, "pod-2", mem="2Gi", model="bert")

    def refused() -> str:
        pod = core.read_namespaced_pod("pod-2", "default")
        for condition in pod.status.conditions or []:
            if condition.type == "PodScheduled" and condition.status == "False":
                return str(condition.message)
        return ""

    said = await eventually(refused, what="pod-2 refused")
    assert "Insufficient GPU memory (largest free block 1Gi)" in said, said

    # status: both GPUs allocated 14Gi, the replica named on its GPU beside the pod on the other.
    code, text = _cli(kubeconfig, placement_keys, "status")
    assert code == 0, text
    rows = _gpu_rows(text)
    pod_gpu = core.read_namespaced_pod("pod-14", "default").metadata.annotations[
        "tritonshare.io/gpu"
    ]
    assert {uuid: row[6] for uuid, row in rows.items()} == {replica["gpu"]: "14Gi", pod_gpu: "14Gi"}
    assert {uuid: row[9] for uuid, row in rows.items()} == {replica["gpu"]: "1Gi", pod_gpu: "1Gi"}
    assert rows[replica["gpu"]][11] == "default/big replica 0: big_model (asks 14Gi)"
    assert rows[pod_gpu][11] == "default/pod-14: resnet (asks 14Gi)"
    assert "1 pod pending" in text, text
    code, data = _cli(kubeconfig, placement_keys, "status", "-o", "json")
    document = json.loads(data)
    assert document["allocated"] == 28 * GI and document["pending"] == ["default/pod-2"]

    # explain of the pending pod: the binder's own words, no place where the binder found none.
    code, text = _cli(kubeconfig, placement_keys, "explain", "pod-2")
    assert code == 0, text
    assert "would place it now" not in text, text
    fits_nowhere = next(line for line in text.splitlines() if line.startswith("It fits nowhere"))
    assert fits_nowhere == f"It fits nowhere now: {said}"

    # explain of the TritonModel, three ways of naming it: placed where its status says, and
    # not served as its status says (no agent here to load it).
    placed = (
        f"Replica 0 is placed on node gpu-1, GPU {_index(rows, replica['gpu'])} "
        f"({replica['gpu']}), model host pod {replica['host']}; not served: not loaded on its "
        f"model host yet."
    )
    for words in (["tm/big"], ["tritonmodel", "big"], ["big"], ["tm/default/big"]):
        code, text = _cli(kubeconfig, placement_keys, "explain", *words)
        assert code == 0, (words, text)
        assert text.splitlines() == [
            "TritonModel default/big asks for 14Gi of GPU memory per replica for model "
            "big_model; 1 wanted.",
            placed,
        ], words
    code, _ = _cli(kubeconfig, placement_keys, "explain", "tm/absent")
    assert code == 1

    # Scaled to 2: the second replica fits nowhere, for the binder and the CLI alike.
    custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, "default", PLURAL, "big", {"spec": {"replicas": 2}}
    )

    def placed_condition() -> str:
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "big")
        for condition in (obj.get("status") or {}).get("conditions") or []:
            if condition["type"] == "Placed" and condition["status"] == "False":
                return str(condition["message"])
        return ""

    binder_says = await eventually(placed_condition, what="replica 1 refused")
    code, text = _cli(kubeconfig, placement_keys, "explain", "tm/big", "-o", "json")
    document = json.loads(text)
    [first, second] = document["placements"]
    assert first["placed"]["gpu"] == replica["gpu"]
    assert second["decision"] is None
    assert second["message"] in binder_says, (second, binder_says)


def _index(rows: dict[str, list[str]], uuid: str) -> str:
    return rows[uuid][2]


async def test_status_narrows_to_a_namespace(
    kubeconfig: Path,
    kube_api: kubernetes.client.ApiClient,
    core: Any,
    make_binder: MakeBinder,
    placement_keys: PlacementKeys,
) -> None:
    add_node(kube_api, "gpu-1", [15 * GI, 15 * GI])
    core.create_namespace({"metadata": {"name": "team-b"}})
    await make_binder()
    add_pod(core, "mine", mem="2Gi", model="resnet")
    theirs = pod_obj("theirs", mem="3Gi", model="bert", namespace="team-b")
    del theirs["metadata"]["uid"], theirs["metadata"]["creationTimestamp"]
    core.create_namespaced_pod("team-b", theirs)
    await eventually(
        lambda: (
            node_of(core, "mine") and core.read_namespaced_pod("theirs", "team-b").spec.node_name
        ),
        what="both bound",
    )
    _, every = _cli(kubeconfig, placement_keys, "status")
    _, also_every = _cli(kubeconfig, placement_keys, "status", "-A")
    assert "default/mine" in every and "team-b/theirs" in every
    assert every == also_every
    code, narrowed = _cli(kubeconfig, placement_keys, "status", "-n", "team-b")
    assert code == 0
    assert "team-b/theirs" in narrowed and "default/mine" not in narrowed, narrowed
    # The GPU figures stay the node's: GPUs are shared by every namespace.
    assert sorted(r[6] for r in _gpu_rows(narrowed).values()) == sorted(
        r[6] for r in _gpu_rows(every).values()
    )
    _, data = _cli(kubeconfig, placement_keys, "status", "-n", "default", "-o", "json")
    pods = [p["pod"] for n in json.loads(data)["nodes"] for g in n["gpus"] for p in g["pods"]]
    assert pods == ["default/mine"]


@pytest.mark.parametrize(
    ("words", "target"),
    [
        (["web-0"], ("", "", "web-0")),
        (["models/web-0"], ("", "models", "web-0")),
        (["pod/web-0"], ("pod", "", "web-0")),
        (["po/models/web-0"], ("pod", "models", "web-0")),
        (["tm/add-one"], ("tritonmodel", "", "add-one")),
        (["TritonModel", "add-one"], ("tritonmodel", "", "add-one")),
        (["tritonmodels/team-a/add-one"], ("tritonmodel", "team-a", "add-one")),
    ],
)
def test_explain_reads_names_as_kubectl_does(
    words: list[str], target: tuple[str, str, str]
) -> None:
    assert explain_target(words) == target


@pytest.mark.parametrize("words", [["a", "b"], ["a/b/c"], ["tm/"], ["x/"]])
def test_explain_refuses_what_names_nothing(words: list[str]) -> None:
    with pytest.raises(ValueError, match="write POD, NAMESPACE/POD"):
        explain_target(words)


async def test_status_says_asleep_what_the_agent_reports_asleep_not_what_is_unmeasured(
    kubeconfig: Path,
    kube_api: kubernetes.client.ApiClient,
    core: Any,
    make_binder: MakeBinder,
    placement_keys: PlacementKeys,
) -> None:
    """An on-demand model the node has not measured yet is loading, not asleep: `asleep` is the
    agent's ModelSleeping condition, on a model pod or on the replica's host."""
    custom: Any = kubernetes.client.CustomObjectsApi(kube_api)
    add_node(kube_api, "gpu-1", [15 * GI])
    await make_binder()
    model = _model("lazy", 1, "2Gi")
    model["spec"]["residency"] = "on-demand"
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model)
    add_pod(core, "pod-od", mem="1Gi", model="bert", annotations={KEYS.residency: "on-demand"})
    await eventually(lambda: node_of(core, "pod-od"), what="the pod bound")

    def host() -> Any:
        hosts = core.list_namespaced_pod("default", label_selector=f"{host_label(KEYS)}=true")
        return hosts.items[0] if hosts.items else None

    host_pod = await eventually(host, what="the replica's host")

    def shown() -> tuple[str, dict[str, bool]]:
        code, text = _cli(kubeconfig, placement_keys, "status")
        assert code == 0, text
        [row] = _gpu_rows(text).values()
        _, data = _cli(kubeconfig, placement_keys, "status", "-o", "json")
        [gpu] = json.loads(data)["nodes"][0]["gpus"]
        return row[11], {p["pod"]: p["asleep"] for p in gpu["pods"]}

    text, asleep = shown()
    assert "default/pod-od: bert (asks 1Gi, on-demand)" in text, text
    assert "default/lazy replica 0: big_model (asks 2Gi, on-demand)" in text, text
    assert asleep == {"default/pod-od": False, "default/lazy/0": False}

    sleeping = {"status": "False", "reason": SLEEPING_REASON, "message": "asleep"}
    core.patch_namespaced_pod_status(
        "pod-od", "default", {"status": {"conditions": [{"type": KEYS.model_loaded, **sleeping}]}}
    )
    replica = {"type": loaded_condition(KEYS, "lazy", 0), **sleeping}
    core.patch_namespaced_pod_status(
        host_pod.metadata.name, "default", {"status": {"conditions": [replica]}}
    )
    text, asleep = shown()
    assert "default/pod-od: bert (asks 1Gi, on-demand, asleep)" in text, text
    assert "default/lazy replica 0: big_model (asks 2Gi, on-demand, asleep)" in text, text
    assert asleep == {"default/pod-od": True, "default/lazy/0": True}


async def test_explain_names_the_quota_that_refuses_a_replica(
    kubeconfig: Path,
    kube_api: kubernetes.client.ApiClient,
    core: Any,
    make_binder: MakeBinder,
    placement_keys: PlacementKeys,
) -> None:
    """A replica the namespace's GPU-memory quota refuses is said refused by it, in the
    binder's words, never "would place it now" on a node with room."""
    custom: Any = kubernetes.client.CustomObjectsApi(kube_api)
    add_node(kube_api, "gpu-1", [15 * GI, 15 * GI])
    core.create_namespaced_resource_quota(
        "default",
        {
            "metadata": {"name": "gpu"},
            "spec": {"hard": {"requests.tritonshare.io/gpu-mem": "16Gi"}},
        },
    )
    await make_binder()
    custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, _model("big", 2, "10Gi")
    )

    def placed_condition() -> dict[str, Any]:
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "big")
        found = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}
        return found.get("Placed") or {}

    placed = await eventually(
        lambda: placed_condition().get("reason") == "ExceededQuota" and placed_condition(),
        what="replica 1 refused by the quota",
    )
    code, text = _cli(kubeconfig, placement_keys, "explain", "tm/big")
    assert code == 0, text
    assert "would place it now" not in text, text
    [refused] = [line for line in text.splitlines() if line.startswith("Replica 1")]
    assert refused.startswith("Replica 1 is refused by its namespace's quota: "), refused
    assert "exceeded quota: gpu" in refused, (refused, placed["message"])
