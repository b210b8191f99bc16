"""The model hosts the binder builds for TritonModels, against the simulated API server through the
official client: a host is a model pod that serves many models (the loader and the proxy the
webhook writes into a model pod, with the host's arguments); its `serves-<model>` label, the
model's readyReplicas, Ready condition and ReplicaNotServed Events follow the agent's loaded
condition on it (written here as the agent writes it, a strategic-merge patch of pods/status),
without placing anything again; a replica scaled away drains (out of the Service in
the same write that marks it draining) and leaves once no longer loaded, or after the drain's
bound; replicas of a model spread over nodes, then share them."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import kubernetes.client
import pytest

from common.contract import Keys
from common.hosted import host_name, loaded_condition
from common.podresources import CPU, MEMORY, MODEL_HOST_BASE, MODEL_HOST_PER_MODEL, pod_requests
from proxy.settings import parse_settings as parse_proxy_settings
from sim.apiserver import RunningApiServer
from tests.binder.objects import GI
from tests.binder.simcluster import MakeBinder, add_node, eventually
from tests.binder.tritonmodels import test_tritonmodels
from tests.binder.tritonmodels.test_tritonmodels import (
    GROUP,
    HOSTED,
    PLURAL,
    SERVES,
    VERSION,
    hosts,
    loaded_types,
    model,
    placed,
    read,
)
from tests.deploy.test_admission_policy import client_with_token
from tests.fixtures_sim import new_watch
from webhook.mutation import complete
from webhook.settings import Settings as WebhookSettings

KEYS = Keys()
NODES = ("n1", "n2", "n3")
READY_FILE = "/var/run/tritonshare/host/ready.json"

# The simulated API server serving the chart's CRDs, and the custom objects client.
apiserver = test_tritonmodels.apiserver
custom = test_tritonmodels.custom


@pytest.fixture
def nodes(kube_api: kubernetes.client.ApiClient) -> tuple[str, ...]:
    for node in NODES:
        add_node(kube_api, node, [16 * GI])
    return NODES


HOST_READY = {"type": "Ready", "status": "True"}
"""What the kubelet writes on a host once its proxy's readiness probe passes (no kubelet here)."""


def set_loaded(
    core: Any,
    node: str,
    status: str,
    reason: str = "ModelReady",
    message: str = "",
    host_ready: bool = True,
    replicas: tuple[int, ...] | None = None,
) -> None:
    """What the agent writes on the host for its replica of resnet (and the kubelet: the host
    Ready, unless `host_ready` is False): of each replica there, or of those `replicas`."""
    conditions = [
        {"type": t, "status": status, "reason": reason, "message": message}
        for t in loaded_types(core, node, "resnet", replicas=replicas)
    ]
    ready = {**HOST_READY, "status": "True" if host_ready else "False"}
    core.patch_namespaced_pod_status(
        host_name(node),
        "default",
        {"status": {"conditions": [*conditions, ready]}},
        _content_type="application/strategic-merge-patch+json",
    )


def not_served(core: Any) -> list[Any]:
    events = core.list_namespaced_event("default", field_selector="involvedObject.name=resnet")
    return [e for e in events.items if e.reason == "ReplicaNotServed"]


def hosted(host: Any) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = json.loads(host.metadata.annotations[HOSTED])
    return entries


def status(custom: Any) -> dict[str, Any]:
    found: dict[str, Any] = read(custom, "resnet").get("status") or {}
    return found


def scale(custom: Any, replicas: int) -> None:
    custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, "default", PLURAL, "resnet", {"spec": {"replicas": replicas}}
    )


async def all_loaded(
    custom: Any, core: Any, replicas: int, gpu_memory: str = "2Gi"
) -> dict[str, Any]:
    """resnet placed with `replicas`, each loaded on its host and behind the Service."""
    custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, model("resnet", replicas, gpu_memory)
    )
    obj: dict[str, Any] = await eventually(
        lambda: placed(custom, "resnet", replicas), what="placed"
    )
    await eventually(lambda: len(hosts(core)) == replicas, what="the hosts")
    for entry in obj["status"]["placements"]:
        set_loaded(core, entry["node"], "True")
    await eventually(
        lambda: status(custom).get("readyReplicas") == replicas, what="every replica ready"
    )
    ready = {c["type"]: c for c in status(custom)["conditions"]}["Ready"]
    assert (ready["status"], ready["message"]) == (
        "True",
        f"{replicas} of {replicas} replicas ready",
    )
    assert status(custom)["availableReplicas"] == replicas
    return obj


async def test_a_host_is_a_model_pod_serving_the_models_its_loader_makes_ready(
    nodes: tuple[str, ...], custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    await make_binder(agent_port=18100, triton_http_port=18010, audience="agents.example")
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("resnet", 1))
    [host] = (await eventually(lambda: hosts(core), what="the host")).values()
    pod = core.api_client.sanitize_for_serialization(host)
    spec = pod["spec"]
    loader, proxy = spec["containers"]
    agent = ["--agent-address=$(HOST_IP):18100", "--token-file=/var/run/secrets/tritonshare/token"]
    assert (loader["name"], loader["command"]) == ("loader", ["python", "-m", "loader"])
    assert loader["args"] == [
        "--host", f"--models-file={READY_FILE}", "--model-root=/mnt/models",
        "--proxy-metrics-url=http://$(POD_IP):9002/metrics", *agent
    ]  # fmt: skip
    assert (proxy["name"], proxy["command"]) == ("proxy", ["python", "-m", "proxy"])
    assert proxy["args"] == [
        f"--models-file={READY_FILE}",
        "--triton-http-url=$(HOST_IP):18010",
        "--triton-grpc-url=$(HOST_IP):8011",
        "--listen-http=0.0.0.0:9000",
        "--listen-grpc=0.0.0.0:9001",
        "--listen-metrics=0.0.0.0:9002",
        *agent,
        "--listen-mesh-grpc=0.0.0.0:8033",
        "--listen-mesh-http=0.0.0.0:8008",
        "--routes-file=/etc/tritonshare/routes/routes.json",
    ]
    # The proxy takes them as a model host's (no model id of its own).
    node_ip = [a.replace("$(HOST_IP)", "10.0.0.1") for a in proxy["args"]]
    settings = parse_proxy_settings(node_ip, {})
    assert (settings.model_id, str(settings.models_file)) == ("", READY_FILE)
    host_ip = {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}
    pod_ip = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    assert (loader["env"], proxy["env"]) == ([host_ip, pod_ip], [host_ip])
    mounts = {c["name"]: {m["name"]: m for m in c["volumeMounts"]} for c in (loader, proxy)}
    assert mounts["loader"]["model"] == {"name": "model", "mountPath": "/mnt/models"}
    assert mounts["loader"]["host"] == {"name": "host", "mountPath": "/var/run/tritonshare/host"}
    assert mounts["proxy"]["host"]["readOnly"] is True
    assert "model" not in mounts["proxy"], "the proxy never reads model files"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert set(volumes) == {"model", "tmp", "host", "agent-token", "mesh-routes"}
    assert volumes["mesh-routes"]["configMap"] == {
        "name": "tritonshare-mesh-routes",
        "optional": True,
    }
    assert mounts["proxy"]["mesh-routes"]["readOnly"] is True
    assert "emptyDir" in volumes["model"] and "emptyDir" in volumes["host"]
    [source] = volumes["agent-token"]["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == "agents.example"
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    taint = KEYS.gpu_node_toleration()["key"]
    # The GPU nodes' taints, and those the API server adds to every pod (DefaultTolerationSeconds).
    assert {t["key"] for t in spec["tolerations"]} == {
        "nvidia.com/gpu",
        taint,
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    }
    for container in (loader, proxy):
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }
    # What the binder charges its node for the host, as the kubelet counts the pod.
    assert pod_requests(spec) == {
        CPU: MODEL_HOST_BASE[CPU] + MODEL_HOST_PER_MODEL[CPU],
        MEMORY: MODEL_HOST_BASE[MEMORY] + MODEL_HOST_PER_MODEL[MEMORY],
    }

    # One code path: the model pod the webhook completes runs the same proxy, token and pod
    # settings.
    annotations = {"tritonshare.io/model-uri": "gs://b/add_one", KEYS.gpu_mem: "1Gi"}
    model_pod = complete(
        {"metadata": {"name": "m", "annotations": annotations}, "spec": {"containers": []}},
        WebhookSettings(audience="agents.example"),
    )["spec"]
    [model_proxy] = model_pod["containers"]
    same = ("image", "command", "startupProbe", "livenessProbe", "lifecycle",
            "securityContext")  # fmt: skip
    assert {k: proxy[k] for k in same} == {k: model_proxy[k] for k in same}
    # The model pod's ports, and the namespace router's (`modelmesh-serving`).
    mesh_ports = [
        {"name": "mesh-grpc", "containerPort": 8033},
        {"name": "mesh-http", "containerPort": 8008},
    ]
    assert proxy["ports"] == [*model_proxy["ports"], *mesh_ports]
    # The same readiness, probed every second: a host's proxy runs before its first replica
    # loads, so its first probe fails, and a model pod's 5 s period would keep it out of its
    # Services up to 5 s after the replica loaded; it still leaves them after ~10 s failing.
    ready, model_ready = proxy["readinessProbe"], model_proxy["readinessProbe"]
    assert ready["httpGet"] == model_ready["httpGet"]
    assert ready["periodSeconds"] == 1 < model_ready["periodSeconds"]
    assert ready["periodSeconds"] * ready["failureThreshold"] == (
        model_ready["periodSeconds"] * model_ready["failureThreshold"]
    )
    assert volumes["agent-token"] in model_pod["volumes"]
    assert spec["securityContext"] == model_pod["securityContext"]
    defaults = {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
    tolerations = [t for t in spec["tolerations"] if t["key"] not in defaults]
    assert tolerations == model_pod["tolerations"]


async def test_the_serves_label_and_ready_replicas_follow_the_loaded_condition(
    nodes: tuple[str, ...], custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    await make_binder()
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("resnet", 2))
    obj = await eventually(lambda: placed(custom, "resnet", 2), what="placed")
    first, second = (e["node"] for e in obj["status"]["placements"])
    await eventually(lambda: len(hosts(core)) == 2, what="the hosts")
    assert status(custom)["readyReplicas"] == 0
    assert [p["ready"] for p in status(custom)["placements"]] == [False, False]

    set_loaded(core, first, "True")

    def serving() -> set[str]:
        return {n for n, h in hosts(core).items() if h.metadata.labels.get(SERVES) == "true"}

    await eventually(lambda: serving() == {first}, what="the loaded replica's host serves")
    await eventually(lambda: status(custom).get("readyReplicas") == 1, what="1 ready")
    entries = status(custom)["placements"]
    assert [p["ready"] for p in entries] == [True, False]
    await eventually(
        lambda: (
            status(custom)["placements"][1].get("message") == "not loaded on its model host yet"
        ),
        what="why replica 1 is not ready",
    )
    assert [p["proof"] for p in entries] == [p["proof"] for p in obj["status"]["placements"]]

    # A tenant's own label on the host of a replica not loaded is taken off again.
    core.patch_namespaced_pod(
        host_name(second), "default", {"metadata": {"labels": {SERVES: "true"}}}
    )
    await eventually(lambda: SERVES not in hosts(core)[second].metadata.labels, what="undone")

    set_loaded(core, first, "False", "ModelFailed", "the backend refused the model")
    await eventually(lambda: not serving(), what="out of the Service")
    await eventually(lambda: status(custom).get("readyReplicas") == 0, what="0 ready")
    assert status(custom)["placements"][0]["message"] == (
        "ModelFailed: the backend refused the model"
    )
    ready = {c["type"]: c for c in status(custom)["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "ReplicasNotReady")
    [event] = await eventually(lambda: not_served(core), what="the ReplicaNotServed event")
    assert event.type == "Warning" and event.involved_object.kind == "TritonModel"
    assert event.message == f"replica 0 on node {first}: ModelFailed: the backend refused the model"
    # The same reason again says nothing new.
    set_loaded(core, first, "False", "ModelFailed", "the backend refused the model again")
    await eventually(
        lambda: status(custom)["placements"][0]["message"].endswith("again"), what="the message"
    )
    assert len(not_served(core)) == 1
    assert ready["message"] == (
        f"0 of 2 replicas ready; replica 0 on {first}: ModelFailed: the backend refused the "
        f"model; replica 1 on {second}: not loaded on its model host yet"
    )
    final = read(custom, "resnet")
    assert [p["proof"] for p in final["status"]["placements"]] == [
        p["proof"] for p in obj["status"]["placements"]
    ], "nothing placed again"


def host_versions(core: Any, since: str) -> list[Any]:
    """Every version of the default namespace's pods written since resourceVersion `since`."""
    stream = new_watch().stream(
        core.list_namespaced_pod, "default", resource_version=since, timeout_seconds=1
    )
    return [e["object"] for e in stream if e["type"] == "MODIFIED"]


async def test_a_replica_scaled_away_drains_out_of_the_service_then_leaves(
    nodes: tuple[str, ...], custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    binder = await make_binder()
    obj = await all_loaded(custom, core, 2)
    kept, leaving = (e["node"] for e in obj["status"]["placements"])
    leaving_uid = f"{obj['metadata']['uid']}/1"
    since = core.list_namespaced_pod("default").metadata.resource_version

    scale(custom, 1)

    def draining() -> Any:
        host = hosts(core).get(leaving)
        return host if host is not None and hosted(host)[0].get("draining") else None

    host = await eventually(draining, what="the replica marked draining")
    assert SERVES not in host.metadata.labels
    assert binder.ledger.state.is_accounted(leaving_uid), "charged while it drains"
    await eventually(lambda: placed(custom, "resnet", 1), what="status says 1")
    assert status(custom)["readyReplicas"] == 1
    # Never listed as draining while still behind the Service: both in one write.
    for version in await asyncio.to_thread(host_versions, core, since):
        if version.metadata.name == host_name(leaving) and '"draining":true' in (
            version.metadata.annotations.get(HOSTED, "")
        ):
            assert SERVES not in (version.metadata.labels or {})
    await eventually(lambda: SERVES in hosts(core)[kept].metadata.labels, what="kept serves")

    # Scaled back up during the drain, on the same files: the drain is taken back, the replica
    # kept where it is and served again at once.
    scale(custom, 2)
    again = await eventually(lambda: placed(custom, "resnet", 2), what="replica 1 taken back")
    assert where(again, 1) == where(obj, 1)
    assert placed_condition(custom)["status"] == "True"
    assert not binder.ledger.draining
    await eventually(
        lambda: (
            not hosted(hosts(core)[leaving])[0].get("draining")
            and SERVES in hosts(core)[leaving].metadata.labels
        ),
        what="replica 1 listed not draining and behind the Service",
    )
    await eventually(lambda: status(custom).get("readyReplicas") == 2, what="2 ready again")
    assert not [e for e in core.list_namespaced_event("default").items if "Failed" in e.reason]

    scale(custom, 1)
    await eventually(
        lambda: any(e.get("draining") for e in hosted(hosts(core)[leaving])),
        what="draining again",
    )
    set_loaded(core, leaving, "False", "ModelNotLoaded", "unloaded")
    await eventually(lambda: set(hosts(core)) == {kept}, what="the emptied host deleted")
    await eventually(lambda: not binder.ledger.state.is_accounted(leaving_uid), what="freed")
    assert not binder.ledger.draining


def where(obj: dict[str, Any], ordinal: int) -> tuple[str, str, str]:
    """A replica's node, GPU and proof in the model's status."""
    entry = next(e for e in obj["status"]["placements"] if e["replica"] == ordinal)
    return entry["node"], entry["gpu"], entry["proof"]


def placed_condition(custom: Any) -> dict[str, Any]:
    found: dict[str, Any] = {c["type"]: c for c in status(custom)["conditions"]}["Placed"]
    return found


async def test_the_last_replica_scaled_back_up_during_its_drain_is_taken_back_at_once(
    nodes: tuple[str, ...], custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    """Scale to zero, then a request: the replica still draining (its host still has it
    loaded) is the one served again, never `ReplicaDraining` while it drains."""
    binder = await make_binder()
    obj = await all_loaded(custom, core, 1)
    (entry,) = obj["status"]["placements"]
    node = entry["node"]
    scale(custom, 0)
    await eventually(
        lambda: hosted(hosts(core)[node])[0].get("draining"), what="the replica draining"
    )
    assert SERVES not in hosts(core)[node].metadata.labels
    await eventually(lambda: status(custom).get("replicas") == 0, what="status says 0")

    scale(custom, 1)
    again = await eventually(lambda: placed(custom, "resnet", 1), what="taken back")
    assert where(again, 0) == where(obj, 0)
    assert placed_condition(custom)["status"] == "True"
    assert not binder.ledger.draining
    await eventually(
        lambda: (
            not hosted(hosts(core)[node])[0].get("draining")
            and SERVES in hosts(core)[node].metadata.labels
        ),
        what="listed not draining and behind the Service",
    )
    assert status(custom)["readyReplicas"] == 1

    # Its host had unloaded it meanwhile: it stays placed there, and is served once loaded;
    # as the model's last replica it stays behind the Service meanwhile (its host's proxy holds
    # the requests while its loader loads it again), as through a restart of Triton.
    set_loaded(core, node, "False", "ModelNotLoaded", "unloaded")
    await eventually(lambda: status(custom).get("readyReplicas") == 0, what="not ready")
    assert read(custom, "resnet")["status"]["placements"][0]["proof"] == entry["proof"]
    assert SERVES in hosts(core)[node].metadata.labels
    set_loaded(core, node, "True")
    await eventually(lambda: status(custom).get("readyReplicas") == 1, what="ready again")


async def test_a_replica_wanted_again_on_new_files_waits_for_its_drain(
    nodes: tuple[str, ...], custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    """A drain is taken back only for the same files: otherwise it runs on, and the replica is
    placed again, as a new one, once it has left."""
    await make_binder()
    obj = await all_loaded(custom, core, 2)
    leaving = obj["status"]["placements"][1]["node"]
    scale(custom, 1)
    await eventually(
        lambda: hosted(hosts(core)[leaving])[0].get("draining"), what="the replica draining"
    )
    custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        "resnet",
        {"spec": {"replicas": 2, "storageUri": "https://models.example.com/y.tar.gz"}},
    )
    await eventually(lambda: placed_condition(custom)["status"] == "False", what="Placed=False")
    assert (placed_condition(custom)["reason"], placed_condition(custom)["message"]) == (
        "ReplicaDraining",
        f"replica 1 is placed again once its previous placement on node {leaving} has drained",
    )
    host = hosts(core)[leaving]
    assert hosted(host)[0]["draining"] and SERVES not in host.metadata.labels


async def test_a_drain_ends_at_its_bound(
    nodes: tuple[str, ...], custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    binder = await make_binder(host_drain_seconds=1.0)
    obj = await all_loaded(custom, core, 2)
    leaving = obj["status"]["placements"][1]["node"]
    scale(custom, 1)
    # Still loaded (no loader unloads it here), it leaves after the bound all the same.
    await eventually(lambda: leaving not in hosts(core), what="removed after the bound")
    assert not binder.ledger.state.is_accounted(f"{obj['metadata']['uid']}/1")
    assert status(custom)["readyReplicas"] == 1


async def test_an_on_demand_replica_asleep_stays_behind_its_service(
    nodes: tuple[str, ...], custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    await make_binder()
    obj = await all_loaded(custom, core, 2)
    asleep, failed = (e["node"] for e in obj["status"]["placements"])
    # Unloaded while idle: the host's proxy loads it again on the next request.
    set_loaded(core, asleep, "False", "ModelSleeping", "model resnet is asleep")
    # Written after, in the same watch: once the binder has taken this one out, it has seen both.
    set_loaded(core, failed, "False", "ModelFailed", "the backend refused the model")
    await eventually(
        lambda: SERVES not in hosts(core)[failed].metadata.labels, what="the failed one out"
    )
    await eventually(lambda: status(custom).get("readyReplicas") == 1, what="1 ready")
    assert hosts(core)[asleep].metadata.labels.get(SERVES) == "true"
    assert [p["ready"] for p in status(custom)["placements"]] == [True, False]
    assert [e.message.split(":")[0] for e in not_served(core)] == [f"replica 1 on node {failed}"]


async def test_a_sleeping_replica_leaves_the_service_while_another_one_is_awake(
    nodes: tuple[str, ...], custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    await make_binder()
    obj = await all_loaded(custom, core, 2)
    first, second = (e["node"] for e in obj["status"]["placements"])

    def labels() -> dict[str, str | None]:
        return {n: h.metadata.labels.get(SERVES) for n, h in hosts(core).items()}

    asleep = ("False", "ModelSleeping", "model resnet is asleep")
    set_loaded(core, first, *asleep)
    await eventually(lambda: labels() == {first: "asleep", second: "true"}, what="awake first")
    # Its awake peer's host no longer Ready (out of the endpoints): the sleeping one serves.
    set_loaded(core, second, "True", host_ready=False)
    await eventually(lambda: labels()[first] == "true", what="the sleeping one back in")
    set_loaded(core, second, "True")
    await eventually(lambda: labels()[first] == "asleep", what="out again")
    # Both asleep: both in the Service, and the first request wakes one.
    set_loaded(core, second, *asleep)
    await eventually(lambda: labels() == {first: "true", second: "true"}, what="both in")
    set_loaded(core, second, "True")
    await eventually(
        lambda: labels() == {first: "asleep", second: "true"}, what="the woken one first"
    )
    assert status(custom)["readyReplicas"] == 2, "a sleeping replica still counts as ready"
    # The awake one (the highest ordinal) scaled away, draining: the sleeping one serves.
    scale(custom, 1)
    await eventually(
        lambda: labels().get(first) == "true" and labels().get(second) is None,
        what="the sleeping one serves while the awake one drains",
    )


async def test_a_replica_whose_triton_restarts_stays_in_the_service_only_as_the_last_served(
    nodes: tuple[str, ...], custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    """Triton restarting on a replica's node (TritonUnavailable, then ModelNotLoaded until the
    agent loads the model again): with another replica awake the host leaves the Service; as the
    last one served it stays (the node gateway holds its requests until the model is back,
    rather than its clients finding no endpoint). A failure is no restart: out."""
    await make_binder()
    obj = await all_loaded(custom, core, 2)
    first, second = (e["node"] for e in obj["status"]["placements"])

    def labels() -> dict[str, str | None]:
        return {n: h.metadata.labels.get(SERVES) for n, h in hosts(core).items()}

    down = ("False", "TritonUnavailable", "model resnet is not served: Triton is not reachable")
    set_loaded(core, first, *down)
    await eventually(lambda: labels() == {first: None, second: "true"}, what="the other serves")
    set_loaded(core, second, *down)
    await eventually(lambda: labels() == {first: "true", second: "true"}, what="both stay")
    set_loaded(core, first, "False", "ModelNotLoaded", "model resnet's files are on the node")
    set_loaded(core, second, "True")
    await eventually(lambda: labels() == {first: None, second: "true"}, what="back: first out")
    set_loaded(core, second, "False", "ModelFailed", "the backend refused the model")
    await eventually(lambda: labels() == {first: "true", second: None}, what="failed: out")
    # The status is written in its own turn, after the hosts' labels.
    await eventually(
        lambda: status(custom)["readyReplicas"] == 0, what="neither counts as ready meanwhile"
    )


async def test_replicas_of_a_model_spread_over_nodes_then_share_them(
    nodes: tuple[str, ...], custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    await make_binder()
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("resnet", 4))
    await eventually(lambda: status(custom).get("replicas") == 4, what="4 replicas placed")
    by_node = await eventually(lambda: len(hosts(core)) == 3 and hosts(core), what="3 hosts")
    assert sorted(len(hosted(h)) for h in by_node.values()) == [1, 1, 2]
    nodes_of = [p["node"] for p in status(custom)["placements"]]
    assert len(set(nodes_of[:3])) == 3, "a node without one first"


async def test_a_host_deleted_takes_every_model_on_it_out_of_ready(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "n1", [16 * GI])
    await make_binder()
    for name in ("bert", "resnet"):
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model(name, 1))
    [host] = (await eventually(lambda: hosts(core), what="the host")).values()
    await eventually(lambda: len(hosted(hosts(core)["n1"])) == 2, what="both on the host")
    for name in ("bert", "resnet"):
        condition = {
            "type": loaded_condition(KEYS, name, 0),
            "status": "True",
            "reason": "ModelReady",
        }
        core.patch_namespaced_pod_status(
            host.metadata.name,
            "default",
            {"status": {"conditions": [condition, HOST_READY]}},
            _content_type="application/strategic-merge-patch+json",
        )

    def ready() -> list[int]:
        return [
            (read(custom, n).get("status") or {}).get("readyReplicas", 0)
            for n in ("bert", "resnet")
        ]

    await eventually(lambda: ready() == [1, 1], what="both ready")
    core.delete_namespaced_pod(host.metadata.name, "default", grace_period_seconds=0)
    await eventually(lambda: ready() == [0, 0], what="neither ready")
    again = await eventually(lambda: hosts(core), what="a new host")
    assert again["n1"].metadata.uid != host.metadata.uid
    assert not {k for k in again["n1"].metadata.labels if "serves-" in k}, "none loaded there yet"


async def test_a_new_leader_drains_on_what_the_old_one_began(
    nodes: tuple[str, ...], custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    old = await make_binder()
    obj = await all_loaded(custom, core, 2)
    kept, leaving = (e["node"] for e in obj["status"]["placements"])
    leaving_uid = f"{obj['metadata']['uid']}/1"
    scale(custom, 1)
    await eventually(lambda: hosted(hosts(core)[leaving])[0].get("draining"), what="draining")
    await make_binder.stop(old)
    # The tenant lists a draining replica of its own making on the other host: not charged.
    entries = hosted(hosts(core)[kept])
    forged = {**entries[0], "replica": 5, "draining": True}
    value = json.dumps([*entries, forged])
    core.patch_namespaced_pod(
        host_name(kept), "default", {"metadata": {"annotations": {HOSTED: value}}}
    )

    new = await make_binder()
    assert new.ledger.state.is_accounted(leaving_uid) and leaving_uid in new.ledger.draining
    assert not new.ledger.state.is_accounted(f"{obj['metadata']['uid']}/5")
    # Once the new leader has reconciled the model (its readiness written), the drain is still on.
    set_loaded(core, kept, "False", "ModelFailed", "gone")
    await eventually(lambda: status(custom).get("readyReplicas") == 0, what="the new leader's")
    assert hosted(hosts(core)[leaving])[0]["draining"] is True
    await eventually(lambda: len(hosted(hosts(core)[kept])) == 1, what="the forged entry gone")
    set_loaded(core, leaving, "False", "ModelNotLoaded", "unloaded")
    await eventually(lambda: leaving not in hosts(core), what="the drained host deleted")
    await eventually(lambda: not new.ledger.state.is_accounted(leaving_uid), what="freed")


async def test_a_hosts_load_failure_is_the_models_ready_reason_with_one_event_per_cause(
    nodes: tuple[str, ...],
    custom: Any,
    core: Any,
    make_binder: MakeBinder,
    apiserver: RunningApiServer,
) -> None:
    """The host's loader's failure (the agent's loaded condition: FetchFailed and its message)
    is the model's Ready reason, with the node and the cause in its message, and one Event per
    cause: the same cause written again says nothing new, another cause of the same kind does.
    A condition on one namespace's host never marks another namespace's model of the same name."""
    await make_binder()
    core.create_namespace({"metadata": {"name": "team-b"}})
    for namespace in ("default", "team-b"):
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, model("resnet", 1)
        )
    obj = await eventually(lambda: placed(custom, "resnet", 1), what="placed")
    [node] = (e["node"] for e in obj["status"]["placements"])
    await eventually(lambda: node in hosts(core), what="the host")
    missing = "model resnet is not loaded: the model host's loader cannot load replica resnet/0"
    not_found = f"{missing}: https://models.example.com/x.tar.gz answered HTTP 404 Not Found"
    set_loaded(core, node, "False", "FetchFailed", not_found)

    def ready() -> dict[str, Any]:
        found: dict[str, Any] = {c["type"]: c for c in status(custom)["conditions"]}["Ready"]
        return found

    await eventually(lambda: ready()["reason"] == "FetchFailed", what="Ready says FetchFailed")
    assert ready()["status"] == "False"
    assert ready()["message"] == f"0 of 1 replicas ready; replica 0 on {node}: FetchFailed: " + (
        not_found
    )
    [event] = await eventually(lambda: not_served(core), what="the ReplicaNotServed event")
    assert event.type == "Warning" and "HTTP 404 Not Found" in event.message
    assert event.message.startswith(f"replica 0 on node {node}: FetchFailed: ")

    # Written again (the agent's next pass, another binder loop): no new Event.
    set_loaded(core, node, "False", "ModelPending", "not loaded yet")
    await eventually(lambda: ready()["reason"] == "ReplicasNotReady", what="pending again")
    set_loaded(core, node, "False", "FetchFailed", not_found)
    await eventually(lambda: ready()["reason"] == "FetchFailed", what="FetchFailed again")
    # A new cause of the same kind: its own Event.
    forbidden = f"{missing}: https://models.example.com/x.tar.gz answered HTTP 403 Forbidden"
    set_loaded(core, node, "False", "FetchFailed", forbidden)
    events = await eventually(lambda: len(not_served(core)) == 2 and not_served(core), what="2")
    assert sorted("403" in e.message for e in events) == [False, True]
    assert ready()["message"].endswith("HTTP 403 Forbidden")

    # The other namespace's model of the same name says only that it is not loaded yet.
    other = custom.get_namespaced_custom_object(GROUP, VERSION, "team-b", PLURAL, "resnet")
    other_ready = {c["type"]: c for c in other["status"]["conditions"]}["Ready"]
    assert other_ready["reason"] == "ReplicasNotReady", other_ready
    assert "HTTP" not in other_ready["message"]
    found = core.list_namespaced_event("team-b", field_selector="involvedObject.name=resnet")
    assert [e for e in found.items if e.reason == "ReplicaNotServed"] == []

    # team-b's tenant may write its own host's status (full rights in its namespace): a forged
    # loaded condition there reaches only its own model, never default's of the same name.
    token = apiserver.service_account_token("team-b", "default")
    other_node = other["status"]["placements"][0]["node"]
    with client_with_token(apiserver, token) as tenant_api:
        types = loaded_types(core, other_node, "resnet", "team-b")
        forged = {"status": {"conditions": [{"type": t, "status": "True"} for t in types]}}
        kubernetes.client.CoreV1Api(tenant_api).patch_namespaced_pod_status(
            host_name(other_node), "team-b", forged
        )

    def labelled(namespace: str, node_name: str) -> bool:
        pod = core.read_namespaced_pod(host_name(node_name), namespace)
        return bool((pod.metadata.labels or {}).get(SERVES) == "true")

    await eventually(lambda: labelled("team-b", other_node), what="team-b's own host labelled")
    assert not labelled("default", node)
    assert ready()["reason"] == "FetchFailed" and status(custom)["readyReplicas"] == 0

    # Loaded at last: Ready.
    set_loaded(core, node, "True")
    await eventually(lambda: ready()["reason"] == "AllReplicasReady", what="Ready")
    assert len(not_served(core)) == 2


async def test_an_idempotent_models_replicas_say_so_to_their_host(
    nodes: tuple[str, ...], custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    """spec.idempotent reaches the host's loader (and through its models file, the proxy, which
    then sends again a call lost with the node gateway's process); a model without it is not."""
    await make_binder()
    stateless = model("resnet", 1)
    stateless["spec"]["idempotent"] = True
    for body in (stateless, model("bert", 1)):
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)

    def entries() -> dict[str, dict[str, Any]] | None:
        found = {e["model"]: e for host in hosts(core).values() for e in hosted(host)}
        return found if len(found) == 2 else None

    found = await eventually(entries, what="both models on hosts")
    assert found["resnet"].get("idempotent") is True
    assert "idempotent" not in found["bert"]
    # A change applies to the replicas placed already.
    patch = {"spec": {"idempotent": True}}
    custom.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "bert", patch)
    await eventually(
        lambda: (entries() or {}).get("bert", {}).get("idempotent"), what="bert idempotent"
    )
