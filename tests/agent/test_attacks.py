"""A tenant with full rights in its own namespace attacks another team's model through the agent.

Every attack goes through the agent's real gRPC API, with tokens minted by sim/'s API server as
the kubelet mints them, pods written with the official client, and a real Triton serving the
victim's model. The victim is `team-b/victim` (model `shared-model`, add_one: x + 1); the
attacker is in `team-a` and ships a model that answers x + 100, so whose answers Triton gives is
plain to see. Each test fails on an agent that trusts annotations or spec.nodeName.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import kubernetes.client
import numpy as np
import pytest
import tritonclient.http as triton_http

from agent.errors import TritonError
from agent.installs.repository import Staging
from agent.triton import IndexEntry
from common.hosted import host_name
from common.tritonname import private_triton_name
from protos import agent_pb2
from sim.apiserver import RunningApiServer
from sim.triton import TritonServer
from tests.agent.conftest import (
    NODE,
    RunningAgent,
    StartAgent,
    bearer,
    eventually,
    install_dir,
    install_requests,
    make_pod,
    manifest_of,
)
from tests.agent.hosts import make_host, replica
from tests.conftest import copy_model
from tests.fixtures_sim import core_v1

pytestmark = pytest.mark.triton

MODEL = "shared-model"


def infer(triton: TritonServer, model: str) -> float:
    client = triton_http.InferenceServerClient(triton.http_url)
    try:
        tensor = triton_http.InferInput("INPUT0", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[1.0]], dtype=np.float32))
        output = client.infer(model, [tensor]).as_numpy("OUTPUT0")
        assert output is not None
        return float(output.ravel()[0])
    finally:
        client.close()


def attacker_model(tmp_path: Path, name: str = MODEL) -> Path:
    """add_one renamed to `name`, answering x + 100."""
    source = copy_model("add_one", tmp_path / "attacker", as_name=name)
    model_py = source / "1" / "model.py"
    model_py.write_text(model_py.read_text().replace("(data + 1)", "(data + 100)"))
    return source


def unnamed_model(tmp_path: Path) -> Path:
    """add_one with no name in its config, so it installs under any model id."""
    source = copy_model("add_one", tmp_path / "unnamed")
    config = source / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "add_one"\n', ""))
    return source


def victim_name(api: kubernetes.client.ApiClient) -> str:
    """The name of the victim's model in Triton: its pod's private name."""
    core: Any = kubernetes.client.CoreV1Api(api)
    uid = core.read_namespaced_pod("victim", "team-b").metadata.uid
    return private_triton_name("team-b", MODEL, uid)


def entries(directory: Path) -> list[Path]:
    return list(directory.iterdir())


def namespaces(api: kubernetes.client.ApiClient, *names: str) -> None:
    core: Any = kubernetes.client.CoreV1Api(api)
    for name in names:
        core.create_namespace({"metadata": {"name": name}})


def events(api: kubernetes.client.ApiClient, namespace: str, pod: str) -> list[tuple[str, str]]:
    core: Any = kubernetes.client.CoreV1Api(api)
    found = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod}")
    return [(e.reason, e.message) for e in found.items]


async def refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call
    return error.value


async def serve_victim(
    running: RunningAgent, apiserver: RunningApiServer, api: Any, triton: TritonServer, tmp: Path
) -> tuple[str, Any]:
    """The victim's pod, placed by the binder, with its model installed, loaded and answering."""
    namespaces(api, "team-a", "team-b")
    make_pod(api, "victim", MODEL, namespace="team-b", gpu_uuid=running.mock.gpus[0].uuid)
    token = apiserver.mint_token("team-b", "victim")
    reply = await install_dir(running.stub, token, copy_model("add_one", tmp, as_name=MODEL), MODEL)
    status = await running.stub.LoadModel(
        agent_pb2.LoadModelRequest(model_id=MODEL), metadata=bearer(token)
    )
    assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
    assert infer(triton, victim_name(api)) == 2.0
    return token, reply


async def every_call_refused(running: RunningAgent, token: str, source: Path) -> list[Any]:
    stub, metadata = running.stub, bearer(token)
    return [
        await refused(stub.GetModel(agent_pb2.GetModelRequest(model_id=MODEL), metadata=metadata)),
        await refused(
            stub.UnloadModel(agent_pb2.UnloadModelRequest(model_id=MODEL), metadata=metadata)
        ),
        await refused(install_dir(stub, token, source, MODEL)),
        await refused(
            stub.LoadModel(agent_pb2.LoadModelRequest(model_id=MODEL), metadata=metadata)
        ),
    ]


async def index_or_none(running: RunningAgent) -> dict[str, IndexEntry] | None:
    """Triton's repository index, or None when Triton refused it: an index taken while the
    agent removes a model's files can fail to stat them, and is asked again."""
    try:
        return await running.agent.triton.index()
    except TritonError:
        return None


@pytest.mark.parametrize("copied", [False, True], ids=["no-proof", "proof-copied-from-victim"])
async def test_a_pod_created_with_node_name_cannot_read_replace_or_unload_another_teams_model(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
    copied: bool,
) -> None:
    _, victim = await serve_victim(running, apiserver, kube_api, triton, tmp_path / "victim")
    core: Any = kubernetes.client.CoreV1Api(kube_api)
    make_pod(kube_api, "attacker", MODEL, namespace="team-a", proven=False)
    if copied:
        stolen = core.read_namespaced_pod("victim", "team-b").metadata.annotations
        core.patch_namespaced_pod("attacker", "team-a", {"metadata": {"annotations": stolen}})
    token = apiserver.mint_token("team-a", "attacker")

    for error in await every_call_refused(running, token, attacker_model(tmp_path)):
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error.details()
        details = error.details() or ""
        assert "not placed on this node by the tritonshare binder" in details
        assert "victim" not in details and victim.manifest_digest[:12] not in details
    assert infer(triton, victim_name(kube_api)) == 2.0
    reason = "PlacementChanged" if copied else "NotPlacedByBinder"
    await eventually(
        lambda: reason in {r for r, _ in events(kube_api, "team-a", "attacker")},
        what=f"a {reason} event on the attacker's pod",
    )

    # Once the attacker's pod is gone, nothing of it is adopted for the victim.
    core.delete_namespaced_pod("attacker", "team-a", grace_period_seconds=0)
    passes = running.agent.reconciler.passes
    await eventually(lambda: running.agent.reconciler.passes >= passes + 2, what="two passes")
    assert infer(triton, victim_name(kube_api)) == 2.0


async def test_a_second_proven_pod_of_the_model_id_gets_its_own_model_never_the_first(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    """Two placements of one model id on a node (another namespace's model of the same id, a
    rollout's new revision): each pod's model has its own name in Triton, and the second pod's
    calls never read, unload or replace the first's."""
    _, victim = await serve_victim(running, apiserver, kube_api, triton, tmp_path / "victim")
    make_pod(kube_api, "double", MODEL, namespace="team-a")
    token = apiserver.mint_token("team-a", "double")
    stub, metadata = running.stub, bearer(token)
    seen = await stub.GetModel(agent_pb2.GetModelRequest(model_id=MODEL), metadata=metadata)
    assert seen.state == agent_pb2.MODEL_STATE_ABSENT
    assert (seen.pod, seen.manifest_digest) == ("", "")
    gone = await stub.UnloadModel(agent_pb2.UnloadModelRequest(model_id=MODEL), metadata=metadata)
    assert gone.state == agent_pb2.MODEL_STATE_ABSENT
    assert infer(triton, victim_name(kube_api)) == 2.0

    reply = await install_dir(stub, token, attacker_model(tmp_path), MODEL)
    assert not reply.unchanged and reply.manifest_digest != victim.manifest_digest
    status = await stub.LoadModel(agent_pb2.LoadModelRequest(model_id=MODEL), metadata=metadata)
    assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
    assert status.pod == "team-a/double"
    core: Any = kubernetes.client.CoreV1Api(kube_api)
    uid = core.read_namespaced_pod("double", "team-a").metadata.uid
    assert infer(triton, private_triton_name("team-a", MODEL, uid)) == 101.0
    assert infer(triton, victim_name(kube_api)) == 2.0


@pytest.mark.parametrize("edited", ["gpu", "model-id"])
async def test_annotations_edited_after_binding_prove_nothing(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
    edited: str,
) -> None:
    token, _ = await serve_victim(running, apiserver, kube_api, triton, tmp_path / "victim")
    name = victim_name(kube_api)
    core: Any = kubernetes.client.CoreV1Api(kube_api)
    value = running.mock.gpus[1].uuid if edited == "gpu" else MODEL
    if edited == "model-id":
        # Move the pod's own placement to another model id (it then claims that id instead).
        core.patch_namespaced_pod(
            "victim", "team-b", {"metadata": {"annotations": {"tritonshare.io/model-id": "other"}}}
        )
        model = "other"
    else:
        core.patch_namespaced_pod(
            "victim", "team-b", {"metadata": {"annotations": {"tritonshare.io/gpu": value}}}
        )
        model = MODEL
    error = await refused(
        running.stub.LoadModel(agent_pb2.LoadModelRequest(model_id=model), metadata=bearer(token))
    )
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "GPU or model id changed after the binder placed it" in (error.details() or "")
    # The pod no longer proves a placement: it wants nothing, and its model is removed as an
    # orphan; nothing is pinned to the GPU it chose.
    records = running.agent.models.records.known()
    assert all(r.gpu_uuid != running.mock.gpus[1].uuid for r in records.values())

    async def removed() -> bool:
        index = await index_or_none(running)
        if index is None:
            return False
        entry = index.get(name)
        return entry is None or entry.state == "UNAVAILABLE"

    await eventually(removed, what="the unproven pod's model to be removed")


async def test_a_model_id_with_a_trailing_newline_is_refused(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    model_repository: Path,
    tmp_path: Path,
) -> None:
    make_pod(kube_api, "newline", "m1\n")
    token = apiserver.mint_token("default", "newline")
    error = await refused(install_dir(running.stub, token, unnamed_model(tmp_path), "m1\n"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "outside [A-Za-z0-9_.-]" in (error.details() or "")
    assert entries(model_repository) == []


async def test_tokens_not_bound_to_a_pod_are_refused_and_refusals_are_cached(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
) -> None:
    make_pod(kube_api, "m-pod", "m")
    core: Any = kubernetes.client.CoreV1Api(kube_api)
    unbound = core.create_namespaced_service_account_token(
        "default", "default", {"spec": {"audiences": ["tritonshare-agent"]}}
    ).status.token
    request = agent_pb2.GetModelRequest(model_id="m")
    error = await refused(running.stub.GetModel(request, metadata=bearer(unbound)))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "not bound to a pod" in (error.details() or "")

    reviews = running.agent.authorizer.reviews
    for _ in range(20):
        again = await refused(running.stub.GetModel(request, metadata=bearer("forged.token.x")))
        assert again.code() == grpc.StatusCode.UNAUTHENTICATED
    assert running.agent.authorizer.reviews == reviews + 1


async def test_a_tenant_cannot_fill_the_disk_or_hold_installs_open(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    model_repository: Path,
    tmp_path: Path,
    start_custom_agent: StartAgent,
) -> None:
    running = await start_custom_agent(max_model_bytes=4 * 1024**2, install_idle_seconds=1.0)
    source = unnamed_model(tmp_path)
    for name in ("big", "stalled", "small"):
        make_pod(kube_api, name, "small" if name == "small" else name)
    tokens = {n: apiserver.mint_token("default", n) for n in ("big", "stalled", "small")}

    # Over the per-model limit: refused at the header, before a byte is written.
    (source / "1" / "weights.bin").write_bytes(b"\0" * (5 * 1024**2))
    header = install_requests("big", manifest_of(source), lambda p: (source / p).read_bytes())
    first = await anext(header)

    async def header_only() -> AsyncIterator[Any]:
        yield first

    big = await refused(running.stub.InstallModel(header_only(), metadata=bearer(tokens["big"])))
    assert big.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-model-bytes" in (big.details() or "")
    (source / "1" / "weights.bin").write_bytes(b"\0" * (3 * 1024**2))

    # Free space is shared: an install in progress holds what it wrote, and no write may eat
    # into the headroom; a refusal says so without saying how much is free.
    headroom = 64 * 1024**2
    files = manifest_of(source)
    started: list[bool] = []

    async def stalled_stream() -> AsyncIterator[Any]:
        requests = install_requests("stalled", files, lambda p: (source / p).read_bytes())
        yield await anext(requests)  # the header
        yield await anext(requests)  # one chunk
        started.append(True)
        await running.lifecycle.stop_event.wait()  # then nothing, ever

    stall = running.stub.InstallModel(stalled_stream(), metadata=bearer(tokens["stalled"]))
    await eventually(lambda: bool(started), what="the stalled install to start")
    await eventually(
        lambda: any(model_repository.parent.joinpath(".tritonshare-staging").iterdir()),
        what="the stalled install's staging directory",
    )
    running.agent.repository.disk_free = lambda _: headroom + 100
    # A model within one HTTP/2 window: grpc's client keeps the status of a call refused while
    # it still writes only when nothing is pending.
    tiny = unnamed_model(tmp_path / "tiny")
    small = await refused(install_dir(running.stub, tokens["small"], tiny, "small"))
    assert small.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "no room" in (small.details() or "") and "100" not in (small.details() or "")
    running.agent.repository.disk_free = lambda _: headroom + 4 * 1024**2

    # The stalled stream is cut by the idle limit; its files go with it.
    error = await refused(stall)
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "--install-idle-seconds" in (error.details() or "")
    assert list(model_repository.parent.joinpath(".tritonshare-staging").iterdir()) == []
    assert running.agent.repository.staged_bytes("default") == 0
    reply = await install_dir(running.stub, tokens["small"], source, "small")
    assert not reply.unchanged


async def test_a_pod_cannot_pile_up_calls_and_take_the_agent_from_others(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
    start_custom_agent: StartAgent,
) -> None:
    """Streams opened and left waiting (the second waits for the first's model lock) are
    bounded per pod; other pods are served meanwhile."""
    running = await start_custom_agent(max_calls_per_pod=2, install_idle_seconds=30.0)
    source = unnamed_model(tmp_path)
    make_pod(kube_api, "hog", "hog")
    make_pod(kube_api, "fair", "fair")
    hog, fair = apiserver.mint_token("default", "hog"), apiserver.mint_token("default", "fair")
    files = manifest_of(source)
    opened: list[int] = []

    async def stalled() -> AsyncIterator[Any]:
        yield await anext(install_requests("hog", files, lambda p: (source / p).read_bytes()))
        opened.append(1)
        await running.lifecycle.stop_event.wait()

    calls = [running.stub.InstallModel(stalled(), metadata=bearer(hog)) for _ in range(2)]
    await eventually(lambda: len(opened) == 2, what="both stalled streams to be open")
    await eventually(
        lambda: running.agent.gate._in_progress.get(running_uid(kube_api, "hog")) == 2,
        what="both streams admitted",
    )
    error = await refused(
        running.stub.GetModel(agent_pb2.GetModelRequest(model_id="hog"), metadata=bearer(hog))
    )
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "calls in progress" in (error.details() or "")
    reply = await install_dir(running.stub, fair, unnamed_model(tmp_path / "fair"), "fair")
    assert not reply.unchanged
    for call in calls:
        call.cancel()
    await eventually(
        lambda: not running.agent.gate._in_progress, what="the hog's slots to be freed"
    )
    status = await running.stub.GetModel(
        agent_pb2.GetModelRequest(model_id="hog"), metadata=bearer(hog)
    )
    assert status.model_id == "hog"


async def test_a_model_host_may_hold_as_many_calls_as_its_namespace(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    start_custom_agent: StartAgent,
) -> None:
    """A model host loads and polls for every model of its namespace on the node: its calls are
    bounded by its namespace's bound, not a pod's (the namespace's bound, which a namespace's
    pods share, is unchanged). A plain pod of the namespace keeps the pod's bound."""
    running = await start_custom_agent(
        max_calls=8, max_calls_per_pod=2, max_calls_per_namespace=4, install_idle_seconds=30.0
    )
    core_v1(kube_api).create_namespace({"metadata": {"name": "team-a"}})
    gpu = running.mock.gpus[0].uuid
    make_host(kube_api, "team-a", [replica("team-a", "one", gpu)])
    host = host_name(NODE)
    await eventually(lambda: running.agent.pods.is_host(f"team-a/{host}"), what="the host seen")
    token = apiserver.mint_token("team-a", host)
    uid = str(core_v1(kube_api).read_namespaced_pod(host, "team-a").metadata.uid)

    async def silent() -> AsyncIterator[Any]:
        await running.lifecycle.stop_event.wait()  # holds its slot, sends nothing
        yield agent_pb2.InstallModelRequest()

    calls = [running.stub.InstallModel(silent(), metadata=bearer(token)) for _ in range(4)]
    await eventually(
        lambda: running.agent.gate._in_progress.get(uid) == 4, what="four calls of the host"
    )
    error = await refused(
        running.stub.ListHosted(agent_pb2.ListHostedRequest(), metadata=bearer(token))
    )
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "model host" in (error.details() or "")
    assert "--max-calls-per-namespace" in (error.details() or "")
    for call in calls:
        call.cancel()
    await eventually(lambda: not running.agent.gate._in_progress, what="the host's slots freed")

    make_pod(kube_api, "plain", "plain", namespace="team-a")
    plain = apiserver.mint_token("team-a", "plain")
    plain_uid = str(core_v1(kube_api).read_namespaced_pod("plain", "team-a").metadata.uid)
    pod_calls = [running.stub.InstallModel(silent(), metadata=bearer(plain)) for _ in range(2)]
    await eventually(
        lambda: running.agent.gate._in_progress.get(plain_uid) == 2,
        what="two calls of the plain pod",
    )
    error = await refused(
        running.stub.GetModel(agent_pb2.GetModelRequest(model_id="plain"), metadata=bearer(plain))
    )
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "pod team-a/plain" in (error.details() or "")
    for call in pod_calls:
        call.cancel()


def running_uid(api: kubernetes.client.ApiClient, name: str) -> str:
    core: Any = kubernetes.client.CoreV1Api(api)
    return str(core.read_namespaced_pod(name, "default").metadata.uid)


async def test_an_install_has_a_total_deadline_and_tiny_chunks_are_written_together(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
    start_custom_agent: StartAgent,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    running = await start_custom_agent(install_deadline_seconds=3.0)
    writes: list[int] = []
    original = Staging.write

    def counting(self: Staging, path: str, offset: int, data: bytes) -> None:
        writes.append(len(data))
        original(self, path, offset, data)

    monkeypatch.setattr(Staging, "write", counting)
    source = copy_model("add_one", tmp_path / "src", as_name="trickle")
    # Small files: the install below sends one message per byte and must end well within the
    # 3 s deadline even on a busy machine.
    (source / "1" / "weights.bin").write_bytes(bytes(range(256)) * 2)
    make_pod(kube_api, "trickle", "trickle")
    token = apiserver.mint_token("default", "trickle")
    # 1-byte chunks: one write per file, not one per message.
    reply = await install_dir(running.stub, token, source, "trickle", chunk=1)
    assert reply.bytes_written == sum(s for _, s, _ in manifest_of(source))
    assert len(writes) == len(manifest_of(source))

    # A stream that keeps sending, slowly, forever, is cut at the total deadline.
    make_pod(kube_api, "slow", "slow")
    slow_token = apiserver.mint_token("default", "slow")
    files = manifest_of(copy_model("add_one", tmp_path / "slow", as_name="slow"))
    files = [*files, ("1/weights.bin", 10**6, "0" * 64)]

    async def forever() -> AsyncIterator[Any]:
        yield await anext(install_requests("slow", files, lambda p: b""))
        offset = 0
        while not running.lifecycle.stop_event.is_set():
            yield agent_pb2.InstallModelRequest(
                chunk=agent_pb2.FileChunk(path="1/weights.bin", offset=offset, data=b"x")
            )
            offset += 1
            await asyncio.sleep(0.2)  # the attack: a byte every 0.2 s, under the idle limit

    error = await refused(running.stub.InstallModel(forever(), metadata=bearer(slow_token)))
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "--install-deadline-seconds" in (error.details() or "")


CONFIG_HEAD = 'backend: "onnxruntime"\nmax_batch_size: 0\n'


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            CONFIG_HEAD + "instance_group [ { kind: KIND_GPU gpus: [0] secondary_devices [ "
            "{ kind: KIND_NVDLA device_id: 0 } ] } ]",
            "sets secondary_devices",
        ),
        (
            CONFIG_HEAD + 'instance_group [ { kind: KIND_CPU host_policy: "numa0" } ]',
            "sets host_policy",
        ),
        (
            CONFIG_HEAD + 'parameters { key: "cache" value: { string_value: "/var/lib/other" } }',
            "names a host path",
        ),
        (
            CONFIG_HEAD + 'parameters { key: "cache" value: { string_value: "a/../../b" } }',
            "names a host path",
        ),
        (CONFIG_HEAD + 'default_model_filename: "../victim/1/model.onnx"', "is a path"),
        (
            CONFIG_HEAD + 'model_repository_agents { agents [ { name: "checksum" } ] }',
            "model_repository_agents",
        ),
        (
            'platform: "ensemble"\nmax_batch_size: 0\nensemble_scheduling { step [ { '
            'model_name: "victim" model_version: -1 } ] }',
            "an ensemble calls other models",
        ),
        (
            CONFIG_HEAD + "optimization { execution_accelerators { gpu_execution_accelerator "
            '[ { name: "tensorrt" parameters { key: "trt_engine_cache_path" '
            'value: "/host/cache" } } ] } }',
            "names a host path",
        ),
    ],
)
async def test_configs_that_reach_beyond_the_placement_are_refused(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    model_repository: Path,
    tmp_path: Path,
    config: str,
    message: str,
) -> None:
    namespaces(kube_api, "team-c")
    make_pod(kube_api, "p", "m", namespace="team-c")
    token = apiserver.mint_token("team-c", "p")
    source = tmp_path / "m"
    (source / "1").mkdir(parents=True)
    (source / "config.pbtxt").write_text(config)
    (source / "1" / "model.onnx").write_bytes(b"onnx")
    error = await refused(install_dir(running.stub, token, source, "m"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert message in (error.details() or "")
    assert entries(model_repository) == []


@pytest.mark.parametrize("how", ["python-backend", "shipped-backend-library", "custom-ops"])
async def test_tenant_code_runs_in_triton_only_for_allowed_namespaces(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    model_repository: Path,
    tmp_path: Path,
    how: str,
) -> None:
    namespaces(kube_api, "team-c")  # not in the agent's --tenant-code-namespaces
    make_pod(kube_api, "p", "m", namespace="team-c")
    token = apiserver.mint_token("team-c", "p")
    source = copy_model("add_one", tmp_path, as_name="m")
    if how != "python-backend":
        config = (source / "config.pbtxt").read_text().replace('"python"', '"onnxruntime"')
        if how == "custom-ops":
            config += '\nmodel_operations { op_library_filename: "libevil.so" }\n'
        (source / "config.pbtxt").write_text(config)
    if how == "shipped-backend-library":
        (source / "1" / "libtriton_onnxruntime.so").write_bytes(b"\x7fELF")
    error = await refused(install_dir(running.stub, token, source, "m"))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error.details()
    assert "may not run its own code" in (error.details() or "") or "not allowed to" in (
        error.details() or ""
    )
    assert entries(model_repository) == []
    await eventually(
        lambda: "TenantCodeNotAllowed" in {r for r, _ in events(kube_api, "team-c", "p")},
        what="a TenantCodeNotAllowed event",
    )


@pytest.mark.parametrize("under", ["public-id", "private-name"])
async def test_what_triton_runs_behind_the_agents_back_is_not_adopted(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    model_repository: Path,
    tmp_path: Path,
    under: str,
) -> None:
    """Tenant code inside Triton (or anyone with the repository API) drops a model into the
    repository under a wanted pod's model id, or its private name, and loads it: the agent never
    installed it, so it goes."""
    namespaces(kube_api, "team-a", "team-b")
    make_pod(kube_api, "victim", MODEL, namespace="team-b", phase="Running")
    name = MODEL if under == "public-id" else victim_name(kube_api)
    shutil.copytree(attacker_model(tmp_path, name), model_repository / name)
    client = triton_http.InferenceServerClient(triton.http_url)
    try:
        client.load_model(name)
    finally:
        client.close()
    assert infer(triton, name) == 101.0

    async def gone() -> bool:
        index = await index_or_none(running)
        if index is None:
            return False
        entry = index.get(name)
        return (entry is None or entry.state == "UNAVAILABLE") and not (
            model_repository / name
        ).exists()

    await eventually(gone, what="the unvouched model to be unloaded and removed")


async def test_files_swapped_under_a_loaded_model_are_not_vouched_for(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    model_repository: Path,
    tmp_path: Path,
    start_custom_agent: StartAgent,
    triton: TritonServer,
) -> None:
    running = await start_custom_agent(resync_seconds=0.5)
    await serve_victim(running, apiserver, kube_api, triton, tmp_path / "victim")
    core: Any = kubernetes.client.CoreV1Api(kube_api)
    core.patch_namespaced_pod_status("victim", "team-b", {"status": {"phase": "Running"}})
    # The attacker's files replace the victim's on disk, and Triton is told to reload.
    name = victim_name(kube_api)
    shutil.rmtree(model_repository / name)
    shutil.copytree(attacker_model(tmp_path, name), model_repository / name)
    client = triton_http.InferenceServerClient(triton.http_url)
    try:
        client.load_model(name)
    finally:
        client.close()

    async def taken_out() -> bool:
        index = await index_or_none(running)
        if index is None:
            return False
        entry = index.get(name)
        unloaded = entry is None or entry.state == "UNAVAILABLE"
        return unloaded and not (model_repository / name).exists()

    await eventually(taken_out, what="the swapped model to be taken out and removed")
    await eventually(
        lambda: "ModelNotVouched" in {r for r, _ in events(kube_api, "team-b", "victim")},
        what="a ModelNotVouched event on the victim's pod",
    )


def onnx_naming(location: str) -> bytes:
    """An ONNX model (as onnx.save_model writes it) whose one initializer keeps its bytes in
    `location`."""

    def field(number: int, payload: bytes | int) -> bytes:
        if isinstance(payload, int):
            return bytes([number << 3, payload])
        size = len(payload)
        assert size < 128
        return bytes([number << 3 | 2, size]) + payload

    entry = field(1, b"location") + field(2, location.encode())
    tensor = field(1, 4) + field(2, 1) + field(8, b"w") + field(13, entry) + field(14, 1)
    return field(1, 8) + field(7, field(5, tensor))


@pytest.mark.parametrize(
    "location", ["../../shared-model/1/model.py", "/proc/self/environ"], ids=["neighbour", "host"]
)
async def test_an_onnx_model_cannot_make_onnxruntime_read_files_beyond_it(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    model_repository: Path,
    tmp_path: Path,
    location: str,
) -> None:
    """Attack: team-a's "only data" ONNX model keeps a tensor's bytes in the victim's model file
    or the host's: onnxruntime 1.19 (Triton 2.51) would read them. The agent refuses the install
    and keeps nothing; the same model with its data beside it installs."""
    await serve_victim(running, apiserver, kube_api, triton, tmp_path / "victim")
    make_pod(kube_api, "p", "m", namespace="team-a")
    token = apiserver.mint_token("team-a", "p")
    source = tmp_path / "m"
    (source / "1").mkdir(parents=True)
    (source / "config.pbtxt").write_text(CONFIG_HEAD)
    (source / "1" / "model.onnx").write_bytes(onnx_naming(location))
    error = await refused(install_dir(running.stub, token, source, "m"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert f"keeps tensor data in {location!r}, which is not a file of the model" in (
        error.details() or ""
    )
    assert sorted(p.name for p in entries(model_repository)) == [victim_name(kube_api)]

    (source / "1" / "model.onnx").write_bytes(onnx_naming("weights.bin"))
    (source / "1" / "weights.bin").write_bytes(b"\x00" * 16)
    reply = await install_dir(running.stub, token, source, "m")
    assert not reply.unchanged


@pytest.mark.parametrize("backend", ["pytorch", "tensorflow", "openvino", "pytorch_libtorch"])
async def test_framework_backends_whose_graphs_read_files_are_tenant_code(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    model_repository: Path,
    tmp_path: Path,
    backend: str,
) -> None:
    """A TorchScript model can call torch.from_file, a TensorFlow graph ReadFile: in the one
    Triton process they read what Triton can read. By default they are allowed only where tenant
    code is, and the refusal says why and what to do."""
    namespaces(kube_api, "team-c")  # not in the agent's --tenant-code-namespaces
    make_pod(kube_api, "p", "m", namespace="team-c")
    token = apiserver.mint_token("team-c", "p")
    source = tmp_path / "m"
    (source / "1").mkdir(parents=True)
    key = "platform" if "_" in backend else "backend"
    (source / "config.pbtxt").write_text(f'{key}: "{backend}"\nmax_batch_size: 0\n')
    (source / "1" / "model.pt").write_bytes(b"graph")
    error = await refused(install_dir(running.stub, token, source, "m"))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error.details()
    details = error.details() or ""
    assert "runs graphs that read files" in details, details
    assert "--tenant-code-namespaces" in details and "export to ONNX" in details, details
    assert entries(model_repository) == []
