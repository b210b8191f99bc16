"""Load quarantine by namespace, through a real Triton and a real agent: after a namespace's
files were quarantined on the node, the same model with one byte more (a new digest) does not
get `--crash-quarantine-after` more crashes. The namespace's new models load as suspects (last,
alone, then a quiet period), and after `--crash-namespace-quarantine-after` more crashes every
new load of the namespace is refused on the node, its pod told why, the Node and `tritonshare
status` showing it, and `quarantine clear NODE NAMESPACE/*` lifting it; another namespace's
model still loads. Before the namespace count, each new version of the files crashed Triton
`--crash-quarantine-after` more times."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import kubernetes.client
import pytest

from protos import agent_pb2
from sim.apiserver import RunningApiServer
from sim.triton import TritonServer
from tests.agent.conftest import NODE, StartAgent, bearer, eventually, install_dir, make_pod
from tests.agent.quarantine.test_quarantine import (
    condition,
    events,
    killer_model,
    kubelet_restarts,
    quarantine_shown,
    run_cli,
)
from tests.conftest import copy_model

pytestmark = [pytest.mark.triton, pytest.mark.slow]


async def test_new_files_of_a_namespace_whose_files_were_quarantined_are_held_and_then_refused(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    kubeconfig: Path,
    tmp_path: Path,
) -> None:
    running = await start_custom_agent(crash_quarantine_after=2, lease_renew_seconds=0.5)
    gpu = running.mock.gpus[0].uuid
    source = killer_model(tmp_path / "src")

    async def deploy(version: int, namespace: str = "default", model: Path = source) -> str:
        """Pod `killer-<version>` with the killer's files and `version` bytes more."""
        pod = f"killer-{version}"
        if version:
            (model / "1" / "model.py").write_text(
                (model / "1" / "model.py").read_text() + "#" * version
            )
        make_pod(kube_api, pod, "killer", gpu_uuid=gpu, phase="Running", namespace=namespace)
        token = apiserver.mint_token(namespace, pod)
        await install_dir(running.stub, token, model, "killer")
        return token

    async def load(token: str) -> Any:
        return await running.stub.LoadModel(
            agent_pb2.LoadModelRequest(model_id="killer"), metadata=bearer(token)
        )

    async with kubelet_restarts(triton) as restarts:
        for version in (0, 1):
            token = await deploy(version)
            with pytest.raises(grpc.aio.AioRpcError):
                await load(token)
            await eventually(
                lambda v=version: any(r.quarantined for r in running.agent.crashes.records()[v:]),
                limit=90,
                what=f"version {version} of the files quarantined",
            )
        # The first version took 2 crashes; the second 2 more, which quarantine the namespace
        # (--crash-namespace-quarantine-after, 2 by default).
        assert len(restarts) == 4
        passes = running.agent.reconciler.passes
        await eventually(lambda: running.agent.reconciler.passes >= passes + 2, what="passes")

        token = await deploy(2)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await load(token)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = refused.value.details() or ""
        assert "namespace default" in details and "quarantine" in details, details
        passes = running.agent.reconciler.passes
        await eventually(lambda: running.agent.reconciler.passes >= passes + 3, what="passes")
        assert len(restarts) == 4, "the namespace's third version never reached Triton"
        warned = [r for r, _ in events(kube_api, "killer-2")]
        assert "NamespaceCrashedTriton" in warned
        await eventually(
            lambda: condition(kube_api, "killer-2")[:2] == ("False", "NamespaceCrashedTriton"),
            what="the pod's condition naming the namespace's quarantine",
        )
        await eventually(
            lambda: any(q.get("cause") == "namespace" for q in quarantine_shown(kube_api)),
            what="the Node's quarantined annotation naming the namespace",
        )
        sample = running.agent.metrics.registry.get_sample_value
        held = {"model_namespace": "default"}
        assert sample("tritonshare_agent_quarantined_namespaces", held) == 1
        code, out = await asyncio.to_thread(run_cli, kubeconfig, "status")
        assert code == 0 and f"namespace default on {NODE}" in out, out

        # The operator lifts it by NAMESPACE/* (the pod that wanted the third version gone: with
        # it there, the node would load it again); the namespace's files stay quarantined.
        core: Any = kubernetes.client.CoreV1Api(kube_api)
        core.delete_namespaced_pod("killer-2", "default", grace_period_seconds=0)
        code, out = await asyncio.to_thread(
            run_cli, kubeconfig, "quarantine", "clear", NODE, "default/*"
        )
        assert code == 0, out
        await eventually(
            lambda: running.agent.crashes.namespace_quarantine("default") is None,
            what="the namespace's quarantine lifted",
        )
        assert running.agent.crashes.held("default"), "its files' quarantines still hold it"

        # Another namespace's model still loads on the node.
        core.create_namespace({"metadata": {"name": "team-b"}})
        good = copy_model("add_one", tmp_path / "good", as_name="killer")
        loaded = await load(await deploy(0, "team-b", good))
        assert loaded.state == agent_pb2.MODEL_STATE_READY, loaded.reason
        assert len(restarts) == 4
