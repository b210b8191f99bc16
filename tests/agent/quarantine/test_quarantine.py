"""Crash quarantine through a real Triton: a model whose load kills Triton is counted, loaded
again last and alone, and quarantined on the node after `--crash-quarantine-after` crashes in a
row; the node's other model is served again; the pod, the Events and the metrics say so; the
record survives an agent restart."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import kubernetes.client
import pytest

from agent.quarantine.crashledger import Marker
from agent.triton import READY
from binder.cli.main import main as cli
from protos import agent_pb2
from sim.apiserver import RunningApiServer
from sim.crashers import load_killer
from sim.triton import TritonServer, free_port
from tests.agent.conftest import (
    NODE,
    StartAgent,
    bearer,
    eventually,
    install_dir,
    make_pod,
    name_in_triton,
)
from tests.conftest import copy_model

pytestmark = [pytest.mark.triton, pytest.mark.slow]

CONDITION = "tritonshare.io/ModelLoaded"
QUARANTINED = "tritonshare_agent_quarantined_models"

KILLER = load_killer()


@contextlib.asynccontextmanager
async def kubelet_restarts(triton: TritonServer) -> AsyncIterator[list[int]]:
    """Restart Triton whenever it exits, as the kubelet restarts a crashed container; yields the
    list of exits (one entry each, added as soon as one is seen). A thread of its own, as the
    kubelet is a process of its own: a test may stall the agent's event loop."""
    restarts: list[int] = []
    stop = threading.Event()

    def supervise() -> None:
        while not stop.wait(0.05):
            if triton.exited():
                restarts.append(1)  # before the agent can count it: that needs Triton back
                triton.restart()

    thread = threading.Thread(target=supervise, name="kubelet-restarts", daemon=True)
    thread.start()
    try:
        yield restarts
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 60)


def killer_model(root: Path) -> Path:
    source = copy_model("add_one", root, as_name="killer")
    (source / "1" / "model.py").write_text(KILLER)
    return source


async def deploy(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    stub: Any,
    gpu: str,
    source: Path,
    model_id: str,
) -> str:
    """A Running pod whose loader installed its model; returns its token."""
    make_pod(kube_api, f"{model_id}-pod", model_id, gpu_uuid=gpu, phase="Running")
    token = apiserver.mint_token("default", f"{model_id}-pod")
    await install_dir(stub, token, source, model_id)
    return token


def pod_of(api: kubernetes.client.ApiClient, name: str) -> Any:
    return kubernetes.client.CoreV1Api(api).read_namespaced_pod(name, "default")


def events(api: kubernetes.client.ApiClient, pod: str) -> list[tuple[str, str]]:
    core: Any = kubernetes.client.CoreV1Api(api)
    found = core.list_namespaced_event("default", field_selector=f"involvedObject.name={pod}")
    return [(e.reason, e.message) for e in found.items]


def quarantine_shown(api: kubernetes.client.ApiClient) -> list[dict[str, Any]]:
    """The node's `quarantined` annotation, as the agent writes it."""
    node: Any = kubernetes.client.CoreV1Api(api).read_node(NODE)
    shown = (node.metadata.annotations or {}).get("tritonshare.io/quarantined") or "[]"
    return list(json.loads(shown))


def run_cli(kubeconfig: Path, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = cli(["--kubeconfig", str(kubeconfig), *args], out=out)
    return code, out.getvalue()


def condition(api: kubernetes.client.ApiClient, pod: str) -> tuple[str, str, str]:
    for c in pod_of(api, pod).status.conditions or []:
        if c.type == CONDITION:
            return c.status, c.reason, c.message
    return "", "", ""


async def test_a_model_whose_load_kills_triton_is_quarantined_and_the_other_is_served(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    kubeconfig: Path,
    tmp_path: Path,
) -> None:
    fast = {"crash_quarantine_after": 2, "lease_renew_seconds": 0.5}
    running = await start_custom_agent(**fast)
    gpu = running.mock.gpus[0].uuid
    good_source = copy_model("add_one", tmp_path / "src", as_name="good")
    good_token = await deploy(apiserver, kube_api, running.stub, gpu, good_source, "good")
    loaded = await running.stub.LoadModel(
        agent_pb2.LoadModelRequest(model_id="good"), metadata=bearer(good_token)
    )
    assert loaded.state == agent_pb2.MODEL_STATE_READY, loaded.reason
    good, killer = name_in_triton(kube_api, "good-pod", "good"), ""

    async def good_ready() -> bool:
        entry = await running.agent.triton.state(good)
        return entry is not None and entry.state == READY

    async with kubelet_restarts(triton) as restarts:
        killer_token = await deploy(
            apiserver, kube_api, running.stub, gpu, killer_model(tmp_path / "src"), "killer"
        )
        killer = name_in_triton(kube_api, "killer-pod", "killer")
        with pytest.raises(grpc.aio.AioRpcError):
            await running.stub.LoadModel(
                agent_pb2.LoadModelRequest(model_id="killer"), metadata=bearer(killer_token)
            )
        registry = running.agent.metrics.registry
        labels = {"model_namespace": "default", "model_id": "killer"}

        owned = running.agent.owners.get(killer)
        assert owned is not None
        labels["digest"] = owned.digest

        def quarantined() -> bool:
            return registry.get_sample_value(QUARANTINED, labels) == 1

        await eventually(quarantined, limit=90, what="the killer model quarantined")
        assert len(restarts) == 2, "the second crash quarantines it (--crash-quarantine-after 2)"
        await eventually(good_ready, limit=60, what="the other model served again")

        # Quarantined: several passes later, it has not been loaded again.
        passes = running.agent.reconciler.passes
        await eventually(
            lambda: running.agent.reconciler.passes >= passes + 3, what="three more passes"
        )
        assert len(restarts) == 2
        assert await good_ready()
        entry = await running.agent.triton.state(killer)
        assert entry is None or entry.state != READY
        await eventually(
            lambda: condition(kube_api, "killer-pod")[:2] == ("False", "ModelCrashedTriton"),
            what="the pod's ModelLoaded condition naming the crashes",
        )
        message = condition(kube_api, "killer-pod")[2]
        assert "2 times in a row" in message and "quarantine" in message
        warned = [m for r, m in events(kube_api, "killer-pod") if r == "ModelCrashedTriton"]
        assert warned and "exited unexpectedly 2 times" in warned[0]
        assert condition(kube_api, "good-pod")[:2] != ("False", "ModelCrashedTriton")

        # The pod itself (its loader retrying, a restarted proxy) is refused, saying why.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await running.stub.LoadModel(
                agent_pb2.LoadModelRequest(model_id="killer"), metadata=bearer(killer_token)
            )
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "quarantined on this node" in (refused.value.details() or "")

        # An agent restart (or a node pod replacement: the state directory is the node's)
        # keeps the quarantine.
        await running.stop()
        second = await start_custom_agent(**fast)
        registry = second.agent.metrics.registry
        running = second
        assert quarantined()
        passes = second.agent.reconciler.passes
        await eventually(lambda: second.agent.reconciler.passes >= passes + 3, what="passes")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await second.stub.LoadModel(
                agent_pb2.LoadModelRequest(model_id="killer"), metadata=bearer(killer_token)
            )
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert len(restarts) == 2, "never loaded again, whoever asks"
        assert await good_ready()

        # A node pod replacement starts with an empty state directory: the quarantine comes
        # back from the Node before the new agent serves.
        await eventually(lambda: bool(quarantine_shown(kube_api)), what="the Node's annotation")
        directory = second.agent.owners.directory
        await second.stop()
        (directory / "crashes.json").unlink()
        third = await start_custom_agent(**fast)
        registry = third.agent.metrics.registry
        assert quarantined(), "taken back from the Node"
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await third.stub.LoadModel(
                agent_pb2.LoadModelRequest(model_id="killer"), metadata=bearer(killer_token)
            )
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        second = running = third

        # The operator sees it in `tritonshare status` and lifts it; the model's files are
        # quarantined, not its pod: the pod gone, the quarantine stays until lifted.
        kubernetes.client.CoreV1Api(kube_api).delete_namespaced_pod(
            "killer-pod", "default", grace_period_seconds=0
        )
        await eventually(
            lambda: [q["model"] for q in quarantine_shown(kube_api)] == ["default/killer"],
            what="the node's quarantined annotation",
        )
        code, out = await asyncio.to_thread(run_cli, kubeconfig, "status")
        assert code == 0 and f"default/killer on {NODE}: 2 crashes in a row" in out, out
        code, out = await asyncio.to_thread(
            run_cli, kubeconfig, "quarantine", "clear", NODE, "default/killer"
        )
        assert code == 0, out
        await eventually(lambda: not quarantined(), what="the quarantine lifted")
        await eventually(lambda: not quarantine_shown(kube_api), what="the annotation removed")
        node: Any = kubernetes.client.CoreV1Api(kube_api).read_node(NODE)
        assert "tritonshare.io/quarantine-clear" not in (node.metadata.annotations or {})
        assert not second.agent.crashes.records()


LATE_KILLER = load_killer(0.5)


async def test_a_model_that_kills_triton_just_after_its_load_is_quarantined_too(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    """Its loads are answered READY; Triton dies half a second later, inside the settling
    window (--crash-settle-seconds), so the crash is still its own."""
    running = await start_custom_agent(crash_quarantine_after=2, crash_settle_seconds=10.0)
    source = copy_model("add_one", tmp_path / "src", as_name="late")
    (source / "1" / "model.py").write_text(LATE_KILLER)
    gpu = running.mock.gpus[0].uuid
    token = await deploy(apiserver, kube_api, running.stub, gpu, source, "late")
    late = name_in_triton(kube_api, "late-pod", "late")
    owned = running.agent.owners.get(late)
    assert owned is not None
    async with kubelet_restarts(triton) as restarts:
        loaded = await running.stub.LoadModel(
            agent_pb2.LoadModelRequest(model_id="late"), metadata=bearer(token)
        )
        assert loaded.state == agent_pb2.MODEL_STATE_READY, "its load succeeds"
        await eventually(
            lambda: running.agent.crashes.quarantined(owned.digest) is not None,
            limit=90,
            what="the model quarantined",
        )
        assert len(restarts) == 2
        passes = running.agent.reconciler.passes
        await eventually(lambda: running.agent.reconciler.passes >= passes + 3, what="passes")
        assert len(restarts) == 2, "not loaded again"


async def test_a_load_that_never_reached_triton_is_not_counted_as_a_crash(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    """After another tenant's model took Triton down, the agent loads the node's models again
    while Triton starts: its gRPC port may refuse them (or the agent's channel fail fast in its
    reconnect backoff) while its HTTP index already answers. Such a load never reached Triton,
    so nothing of it can have crashed Triton: counting it would quarantine the victim's own
    model for the attacker's crash. Here Triton's gRPC port is one nobody listens on."""
    running = await start_custom_agent(
        crash_quarantine_after=2, triton_grpc_url=f"127.0.0.1:{free_port()}"
    )
    gpu = running.mock.gpus[0].uuid
    source = copy_model("add_one", tmp_path / "src", as_name="victim")
    token = await deploy(apiserver, kube_api, running.stub, gpu, source, "victim")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await running.stub.LoadModel(
            agent_pb2.LoadModelRequest(model_id="victim"), metadata=bearer(token)
        )
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    passes = running.agent.reconciler.passes
    # Passes that find the model not loaded and no load in flight (and try it again).
    await eventually(lambda: running.agent.reconciler.passes >= passes + 2, what="two passes")
    assert running.agent.crashes.records() == []
    assert condition(kube_api, "victim-pod")[1] != "ModelCrashedTriton"


async def test_a_load_triton_died_under_counts_when_its_pod_asks_again_before_any_pass(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    """A crashing pod's loader asks for its load again as soon as Triton is back, before any
    reconcile pass finds Triton up with no load under way: the load Triton died under (its
    marker left over) counts then, so the pod cannot take Triton down again and again without
    ever being counted. Here the marker is left as a load Triton died under leaves it."""
    running = await start_custom_agent(crash_quarantine_after=1, resync_seconds=3600)
    gpu = running.mock.gpus[0].uuid
    source = copy_model("add_one", tmp_path / "src", as_name="crashy")
    token = await deploy(apiserver, kube_api, running.stub, gpu, source, "crashy")
    name = name_in_triton(kube_api, "crashy-pod", "crashy")
    owned = running.agent.owners.get(name)
    assert owned is not None
    running.agent.crashes.loading(Marker(name, owned.digest, "crashy", "default/crashy-pod"))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await running.stub.LoadModel(
            agent_pb2.LoadModelRequest(model_id="crashy"), metadata=bearer(token)
        )
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "quarantined" in (refused.value.details() or "")
    assert [r.crashes for r in running.agent.crashes.records()] == [1]
