"""A tenant with full rights in its namespace tries to make a model host act for what the binder
did not place there: the agent's authorizer and its view of the node's pods, against sim/'s real
TokenReview and pods written with the official client. Only the binder's signed proof of each
replica decides; the host's labels and annotation, which the tenant can edit, prove nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from agent.api.auth import Authorizer, Caller
from agent.errors import NotPlacedError, PermissionDeniedError
from agent.kube.client import KubeClient
from agent.pods.nodepods import REFUSED_PER_HOST, NodePods
from agent.pods.ownership import OwnerRecord
from agent.pods.provenpods import PlacementVerifier
from common.contract import RESIDENCY_ON_DEMAND, Keys
from common.hosted import encode_hosted, host_name
from common.tritonname import private_triton_name
from sim.apiserver import RunningApiServer
from tests.agent.conftest import NODE, bearer, make_node, make_pod
from tests.agent.hosts import make_host, replica, replica_triton_name, unwatched
from tests.fixtures_sim import TEST_RING, core_v1

OTHER_NODE = "gpu-node-2"
GPU = "GPU-00000000-0000-0000-0000-000000000001"


def authorizer(kube: KubeClient, node: str = NODE) -> Authorizer:
    return Authorizer(
        kube,
        PlacementVerifier(lambda: TEST_RING, node),
        node_name=node,
        scheduler_name="tritonshare",
        keys=Keys(),
        audience="tritonshare-agent",
        platform_accounts=(),
        watched_host=unwatched,
    )


def node_pods(kube: KubeClient, node: str = NODE) -> NodePods:
    return NodePods(
        PlacementVerifier(lambda: TEST_RING, node),
        kube.get_pod,
        scheduler_name="tritonshare",
        keys=Keys(),
    )


@pytest.fixture
async def kube(
    kubeconfig: Path, kube_api: kubernetes.client.ApiClient
) -> AsyncIterator[KubeClient]:
    for name in ("team-a", "team-b"):
        core_v1(kube_api).create_namespace({"metadata": {"name": name}})
    make_node(kube_api)
    make_node(kube_api, OTHER_NODE)
    client = KubeClient(str(kubeconfig))
    try:
        yield client
    finally:
        await client.close()


async def caller(auth: Authorizer, apiserver: RunningApiServer, namespace: str, pod: str) -> Caller:
    return await auth.authenticate(bearer(apiserver.mint_token(namespace, pod)))


def listed(api: kubernetes.client.ApiClient) -> list[dict[str, Any]]:
    pods = core_v1(api).list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}")
    items: list[dict[str, Any]] = api.sanitize_for_serialization(pods)["items"]  # type: ignore[no-untyped-call]
    return items


async def test_a_host_acts_only_as_its_proven_replicas(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient, kube: KubeClient
) -> None:
    """The positive case: the host acts as each replica, named and proven as the binder signed
    it, under a private name of its own; a model it does not serve is refused."""
    entries = [replica("team-a", "resnet", GPU), replica("team-a", "bert", GPU, ordinal=2)]
    make_host(kube_api, "team-a", entries)
    auth = authorizer(kube)
    host = await caller(auth, apiserver, "team-a", host_name(NODE))
    proven = await auth.authorize_model(host, "bert")
    assert proven.pod.name == "bert/2" and proven.pod.host == host_name(NODE)
    assert proven.uid == entries[1].replica_uid and proven.namespace == "team-a"
    assert proven.request == 1024**3 and proven.gpu_uuid == GPU
    with pytest.raises(PermissionDeniedError, match="serves no replica of model 'vgg'"):
        await auth.authorize_model(host, "vgg")
    pods = node_pods(kube)
    pods.replace(listed(kube_api))
    assert sorted(p.key for p in pods.all_proven()) == ["team-a/bert/2", "team-a/resnet/0"]
    # Each replica's own name in Triton: never another namespace's, nor a pod's of that name.
    names = {replica_triton_name(e, "team-a") for e in entries}
    assert len(names) == 2
    assert replica_triton_name(entries[0], "team-b") not in names
    make_pod(kube_api, "resnet", "resnet", namespace="team-a", gpu_uuid=GPU)
    pod_uid = core_v1(kube_api).read_namespaced_pod("resnet", "team-a").metadata.uid
    assert private_triton_name("team-a", "resnet", pod_uid) not in names


async def test_an_entry_copied_to_another_namespaces_host_gets_nothing(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient, kube: KubeClient
) -> None:
    victim = replica("team-b", "secret-model", GPU)
    make_host(kube_api, "team-b", [victim])
    make_host(kube_api, "team-a", [victim])  # the attacker's host, the victim's entry copied
    auth = authorizer(kube)
    attacker = await caller(auth, apiserver, "team-a", host_name(NODE))
    with pytest.raises(NotPlacedError, match="was not placed on this node"):
        await auth.authorize_model(attacker, "secret-model")
    obj = await auth.host_of(attacker)
    proven, refused = auth.hosted(obj)
    assert proven == [] and refused and refused[0].startswith("secret-model/0: ")
    pods = node_pods(kube)
    pods.replace(listed(kube_api))
    assert [p.key for p in pods.all_proven()] == ["team-b/secret-model/0"]


async def test_an_entry_copied_to_the_host_on_another_node_gets_nothing(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient, kube: KubeClient
) -> None:
    entry = replica("team-a", "resnet", GPU, node=NODE)
    make_host(kube_api, "team-a", [entry], node=OTHER_NODE)
    auth = authorizer(kube, OTHER_NODE)
    host = await caller(auth, apiserver, "team-a", host_name(OTHER_NODE))
    with pytest.raises(NotPlacedError):
        await auth.authorize_model(host, "resnet")
    # And this node's agent does not act for another node's host.
    with pytest.raises(PermissionDeniedError, match="not to gpu-node-1"):
        await authorizer(kube).authorize_model(host, "resnet")


@pytest.mark.parametrize(
    "edit",
    [{"gpu": "GPU-ffffffff-0000-0000-0000-000000000002"}, {"residency": RESIDENCY_ON_DEMAND}],
    ids=["gpu", "residency"],
)
async def test_an_edited_entry_fails(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    kube: KubeClient,
    edit: dict[str, Any],
) -> None:
    make_host(kube_api, "team-a", [replace(replica("team-a", "resnet", GPU), **edit)])
    auth = authorizer(kube)
    host = await caller(auth, apiserver, "team-a", host_name(NODE))
    with pytest.raises(NotPlacedError, match="does not match"):
        await auth.authorize_model(host, "resnet")


async def test_a_host_of_a_storage_secret_is_named_after_it(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient, kube: KubeClient
) -> None:
    """A namespace has a host per storage Secret on a node: one named after its node and the
    Secret its annotation names acts for its replicas; under another Secret's name, or the
    node's alone, it is no host of the node."""
    make_host(kube_api, "team-a", [replica("team-a", "bert", GPU)], secret="creds")
    auth = authorizer(kube)
    host = await caller(auth, apiserver, "team-a", host_name(NODE, "creds"))
    proven = await auth.authorize_model(host, "bert")
    assert proven.pod.host == host_name(NODE, "creds")
    for name in (host_name(NODE, "other"), host_name(NODE)):
        make_host(kube_api, "team-a", [replica("team-a", "gpt", GPU)], secret="creds", name=name)
        impostor = await caller(auth, apiserver, "team-a", name)
        with pytest.raises(PermissionDeniedError, match="is not its node's model host"):
            await auth.authorize_model(impostor, "gpt")


async def test_a_tenant_pod_that_calls_itself_a_host_acts_for_no_replica(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient, kube: KubeClient
) -> None:
    """A tenant's own pod with the host label and an annotation: named otherwise than the
    node's host, it stands for nothing; named as the host and placed by the binder as a model
    pod, its own proof, put in an entry, is the proof of another name and uid."""
    real = replica("team-a", "resnet", GPU)
    make_host(kube_api, "team-a", [real], name="impostor")
    auth = authorizer(kube)
    impostor = await caller(auth, apiserver, "team-a", "impostor")
    with pytest.raises(PermissionDeniedError, match="is not its node's model host"):
        await auth.authorize_model(impostor, "resnet")

    pod = make_pod(kube_api, host_name(NODE), "resnet", namespace="team-a", gpu_uuid=GPU)
    own_proof = pod["metadata"]["annotations"]["tritonshare.io/placement"]
    as_pod = await caller(auth, apiserver, "team-a", host_name(NODE))
    assert (await auth.authorize_model(as_pod, "resnet")).pod.host == "", "a model pod so far"
    forged = replace(real, uid=pod["metadata"]["uid"], proof=own_proof)
    core_v1(kube_api).patch_namespaced_pod(
        host_name(NODE),
        "team-a",
        {
            "metadata": {
                "labels": {"tritonshare.io/model-host": "true"},
                "annotations": {"tritonshare.io/hosted-models": encode_hosted([forged])},
            }
        },
    )
    core_v1(kube_api).patch_namespaced_pod_status(
        host_name(NODE), "team-a", {"status": {"phase": "Running"}}
    )
    tenant = await caller(auth, apiserver, "team-a", host_name(NODE))
    with pytest.raises(NotPlacedError, match="does not match"):
        await auth.authorize_model(tenant, "resnet")
    pods = node_pods(kube)
    pods.replace(listed(kube_api))
    assert pods.all_proven() == [], "neither the impostor nor the relabelled pod wants a model"


async def test_a_model_pod_cannot_list_hosted_replicas_and_a_malformed_host_serves_none(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient, kube: KubeClient
) -> None:
    make_pod(kube_api, "plain", "resnet", namespace="team-a", gpu_uuid=GPU)
    auth = authorizer(kube)
    plain = await caller(auth, apiserver, "team-a", "plain")
    with pytest.raises(PermissionDeniedError, match="is not a model host"):
        await auth.host_of(plain)
    make_host(kube_api, "team-b", [])
    core_v1(kube_api).patch_namespaced_pod(
        host_name(NODE),
        "team-b",
        {"metadata": {"annotations": {"tritonshare.io/hosted-models": "[{"}}},
    )
    pods = node_pods(kube)
    problems = pods.replace(listed(kube_api))
    assert [(host.key, why) for host, why in problems] == [
        (f"team-b/{host_name(NODE)}", problems[0][1])
    ]
    assert "is not JSON" in problems[0][1]
    host = await caller(auth, apiserver, "team-b", host_name(NODE))
    with pytest.raises(PermissionDeniedError, match="serves no replica: the hosted-models"):
        await auth.authorize_model(host, "resnet")


async def test_a_host_full_of_forged_entries_costs_the_agent_a_bounded_number_of_writes(
    kube_api: kubernetes.client.ApiClient, kube: KubeClient
) -> None:
    forged = [replace(replica("team-a", f"m{i}", GPU), proof="v1.forged") for i in range(20)]
    make_host(kube_api, "team-a", forged)
    pods = node_pods(kube)
    pods.replace(listed(kube_api))
    refused = pods.unproven()
    assert len(refused) == REFUSED_PER_HOST
    assert all(error.event_reason == "PlacementChanged" for _, error in refused)


async def test_a_replicas_owner_record_lives_while_its_host_names_it_with_a_valid_proof(
    kube_api: kubernetes.client.ApiClient, kube: KubeClient
) -> None:
    entry = replica("team-a", "resnet", GPU)
    make_host(kube_api, "team-a", [entry])
    pods = node_pods(kube)
    record = OwnerRecord(entry.replica_uid, f"team-a/{entry.replica_name}", "resnet")
    assert await pods.owner_alive(record)
    make_host(kube_api, "team-b", [entry])  # the entry copied into another namespace's host
    copied = OwnerRecord(entry.replica_uid, f"team-b/{entry.replica_name}", "resnet")
    assert not await pods.owner_alive(copied), "another namespace's host does not stand for it"
    body = {"metadata": {"annotations": {"tritonshare.io/hosted-models": encode_hosted([])}}}
    core_v1(kube_api).patch_namespaced_pod(host_name(NODE), "team-a", body)
    assert not await pods.owner_alive(record)


async def test_several_replicas_of_a_model_each_act_only_as_placed(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient, kube: KubeClient
) -> None:
    """Two replicas of one model on a host: each call names its ordinal and acts as that
    replica; an entry copied under another ordinal (a forged slot) does not verify, and an
    entry listed twice makes its slot ambiguous, so it is refused rather than doubled."""
    first, second = replica("team-a", "resnet", GPU), replica("team-a", "resnet", GPU, ordinal=1)
    make_host(kube_api, "team-a", [first, second])
    auth = authorizer(kube)
    host = await caller(auth, apiserver, "team-a", host_name(NODE))
    assert (await auth.authorize_model(host, "resnet", 0)).uid == first.replica_uid
    assert (await auth.authorize_model(host, "resnet", 1)).uid == second.replica_uid
    assert replica_triton_name(first, "team-a") != replica_triton_name(second, "team-a")
    with pytest.raises(PermissionDeniedError, match="say which replica"):
        await auth.authorize_model(host, "resnet")
    with pytest.raises(PermissionDeniedError, match="serves no replica 2 of model 'resnet'"):
        await auth.authorize_model(host, "resnet", 2)

    forged = replace(first, replica=2)  # replica 0's proof under a slot never placed
    twice = [first, first, second, forged]
    core_v1(kube_api).patch_namespaced_pod(
        host_name(NODE),
        "team-a",
        {"metadata": {"annotations": {"tritonshare.io/hosted-models": encode_hosted(twice)}}},
    )
    with pytest.raises(NotPlacedError):
        await auth.authorize_model(host, "resnet", 2)
    with pytest.raises(PermissionDeniedError, match="names 2 replicas 0 of model 'resnet'"):
        await auth.authorize_model(host, "resnet", 0)
    pods = node_pods(kube)
    pods.replace(listed(kube_api))
    proven = sorted(p.key for p in pods.all_proven())
    assert proven.count("team-a/resnet/0") <= 1 and "team-a/resnet/2" not in proven
    assert len(proven) <= 2, "never more replicas than placed"
