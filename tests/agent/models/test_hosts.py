"""The agent serves a model host's replicas as it serves model pods: through its real gRPC API,
its pod watch on sim/'s API server and a real Triton. The host's token installs and loads each
replica it serves under a private name of its own; ListHosted lists them with their states and
says why an entry is refused; each replica's loaded condition appears on the host pod; the
caller table has one row per replica at the host's address; an entry the binder takes off the
annotation is unloaded and its condition removed."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import kubernetes.client
import pytest

from agent.triton import LOADING, READY
from common.callers import read_table
from common.contract import RESIDENCY_ON_DEMAND, Keys
from common.hosted import host_name, loaded_condition
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
    make_pod,
)
from tests.agent.hosts import make_host, replica, replica_triton_name, set_hosted
from tests.agent.models.test_residency import SLOW_UNLOAD
from tests.agent.test_attacks import infer
from tests.conftest import copy_model
from tests.fixtures_sim import core_v1

pytestmark = pytest.mark.triton

HOST = host_name(NODE)
ADDRESS = "10.1.0.7"


def conditions(api: kubernetes.client.ApiClient, namespace: str) -> dict[str, tuple[str, str]]:
    pod = core_v1(api).read_namespaced_pod(HOST, namespace)
    return {c.type: (c.status, c.reason) for c in pod.status.conditions or []}


def host_events(api: kubernetes.client.ApiClient, namespace: str) -> list[tuple[str, str]]:
    found = core_v1(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={HOST}"
    )
    return [(e.reason, e.message) for e in found.items]


async def test_a_host_serves_its_replicas_each_under_its_own_name(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    start_custom_agent: StartAgent,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    table = tmp_path / "callers.json"
    running = await start_custom_agent(gateway_table=table, gateway_table_refresh_seconds=0.2)
    core_v1(kube_api).create_namespace({"metadata": {"name": "team-a"}})
    gpus = [g.uuid for g in running.mock.gpus]
    one = replica(
        "team-a",
        "one",
        gpus[0],
        storage_uri="s3://models/one",
        concurrency=3,
        storage_secret="creds",
    )
    two = replica("team-a", "two", gpus[1], ordinal=1)
    stolen = replica("team-b", "three", gpus[0])  # another namespace's entry, copied
    core_v1(kube_api).create_namespace({"metadata": {"name": "team-b"}})
    make_host(kube_api, "team-b", [stolen], pod_ip="10.1.0.9")
    make_host(kube_api, "team-a", [one, two, stolen], pod_ip=ADDRESS)
    token = apiserver.mint_token("team-a", HOST)
    stub = running.stub

    # Before its loader acts, each proven replica is pending (no Event); the copied one says why.
    keys = Keys()
    await eventually(
        lambda: (
            conditions(kube_api, "team-a").get(loaded_condition(keys, "two", 1))
            == ("False", "ModelPending")
        ),
        what="replica two pending on the host",
    )
    await eventually(
        lambda: (
            conditions(kube_api, "team-a").get(loaded_condition(keys, "three", 0))
            == ("False", "PlacementChanged")
        ),
        what="the copied entry refused on the host",
    )

    for entry in (one, two):
        source = copy_model("add_one", tmp_path / entry.model, as_name=entry.model)
        await install_dir(stub, token, source, entry.model)
        status = await stub.LoadModel(
            agent_pb2.LoadModelRequest(model_id=entry.model), metadata=bearer(token)
        )
        assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
        assert status.triton_name == replica_triton_name(entry, "team-a")
        assert status.pod == f"team-a/{entry.replica_name}"
        assert infer(triton, status.triton_name) == 2.0
    assert replica_triton_name(one, "team-a") != replica_triton_name(two, "team-a")
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.LoadModel(agent_pb2.LoadModelRequest(model_id="three"), metadata=bearer(token))
    assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED

    listed = await stub.ListHosted(agent_pb2.ListHostedRequest(), metadata=bearer(token))
    assert [(r.model_id, r.replica, r.status.state) for r in listed.replicas] == [
        ("one", 0, agent_pb2.MODEL_STATE_READY),
        ("two", 1, agent_pb2.MODEL_STATE_READY),
    ]
    assert listed.replicas[0].storage_uri == "s3://models/one"
    assert listed.replicas[0].max_concurrency == 3
    assert [r.storage_secret for r in listed.replicas] == ["creds", ""]
    assert [r.split(":")[0] for r in listed.refused] == ["three/0"]
    # A host's loader lists every fraction of a second: from the agent's pod watch, not a read.
    apiserver.audit.clear()
    for _ in range(10):
        again = await stub.ListHosted(agent_pb2.ListHostedRequest(), metadata=bearer(token))
        assert [r.model_id for r in again.replicas] == ["one", "two"]
    reads = [r for r in apiserver.audit if (r.verb, r.resource, r.name) == ("get", "pods", HOST)]
    assert reads == []

    # The conditions on the host pod, and the gateway's rows: one per replica, the host's address.
    def loaded() -> bool:
        found = conditions(kube_api, "team-a")
        return all(
            found.get(loaded_condition(keys, m, i)) == ("True", "ModelReady")
            for i, m in enumerate(["one", "two"])
        )

    await eventually(loaded, what="both replicas' loaded conditions True on the host")

    def rows() -> list[tuple[str, str, str, str]]:
        if not table.exists():
            return []
        return sorted(
            (c.address, c.model_id, c.pod, c.name_in_triton) for c in read_table(table).callers
        )

    expected = sorted(
        (ADDRESS, e.model, f"team-a/{HOST}", replica_triton_name(e, "team-a")) for e in (one, two)
    )
    await eventually(lambda: rows() == expected, what="one caller row per replica")
    await eventually(
        lambda: any(
            reason == "ModelNotServed" and message.startswith("replica three/0: ")
            for reason, message in host_events(kube_api, "team-a")
        ),
        what="an Event on the host naming the refused replica",
    )
    # Nothing of the copy reaches the namespace it was copied from.
    assert not any("team-a" in message for _, message in host_events(kube_api, "team-b"))
    assert conditions(kube_api, "team-b")[loaded_condition(keys, "three", 0)] == (
        "False",
        "ModelPending",
    )

    # A replica stays loaded until the binder marks it draining; then its loader may unload it.
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.UnloadModel(agent_pb2.UnloadModelRequest(model_id="two"), metadata=bearer(token))
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "is not draining" in (error.value.details() or "")
    set_hosted(kube_api, "team-a", [one, replace(two, draining=True)])
    status = await stub.UnloadModel(
        agent_pb2.UnloadModelRequest(model_id="two"), metadata=bearer(token)
    )
    assert status.state == agent_pb2.MODEL_STATE_ABSENT, status
    # Its condition tells the binder it is unloaded and may leave the host.
    await eventually(
        lambda: (
            conditions(kube_api, "team-a").get(loaded_condition(keys, "two", 1))
            == ("False", "ModelDrained")
        ),
        what="the drained replica's condition",
    )
    assert conditions(kube_api, "team-a")[loaded_condition(keys, "one", 0)] == (
        "True",
        "ModelReady",
    )

    # The binder takes replica two off the host: unloaded, its files and condition gone.
    set_hosted(kube_api, "team-a", [one])
    name_two = replica_triton_name(two, "team-a")

    async def two_gone() -> bool:
        entry = await running.agent.triton.state(name_two)
        return entry is None or entry.state not in (READY, LOADING)

    await eventually(two_gone, what="replica two unloaded")
    await eventually(
        lambda: not (running.agent.repository.model_dir(name_two)).exists(),
        what="replica two's files removed",
    )
    await eventually(
        lambda: (
            loaded_condition(keys, "two", 1) not in conditions(kube_api, "team-a")
            and loaded_condition(keys, "three", 0) not in conditions(kube_api, "team-a")
        ),
        what="the conditions of the replicas that left removed",
    )
    await eventually(lambda: [r[1] for r in rows()] == ["one"], what="replica two's row gone")
    assert infer(triton, replica_triton_name(one, "team-a")) == 2.0
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.GetModel(agent_pb2.GetModelRequest(model_id="two"), metadata=bearer(token))
    assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_a_draining_replica_reads_drained_as_its_unload_starts_not_once_it_ends(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    start_custom_agent: StartAgent,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    """Its host's proxy has drained it when its loader unloads it: from then on it serves
    nothing there, though Triton reports it READY until the unload ends (seconds for a large
    model). The binder, which may want it again meanwhile and keep it (it is then loaded
    again), must not count it served while another replica's host leaves its Service."""
    running = await start_custom_agent()
    core_v1(kube_api).create_namespace({"metadata": {"name": "team-a"}})
    gpu = running.mock.gpus[0].uuid
    slow = replica("team-a", "slow", gpu)
    make_host(kube_api, "team-a", [slow], pod_ip=ADDRESS)
    token = apiserver.mint_token("team-a", HOST)
    release = tmp_path / "release"
    source = copy_model("add_one", tmp_path / "slow", as_name="slow")
    (source / "1" / "model.py").write_text(SLOW_UNLOAD.replace("RELEASE", str(release)))
    await install_dir(running.stub, token, source, "slow")
    status = await running.stub.LoadModel(
        agent_pb2.LoadModelRequest(model_id="slow"), metadata=bearer(token)
    )
    assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
    keys = Keys()
    kind = loaded_condition(keys, "slow", 0)
    await eventually(
        lambda: conditions(kube_api, "team-a").get(kind) == ("True", "ModelReady"),
        what="the replica's condition True",
    )
    set_hosted(kube_api, "team-a", [replace(slow, draining=True)])
    unloading = asyncio.ensure_future(
        running.stub.UnloadModel(
            agent_pb2.UnloadModelRequest(model_id="slow"), metadata=bearer(token)
        )
    )
    try:
        await eventually(
            lambda: conditions(kube_api, "team-a").get(kind) == ("False", "ModelDrained"),
            what="the draining replica's condition False as its unload starts",
        )
        entry = await running.agent.triton.state(replica_triton_name(slow, "team-a"))
        assert entry is not None and entry.state in ("READY", "UNLOADING"), entry
        assert not unloading.done()
    finally:
        release.touch()
        status = await unloading
    assert status.state == agent_pb2.MODEL_STATE_ABSENT, status
    assert conditions(kube_api, "team-a")[kind] == ("False", "ModelDrained")


async def test_a_model_pods_token_cannot_list_hosted_replicas(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    start_custom_agent: StartAgent,
) -> None:
    running = await start_custom_agent()
    make_pod(kube_api, "plain", "m", gpu_uuid=running.mock.gpus[0].uuid)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await running.stub.ListHosted(
            agent_pb2.ListHostedRequest(),
            metadata=bearer(apiserver.mint_token("default", "plain")),
        )
    assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "is not a model host" in (error.value.details() or "")


async def test_replicas_of_one_model_name_in_two_namespaces_and_a_pod_never_collide(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    start_custom_agent: StartAgent,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    """Two namespaces' hosts serve a model each calls `same`, beside a model pod of that id:
    three models in Triton, each answering as its own files say; neither host acts on a model
    its annotation does not name."""
    running = await start_custom_agent()
    gpu = running.mock.gpus[0].uuid
    served = {}
    for namespace, add in (("team-a", 10), ("team-b", 20)):
        core_v1(kube_api).create_namespace({"metadata": {"name": namespace}})
        entry = replica(namespace, "same", gpu)
        make_host(kube_api, namespace, [entry])
        source = copy_model("add_one", tmp_path / namespace, as_name="same")
        model_py = source / "1" / "model.py"
        model_py.write_text(model_py.read_text().replace("(data + 1)", f"(data + {add})"))
        token = apiserver.mint_token(namespace, HOST)
        await install_dir(running.stub, token, source, "same")
        status = await running.stub.LoadModel(
            agent_pb2.LoadModelRequest(model_id="same"), metadata=bearer(token)
        )
        assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
        served[namespace] = status.triton_name
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await running.stub.LoadModel(
                agent_pb2.LoadModelRequest(model_id="other"), metadata=bearer(token)
            )
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "serves no replica of model 'other'" in (error.value.details() or "")
    make_pod(kube_api, "same", "same", gpu_uuid=gpu)
    token = apiserver.mint_token("default", "same")
    await install_dir(running.stub, token, copy_model("add_one", tmp_path, as_name="same"), "same")
    status = await running.stub.LoadModel(
        agent_pb2.LoadModelRequest(model_id="same"), metadata=bearer(token)
    )
    assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
    served["pod"] = status.triton_name
    assert len(set(served.values())) == 3
    answers = {where: infer(triton, name) for where, name in served.items()}
    assert answers == {"team-a": 11.0, "team-b": 21.0, "pod": 2.0}


async def test_an_entry_copied_into_another_namespaces_host_leaves_the_victim_served(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    start_custom_agent: StartAgent,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    """A replica's uid is its TritonModel's, which a tenant can copy into its own host: the
    agent must still find the victim's replica wanting its model, and never unload it."""
    running = await start_custom_agent()
    victim = replica("team-b", "victim", running.mock.gpus[0].uuid)
    for namespace in ("team-b", "team-a"):
        core_v1(kube_api).create_namespace({"metadata": {"name": namespace}})
    make_host(kube_api, "team-b", [victim])
    token = apiserver.mint_token("team-b", HOST)
    await install_dir(running.stub, token, copy_model("add_one", tmp_path, "victim"), "victim")
    status = await running.stub.LoadModel(
        agent_pb2.LoadModelRequest(model_id="victim"), metadata=bearer(token)
    )
    assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
    make_host(kube_api, "team-a", [victim])  # the attacker's host, listed after the victim's
    await eventually(
        lambda: len(running.agent.pods.by_key) == 2, what="the agent to see both hosts"
    )
    reconciler = running.agent.reconciler
    passes = reconciler.passes
    grace = running.agent.settings.orphan_grace_seconds
    await asyncio.sleep(grace)  # an orphan is removed only once idle for the grace period
    await eventually(lambda: reconciler.passes >= passes + 3, what="three reconcile passes")
    assert infer(triton, status.triton_name) == 2.0
    entry = await running.agent.triton.state(status.triton_name)
    assert entry is not None and entry.state == READY


async def test_a_host_sleeps_and_wakes_only_its_on_demand_replicas(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    running: RunningAgent,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    """What the host's proxy and loader rely on: the host's token sleeps and wakes its on-demand
    replica; ListHosted and the loaded condition say it is asleep; an always replica is never
    put to sleep, whatever the host's own models file says."""
    core_v1(kube_api).create_namespace({"metadata": {"name": "team-a"}})
    gpu = running.mock.gpus[0].uuid
    lazy = replica("team-a", "lazy", gpu, residency=RESIDENCY_ON_DEMAND)
    kept = replica("team-a", "kept", gpu, ordinal=1)
    make_host(kube_api, "team-a", [lazy, kept], pod_ip=ADDRESS)
    token = apiserver.mint_token("team-a", HOST)
    stub = running.stub
    for entry in (lazy, kept):
        source = copy_model("add_one", tmp_path / entry.model, as_name=entry.model)
        await install_dir(stub, token, source, entry.model)
        status = await stub.LoadModel(
            agent_pb2.LoadModelRequest(model_id=entry.model), metadata=bearer(token)
        )
        assert status.state == agent_pb2.MODEL_STATE_READY, status.reason

    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.UnloadModel(
            agent_pb2.UnloadModelRequest(model_id="kept", idle=True), metadata=bearer(token)
        )
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    await stub.UnloadModel(
        agent_pb2.UnloadModelRequest(model_id="lazy", idle=True), metadata=bearer(token)
    )
    listed = await stub.ListHosted(agent_pb2.ListHostedRequest(), metadata=bearer(token))
    assert [(r.model_id, r.status.state, r.status.sleeping) for r in listed.replicas] == [
        ("kept", agent_pb2.MODEL_STATE_READY, False),
        ("lazy", agent_pb2.MODEL_STATE_INSTALLED, True),
    ]
    keys = Keys()
    await eventually(
        lambda: (
            conditions(kube_api, "team-a").get(loaded_condition(keys, "lazy", 0))
            == ("False", "ModelSleeping")
        ),
        what="the asleep replica's condition",
    )
    assert host_events(kube_api, "team-a") == [], "asleep is no fault"
    woken = await stub.LoadModel(
        agent_pb2.LoadModelRequest(model_id="lazy"), metadata=bearer(token)
    )
    assert woken.state == agent_pb2.MODEL_STATE_READY and not woken.sleeping
    assert infer(triton, woken.triton_name) == 2.0
    assert infer(triton, replica_triton_name(kept, "team-a")) == 2.0


def condition_of(
    api: kubernetes.client.ApiClient, namespace: str, condition_type: str
) -> tuple[str, str, str] | None:
    pod = core_v1(api).read_namespaced_pod(HOST, namespace)
    for c in pod.status.conditions or []:
        if c.type == condition_type:
            return c.status, c.reason, c.message or ""
    return None


def failure(model: str, reason: str, message: str, replica: int = 0) -> agent_pb2.LoadFailure:
    return agent_pb2.LoadFailure(model_id=model, reason=reason, message=message, replica=replica)


async def test_a_hosts_load_failures_reach_only_its_own_replicas_conditions(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    running: RunningAgent,
    tmp_path: Path,
) -> None:
    """What a host's loader reports it cannot load (ListHosted) is on its replica's loaded
    condition, with the loader's reason and a bounded one-line message, and an Event; a reason
    it makes up reads ModelLoadFailed; a report about another namespace's model, or a model its
    host does not serve, marks nothing; the next report without it clears it."""
    for namespace in ("team-a", "team-b"):
        core_v1(kube_api).create_namespace({"metadata": {"name": namespace}})
    gpu = running.mock.gpus[0].uuid
    one, two = replica("team-a", "one", gpu), replica("team-a", "two", gpu, ordinal=1)
    victim = replica("team-b", "victim", gpu)
    make_host(kube_api, "team-b", [victim], pod_ip="10.1.0.9")
    make_host(kube_api, "team-a", [one, two], pod_ip=ADDRESS)
    token = apiserver.mint_token("team-a", HOST)
    keys = Keys()
    loaded_one, loaded_two = loaded_condition(keys, "one", 0), loaded_condition(keys, "two", 1)
    victims = loaded_condition(keys, "victim", 0)

    def reads(namespace: str, condition_type: str, reason: str) -> bool:
        found = condition_of(kube_api, namespace, condition_type)
        return found is not None and found[1] == reason

    await eventually(lambda: reads("team-b", victims, "ModelPending"), what="victim pending")
    await running.stub.ListHosted(
        agent_pb2.ListHostedRequest(
            failures=[
                failure("one", "FetchFailed", "https://store/one.tgz answered HTTP 404 Not Found"),
                failure("two", "AllReplicasReady", "line one\nline two " + "x" * 5000, 1),
                failure("victim", "FetchFailed", "forged by team-a"),
                failure("nobody", "FetchFailed", "no such replica"),
            ]
        ),
        metadata=bearer(token),
    )
    await eventually(lambda: reads("team-a", loaded_one, "FetchFailed"), what="one's failure")
    await eventually(lambda: reads("team-a", loaded_two, "ModelLoadFailed"), what="two's failure")
    said = condition_of(kube_api, "team-a", loaded_one)
    assert said is not None and said[0] == "False"
    assert "replica one/0" in said[2] and "answered HTTP 404 Not Found" in said[2], said
    said = condition_of(kube_api, "team-a", loaded_two)
    assert said is not None and "\n" not in said[2] and len(said[2]) < 600, said
    await eventually(
        lambda: any("HTTP 404" in m for r, m in host_events(kube_api, "team-a")),
        what="an Event naming the 404",
    )
    # Another namespace's replica and a model the host does not serve are untouched.
    assert reads("team-b", victims, "ModelPending")
    assert host_events(kube_api, "team-b") == []
    assert loaded_condition(keys, "nobody", 0) not in conditions(kube_api, "team-a")

    # The loader's next report no longer names one (fixed, or loading again): pending again.
    await running.stub.ListHosted(
        agent_pb2.ListHostedRequest(failures=[failure("two", "ModelInvalid", "no config", 1)]),
        metadata=bearer(token),
    )
    await eventually(lambda: reads("team-a", loaded_one, "ModelPending"), what="one cleared")
    await eventually(lambda: reads("team-a", loaded_two, "ModelInvalid"), what="two's new cause")
    # A new cause of the same kind replaces the message.
    await running.stub.ListHosted(
        agent_pb2.ListHostedRequest(failures=[failure("two", "ModelInvalid", "no version 1", 1)]),
        metadata=bearer(token),
    )
    await eventually(
        lambda: (condition_of(kube_api, "team-a", loaded_two) or ("", "", ""))[2].endswith(
            "no version 1"
        ),
        what="two's new message",
    )


async def _host_with_one_loaded(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    running: RunningAgent,
    tmp_path: Path,
) -> tuple[Any, str]:
    """A model host in team-a with replica one/0 installed and loaded READY: the agent's stub
    and the host's token."""
    core_v1(kube_api).create_namespace({"metadata": {"name": "team-a"}})
    one = replica("team-a", "one", running.mock.gpus[0].uuid)
    make_host(kube_api, "team-a", [one], pod_ip=ADDRESS)
    token = apiserver.mint_token("team-a", HOST)
    stub = running.stub
    source = copy_model("add_one", tmp_path / "one", as_name="one")
    await install_dir(stub, token, source, "one")
    status = await stub.LoadModel(
        agent_pb2.LoadModelRequest(model_id="one"), metadata=bearer(token)
    )
    assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
    return stub, token


async def test_a_replica_triton_has_loaded_reads_false_while_its_loader_reports_a_failure(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    running: RunningAgent,
    tmp_path: Path,
) -> None:
    """A replica Triton has loaded (a load its loader gave up on that ended anyway) whose host's
    loader reports it cannot load it (its files could not be fetched again: the store is down)
    is not in the host's models file, so its host's proxy answers "no longer served on this
    host": its condition reads the loader's failure, not ModelReady, so that the binder keeps
    the host out of the model's Service; once the loader reports no failure it reads True."""
    stub, token = await _host_with_one_loaded(apiserver, kube_api, running, tmp_path)
    loaded_one = loaded_condition(Keys(), "one", 0)

    def reads(reason: str) -> bool:
        found = condition_of(kube_api, "team-a", loaded_one)
        return found is not None and found[1] == reason

    await eventually(lambda: reads("ModelReady"), what="the loaded replica ready")
    down = "https://store/one.tgz answered HTTP 503 the model store is down"
    await stub.ListHosted(
        agent_pb2.ListHostedRequest(failures=[failure("one", "FetchFailed", down)]),
        metadata=bearer(token),
    )
    await eventually(lambda: reads("FetchFailed"), what="the loader's failure on the replica")
    said = condition_of(kube_api, "team-a", loaded_one)
    assert said is not None and said[0] == "False" and "HTTP 503" in said[2], said
    assert "replica one/0" in said[2], said

    await stub.ListHosted(agent_pb2.ListHostedRequest(), metadata=bearer(token))
    await eventually(lambda: reads("ModelReady"), what="ready again once the loader has it")


async def test_a_hosts_replicas_stay_listed_while_triton_is_down(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    start_custom_agent: StartAgent,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    """While Triton does not answer (it crashed, the kubelet restarts it) the agent cannot say
    how a host's replicas are: ListHosted fails as unavailable (the host's loader keeps its
    models as they are) rather than leave them out, which the loader reads as the replicas
    having left the host: it would unlist them, its proxy answering 404 for each, and unload
    them. The agent counts the exit."""
    running = await start_custom_agent(gateway_table=tmp_path / "callers.json")
    stub, token = await _host_with_one_loaded(apiserver, kube_api, running, tmp_path)

    exits = running.agent.metrics.registry
    assert exits.get_sample_value("tritonshare_agent_triton_exits_total") == 0
    triton.kill()
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.ListHosted(agent_pb2.ListHostedRequest(), metadata=bearer(token))
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "Triton" in (error.value.details() or "")
    await eventually(
        lambda: exits.get_sample_value("tritonshare_agent_triton_exits_total") == 1,
        what="the exit counted",
    )

    triton.restart()

    async def listed_again() -> bool:
        try:
            listed = await stub.ListHosted(agent_pb2.ListHostedRequest(), metadata=bearer(token))
        except grpc.aio.AioRpcError:
            return False
        return [(r.model_id, r.replica) for r in listed.replicas] == [("one", 0)]

    await eventually(listed_again, what="the replica listed once Triton is back")
