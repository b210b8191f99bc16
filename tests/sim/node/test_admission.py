"""The simulated kubelet refuses what a real kubelet refuses: a pod whose requests do not fit the
node's allocatable beside the pods it admitted before (`OutOfcpu`, `OutOfmemory`, `OutOfpods`,
`OutOf<extended resource>`), whose host port is taken (`NodePorts`), or that does not tolerate
a NoExecute taint of the node (`TaintToleration`). The refused pod is
Failed with the kubelet's reason and message, gets a Warning Event, and never runs; an extended
resource the node does not list is ignored, as the kubelet ignores it; terminated pods free what
they held."""

from __future__ import annotations

from typing import Any

import kubernetes.client

from sim.apiserver import RunningApiServer
from sim.node.admission import NodeAdmission
from sim.node.kubelet import HollowKubelet
from tests.sim.node.test_kubelet import core, create, read, wait_for

NODE = {"status": {"allocatable": {"cpu": "8", "memory": "16Gi", "pods": "3", "x.io/dev": "1"}}}


def pod(name: str, requests: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "i"}
    if requests:
        container["resources"] = {"requests": requests}
    container.update(extra)
    return {"metadata": {"name": name, "uid": name}, "spec": {"containers": [container]}}


def admission() -> NodeAdmission:
    judge = NodeAdmission()
    judge.set_node(NODE)
    return judge


def test_a_pod_asking_more_cpu_than_the_node_has_is_out_of_cpu() -> None:
    refusal = admission().admit(pod("big", {"cpu": "64", "memory": "512Gi"}))
    assert refusal is not None and refusal.reason == "OutOfcpu"
    assert refusal.message == (
        "Pod was rejected: Node didn't have enough resource: cpu, requested: 64000, used: 0, "
        "capacity: 8000"
    )


def test_two_pods_that_fit_alone_but_not_together() -> None:
    judge = admission()
    assert judge.admit(pod("a", {"memory": "10Gi"})) is None
    refusal = judge.admit(pod("b", {"memory": "10Gi"}))
    assert refusal is not None and refusal.reason == "OutOfmemory"
    judge.forget("a")  # a terminated: its memory is free again
    assert judge.admit(pod("b", {"memory": "10Gi"})) is None


def test_the_pod_count_is_checked_first() -> None:
    judge = admission()
    for name in ("a", "b", "c"):
        assert judge.admit(pod(name)) is None
    refusal = judge.admit(pod("d", {"cpu": "64"}))
    assert refusal is not None and refusal.reason == "OutOfpods"


def test_extended_resources_the_node_lacks_are_ignored_and_those_it_has_count() -> None:
    judge = admission()
    assert judge.admit(pod("gpu-mem", {"tritonshare.io/gpu-mem": "40Gi"})) is None
    assert judge.admit(pod("dev", {"x.io/dev": "1"})) is None
    refusal = judge.admit(pod("dev2", {"x.io/dev": "1"}))
    assert refusal is not None and refusal.reason == "OutOfx.io/dev"


def test_a_taken_host_port_refuses_the_pod() -> None:
    judge = admission()
    port = [{"containerPort": 80, "hostPort": 8080}]
    assert judge.admit(pod("a", ports=port)) is None
    refusal = judge.admit(pod("b", ports=port))
    assert refusal is not None and refusal.reason == "NodePorts"


def test_a_pod_that_does_not_tolerate_a_no_execute_taint_is_refused() -> None:
    """A pod created with spec.nodeName skips the scheduler: the kubelet still checks NoExecute
    taints (and only those)."""
    judge = NodeAdmission()
    taints = [
        {"key": "tritonshare.io/gpu-node", "value": "true", "effect": "NoExecute"},
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
    ]
    judge.set_node({**NODE, "spec": {"taints": taints}})
    refusal = judge.admit(pod("plain"))
    assert refusal is not None and refusal.reason == "TaintToleration"
    assert refusal.message == "Pod was rejected: Predicate TaintToleration failed"
    wrong_value = pod("wrong")
    toleration = {"key": "tritonshare.io/gpu-node", "operator": "Equal", "value": "false"}
    wrong_value["spec"]["tolerations"] = [toleration]
    assert judge.admit(wrong_value) is not None
    for toleration in (
        {"key": "tritonshare.io/gpu-node", "operator": "Exists", "effect": "NoExecute"},
        {"key": "tritonshare.io/gpu-node", "value": "true"},
        {"operator": "Exists"},
    ):
        tolerating = pod(f"tolerating-{len(judge.admitted)}")
        tolerating["spec"]["tolerations"] = [toleration]
        assert judge.admit(tolerating) is None, toleration


def test_a_node_publishing_no_allocatable_refuses_nothing() -> None:
    judge = NodeAdmission()
    judge.set_node({"status": {}})
    assert judge.admit(pod("big", {"cpu": "640"})) is None


def test_the_hollow_kubelet_fails_a_pod_the_node_cannot_hold_and_never_runs_it(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient
) -> None:
    api = apiserver.api_client()
    core(kube_api).create_node({"metadata": {"name": "small"}})
    core(kube_api).patch_node_status("small", NODE)
    hollow = HollowKubelet(api, ["small"])
    hollow.start()
    try:
        for name, cpu in (("fits", "2"), ("too-big", "64")):
            manifest = pod(name, {"cpu": cpu})
            del manifest["metadata"]["uid"]
            manifest["metadata"]["namespace"] = "default"
            manifest["spec"]["nodeName"] = "small"
            create(kube_api, manifest)
        wait_for("the pod that fits to run", lambda: _phase(kube_api, "fits") == "Running")
        wait_for("the big pod to fail", lambda: _phase(kube_api, "too-big") == "Failed")
        refused = read(kube_api, "too-big")
        assert refused is not None
        assert refused["status"]["reason"] == "OutOfcpu"
        assert refused["status"]["message"].startswith(
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 64000"
        )
        events = core(kube_api).list_namespaced_event(
            "default", field_selector="involvedObject.name=too-big"
        )
        assert [e.reason for e in events.items] == ["OutOfcpu"]
    finally:
        hollow.stop()
        api.close()  # type: ignore[no-untyped-call]


def test_the_hollow_kubelet_fails_a_pod_put_on_a_gpu_node_without_its_toleration(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient
) -> None:
    """A tenant's pod created with spec.nodeName on a GPU node (tritonshare.io/gpu-node, NoExecute)
    never runs there, and says why."""
    api = apiserver.api_client()
    taint = {"key": "tritonshare.io/gpu-node", "value": "true", "effect": "NoExecute"}
    core(kube_api).create_node({"metadata": {"name": "gpu"}, "spec": {"taints": [taint]}})
    core(kube_api).patch_node_status("gpu", NODE)
    hollow = HollowKubelet(api, ["gpu"])
    hollow.start()
    try:
        for name, tolerations in (
            ("squat", []),
            ("model", [{"key": taint["key"], "operator": "Exists"}]),
        ):
            manifest = pod(name, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
            del manifest["metadata"]["uid"]
            manifest["metadata"]["namespace"] = "default"
            manifest["spec"]["nodeName"] = "gpu"
            manifest["spec"]["tolerations"] = tolerations
            create(kube_api, manifest)
        wait_for("the squatter to fail", lambda: _phase(kube_api, "squat") == "Failed")
        wait_for("the tolerating pod to run", lambda: _phase(kube_api, "model") == "Running")
        refused = read(kube_api, "squat")
        assert refused is not None and refused["status"]["reason"] == "TaintToleration"
        events = core(kube_api).list_namespaced_event(
            "default", field_selector="involvedObject.name=squat"
        )
        assert [e.reason for e in events.items] == ["TaintToleration"]
    finally:
        hollow.stop()
        api.close()  # type: ignore[no-untyped-call]


def _phase(api: kubernetes.client.ApiClient, name: str) -> str | None:
    found = read(api, name)
    return None if found is None else found.get("status", {}).get("phase")
