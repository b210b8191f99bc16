"""Every pod whose model is quarantined says so, whatever its phase, through a real Triton: a
first-load crasher still in its loader gets the condition and the Event; a ReplicaSet's pod is
then marked Failed, and the binder no longer charges its GPU memory; its replacement, with the
same files, is refused at install with the quarantine's reason (the loader shows it) and never
reaches Triton. The operator lists the quarantine, and clearing it is refused while the replacement
still wants the same files, unless forced."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import kubernetes.client
import pytest

from agent.quarantine.crashledger import Marker
from loader.errors import INSTALL, LOAD, classify
from protos import agent_pb2
from sim.apiserver import RunningApiServer
from sim.triton import TritonServer
from tests.agent.conftest import (
    NODE,
    StartAgent,
    bearer,
    eventually,
    install_dir,
    make_pod,
    name_in_triton,
)
from tests.agent.quarantine.test_quarantine import (
    condition,
    events,
    killer_model,
    kubelet_restarts,
    pod_of,
    quarantine_shown,
    run_cli,
)
from tests.conftest import copy_model
from tests.fixtures_sim import sign_placement

pytestmark = [pytest.mark.triton, pytest.mark.slow]

GIB = 1024**3
CRASHED = ("False", "ModelCrashedTriton")


def replica(api: kubernetes.client.ApiClient, name: str, model_id: str, gpu: str) -> None:
    """A pod of ReplicaSet `<model_id>-rs` bound to the node, in its loader (Pending), with a
    1 GiB GPU memory limit and the binder's proof."""
    body: Any = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": {"tritonshare.io/model-id": model_id, "tritonshare.io/gpu": gpu},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{model_id}-rs",
                    "uid": f"{model_id}-rs-uid",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "nodeName": NODE,
            "schedulerName": "tritonshare",
            "initContainers": [{"name": "loader", "image": "tritonshare/loader"}],
            "containers": [
                {
                    "name": "proxy",
                    "image": "tritonshare/proxy",
                    "resources": {"limits": {"tritonshare.io/gpu-mem": "1Gi"}},
                }
            ],
        },
    }
    kubernetes.client.CoreV1Api(api).create_namespaced_pod("default", body)
    sign_placement(api, "default", name, request=GIB)


def charged(kubeconfig: Path) -> dict[str, int]:
    """Pod -> the GPU memory `tritonshare status` (the binder's ledger) charges it."""
    code, out = run_cli(kubeconfig, "status", "-o", "json")
    assert code == 0, out
    found = {}
    for node in json.loads(out)["nodes"]:
        for gpu in node["gpus"]:
            for pod in gpu["pods"]:
                found[str(pod["pod"])] = int(pod["request"])
    return found


async def refusal(call: Any) -> grpc.aio.AioRpcError | None:
    try:
        await call
    except grpc.aio.AioRpcError as e:
        return e
    return None


async def test_a_replicasets_first_load_crasher_is_marked_failed_and_its_replacement_refused(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    kubeconfig: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    running = await start_custom_agent(crash_quarantine_after=2, lease_renew_seconds=0.5)
    gpu = running.mock.gpus[0].uuid
    source = killer_model(tmp_path / "src")
    replica(kube_api, "killer-0", "killer", gpu)
    token = apiserver.mint_token("default", "killer-0")
    assert "default/killer-0" in charged(kubeconfig)

    async with kubelet_restarts(triton) as restarts:
        # Its loader, restarted by the kubelet after each failure: install, then load, until
        # the agent refuses it saying why or marks the pod Failed (the kubelet then stops it).
        last = ""

        async def loader_stops() -> bool:
            nonlocal last
            if pod_of(kube_api, "killer-0").status.phase == "Failed":
                return True
            failed = await refusal(install_dir(running.stub, token, source, "killer"))
            if failed is None:
                load = running.stub.LoadModel(
                    agent_pb2.LoadModelRequest(model_id="killer"), metadata=bearer(token)
                )
                failed = await refusal(load)
            details = (failed.details() or "") if failed is not None else ""
            if failed is not None and "quarantined on this node" in details:
                phase = INSTALL if details.startswith("InstallModel") else LOAD
                last = str(classify(failed.code(), details, phase))
                return True
            await asyncio.sleep(0.2)
            return False

        await eventually(loader_stops, limit=120, what="the crasher's loader stopped")
        assert len(restarts) == 2, "--crash-quarantine-after 2"
        assert not last or ("quarantined on this node" in last and "clear" in last), last

        # The condition and the Event, then Failed: its ReplicaSet replaces it.
        await eventually(
            lambda: pod_of(kube_api, "killer-0").status.phase == "Failed", what="Failed"
        )
        status = pod_of(kube_api, "killer-0").status
        assert status.reason == "ModelCrashedTriton"
        assert "quarantined on this node" in status.message
        assert condition(kube_api, "killer-0")[:2] == CRASHED, "said before it was Failed"
        await eventually(
            lambda: any("quarantined" in m for _, m in events(kube_api, "killer-0")),
            what="the Warning Event",
        )
        assert "default/killer-0" not in charged(kubeconfig), "a Failed pod holds no GPU memory"

        # The replacement, same files: refused at install, before a byte reaches the node.
        replica(kube_api, "killer-1", "killer", gpu)
        token = apiserver.mint_token("default", "killer-1")
        failed = await refusal(install_dir(running.stub, token, source, "killer"))
        assert failed is not None and failed.code() == grpc.StatusCode.FAILED_PRECONDITION
        shown = str(classify(failed.code(), failed.details() or "", INSTALL))
        assert "the agent cannot install the model" in shown
        assert "exited unexpectedly 2 times in a row" in shown and "quarantined" in shown
        await eventually(
            lambda: condition(kube_api, "killer-1")[:2] == CRASHED,
            what="the replacement's condition",
        )
        await eventually(
            lambda: (
                {"ModelCrashedTriton", "ModelNotServed"}
                <= {r for r, _ in events(kube_api, "killer-1")}
            ),
            what="the replacement's Warning Events",
        )
        passes = running.agent.reconciler.passes
        await eventually(lambda: running.agent.reconciler.passes >= passes + 3, what="passes")
        assert len(restarts) == 2, "the replacement never reached Triton"
        assert not (
            running.agent.repository.root / name_in_triton(kube_api, "killer-1", "killer")
        ).exists()
        # Refused, not failed: a Failed replacement would be replaced again, and again.
        assert pod_of(kube_api, "killer-1").status.phase == "Pending"
        assert charged(kubeconfig)["default/killer-1"] == GIB

    # The operator: the quarantine listed, its clearing refused while the replacement wants
    # the same files (it would crash Triton again), done when forced.
    await eventually(
        lambda: [q.get("wanted_by") for q in quarantine_shown(kube_api)] == [["default/killer-1"]],
        what="the Node's annotation naming the replacement",
    )
    code, out = await asyncio.to_thread(run_cli, kubeconfig, "quarantine", "list")
    assert code == 0 and out.splitlines()[1].split()[:3] == [NODE, "files", "default"], out
    assert "2 times in a row; still wanted by default/killer-1" in out
    clear = ("quarantine", "clear", NODE, "default/killer-0")
    code, _ = await asyncio.to_thread(run_cli, kubeconfig, *clear)
    assert code == 1
    assert "pod default/killer-1 on node" in capsys.readouterr().err
    assert running.agent.crashes.records(), "nothing cleared"
    code, out = await asyncio.to_thread(run_cli, kubeconfig, *clear, "--force")
    assert code == 0, out
    await eventually(lambda: not running.agent.crashes.records(), what="the quarantine lifted")


async def test_a_pod_in_its_loader_says_its_files_are_quarantined(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    """No controller: the pod stays in its loader, its condition and Event saying why. The load
    Triton died under is left as such a load leaves it (a marker, the model not in Triton)."""
    running = await start_custom_agent(crash_quarantine_after=1)
    gpu = running.mock.gpus[0].uuid
    source = copy_model("add_one", tmp_path / "src", as_name="crashy")
    make_pod(kube_api, "crashy-pod", "crashy", gpu_uuid=gpu)
    token = apiserver.mint_token("default", "crashy-pod")
    await install_dir(running.stub, token, source, "crashy")
    name = name_in_triton(kube_api, "crashy-pod", "crashy")
    owned = running.agent.owners.get(name)
    assert owned is not None
    running.agent.crashes.loading(Marker(name, owned.digest, "crashy", "default/crashy-pod"))
    failed = await refusal(
        running.stub.LoadModel(
            agent_pb2.LoadModelRequest(model_id="crashy"), metadata=bearer(token)
        )
    )
    assert failed is not None and failed.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert str(classify(failed.code(), failed.details() or "", LOAD)).startswith(
        "the agent refused to load the model: model crashy was being loaded when"
    )
    await eventually(
        lambda: condition(kube_api, "crashy-pod")[:2] == CRASHED, what="the pod's condition"
    )
    assert "quarantined on this node" in condition(kube_api, "crashy-pod")[2]
    await eventually(
        lambda: any(
            r == "ModelNotServed" and "quarantined" in m for r, m in events(kube_api, "crashy-pod")
        ),
        what="the Warning Event",
    )
    assert pod_of(kube_api, "crashy-pod").status.phase == "Pending", "no controller: not Failed"
