"""An unload under way is no exit of Triton, through a real Triton and a real agent: a model
whose unload Triton holds open (its instance's finalize, as a long queue delay holds it) after
its pod is deleted, within its load's settling window, is neither counted nor suspected as a
crash, and no namespace is held for it (agent/models/aftercrash.py, agent/models/loads.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import grpc
import kubernetes.client
import pytest

from agent.triton import UNLOADING
from protos import agent_pb2
from sim.apiserver import RunningApiServer
from sim.triton import TritonServer
from tests.agent.conftest import StartAgent, bearer, eventually, install_dir, make_pod
from tests.agent.models.test_residency import SLOW_UNLOAD
from tests.conftest import copy_model

pytestmark = [pytest.mark.triton, pytest.mark.slow]

CRASHES = "tritonshare_agent_triton_crashes_suspected_total"


async def test_a_slow_unload_after_the_pod_is_deleted_is_no_crash(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The unload outlasts the agent's wait for it: the model stays UNLOADING with no unload of
    # the agent's under way, and its load's marker is still settling.
    running = await start_custom_agent(unload_timeout_seconds=1.0, crash_settle_seconds=60.0)
    release = tmp_path / "release"
    source = copy_model("add_one", tmp_path / "slow", as_name="slow")
    (source / "1" / "model.py").write_text(SLOW_UNLOAD.replace("RELEASE", str(release)))
    gpu = running.mock.gpus[0].uuid
    make_pod(kube_api, "slow", "slow", gpu_uuid=gpu, phase="Running")
    token = apiserver.mint_token("default", "slow")
    await install_dir(running.stub, token, source, "slow")
    loaded = await running.stub.LoadModel(
        agent_pb2.LoadModelRequest(model_id="slow"), metadata=bearer(token)
    )
    assert loaded.state == agent_pb2.MODEL_STATE_READY, loaded.reason
    name = loaded.triton_name or next(iter(running.agent.models.owners.all()))
    caplog.set_level(logging.WARNING)
    try:
        # The pod's proxy asks for the unload as it stops; the pod is then gone.
        with pytest.raises(grpc.aio.AioRpcError):
            await running.stub.UnloadModel(
                agent_pb2.UnloadModelRequest(model_id="slow"), metadata=bearer(token)
            )
        core: Any = kubernetes.client.CoreV1Api(kube_api)
        core.delete_namespaced_pod("slow", "default", grace_period_seconds=0)
        assert (await running.agent.triton.state(name)) is not None
        passes = running.agent.reconciler.passes
        await eventually(
            lambda: running.agent.reconciler.passes >= passes + 6,
            limit=60,
            what="reconcile passes while Triton unloads the model",
        )
        entry = await running.agent.triton.state(name)
        assert entry is not None and entry.state == UNLOADING, entry
    finally:
        release.touch()
    await eventually(
        lambda: not running.agent.crashes.markers(), limit=60, what="the marker answered"
    )
    assert not triton.exited()
    registry = running.agent.metrics.registry
    assert not registry.get_sample_value(CRASHES), "no crash suspected"
    assert running.agent.crashes.records() == []
    assert running.agent.crashes.namespaces() == []
    said = [r.getMessage() for r in caplog.records if "Triton exited" in r.getMessage()]
    assert said == []
