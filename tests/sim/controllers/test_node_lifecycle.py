"""A node's heartbeat and the node lifecycle controller, through the official client against sim/.

A hollow kubelet renews its node's Lease in `kube-node-lease` and its Ready condition; once it
stops, the controller marks the node Ready=Unknown, taints it `unreachable` (NoSchedule and
NoExecute), marks its pods not ready and evicts each after its toleration of the taint; once a
kubelet beats again, the taints go. The grace and periods are short here; their defaults are
kube's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, cast

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from sim.apiserver import RunningApiServer
from sim.controllers.nodelifecycle import UNREACHABLE, NodeLifecycleController, eviction_delay
from sim.node.heartbeat import NODE_LEASE_NAMESPACE
from sim.node.kubelet import HollowKubelet

NODE, NS = "gpu-x", "default"
GRACE = 1.5


def core(api: kubernetes.client.ApiClient) -> Any:
    return cast(Any, kubernetes.client.CoreV1Api(api))


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


def node(api: kubernetes.client.ApiClient) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(core(api).read_node(NODE, _preload_content=False).data)
    return found


def ready(api: kubernetes.client.ApiClient) -> str:
    conditions = node(api).get("status", {}).get("conditions") or []
    return next((str(c["status"]) for c in conditions if c["type"] == "Ready"), "")


def taints(api: kubernetes.client.ApiClient) -> set[tuple[str, str]]:
    return {(t["key"], t["effect"]) for t in node(api).get("spec", {}).get("taints") or []}


def pod(api: kubernetes.client.ApiClient, name: str) -> dict[str, Any] | None:
    try:
        response = core(api).read_namespaced_pod(name, NS, _preload_content=False)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    found: dict[str, Any] = json.loads(response.data)
    return found


def create_pod(api: kubernetes.client.ApiClient, name: str, seconds: int | None) -> None:
    toleration: dict[str, Any] = {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute"}
    if seconds is not None:
        toleration["tolerationSeconds"] = seconds
    body = {
        "metadata": {"name": name},
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "c", "image": "busybox"}],
            "tolerations": [toleration],
        },
    }
    core(api).create_namespaced_pod(NS, body, _preload_content=False)


@pytest.fixture
def api(apiserver: RunningApiServer) -> Iterator[kubernetes.client.ApiClient]:
    client = apiserver.api_client()
    core(client).create_node(
        {"metadata": {"name": NODE}, "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]}},
        _preload_content=False,
    )
    try:
        yield client
    finally:
        client.close()  # type: ignore[no-untyped-call]


@pytest.fixture
def controller(apiserver: RunningApiServer) -> Iterator[NodeLifecycleController]:
    client = apiserver.api_client()
    running = NodeLifecycleController(client, grace=GRACE, period=0.2)
    running.start()
    try:
        yield running
    finally:
        running.stop()
        client.close()  # type: ignore[no-untyped-call]


def kubelet(apiserver: RunningApiServer) -> HollowKubelet:
    return HollowKubelet(apiserver.api_client(), [NODE], heartbeat_seconds=0.2)


def test_the_kubelet_renews_its_nodes_lease_and_reports_it_ready(
    apiserver: RunningApiServer, api: kubernetes.client.ApiClient
) -> None:
    leases = cast(Any, kubernetes.client.CoordinationV1Api(api))

    def renewed() -> str:
        try:
            lease = json.loads(
                leases.read_namespaced_lease(
                    NODE, NODE_LEASE_NAMESPACE, _preload_content=False
                ).data
            )
        except ApiException:
            return ""
        return str(lease["spec"].get("renewTime") or "")

    with kubelet(apiserver):
        first = wait_for("the node's Lease", renewed)
        wait_for("the Lease renewed", lambda: renewed() not in ("", first))
        assert ready(api) == "True"
        lease = json.loads(
            leases.read_namespaced_lease(NODE, NODE_LEASE_NAMESPACE, _preload_content=False).data
        )
        assert lease["spec"]["holderIdentity"] == NODE
        assert lease["spec"]["leaseDurationSeconds"] == 40
        assert lease["metadata"]["ownerReferences"][0]["kind"] == "Node"


def test_the_api_server_adds_the_default_not_ready_and_unreachable_tolerations(
    api: kubernetes.client.ApiClient,
) -> None:
    body = {"metadata": {"name": "plain"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    core(api).create_namespaced_pod(NS, body, _preload_content=False)
    created = pod(api, "plain")
    assert created is not None
    assert {
        (t["key"], t["effect"], t["tolerationSeconds"]) for t in created["spec"]["tolerations"]
    } == {
        ("node.kubernetes.io/not-ready", "NoExecute", 300),
        (UNREACHABLE, "NoExecute", 300),
    }


def test_a_silent_node_goes_unknown_its_pods_go_after_their_tolerations_and_it_comes_back(
    apiserver: RunningApiServer,
    api: kubernetes.client.ApiClient,
    controller: NodeLifecycleController,
) -> None:
    create_pod(api, "at-once", 0)
    create_pod(api, "after-3s", 3)
    create_pod(api, "for-ever", None)
    hollow = kubelet(apiserver)
    hollow.start()
    wait_for("the pods running", lambda: all(
        (pod(api, n) or {}).get("status", {}).get("phase") == "Running"
        for n in ("at-once", "after-3s", "for-ever")
    ))  # fmt: skip
    time.sleep(GRACE + 0.5)  # beating: the node stays Ready and untainted
    assert ready(api) == "True"
    assert (UNREACHABLE, "NoExecute") not in taints(api)

    stopped = time.monotonic()
    hollow.stop()  # the node's kubelet gone
    wait_for("the node Unknown", lambda: ready(api) == "Unknown", timeout=GRACE + 5)
    assert time.monotonic() - stopped >= GRACE - 0.3
    wait_for(
        "the unreachable taints",
        lambda: {(UNREACHABLE, "NoSchedule"), (UNREACHABLE, "NoExecute")} <= taints(api),
    )
    assert ("gpu", "NoSchedule") in taints(api)
    tainted = time.monotonic()
    conditions = node(api)["status"]["conditions"]
    assert conditions[0]["reason"] == "NodeStatusUnknown"

    def not_ready(name: str) -> bool:
        conditions = (pod(api, name) or {}).get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "False" for c in conditions)

    for name in ("after-3s", "for-ever"):
        wait_for(f"{name} not ready", partial(not_ready, name))
    wait_for(
        "at-once evicted",
        lambda: (pod(api, "at-once") or {}).get("metadata", {}).get("deletionTimestamp"),
        timeout=3,
    )
    assert not pod(api, "after-3s")["metadata"].get("deletionTimestamp")  # type: ignore[index]
    wait_for(
        "after-3s evicted",
        lambda: (pod(api, "after-3s") or {}).get("metadata", {}).get("deletionTimestamp"),
        timeout=8,
    )
    assert time.monotonic() - tainted >= 2.5
    # Its kubelet is gone: the evicted pods stay Terminating, as on a real cluster.
    assert pod(api, "at-once") is not None
    assert not pod(api, "for-ever")["metadata"].get("deletionTimestamp")  # type: ignore[index]

    with kubelet(apiserver):  # the node back
        wait_for("the node Ready", lambda: ready(api) == "True", timeout=10)
        wait_for(
            "the unreachable taints lifted",
            lambda: not any(key == UNREACHABLE for key, _ in taints(api)),
            timeout=10,
        )
        assert ("gpu", "NoSchedule") in taints(api)
        wait_for("the evicted pods removed", lambda: pod(api, "at-once") is None, timeout=10)
        assert pod(api, "for-ever") is not None


def test_a_pod_not_tolerating_a_no_execute_taint_goes_at_once() -> None:
    taint = {"key": UNREACHABLE, "effect": "NoExecute"}
    other = {"key": "other", "effect": "NoExecute"}
    tolerating = {"spec": {"tolerations": [{"key": UNREACHABLE, "tolerationSeconds": 30}]}}
    assert eviction_delay(tolerating, [taint]) == 30
    assert eviction_delay(tolerating, [taint, other]) == 0
    assert eviction_delay({"spec": {"tolerations": [{"operator": "Exists"}]}}, [taint]) is None
    assert eviction_delay({"spec": {}}, [taint]) == 0


def test_an_api_server_outage_longer_than_the_grace_marks_no_node_unknown(
    apiserver: RunningApiServer, api: kubernetes.client.ApiClient, caplog: pytest.LogCaptureFixture
) -> None:
    client = apiserver.api_client()
    controller = NodeLifecycleController(client, grace=2.5, period=0.2)
    hollow = HollowKubelet(apiserver.api_client(), [NODE], heartbeat_seconds=1.0)
    with hollow:
        wait_for("the node Ready", lambda: ready(api) == "True")
        controller.start()
        try:
            time.sleep(1.0)  # a few passes see the node beat
            apiserver.pause()  # neither the kubelet nor the controller reach it meanwhile
            time.sleep(4)
            apiserver.resume()
            # Both find it again; the kubelet has a whole grace to beat before it is judged.
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                assert ready(api) == "True"
                time.sleep(0.05)
            assert "stopped posting" not in caplog.text
            assert (UNREACHABLE, "NoExecute") not in taints(api)
        finally:
            controller.stop()
            client.close()  # type: ignore[no-untyped-call]
