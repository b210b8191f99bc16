"""A TritonModel's roll to a new storageUri, against the simulated API server through the official
client (the agent's loaded condition written here as the agent writes it): a surge replica on
the new files is placed on another node first, the old replica stays behind the Service until
the surge is loaded, then drains; `updatedReplicas` and the `Progressing` condition follow. New
files that do not load stop the roll with the old replica served, a condition and an Event; with
no room for a surge, each replica in turn drains and is placed again on the new files, and an
Event says so."""

from __future__ import annotations

from typing import Any

import kubernetes.client
import pytest

from tests.binder.objects import GI
from tests.binder.simcluster import MakeBinder, add_node, eventually
from tests.binder.tritonmodels import test_model_hosts
from tests.binder.tritonmodels.test_model_hosts import all_loaded, hosted, set_loaded, status
from tests.binder.tritonmodels.test_tritonmodels import GROUP, PLURAL, SERVES, VERSION, hosts

NEW_URI = "https://models.example.com/y.tar.gz"

apiserver = test_model_hosts.apiserver
custom = test_model_hosts.custom
nodes = test_model_hosts.nodes


def roll_to(custom: Any, uri: str) -> None:
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "resnet", {"spec": {"storageUri": uri}}
    )


def progressing(custom: Any) -> dict[str, Any]:
    found: dict[str, Any] = {c["type"]: c for c in status(custom).get("conditions") or []}.get(
        "Progressing"
    ) or {}
    return found


def events(core: Any, reason: str) -> list[Any]:
    found = core.list_namespaced_event("default", field_selector="involvedObject.name=resnet")
    return [e for e in found.items if e.reason == reason]


def surge_host(core: Any, old_node: str) -> Any:
    """The host of the surge replica: on another node, listing the new files."""
    for node, host in hosts(core).items():
        if node != old_node and any(e.get("storageUri") == NEW_URI for e in hosted(host)):
            return host
    return None


@pytest.fixture
def two_nodes(kube_api: kubernetes.client.ApiClient) -> tuple[str, ...]:
    for node in ("n1", "n2"):
        add_node(kube_api, node, [16 * GI])
    return ("n1", "n2")


async def test_a_roll_places_a_surge_replica_and_drains_the_old_once_it_serves(
    two_nodes: tuple[str, ...], custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    binder = await make_binder()
    obj = await all_loaded(custom, core, 1)
    [entry] = obj["status"]["placements"]
    old_node, old_uri = entry["node"], entry["storageUri"]
    old_uid = f"{obj['metadata']['uid']}/0"

    roll_to(custom, NEW_URI)
    host = await eventually(lambda: surge_host(core, old_node), what="the surge replica's host")
    [surge] = hosted(host)
    assert surge["replica"] == 1 and not surge.get("draining")
    await eventually(lambda: status(custom).get("updatedReplicas") == 1, what="1 updated")
    # The old replica stays on its files and behind the Service while the surge loads.
    old_host = hosts(core)[old_node]
    assert [(e["replica"], e["storageUri"]) for e in hosted(old_host)] == [(0, old_uri)]
    assert old_host.metadata.labels.get(SERVES) == "true"
    assert SERVES not in host.metadata.labels
    assert progressing(custom)["status"] == "True"
    assert progressing(custom)["reason"] == "ReplicaUpdating"
    assert "replica 1 on node" in progressing(custom)["message"]
    assert status(custom)["readyReplicas"] == 1
    ready = {c["type"]: c for c in status(custom)["conditions"]}["Ready"]
    assert ready["status"] == "True", "the old replica serves: the model stays Ready"

    # Loaded on a host whose readiness probe has not passed yet: its endpoint is not ready, so
    # the old replica stays, the only one ready.
    set_loaded(core, host.spec.node_name, "True", host_ready=False)
    await eventually(
        lambda: "not Ready" in progressing(custom).get("message", ""),
        what="the roll waiting for the surge's host to be Ready",
    )
    assert not hosted(hosts(core)[old_node])[0].get("draining")
    assert hosts(core)[old_node].metadata.labels.get(SERVES) == "true"
    assert status(custom)["readyReplicas"] == 1

    # Ready: the surge is behind the Service and the old replica drains, in that order.
    set_loaded(core, host.spec.node_name, "True")

    def old_draining() -> bool:
        listed = hosted(hosts(core)[old_node])
        return bool(listed) and bool(listed[0].get("draining"))

    await eventually(old_draining, what="the old replica draining")
    assert hosts(core)[host.spec.node_name].metadata.labels.get(SERVES) == "true"
    assert SERVES not in hosts(core)[old_node].metadata.labels
    set_loaded(core, old_node, "False", "ModelNotLoaded", "unloaded")
    await eventually(lambda: old_node not in hosts(core), what="the old host removed")
    await eventually(lambda: progressing(custom).get("reason") == "NewFilesServed", what="done")
    final = status(custom)
    assert [(e["replica"], e["storageUri"]) for e in final["placements"]] == [(1, NEW_URI)]
    assert (final["replicas"], final["updatedReplicas"], final["readyReplicas"]) == (1, 1, 1)
    assert not binder.ledger.state.is_accounted(old_uid)
    assert not events(core, "RollingInPlace")


async def test_new_files_that_do_not_load_stop_the_roll_with_the_old_replica_served(
    two_nodes: tuple[str, ...], custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    await make_binder()
    obj = await all_loaded(custom, core, 1)
    old_node = obj["status"]["placements"][0]["node"]

    roll_to(custom, NEW_URI)
    host = await eventually(lambda: surge_host(core, old_node), what="the surge replica's host")
    why = "model resnet failed on the node: no config.pbtxt"
    set_loaded(core, host.spec.node_name, "False", "ModelLoadFailed", why)
    await eventually(lambda: progressing(custom).get("status") == "False", what="stalled")
    condition = progressing(custom)
    assert condition["reason"] == "NewFilesNotServed"
    assert why in condition["message"] and "stay served" in condition["message"]
    [event] = await eventually(lambda: events(core, "NewFilesNotServed"), what="the Event")
    assert event.type == "Warning" and why in event.message
    old_host = hosts(core)[old_node]
    assert old_host.metadata.labels.get(SERVES) == "true"
    assert not any(e.get("draining") for e in hosted(old_host))
    assert status(custom)["readyReplicas"] == 1

    # Rolled back to the old files: the surge leaves, the old replica is the current one.
    roll_to(custom, obj["spec"]["storageUri"])
    await eventually(lambda: host.spec.node_name not in hosts(core), what="the surge removed")
    await eventually(lambda: progressing(custom).get("reason") == "NewFilesServed", what="done")
    assert [e["replica"] for e in status(custom)["placements"]] == [0]


async def test_with_no_room_for_a_surge_each_replica_is_replaced_in_turn_and_an_event_says_so(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "n1", [16 * GI])
    await make_binder()
    await all_loaded(custom, core, 1, "10Gi")  # no room for a second beside it

    roll_to(custom, NEW_URI)
    # The only node holds the replica: it drains (out of the Service) ...
    await eventually(
        lambda: [e.get("draining") for e in hosted(hosts(core)["n1"])] == [True],
        what="the replica draining",
    )
    assert SERVES not in hosts(core)["n1"].metadata.labels
    [event] = await eventually(lambda: events(core, "RollingWithoutSurge"), what="the Event")
    assert "no room for a surge replica" in event.message and "n1" in event.message
    assert progressing(custom)["reason"] == "RollingWithoutSurge"
    # ... and once unloaded, is placed again on the new files.
    set_loaded(core, "n1", "False", "ModelDrained", "unloaded")

    def replaced() -> bool:
        listed = hosted(hosts(core)["n1"]) if "n1" in hosts(core) else []
        return [(e["storageUri"], e.get("draining")) for e in listed] == [(NEW_URI, None)]

    await eventually(replaced, what="the replica placed again on the new files")
    assert progressing(custom)["reason"] == "RollingWithoutSurge"
    set_loaded(core, "n1", "True")
    await eventually(lambda: progressing(custom).get("reason") == "NewFilesServed", what="done")
    [entry] = status(custom)["placements"]
    assert entry["storageUri"] == NEW_URI
    assert status(custom)["readyReplicas"] == 1


async def test_a_roll_on_one_node_surges_in_place_and_drains_the_old_once_the_surge_serves(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "n1", [16 * GI])
    await make_binder()
    await all_loaded(custom, core, 1)
    roll_to(custom, NEW_URI)

    def listed() -> list[tuple[int, str, bool]]:
        entries = hosted(hosts(core)["n1"])
        return [(e["replica"], e["storageUri"], bool(e.get("draining"))) for e in entries]

    old_uri = listed()[0][1]
    await eventually(lambda: len(listed()) == 2, what="the surge beside the old replica")
    assert listed() == [(0, old_uri, False), (1, NEW_URI, False)]
    assert hosts(core)["n1"].metadata.labels.get(SERVES) == "true", "the old one serves"
    set_loaded(core, "n1", "False", "ModelNotLoaded", "loading", replicas=(1,))
    await eventually(
        lambda: "replica 1 on node" in progressing(custom).get("message", ""), what="waiting"
    )
    assert listed() == [(0, old_uri, False), (1, NEW_URI, False)], "nothing drains yet"
    set_loaded(core, "n1", "True", replicas=(1,))
    await eventually(lambda: listed()[0][2], what="the old replica draining")
    assert hosts(core)["n1"].metadata.labels.get(SERVES) == "true", "the surge serves"
    assert not events(core, "RollingWithoutSurge")
    set_loaded(core, "n1", "False", "ModelNotLoaded", "unloaded", replicas=(0,))
    await eventually(lambda: progressing(custom).get("reason") == "NewFilesServed", what="done")
    await eventually(lambda: listed() == [(1, NEW_URI, False)], what="the old one gone")
    assert status(custom)["readyReplicas"] == 1


async def test_a_new_leader_goes_on_with_the_roll_and_new_files_again_replace_a_stuck_surge(
    nodes: tuple[str, ...], custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    first = await make_binder()
    obj = await all_loaded(custom, core, 2)
    uid = obj["metadata"]["uid"]
    roll_to(custom, NEW_URI)
    await eventually(lambda: status(custom).get("updatedReplicas") == 1, what="the surge placed")
    [surge] = [e for e in status(custom)["placements"] if e["storageUri"] == NEW_URI]
    await make_binder.stop(first)

    # The new leader charges the surge from the status (its files with it) and places no other.
    second = await make_binder()
    assert second.ledger.state.is_accounted(f"{uid}/{surge['replica']}")
    set_loaded(core, surge["node"], "False", "ModelFailed", "model resnet failed: bad files")
    await eventually(lambda: progressing(custom).get("reason") == "NewFilesNotServed", what="stall")
    assert status(custom)["replicas"] == 3 and status(custom)["readyReplicas"] == 2

    # Other new files: the stuck surge (on files no longer wanted, not served) leaves first,
    # not a replica that serves.
    third_uri = "https://models.example.com/z.tar.gz"
    roll_to(custom, third_uri)

    def stuck_surge_gone() -> bool:
        listed = [e for host in hosts(core).values() for e in hosted(host)]
        placements = status(custom)["placements"]
        return all(e.get("storageUri") != NEW_URI for e in [*listed, *placements])

    await eventually(stuck_surge_gone, what="the stuck surge removed")
    served = {e["node"] for e in obj["status"]["placements"]}
    assert all(hosts(core)[node].metadata.labels.get(SERVES) == "true" for node in served)
    assert {e["node"] for e in status(custom)["placements"]} >= served


async def test_files_no_host_can_fetch_roll_nothing(
    two_nodes: tuple[str, ...], custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    await make_binder()
    obj = await all_loaded(custom, core, 1)
    node = obj["status"]["placements"][0]["node"]
    endpoint = {"tritonshare.io/s3-endpoint": "https://minio:9000"}  # a URL, not host[:port]
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "resnet", {"metadata": {"annotations": endpoint}}
    )
    roll_to(custom, "s3://bucket/resnet")
    await eventually(lambda: progressing(custom).get("status") == "False", what="refused")
    assert progressing(custom)["reason"] == "UnsupportedStorage"
    assert "is not a host[:port]" in progressing(custom)["message"]
    assert list(hosts(core)) == [node] and not hosted(hosts(core)[node])[0].get("draining")
    assert hosts(core)[node].metadata.labels.get(SERVES) == "true"
    assert [e["storageUri"] for e in status(custom)["placements"]] == [obj["spec"]["storageUri"]]


async def test_with_no_room_for_a_surge_a_roll_keeps_the_models_min_available(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    """A roll without a surge would drain the one ready replica of a model whose minAvailable is
    1: nothing leaves, and the Progressing condition says why."""
    add_node(kube_api, "n1", [16 * GI])
    await make_binder()
    await all_loaded(custom, core, 1, "10Gi")  # no room for a second beside it
    custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        "resnet",
        {"spec": {"storageUri": NEW_URI, "minAvailable": 1}},
    )
    await eventually(lambda: progressing(custom).get("status") == "False", what="refused")
    condition = progressing(custom)
    assert condition["reason"] == "NoRoomToRoll"
    assert "fewer than spec.minAvailable 1" in condition["message"]
    host = hosts(core)["n1"]
    assert not hosted(host)[0].get("draining") and host.metadata.labels.get(SERVES) == "true"
    assert not events(core, "RollingWithoutSurge")
    # The minimum lowered: the roll goes on without a surge.
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "resnet", {"spec": {"minAvailable": 0}}
    )
    await eventually(lambda: events(core, "RollingWithoutSurge"), what="the roll goes on")


async def test_with_room_neither_for_a_surge_nor_a_replacement_nothing_leaves_until_room_appears(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "n1", [16 * GI])
    await make_binder()
    await all_loaded(custom, core, 1, "10Gi")  # no room for a second beside it
    # New files that need more GPU memory than the node has, even with the replica gone.
    custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        "resnet",
        {"spec": {"storageUri": NEW_URI, "gpuMemory": "17Gi"}},
    )
    await eventually(lambda: progressing(custom).get("status") == "False", what="refused")
    condition = progressing(custom)
    assert condition["reason"] == "NoRoomToRoll"
    assert "stay on their files" in condition["message"]
    [event] = await eventually(lambda: events(core, "NoRoomToRoll"), what="the Event")
    assert event.message == condition["message"]
    host = hosts(core)["n1"]
    assert not hosted(host)[0].get("draining") and host.metadata.labels.get(SERVES) == "true"
    assert not events(core, "RollingWithoutSurge")
    # Room appears: the roll goes on through a surge replica there.
    add_node(kube_api, "n2", [32 * GI])
    surge = await eventually(lambda: surge_host(core, "n1"), what="the surge once there is room")
    assert surge.spec.node_name == "n2"
