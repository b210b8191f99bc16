"""`tritonshare status|explain -o json|yaml`: the same figures as the table, for scripts."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import kubernetes.client
import yaml

from binder.cli.main import main as cli
from tests.binder.objects import GI
from tests.binder.simcluster import MakeBinder, add_node, add_pod, eventually, node_of


def run_cli(kubeconfig: Path, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = cli(["--kubeconfig", str(kubeconfig), *args], out=out)
    return code, out.getvalue()


async def test_status_and_explain_as_json_and_yaml(
    kubeconfig: Path, kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI, 16 * GI])
    await make_binder()
    add_pod(core, "resnet", mem="4Gi")
    add_pod(core, "bert", mem="6Gi")
    await eventually(lambda: node_of(core, "resnet") and node_of(core, "bert"))
    add_pod(core, "huge", mem="20Gi")

    code, text = run_cli(kubeconfig, "status", "-o", "json")
    assert code == 0
    status = json.loads(text)
    assert run_cli(kubeconfig, "-o", "yaml", "status") == (
        0,
        yaml.safe_dump(status, sort_keys=False),
    )
    (node,) = status["nodes"]
    assert (node["name"], node["agent"]) == ("gpu-1", "alive")
    full, empty = sorted(node["gpus"], key=lambda g: -len(g["pods"]))
    assert [(p["pod"], p["request"], p["holds"]) for p in full["pods"]] == [
        ("default/bert", 6 * GI, 6 * GI),
        ("default/resnet", 4 * GI, 4 * GI),
    ]
    assert (full["capacity"], full["allocated"], full["free"]) == (16 * GI, 10 * GI, 6 * GI)
    assert (empty["allocated"], empty["free"], empty["pods"]) == (0, 16 * GI, [])
    assert (status["capacity"], status["allocated"]) == (32 * GI, 10 * GI)

    def pending() -> bool:
        pending: list[str] = json.loads(run_cli(kubeconfig, "status", "-o", "json")[1])["pending"]
        return pending == ["default/huge"]

    await eventually(pending, what="the pending pod in the status")
    code, text = run_cli(kubeconfig, "explain", "default/huge", "-o", "json")
    assert code == 0
    explained = json.loads(text)
    assert (explained["pod"], explained["request"], explained["decision"]) == (
        "default/huge", 20 * GI, None,
    )  # fmt: skip
    assert "more than any healthy GPU in the cluster offers" in explained["message"]
    (verdict,) = explained["nodes"]
    assert (verdict["node"], verdict["fits"], verdict["free"]) == (
        "gpu-1",
        False,
        [6 * GI, 16 * GI],
    )
    code, text = run_cli(kubeconfig, "explain", "default/resnet", "-o", "yaml")
    assert yaml.safe_load(text)["bound"]["node"] == "gpu-1"


def test_an_unknown_output_is_refused_with_the_choices(kubeconfig: Path) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli(["--kubeconfig", str(kubeconfig), "status", "-o", "wide"], out=io.StringIO())
    assert code == 2
    assert "--output" in err.getvalue() and "'json'" in err.getvalue()


async def test_status_reads_the_reserve_the_binder_leader_places_with(
    kubeconfig: Path, kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    """No --gpu-mem-reserve: the CLI counts with the binder's own reserve, from its leader Lease;
    a flag given by hand still wins, and the footer says when the two differ."""
    add_node(kube_api, "gpu-1", [16 * GI])
    _, text = run_cli(kubeconfig, "status")
    assert "GPU memory reserve 0 per GPU (no binder leader has published its own" in text
    await make_binder(leader_elect=True, gpu_mem_reserve=2 * GI)

    def published() -> dict[str, Any] | None:
        document: dict[str, Any] = json.loads(run_cli(kubeconfig, "status", "-o", "json")[1])
        return document if document["reserve"] == 2 * GI else None

    document = await eventually(published, what="the leader's reserve in the status")
    assert document["nodes"][0]["gpus"][0]["capacity"] == 14 * GI
    _, text = run_cli(kubeconfig, "status", "-v")
    assert "GPU memory reserve 2Gi per GPU (as the binder leader publishes it)." in text
    assert "what each agent last published" in text
    # Without -v the figures stand alone: no note repeated on every call while all agree.
    _, text = run_cli(kubeconfig, "status")
    assert "GPU memory reserve" not in text and "last published" not in text
    _, text = run_cli(kubeconfig, "status", "--gpu-mem-reserve", "1Gi")
    assert "reserve 1Gi per GPU (from --gpu-mem-reserve; the binder leader places with 2Gi)" in text


async def test_a_model_the_agent_refused_shows_why_and_keeps_its_allocation(
    kubeconfig: Path, kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    """The loader's termination message (the agent's refusal) is shown beside the pod; the pod
    keeps its allocation, as the binder keeps counting it while the pod exists."""
    add_node(kube_api, "gpu-1", [16 * GI])
    await make_binder()
    add_pod(core, "custom", mem="4Gi")
    add_pod(core, "fine", mem="2Gi")
    await eventually(lambda: node_of(core, "custom") and node_of(core, "fine"))
    refusal = "TenantCodeNotAllowed: model 'custom' would run its own code inside the shared Triton"
    terminated = {"exitCode": 4, "reason": "Error", "message": refusal}
    core.patch_namespaced_pod_status(
        "custom",
        "default",
        {"status": {"initContainerStatuses": [
            {"name": "loader", "state": {"waiting": {"reason": "CrashLoopBackOff"}},
             "lastState": {"terminated": terminated}, "restartCount": 2, "image": "ts",
             "imageID": "", "ready": False},
        ]}},
        _preload_content=False,
    )  # fmt: skip
    core.patch_namespaced_pod_status(
        "fine",
        "default",
        {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        _preload_content=False,
    )
    document = json.loads(run_cli(kubeconfig, "status", "-o", "json")[1])
    pods = {p["pod"]: p for p in document["nodes"][0]["gpus"][0]["pods"]}
    assert pods["default/custom"]["load"] == {"state": "failed", "message": f"loader: {refusal}"}
    assert pods["default/fine"]["load"] == {"state": "serving", "message": ""}
    assert document["allocated"] == 6 * GI
    _, text = run_cli(kubeconfig, "status")
    assert f"  default/custom on gpu-1: failed: loader: {refusal}" in text
    assert "default/fine on" not in text


def test_a_pod_whose_model_is_not_served_says_why_in_its_load_state() -> None:
    from binder.cli.report import load_state

    pod = {
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "False"},
                {
                    "type": "tritonshare.io/ModelLoaded",
                    "status": "False",
                    "reason": "ModelMissing",
                    "message": "model m is missing on the node",
                },
            ],
            "initContainerStatuses": [{"name": "loader", "state": {"terminated": {"exitCode": 0}}}],
        }
    }
    assert load_state(pod) == ("not served", "ModelMissing: model m is missing on the node")
    pod["status"]["conditions"][1]["status"] = "True"  # type: ignore[index]
    assert load_state(pod) == ("starting", "")
