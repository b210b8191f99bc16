"""Each pod's model has a private name in Triton, through the real agent and a real
Triton: two namespaces run models of one id on one node, a rollout's two revisions too, and a
model installed before private names keeps serving under its public name.

The attacks come first: a tenant whose model id is another pod's private name, or the name of a
model installed before private names, gets a model of its own and can neither reach nor replace
the other. The victim's model answers x + 1, the attacker's x + 100.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.installs.repository import MANIFEST_FILE, manifest_to_json
from common.callers import read_table
from common.manifest import Manifest, ManifestEntry
from common.tritonname import private_triton_name
from protos import agent_pb2
from sim.apiserver import RunningApiServer
from sim.triton import TritonServer
from tests.agent.conftest import (
    RunningAgent,
    StartAgent,
    bearer,
    eventually,
    install_dir,
    make_pod,
    manifest_of,
)
from tests.agent.test_attacks import attacker_model, infer, namespaces, refused
from tests.conftest import copy_model

pytestmark = pytest.mark.triton

MODEL = "resnet50"


def uid_of(api: kubernetes.client.ApiClient, namespace: str, name: str) -> str:
    core: Any = kubernetes.client.CoreV1Api(api)
    return str(core.read_namespaced_pod(name, namespace).metadata.uid)


def set_address(api: kubernetes.client.ApiClient, namespace: str, name: str, ip: str) -> None:
    core: Any = kubernetes.client.CoreV1Api(api)
    core.patch_namespaced_pod_status(
        name, namespace, {"status": {"podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "127.0.0.1"}}
    )


async def serve(
    running: RunningAgent,
    apiserver: RunningApiServer,
    api: kubernetes.client.ApiClient,
    source: Path,
    namespace: str,
    pod: str,
    model_id: str,
) -> Any:
    """Install and load the pod's model as its loader does; the READY status."""
    token = apiserver.mint_token(namespace, pod)
    await install_dir(running.stub, token, source, model_id)
    status = await running.stub.LoadModel(
        agent_pb2.LoadModelRequest(model_id=model_id), metadata=bearer(token)
    )
    assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
    assert status.model_id == model_id
    uid = uid_of(api, namespace, pod)
    legacy = status.triton_name == model_id
    assert legacy or status.triton_name == private_triton_name(namespace, model_id, uid)
    return status


async def unload(
    running: RunningAgent, apiserver: RunningApiServer, ns: str, pod: str, m: str
) -> Any:
    return await running.stub.UnloadModel(
        agent_pb2.UnloadModelRequest(model_id=m), metadata=bearer(apiserver.mint_token(ns, pod))
    )


def installed(repository: Path) -> list[str]:
    return [p.name for p in repository.iterdir()]


async def ready_in_triton(running: RunningAgent) -> set[str]:
    index = await running.agent.triton.index()
    return {name for name, entry in index.items() if entry.state == "READY"}


async def test_a_model_id_equal_to_another_pods_private_name_gets_a_model_of_its_own(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    namespaces(kube_api, "team-a", "team-b")
    gpu = running.mock.gpus[0].uuid
    make_pod(kube_api, "victim", MODEL, namespace="team-b", gpu_uuid=gpu)
    victim_name = private_triton_name("team-b", MODEL, uid_of(kube_api, "team-b", "victim"))
    source = copy_model("add_one", tmp_path / "v", as_name=MODEL)
    await serve(running, apiserver, kube_api, source, "team-b", "victim", MODEL)
    assert infer(triton, victim_name) == 2.0

    # The attacker names its model after the victim's name in Triton.
    make_pod(kube_api, "attacker", victim_name, namespace="team-a", gpu_uuid=gpu)
    attacker_name = private_triton_name(
        "team-a", victim_name, uid_of(kube_api, "team-a", "attacker")
    )
    source = attacker_model(tmp_path, victim_name)
    status = await serve(running, apiserver, kube_api, source, "team-a", "attacker", victim_name)
    assert status.triton_name == attacker_name
    assert attacker_name != victim_name
    assert infer(triton, victim_name) == 2.0
    assert infer(triton, attacker_name) == 101.0

    # Its unload takes out its own model only.
    status = await unload(running, apiserver, "team-a", "attacker", victim_name)
    assert status.state == agent_pb2.MODEL_STATE_ABSENT
    assert attacker_name not in await ready_in_triton(running)
    assert infer(triton, victim_name) == 2.0


def lay_out_legacy_model(repository: Path, state: Path, uid: str, pod: str, source: Path) -> None:
    """What an agent before private names left on disk: the model's directory named by its
    public id, with the agent's manifest, and an owner record without a private name."""
    entries = tuple(ManifestEntry(p, s, h) for p, s, h in manifest_of(source))
    manifest = Manifest(entries)
    target = repository / MODEL
    source.rename(target)
    (target / MANIFEST_FILE).write_text(manifest_to_json(manifest))
    state.mkdir(parents=True, exist_ok=True)
    record = {"uid": uid, "pod": pod, "digest": manifest.digest}
    (state / f"{MODEL}.owner.json").write_text(json.dumps(record))


async def test_a_legacy_model_keeps_serving_and_a_tenant_naming_it_cannot_reach_or_replace_it(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    model_repository: Path,
    mock_nvml: Any,
    tmp_path: Path,
) -> None:
    namespaces(kube_api, "team-a", "team-b")
    gpu = mock_nvml.gpus[0].uuid
    make_pod(kube_api, "victim", MODEL, namespace="team-b", gpu_uuid=gpu, phase="Running")
    set_address(kube_api, "team-b", "victim", "127.1.0.5")
    victim_uid = uid_of(kube_api, "team-b", "victim")
    lay_out_legacy_model(
        model_repository,
        model_repository.parent / ".tritonshare-state",
        victim_uid,
        "team-b/victim",
        copy_model("add_one", tmp_path / "legacy", as_name=MODEL),
    )
    table = tmp_path / "gateway" / "callers.json"
    running = await start_custom_agent(gateway_table=table, gateway_table_refresh_seconds=0.2)

    # The agent adopts the record, loads the model under its public name and serves it; the
    # caller table carries no private name for it.
    await eventually(lambda: MODEL in running.agent.models.owners.all(), what="the record")

    async def served() -> bool:
        return MODEL in await ready_in_triton(running)

    await eventually(served, what="the legacy model loaded under its public name")
    assert infer(triton, MODEL) == 2.0
    await eventually(lambda: table.exists() and read_table(table).callers != (), what="a caller")
    (victim,) = read_table(table).callers
    assert (victim.pod, victim.model_id, victim.triton_name) == ("team-b/victim", MODEL, "")
    status = await running.stub.GetModel(
        agent_pb2.GetModelRequest(model_id=MODEL),
        metadata=bearer(apiserver.mint_token("team-b", "victim")),
    )
    assert status.state == agent_pb2.MODEL_STATE_READY and status.pod == "team-b/victim"
    assert status.triton_name == MODEL

    # Another team deploys a model of the same id: it gets a model of its own.
    make_pod(kube_api, "attacker", MODEL, namespace="team-a", gpu_uuid=gpu)
    set_address(kube_api, "team-a", "attacker", "127.1.0.6")
    attacker_name = private_triton_name("team-a", MODEL, uid_of(kube_api, "team-a", "attacker"))
    status = await serve(
        running, apiserver, kube_api, attacker_model(tmp_path, MODEL), "team-a", "attacker", MODEL
    )
    assert status.pod == "team-a/attacker"
    assert infer(triton, MODEL) == 2.0
    assert infer(triton, attacker_name) == 101.0
    await eventually(
        lambda: (
            {(c.pod, c.name_in_triton) for c in read_table(table).callers}
            == {("team-b/victim", MODEL), ("team-a/attacker", attacker_name)}
        ),
        what="both pods in the caller table, each with its own name in Triton",
    )

    # The victim's own pod still answers for its model; the attacker's unload leaves it.
    await unload(running, apiserver, "team-a", "attacker", MODEL)
    assert infer(triton, MODEL) == 2.0
    status = await running.stub.GetModel(
        agent_pb2.GetModelRequest(model_id=MODEL),
        metadata=bearer(apiserver.mint_token("team-b", "victim")),
    )
    assert status.state == agent_pb2.MODEL_STATE_READY and status.pod == "team-b/victim"

    # When the legacy pod is replaced, its public name leaves Triton and the repository.
    core: Any = kubernetes.client.CoreV1Api(kube_api)
    core.delete_namespaced_pod("victim", "team-b", grace_period_seconds=0)

    async def gone() -> bool:
        return MODEL not in await ready_in_triton(running)

    await eventually(gone, what="the replaced legacy model to be unloaded")
    await eventually(lambda: not (model_repository / MODEL).exists(), what="its files removed")


async def test_two_namespaces_and_two_revisions_run_one_model_id_side_by_side(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    model_repository: Path,
    tmp_path: Path,
) -> None:
    namespaces(kube_api, "team-a", "team-b")
    table = tmp_path / "gateway" / "callers.json"
    running = await start_custom_agent(gateway_table=table, gateway_table_refresh_seconds=0.2)
    gpu = running.mock.gpus[0].uuid
    pods = [("team-a", "old", "127.1.0.5"), ("team-a", "new", "127.1.0.6"),
            ("team-b", "b", "127.1.0.7")]  # fmt: skip
    names = {}
    for i, (namespace, pod, ip) in enumerate(pods):
        make_pod(kube_api, pod, MODEL, namespace=namespace, gpu_uuid=gpu)
        set_address(kube_api, namespace, pod, ip)
        names[pod] = private_triton_name(namespace, MODEL, uid_of(kube_api, namespace, pod))
        source = copy_model("add_one", tmp_path / pod, as_name=MODEL)
        model_py = source / "1" / "model.py"
        model_py.write_text(model_py.read_text().replace("(data + 1)", f"(data + {10**i})"))
        status = await serve(running, apiserver, kube_api, source, namespace, pod, MODEL)
        assert status.pod == f"{namespace}/{pod}"
    assert len(set(names.values())) == 3
    assert await ready_in_triton(running) == set(names.values())
    assert sorted(installed(model_repository)) == sorted(names.values())
    assert [infer(triton, names[pod]) for _, pod, _ in pods] == [2.0, 11.0, 101.0]
    await eventually(
        lambda: (
            table.exists()
            and {(c.address, c.model_id, c.triton_name) for c in read_table(table).callers}
            == {(ip, MODEL, names[pod]) for _, pod, ip in pods}
        ),
        what="each pod mapped to its own private name in the caller table",
    )
    # The agent's info metric joins each private name to its pod.
    exposed = text_string_to_metric_families(
        generate_latest(running.agent.metrics.registry).decode()
    )
    info = [
        (s.labels, s.value)
        for family in exposed
        if family.name == "tritonshare_agent_model_info"
        for s in family.samples
    ]
    assert sorted(info, key=lambda i: i[0]["model_pod"]) == sorted(
        [
            (
                {"model": names[pod], "model_namespace": ns, "model_pod": pod, "model_id": MODEL},
                1.0,
            )
            for ns, pod, _ in pods
        ],
        key=lambda i: i[0]["model_pod"],
    )

    # The platform lists the three under their names in Triton, and asks for one by that name.
    make_pod(
        kube_api, "binder", "-", namespace="tritonshare-system",
        service_account="tritonshare-binder", scheduler="default-scheduler",
    )  # fmt: skip
    platform = bearer(apiserver.mint_token("tritonshare-system", "binder"))
    listed = await running.stub.ListModels(agent_pb2.ListModelsRequest(), metadata=platform)
    assert sorted((m.triton_name, m.model_id, m.pod) for m in listed.models) == sorted(
        (names[pod], MODEL, f"{ns}/{pod}") for ns, pod, _ in pods
    )
    one = await running.stub.GetModel(
        agent_pb2.GetModelRequest(model_id=names["b"]), metadata=platform
    )
    assert (one.pod, one.model_id, one.state) == ("team-b/b", MODEL, agent_pb2.MODEL_STATE_READY)

    # Each owner sees and unloads only its own model.
    status = await running.stub.GetModel(
        agent_pb2.GetModelRequest(model_id=MODEL),
        metadata=bearer(apiserver.mint_token("team-a", "new")),
    )
    assert status.pod == "team-a/new" and status.state == agent_pb2.MODEL_STATE_READY
    assert status.triton_name == names["new"]
    status = await unload(running, apiserver, "team-a", "old", MODEL)
    assert status.state == agent_pb2.MODEL_STATE_ABSENT
    assert await ready_in_triton(running) == {names["new"], names["b"]}
    assert [infer(triton, names[pod]) for pod in ("new", "b")] == [11.0, 101.0]
    # The old pod, asking again, learns nothing of the others.
    status = await running.stub.GetModel(
        agent_pb2.GetModelRequest(model_id=MODEL),
        metadata=bearer(apiserver.mint_token("team-a", "old")),
    )
    assert status.state == agent_pb2.MODEL_STATE_ABSENT
    assert (status.pod, status.triton_name, status.manifest_digest) == ("", "", "")
    # No lock is kept for a model that is gone (every rollout brings new names).
    assert names["old"] not in running.agent.models.records.known()
    assert not running.agent.models.records.is_busy(names["old"])
    error = await refused(
        running.stub.ListModels(
            agent_pb2.ListModelsRequest(), metadata=bearer(apiserver.mint_token("team-b", "b"))
        )
    )
    assert error.code().name == "PERMISSION_DENIED"
