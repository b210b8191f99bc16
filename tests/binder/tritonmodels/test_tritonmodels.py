"""The binder's TritonModel controller against the simulated API server serving the chart's CRD,
through the official client: replicas placed with signed proofs in status, a model host per
(namespace, node) owned by the models it serves, a Service per model, scaling through `/scale`,
deletion (garbage collection by the simulated controller manager), refusals as a condition and
an Event, and proofs in status that the binder did not sign left uncharged."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from binder.app import Binder
from common.contract import Keys
from common.hosted import host_name, loaded_condition
from common.proofs import ProofError, pod_claim
from sim.apiserver import ApiServerSettings, RunningApiServer, start_in_thread
from sim.controllers.manager import ControllerManager
from tests.binder.objects import GI
from tests.binder.simcluster import MakeBinder, add_node, eventually
from tests.conftest import require_executable
from tests.deploy.rendering import CHART, render
from tests.e2e.test_rbac import describe, grants_for
from tests.fixtures_sim import PlacementKeys

GROUP, VERSION, PLURAL = "tritonshare.io", "v1alpha1", "tritonmodels"
NODES = ("n1", "n2", "n3")
SERVES = "tritonshare.io/serves-resnet"
HOSTED = "tritonshare.io/hosted-models"


@pytest.fixture
def apiserver() -> Iterator[RunningApiServer]:
    """The simulated API server serving the chart's CRDs (overrides tests.fixtures_sim's)."""
    server = start_in_thread(settings=ApiServerSettings(crds=(CHART / "crds",)))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def custom(kube_api: kubernetes.client.ApiClient) -> Any:
    return kubernetes.client.CustomObjectsApi(kube_api)


@pytest.fixture
def gc(apiserver: RunningApiServer) -> Iterator[ControllerManager]:
    """The simulated controller manager, for its garbage collector."""
    api = apiserver.api_client()
    running = ControllerManager(api, clock=apiserver.clock.now)
    running.start()
    try:
        assert running.wait_synced(10)
        yield running
    finally:
        running.stop()
        api.close()  # type: ignore[no-untyped-call]


@pytest.fixture
async def binder(kube_api: kubernetes.client.ApiClient, make_binder: MakeBinder) -> Binder:
    for node in NODES:
        add_node(kube_api, node, [16 * GI])
    return await make_binder()


def model(name: str, replicas: int, gpu_memory: str = "2Gi") -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TritonModel",
        "metadata": {"name": name},
        "spec": {
            "storageUri": "https://models.example.com/x.tar.gz",
            "gpuMemory": gpu_memory,
            "replicas": replicas,
        },
    }


def read(custom: Any, name: str) -> dict[str, Any]:
    found: dict[str, Any] = custom.get_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, name
    )
    return found


def not_placed(custom: Any, name: str) -> dict[str, Any] | None:
    """The model's `Placed` condition while it reads False, else None."""
    status = read(custom, name).get("status") or {}
    for condition in status.get("conditions") or []:
        if condition["type"] == "Placed" and condition["status"] == "False":
            return dict(condition)
    return None


def placed(custom: Any, name: str, replicas: int) -> dict[str, Any] | None:
    """The model once its status shows `replicas` placed for its current generation."""
    obj = read(custom, name)
    status = obj.get("status") or {}
    if (
        status.get("observedGeneration") == obj["metadata"]["generation"]
        and status.get("replicas") == replicas
        and len(status.get("placements") or []) == replicas
    ):
        return obj
    return None


def where(entry: dict[str, Any]) -> dict[str, Any]:
    """A status placement without its readiness (which follows the host's)."""
    return {k: v for k, v in entry.items() if k not in ("ready", "message")}


def hosts(core: Any) -> dict[str, Any]:
    """Host pods in `default` by node."""
    pods = core.list_namespaced_pod("default", label_selector="tritonshare.io/model-host=true")
    return {p.spec.node_name: p for p in pods.items if not p.metadata.deletion_timestamp}


def loaded_types(
    core: Any,
    node: str,
    model: str,
    namespace: str = "default",
    replicas: tuple[int, ...] | None = None,
) -> list[str]:
    """The loaded conditions the agent writes on the host on `node` for `model`'s replicas
    there (or those of them in `replicas`)."""
    host = core.read_namespaced_pod(host_name(node), namespace)
    entries = json.loads((host.metadata.annotations or {}).get(HOSTED) or "[]")
    return [
        loaded_condition(Keys(), model, e["replica"])
        for e in entries
        if e["model"] == model and (replicas is None or e["replica"] in replicas)
    ]


def kubelet_removes_deleted(core: Any) -> None:
    """What a kubelet does once a deleted pod's containers stopped (none run here)."""
    for pod in core.list_namespaced_pod("default").items:
        if pod.metadata.deletion_timestamp:
            core.delete_namespaced_pod(pod.metadata.name, "default", grace_period_seconds=0)


def verify(keys: PlacementKeys, obj: dict[str, Any], entry: dict[str, Any]) -> None:
    meta = obj["metadata"]
    claim = pod_claim(
        f"{meta['uid']}/{entry['replica']}",
        "default",
        f"{meta['name']}/{entry['replica']}",
        entry["node"],
        entry["gpu"],
        meta["name"],
        "always",
    )
    assert keys.ring.verify(claim, entry["proof"]).request == 2 * GI


async def test_replicas_are_placed_with_proofs_on_hosts_behind_a_service(
    binder: Binder, custom: Any, core: Any, placement_keys: PlacementKeys
) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("resnet", 3))
    obj = await eventually(lambda: placed(custom, "resnet", 3), what="3 replicas placed")
    status = obj["status"]
    entries = status["placements"]
    assert [e["replica"] for e in entries] == [0, 1, 2]
    assert {e["node"] for e in entries} == set(NODES), "a model's replicas never share a node"
    for entry in entries:
        verify(placement_keys, obj, entry)
        assert entry["host"] == host_name(entry["node"])
    assert status["selector"] == f"{SERVES}=true"
    placed_, ready, progressing, loaded = status["conditions"]
    assert (placed_["type"], placed_["status"]) == ("Placed", "True")
    # No replica loaded yet: the files have not been ready once.
    assert (loaded["type"], loaded["status"], loaded["reason"]) == (
        "Loaded", "Unknown", "NotLoadedYet"
    )  # fmt: skip
    assert (ready["type"], ready["status"], ready["reason"]) == (
        "Ready", "False", "ReplicasNotReady"
    )  # fmt: skip
    assert (progressing["type"], progressing["status"], progressing["reason"]) == (
        "Progressing", "True", "NewFilesServed"
    )  # fmt: skip
    assert status["updatedReplicas"] == 3
    assert {e["storageUri"] for e in entries} == {model("resnet", 3)["spec"]["storageUri"]}
    # Another replica's proof does not prove this one.
    with pytest.raises(ProofError):
        verify(placement_keys, obj, {**entries[0], "proof": entries[1]["proof"]})

    by_node = await eventually(lambda: len(hosts(core)) == 3 and hosts(core), what="3 hosts")
    uid = obj["metadata"]["uid"]
    for entry in entries:
        host = by_node[entry["node"]]
        assert host.metadata.name == host_name(entry["node"])
        assert SERVES not in host.metadata.labels, "behind the Service once loaded there"
        assert [(o.kind, o.uid) for o in host.metadata.owner_references] == [("TritonModel", uid)]
        hosted = json.loads(host.metadata.annotations[HOSTED])
        assert hosted == [
            {"model": "resnet", "uid": uid, "replica": entry["replica"], "gpu": entry["gpu"],
             "residency": "always", "proof": entry["proof"], "storageUri": "https://models.example.com/x.tar.gz"}
        ]  # fmt: skip
    # The host's slot is charged once: as the namespace's host, not also as a pod.
    pods = binder.ledger.state.pods
    await eventually(lambda: set(binder.ledger.hosts.get("default", {})) == set(NODES))
    assert [pods.pod_count(n) for n in NODES] == [1, 1, 1]

    service = core.read_namespaced_service("resnet", "default")
    assert service.spec.selector == {SERVES: "true"}
    assert [(p.name, p.port) for p in service.spec.ports] == [("http", 9000), ("grpc", 9001)]
    assert [(o.kind, o.uid) for o in service.metadata.owner_references] == [("TritonModel", uid)]

    # A second model in the namespace joins the hosts there: one more owner, one more label.
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("bert", 1))
    bert = await eventually(lambda: placed(custom, "bert", 1), what="bert placed")
    node = bert["status"]["placements"][0]["node"]

    def joined() -> bool:
        host = hosts(core).get(node)
        return host is not None and '"model":"bert"' in host.metadata.annotations[HOSTED]

    await eventually(joined, what="bert on its host")
    host = hosts(core)[node]
    assert {o.name for o in host.metadata.owner_references} == {"resnet", "bert"}
    assert len(hosts(core)) == 3, "no second host in the namespace on a node"


async def test_scaling_through_scale_moves_the_replicas_and_deleting_removes_everything(
    binder: Binder, custom: Any, core: Any, gc: ControllerManager, apiserver: RunningApiServer
) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("resnet", 3))
    obj = await eventually(lambda: placed(custom, "resnet", 3), what="3 replicas placed")
    first = obj["status"]["placements"][0]
    await eventually(lambda: len(hosts(core)) == 3, what="3 hosts")

    custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, "default", PLURAL, "resnet", {"spec": {"replicas": 1}}
    )
    obj = await eventually(lambda: placed(custom, "resnet", 1), what="scaled to 1")
    assert [where(p) for p in obj["status"]["placements"]] == [where(first)], (
        "the highest ordinals leave first"
    )
    await eventually(lambda: set(hosts(core)) == {first["node"]}, what="emptied hosts deleted")
    kubelet_removes_deleted(core)
    scale = custom.get_namespaced_custom_object_scale(GROUP, VERSION, "default", PLURAL, "resnet")
    assert (scale["status"]["replicas"], scale["status"]["selector"]) == (1, f"{SERVES}=true")
    state = binder.ledger.state
    uid = obj["metadata"]["uid"]
    assert sorted(u for u in state.account_uids() if u.startswith(uid)) == [f"{uid}/0"]

    custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, "default", PLURAL, "resnet", {"spec": {"replicas": 2}}
    )
    await eventually(lambda: placed(custom, "resnet", 2), what="scaled to 2")
    await eventually(lambda: len(hosts(core)) == 2, what="a host for the new replica")

    custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "resnet")
    await eventually(lambda: not hosts(core), what="the hosts collected")

    def no_service() -> bool:
        return not core.list_namespaced_service(
            "default", field_selector="metadata.name=resnet"
        ).items

    await eventually(no_service, what="the Service collected")
    await eventually(
        lambda: not [u for u in state.account_uids() if u.startswith(uid)], what="freed replicas"
    )
    # Every call the binder made here is one deploy/'s RBAC grants it.
    grants = grants_for("tritonshare-binder", render(require_executable("kubectl"), "base"))
    calls = [r for r in apiserver.audit if r.user_agent.startswith("tritonshare-binder/")]
    denied = sorted({describe(c) for c in calls if not any(g.allows(c) for g in grants)})
    assert not denied
    made = {(c.api_group, c.resource, c.subresource, c.verb) for c in calls}
    assert {
        ("tritonshare.io", "tritonmodels", "", "list"),
        ("tritonshare.io", "tritonmodels", "status", "patch"),
        ("", "pods", "", "create"),
        ("", "pods", "", "delete"),
        ("", "services", "", "create"),
    } <= made


def scheduled(core: Any, name: str) -> list[str]:
    """The messages of the model's Scheduled Events, oldest first."""
    found = core.list_namespaced_event("default", field_selector=f"involvedObject.name={name}")
    events = [e for e in found.items if e.reason == "Scheduled" and e.type == "Normal"]
    return [e.message for e in sorted(events, key=lambda e: e.metadata.name)]


async def test_each_turn_that_places_replicas_says_where_in_a_scheduled_event(
    binder: Binder, custom: Any, core: Any
) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("resnet", 2))
    obj = await eventually(lambda: placed(custom, "resnet", 2), what="2 replicas placed")
    first, second = (e["node"] for e in obj["status"]["placements"])
    await eventually(lambda: scheduled(core, "resnet"), what="the Scheduled Event")
    assert scheduled(core, "resnet") == [
        f"Successfully assigned replicas of default/resnet: 0 to {first}, GPU 0 (GPU-{first}-0); "
        f"1 to {second}, GPU 0 (GPU-{second}-0)"
    ]
    custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, "default", PLURAL, "resnet", {"spec": {"replicas": 3}}
    )
    obj = await eventually(lambda: placed(custom, "resnet", 3), what="scaled to 3")
    third = obj["status"]["placements"][2]["node"]
    await eventually(lambda: len(scheduled(core, "resnet")) == 2, what="a second Event")
    await eventually(lambda: len(hosts(core)) == 3, what="3 hosts")  # more turns meanwhile
    assert scheduled(core, "resnet")[1:] == [
        f"Successfully assigned replica 2 of default/resnet to {third}, GPU 0 (GPU-{third}-0)"
    ], "a replica placed before is not told again"


async def test_a_replica_on_a_deleted_node_is_placed_again(
    binder: Binder, custom: Any, core: Any
) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("resnet", 2))
    obj = await eventually(lambda: placed(custom, "resnet", 2), what="2 replicas placed")
    gone, kept = obj["status"]["placements"]
    core.delete_node(gone["node"])

    def moved() -> dict[str, Any] | None:
        now = placed(custom, "resnet", 2)
        entries = now["status"]["placements"] if now else []
        return now if entries and entries[0]["node"] not in (gone["node"], kept["node"]) else None

    obj = await eventually(moved, what="replica 0 placed again")
    assert where(obj["status"]["placements"][1]) == where(kept)
    await eventually(lambda: gone["node"] not in hosts(core), what="the old host deleted")


async def test_a_host_deleted_under_its_replicas_is_made_again(
    binder: Binder, custom: Any, core: Any
) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("resnet", 1))
    [old] = (await eventually(lambda: hosts(core), what="the host")).values()
    core.delete_namespaced_pod(old.metadata.name, "default", grace_period_seconds=0)

    def again() -> Any:
        return next((h for h in hosts(core).values() if h.metadata.uid != old.metadata.uid), None)

    new = await eventually(again, what="a new host")
    assert (new.metadata.name, new.spec.node_name) == (old.metadata.name, old.spec.node_name)
    assert new.metadata.annotations[HOSTED] == old.metadata.annotations[HOSTED]


async def test_a_replica_that_fits_nowhere_gets_the_condition_and_the_event(
    binder: Binder, custom: Any, core: Any
) -> None:
    custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, model("huge", 1, "20Gi")
    )

    def refused() -> dict[str, Any] | None:
        status = read(custom, "huge").get("status") or {}
        for condition in status.get("conditions") or []:
            if condition["type"] == "Placed" and condition["status"] == "False":
                return dict(condition)
        return None

    condition = await eventually(refused, what="Placed=False")
    assert condition["reason"] == "Unschedulable"
    assert condition["message"].startswith("replica 0: 0/3 nodes are available:")
    assert read(custom, "huge")["status"]["replicas"] == 0

    def events() -> list[Any]:
        found = core.list_namespaced_event("default", field_selector="involvedObject.name=huge")
        return [e for e in found.items if e.reason == "FailedScheduling"]

    [event] = await eventually(events, what="the FailedScheduling event")
    assert (event.type, event.involved_object.kind) == ("Warning", "TritonModel")
    assert event.message == condition["message"]
    assert not hosts(core), "no host for a replica not placed"


async def test_a_model_whose_files_no_host_can_fetch_is_not_placed_and_says_why(
    binder: Binder, custom: Any, core: Any
) -> None:
    """The schema refuses what no host fetches (pvc://, http://); the binder refuses what only
    it can judge: s3-* settings a host's loader could not use, read as on a model pod."""
    body = model("in-s3", 1)
    body["spec"]["storageUri"] = "s3://models/in-s3"
    body["metadata"]["annotations"] = {"tritonshare.io/s3-usehttps": "no"}
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)

    condition = await eventually(lambda: not_placed(custom, "in-s3"), what="Placed=False")
    assert condition["reason"] == "UnsupportedStorage"
    assert condition["message"] == (
        "tritonmodel \"in-s3\" replica 0: annotation tritonshare.io/s3-usehttps='no' must be "
        '"1" or "0", as KServe writes it (for example tritonshare.io/s3-usehttps: "0" for a '
        "MinIO without TLS)"
    )
    assert not hosts(core), "no host for a model no host can fetch"


async def test_a_proof_the_binder_did_not_sign_for_the_replica_is_not_charged(
    binder: Binder, custom: Any, make_binder: MakeBinder, placement_keys: PlacementKeys
) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("real", 1))
    real = await eventually(lambda: placed(custom, "real", 1), what="placed")
    stolen = real["status"]["placements"][0]
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("thief", 1))
    await eventually(lambda: placed(custom, "thief", 1), what="thief placed")
    # Whoever can write the status (never a tenant: RBAC) copies a proof, or forges one.
    for proof in (stolen["proof"], "v1.0123456789abcdef.2147483648." + "A" * 43):
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, "default", PLURAL, "thief",
            {"status": {"placements": [{**stolen, "proof": proof}]}},
        )  # fmt: skip

        def replaced(proof: str = proof) -> dict[str, Any] | None:
            obj = placed(custom, "thief", 1)
            entry = obj and obj["status"]["placements"][0]
            return obj if entry and entry["proof"] not in (proof, stolen["proof"]) else None

        thief = await eventually(replaced, what="the binder's own placement back in status")
        verify(placement_keys, thief, thief["status"]["placements"][0])
        charged = binder.ledger.state.charged_pod(f"{thief['metadata']['uid']}/0")
        assert charged is not None and charged.placement not in (proof, stolen["proof"])

    # A restarted binder charges what the status proves.
    await make_binder.stop(binder)
    again = await make_binder()
    state = again.ledger.state
    uids = [f"{real['metadata']['uid']}/0", f"{thief['metadata']['uid']}/0"]
    await eventually(lambda: all(state.is_accounted(u) for u in uids), what="recharged")
    assert not state.assumed_uids(), "charged from status, not placed again"
    charged = state.charged_pod(uids[0])
    assert charged is not None and charged.placement == stolen["proof"]
