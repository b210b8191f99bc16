"""What a platform team meets first with model hosts, at the binder, against the simulated API
server through the official client: a TritonModel's storage Secret reaches its hosts' loader
alone, named in its own namespace only, and a model whose Secret no host mounts gets hosts of its
own (its neighbours' are never replaced for it); a host made from another template is replaced,
one host of a namespace at a time."""

from __future__ import annotations

import functools
import json
import threading
from typing import Any

import kubernetes.client
import pytest

from common.contract import Keys
from common.hosted import (
    HostedError,
    decode_hosted,
    host_name,
    host_storage_problem,
)
from tests.binder.objects import GI
from tests.binder.simcluster import MakeBinder, add_node, eventually
from tests.binder.tritonmodels import test_tritonmodels
from tests.binder.tritonmodels.test_model_hosts import HOST_READY, hosted
from tests.binder.tritonmodels.test_tritonmodels import (
    GROUP,
    PLURAL,
    VERSION,
    hosts,
    kubelet_removes_deleted,
    loaded_types,
    model,
    placed,
    read,
)
from tests.fixtures_sim import new_watch

apiserver = test_tritonmodels.apiserver
custom = test_tritonmodels.custom
SECRET_DIR = "/var/secrets/storage"
KEYS = Keys()
TEMPLATE = "tritonshare.io/host-template"
HOSTED = "tritonshare.io/hosted-models"


def private(name: str, replicas: int, secret: str = "creds") -> dict[str, Any]:  # noqa: S107
    obj = model(name, replicas)
    obj["spec"]["storageSecret"] = secret
    return obj


def condition(custom: Any, name: str, kind: str) -> dict[str, Any]:
    conditions = (read(custom, name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def terminating(core: Any) -> list[str]:
    """The nodes of the hosts being deleted."""
    pods = core.list_namespaced_pod("default").items
    return [p.spec.node_name for p in pods if p.metadata.deletion_timestamp]


def ready_with(custom: Any, name: str, reason: str) -> dict[str, Any]:
    """The model's Ready condition once its reason is `reason`, else {}."""
    found = condition(custom, name, "Ready")
    return found if found.get("reason") == reason else {}


def loaded(core: Any, node: str, *models: str) -> None:
    """What the agent writes on the host on `node` once it serves `models`."""
    agent_writes(core, node, models, {"status": "True", "reason": "ModelReady"})


def agent_writes(core: Any, node: str, models: tuple[str, ...], state: dict[str, str]) -> None:
    """The agent's loaded condition (`state`) of each replica of `models` on the host on `node`,
    the host Ready."""
    conditions = [
        {"type": loaded, **state} for m in models for loaded in loaded_types(core, node, m)
    ] + [HOST_READY]
    core.patch_namespaced_pod_status(
        host_name(node),
        "default",
        {"status": {"conditions": conditions}},
        _content_type="application/strategic-merge-patch+json",
    )


async def test_a_storage_secret_is_mounted_in_its_hosts_loader_alone(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "n1", [16 * GI])
    await make_binder()
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, private("bert", 1))
    host = (await eventually(lambda: hosts(core), what="the host"))["n1"]
    spec = core.api_client.sanitize_for_serialization(host)["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    # Optional: a Secret that does not exist fails its own replicas' fetch, not the host.
    # KServe's keys for s3://, gs:// and https:// storage, each optional.
    names = (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "gcloud-application-credentials.json",
        "https-host",
        "headers",
    )
    keys = [{"key": k, "path": f"creds/{k}"} for k in names]
    assert volumes["storage-secrets"] == {
        "name": "storage-secrets",
        "projected": {"sources": [{"secret": {"name": "creds", "optional": True, "items": keys}}]},
    }
    loader, proxy = spec["containers"]
    mount = {"name": "storage-secrets", "mountPath": SECRET_DIR, "readOnly": True}
    assert mount in loader["volumeMounts"]
    assert f"--storage-secret-dir={SECRET_DIR}" in loader["args"]
    assert all(m["name"] != "storage-secrets" for m in proxy["volumeMounts"]), "none in the proxy"
    assert [e.get("storageSecret") for e in hosted(host)] == ["creds"]


@pytest.mark.parametrize("secret", ["team-a/creds", "../team-a", "Creds", "a" * 254])
async def test_a_storage_secret_is_named_in_the_models_own_namespace_only(
    kube_api: kubernetes.client.ApiClient, custom: Any, secret: str
) -> None:
    """A Secret volume has no namespace (the kubelet reads the pod's own), and no name with a
    slash gets as far as a host: the schema refuses it, and the agent refuses it in a host's
    annotation (which the namespace can edit)."""
    with pytest.raises(kubernetes.client.ApiException) as refused:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, private("bert", 1, secret)
        )
    assert refused.value.status == 422
    assert "spec.storageSecret" in json.loads(str(refused.value.body))["message"]
    forged = json.dumps([{"model": "bert", "uid": "u", "replica": 0, "storageSecret": secret}])
    with pytest.raises(HostedError, match="is not a Secret name"):
        decode_hosted(forged)
    assert "is not a Secret name" in host_storage_problem("https://h/m.tar.gz", secret)


def test_a_credential_goes_over_https_only() -> None:
    """The schema takes no http:// storageUri; the binder's rule holds without it too."""
    assert "not plain http://" in host_storage_problem(
        "http://models.example.com/x.tar.gz", "creds"
    )
    assert host_storage_problem("https://models.example.com/x.tar.gz", "creds") == ""
    assert "cannot read a PersistentVolumeClaim" in host_storage_problem("pvc://claim/m")
    assert host_storage_problem("s3://models/resnet", "creds") == ""
    assert host_storage_problem("gs://models/resnet", "creds") == ""


def all_hosts(core: Any) -> dict[str, Any]:
    """Every host pod in `default`, by name."""
    pods = core.list_namespaced_pod("default", label_selector="tritonshare.io/model-host=true")
    return {p.metadata.name: p for p in pods.items}


async def test_a_model_with_a_new_storage_secret_gets_hosts_of_its_own(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    """A model whose Secret no host of its namespace mounts gets a host on each of its nodes,
    which mounts that Secret alone and names its replicas alone; the namespace's hosts are
    never replaced, nor rewritten, for it. Another model of the same Secret joins that host."""
    for node in ("n1", "n2"):
        add_node(kube_api, node, [16 * GI])
    await make_binder()
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("resnet", 2))
    await eventually(lambda: placed(custom, "resnet", 2), what="resnet placed")
    before = await eventually(lambda: len(all_hosts(core)) == 2 and all_hosts(core), what="2")
    for node in ("n1", "n2"):
        loaded(core, node, "resnet")
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, private("bert", 2))
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, private("gpt", 1))
    await eventually(lambda: placed(custom, "bert", 2), what="bert placed")
    await eventually(lambda: placed(custom, "gpt", 1), what="gpt placed")
    after = await eventually(lambda: len(all_hosts(core)) == 4 and all_hosts(core), what="4")
    for name, host in before.items():
        assert after[name].metadata.uid == host.metadata.uid, "never replaced"
        assert after[name].metadata.annotations[HOSTED] == host.metadata.annotations[HOSTED]
        assert not terminating(core)
    for node in ("n1", "n2"):
        own = after[host_name(node, "creds")]
        assert own.spec.node_name == node
        assert own.metadata.annotations["tritonshare.io/host-secret"] == "creds"
        [volume] = [v for v in own.spec.volumes if v.name == "storage-secrets"]
        assert [s.secret.name for s in volume.projected.sources] == ["creds"]
        assert {e["model"] for e in hosted(own)} <= {"bert", "gpt"}
        assert "bert" in {e["model"] for e in hosted(own)}
    assert sorted(e["model"] for h in after.values() for e in hosted(h)) == [
        "bert",
        "bert",
        "gpt",
        "resnet",
        "resnet",
    ]
    placements = read(custom, "bert")["status"]["placements"]
    assert {p["host"] for p in placements} == {host_name(n, "creds") for n in ("n1", "n2")}


async def test_a_replica_whose_secret_changes_moves_host_once_the_old_one_lets_it_go(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    """A model whose storageSecret is changed moves to the host of its new Secret; the agent acts
    for a replica named by one host at a time, so no write ever has two hosts naming it: the old
    host lets it go (here: is deleted, and gone) before the new one names it."""
    add_node(kube_api, "n1", [16 * GI])
    await make_binder()
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, private("bert", 1))
    await eventually(lambda: placed(custom, "bert", 1), what="bert placed")
    await eventually(lambda: host_name("n1", "creds") in all_hosts(core), what="its host")
    listing: dict[str, list[str]] = {}
    overlaps: list[dict[str, list[str]]] = []
    stop = threading.Event()

    def follow() -> None:
        # Each event in the API server's order: who names bert's replica after it.
        version = ""
        while not stop.is_set():
            options = {"resource_version": version} if version else {}
            for event in new_watch().stream(
                core.list_namespaced_pod, "default", timeout_seconds=1, **options
            ):
                pod = event["object"]
                version = pod.metadata.resource_version
                gone = event["type"] == "DELETED"
                listing[pod.metadata.name] = [] if gone else [e["model"] for e in hosted(pod)]
                if sum("bert" in n for n in listing.values()) > 1:
                    overlaps.append(dict(listing))

    watcher = threading.Thread(target=follow)
    watcher.start()
    try:
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, "bert", {"spec": {"storageSecret": "other"}}
        )
        await eventually(functools.partial(terminating, core), what="the old host deleted")
        new = await eventually(lambda: all_hosts(core).get(host_name("n1", "other")))
        assert hosted(new) == [], "nothing while the old host drains"
        kubelet_removes_deleted(core)

        def moved() -> list[str]:
            host = all_hosts(core).get(host_name("n1", "other"))
            return [e["model"] for e in hosted(host)] if host is not None else []

        assert await eventually(moved, what="bert on its new host") == ["bert"]
        assert host_name("n1", "creds") not in all_hosts(core)
    finally:
        stop.set()
        watcher.join(10)
    assert overlaps == [], "two hosts named the replica at once"


async def test_a_host_the_api_server_refuses_is_in_each_models_ready_condition(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    """Both models placed on the node say why they are not served, in the API server's words:
    their Ready condition (reason FailedCreate), their placement's message and one Warning Event
    each, until the host fits and is created."""
    add_node(kube_api, "n1", [16 * GI])
    await make_binder()
    quota = {"metadata": {"name": "count"}, "spec": {"hard": {"pods": "1"}}}
    core.create_namespaced_resource_quota("default", quota)
    core.create_namespaced_pod(
        "default",
        {"metadata": {"name": "other"}, "spec": {"containers": [{"name": "m", "image": "x"}]}},
    )
    for name in ("bert", "resnet"):
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model(name, 1))
    name = host_name("n1")
    words = (
        f'the binder cannot create model host {name} on node n1: pods "{name}" is forbidden: '
        "exceeded quota: count, requested: pods=1, used: pods=1, limited: pods=1"
    )
    for model_name in ("bert", "resnet"):
        ready = await eventually(
            functools.partial(ready_with, custom, model_name, "FailedCreate"),
            what=f"{model_name}'s Ready condition",
        )
        assert ready["status"] == "False"
        assert ready["message"] == f"0 of 1 replicas ready; replica 0 on n1: {words}"
        [placement] = read(custom, model_name)["status"]["placements"]
        assert (placement["ready"], placement["message"]) == (False, words)
        assert condition(custom, model_name, "Placed")["status"] == "True", "placed all the same"

    def events(model_name: str) -> list[Any]:
        selector = f"involvedObject.name={model_name}"
        return [
            (e.type, e.reason, e.message)
            for e in core.list_namespaced_event("default", field_selector=selector).items
            if e.reason != "Scheduled"
        ]

    for model_name in ("bert", "resnet"):
        await eventually(functools.partial(events, model_name), what=f"{model_name}'s Event")
        assert events(model_name) == [("Warning", "FailedCreate", words)], "one, no other"

    core.patch_namespaced_resource_quota("count", "default", {"spec": {"hard": {"pods": "2"}}})
    await eventually(lambda: "n1" in hosts(core), what="the host once the quota allows it")
    past = "0 of 1 replicas ready; replica 0 on n1: not loaded on its model host yet"

    def settled(model_name: str) -> bool:
        # A status written as the host was being created may say "not created yet" first.
        found = ready_with(custom, model_name, "ReplicasNotReady")
        return found.get("message") == past

    for model_name in ("bert", "resnet"):
        await eventually(
            functools.partial(settled, model_name),
            what=f"{model_name}'s condition past the refusal: {past}",
        )
    assert len(events("bert")) == 1, "one Event per refusal, not one per retry"


async def test_hosts_made_from_another_template_are_replaced_one_at_a_time(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    """A binder upgraded to another --host-image replaces the hosts the old one made, node by
    node; labels and replicas written meanwhile never pass for the new template."""
    for node in ("n1", "n2"):
        add_node(kube_api, node, [16 * GI])
    old = await make_binder(host_image="tritonshare:1.0")
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("resnet", 2))
    before = await eventually(lambda: len(hosts(core)) == 2 and hosts(core), what="2 hosts")
    made = {n: h.metadata.annotations[TEMPLATE] for n, h in before.items()}
    assert len(set(made.values())) == 2, "a hash per node"
    for node in before:
        loaded(core, node, "resnet")
    await eventually(lambda: read(custom, "resnet")["status"].get("readyReplicas") == 2)
    await make_binder.stop(old)

    await make_binder(host_image="tritonshare:1.1")
    [first] = await eventually(functools.partial(terminating, core), what="one old host replaced")
    [other] = set(before) - {first}
    assert hosts(core)[other].metadata.uid == before[other].metadata.uid, "one at a time"
    assert hosts(core)[other].metadata.annotations[TEMPLATE] == made[other], "never patched"
    kubelet_removes_deleted(core)
    again = await eventually(lambda: hosts(core).get(first), what="the new host")
    assert {c.image for c in again.spec.containers} == {"tritonshare:1.1"}
    assert again.metadata.annotations[TEMPLATE] != made[first]
    assert not terminating(core), "the other waits for the new host to serve"
    loaded(core, first, "resnet")
    await eventually(functools.partial(terminating, core), what="then the other host")
    kubelet_removes_deleted(core)
    last = await eventually(lambda: hosts(core).get(other), what="its new host")
    assert {c.image for c in last.spec.containers} == {"tritonshare:1.1"}
    loaded(core, other, "resnet")
    await eventually(lambda: read(custom, "resnet")["status"].get("readyReplicas") == 2)
    assert not terminating(core), "up to date: nothing more replaced"


async def test_a_model_one_host_serves_gets_a_stand_in_before_that_host_is_replaced(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    """A binder upgraded to another --host-image, and a TritonModel of one replica: before its
    host is replaced, a stand-in replica is placed on another node and served, so the model keeps
    a served replica throughout; the stand-in drains once the new host serves the model."""
    for node in ("n1", "n2"):
        add_node(kube_api, node, [16 * GI])
    old = await make_binder(host_image="tritonshare:1.0")
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("solo", 1))
    [first] = await eventually(lambda: len(hosts(core)) == 1 and list(hosts(core)), what="a host")
    loaded(core, first, "solo")
    await eventually(lambda: read(custom, "solo")["status"].get("readyReplicas") == 1)
    await make_binder.stop(old)

    await make_binder(host_image="tritonshare:1.1")
    [other] = {"n1", "n2"} - {first}
    stand_in = await eventually(lambda: hosts(core).get(other), what="the stand-in's host")
    assert [(e["model"], e["replica"]) for e in hosted(stand_in)] == [("solo", 1)]
    assert not terminating(core), "the old host stays until the stand-in serves"
    status = read(custom, "solo")["status"]
    assert condition(custom, "solo", "Placed").get("status") == "True", status
    loaded(core, other, "solo")
    await eventually(functools.partial(terminating, core), what="then the old host goes")
    assert {c.image for c in stand_in.spec.containers} == {"tritonshare:1.1"}
    kubelet_removes_deleted(core)
    again = await eventually(lambda: hosts(core).get(first), what="the new host")
    assert {c.image for c in again.spec.containers} == {"tritonshare:1.1"}
    assert not any(e.get("draining") for e in hosted(hosts(core)[other])), "it serves meanwhile"
    loaded(core, first, "solo")

    def stand_in_drains() -> bool:
        entries = hosted(hosts(core)[other]) if other in hosts(core) else []
        return all(e.get("draining") for e in entries)

    await eventually(stand_in_drains, what="the stand-in drains")
    assert [(e["model"], e["replica"]) for e in hosted(hosts(core)[first])] == [("solo", 0)]
    assert not any(e.get("draining") for e in hosted(hosts(core)[first]))


async def test_with_no_room_for_a_stand_in_the_host_is_replaced_after_the_drain_bound(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    """One node: no stand-in fits anywhere, the model's status says nothing of it (it is
    served), and its host is replaced --host-drain-seconds after the stand-in was asked."""
    add_node(kube_api, "n1", [16 * GI])
    old = await make_binder(host_image="tritonshare:1.0")
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("solo", 1))
    await eventually(lambda: "n1" in hosts(core), what="a host")
    loaded(core, "n1", "solo")
    await eventually(lambda: read(custom, "solo")["status"].get("readyReplicas") == 1)
    await make_binder.stop(old)

    await make_binder(host_image="tritonshare:1.1", host_drain_seconds=2.0)
    await eventually(functools.partial(terminating, core), what="the host replaced")
    assert condition(custom, "solo", "Placed").get("status") == "True"
    going = core.read_namespaced_pod(host_name("n1"), "default")
    assert [(e["model"], e["replica"]) for e in hosted(going)] == [("solo", 0)], "no stand-in"


def node_pod_stopping(core: Any, node: str, model_name: str) -> None:
    """What the agent of `node` writes on its host as its node pod stops."""
    stopping = {"status": "False", "reason": "NodePodStopping", "message": "stopping"}
    agent_writes(core, node, (model_name,), stopping)


async def test_a_model_served_alone_on_a_stopping_node_gets_a_stand_in_until_it_serves_there(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    """A node pod replaced under a TritonModel of one replica: as its agent says the node pod
    stops, the model gets a stand-in on another node; the stopping host keeps it in its Service
    until the stand-in serves (then the agent's drain may end), and the stand-in drains once the
    node's new node pod serves the model again."""
    for node in ("n1", "n2"):
        add_node(kube_api, node, [16 * GI])
    await make_binder()
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("solo", 1))
    [first] = await eventually(lambda: len(hosts(core)) == 1 and list(hosts(core)), what="a host")
    [other] = {"n1", "n2"} - {first}
    loaded(core, first, "solo")
    await eventually(lambda: read(custom, "solo")["status"].get("readyReplicas") == 1)
    label = "tritonshare.io/serves-solo"

    node_pod_stopping(core, first, "solo")
    stand_in = await eventually(lambda: hosts(core).get(other), what="the stand-in's host")
    assert [(e["model"], e["replica"]) for e in hosted(stand_in)] == [("solo", 1)]
    assert hosts(core)[first].metadata.labels.get(label) == "true", "the last served answers on"
    loaded(core, other, "solo")
    await eventually(
        lambda: label not in (hosts(core)[first].metadata.labels or {}),
        what="the stopping host out of the Service once the stand-in serves",
    )
    assert hosts(core)[other].metadata.labels.get(label) == "true"

    loaded(core, first, "solo")  # the new node pod's agent loaded it again

    def stand_in_drains() -> bool:
        entries = hosted(hosts(core)[other]) if other in hosts(core) else []
        return all(e.get("draining") for e in entries)

    await eventually(stand_in_drains, what="the stand-in drains")
    assert not any(e.get("draining") for e in hosted(hosts(core)[first]))


def parked_models(host: Any) -> list[str]:
    value = (host.metadata.annotations or {}).get("tritonshare.io/parked-models") or "[]"
    return [entry["model"] for entry in json.loads(value)]


async def test_a_model_parked_at_zero_on_a_replaced_host_gets_a_stand_in_first(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    """A TritonModel scaled to zero is parked on its namespace's host, whose proxy holds its
    requests: before a binder of another --host-image replaces that host, a stand-in replica of
    it is served on another node (its Service never empty); once the new host is there the
    stand-in drains and the model is parked on the stand-in's host."""
    for node in ("n1", "n2"):
        add_node(kube_api, node, [16 * GI])
    # No autoscaler: a new model at zero would be scaled to one until a request-free window.
    old = await make_binder(host_image="tritonshare:1.0", autoscale_period_seconds=0)
    zero = model("zero", 0)
    zero["spec"]["autoscaling"] = {"target": 1, "minReplicas": 0}
    for obj in (model("solo", 1), zero):
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, obj)
    [first] = await eventually(lambda: len(hosts(core)) == 1 and list(hosts(core)), what="a host")
    await eventually(lambda: parked_models(hosts(core)[first]) == ["zero"], what="zero parked")
    loaded(core, first, "solo")
    await eventually(lambda: read(custom, "solo")["status"].get("readyReplicas") == 1)
    await make_binder.stop(old)

    await make_binder(host_image="tritonshare:1.1", autoscale_period_seconds=0)
    [other] = {"n1", "n2"} - {first}

    def stand_ins() -> set[str]:
        there = hosts(core).get(other)
        return {e["model"] for e in hosted(there)} if there is not None else set()

    await eventually(lambda: stand_ins() == {"solo", "zero"}, what="both stand-ins on n2")
    assert not terminating(core), "the old host stays until the stand-ins serve"
    assert parked_models(hosts(core)[first]) == ["zero"], "it holds zero's requests meanwhile"
    loaded(core, other, "solo", "zero")
    await eventually(functools.partial(terminating, core), what="then the old host goes")
    going = core.read_namespaced_pod(host_name(first), "default")
    assert parked_models(going) == [], "the park is taken off first: its held requests answered"
    assert (going.metadata.labels or {}).get("tritonshare.io/serves-zero") is None
    assert hosts(core)[other].metadata.labels.get("tritonshare.io/serves-zero") == "true"
    kubelet_removes_deleted(core)
    await eventually(lambda: hosts(core).get(first), what="the new host")

    def parked_on_the_stand_ins_host() -> bool:
        there = hosts(core).get(other)
        entries = hosted(there) if there is not None else []
        zero_entries = [e for e in entries if e["model"] == "zero"]
        return (
            there is not None
            and all(e.get("draining") for e in zero_entries)
            and parked_models(there) == ["zero"]
            and there.metadata.labels.get("tritonshare.io/serves-zero") == "true"
        )

    await eventually(parked_on_the_stand_ins_host, what="zero's stand-in drains, zero parked")
    assert read(custom, "zero")["spec"]["replicas"] == 0
