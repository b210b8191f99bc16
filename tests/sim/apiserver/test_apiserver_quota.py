"""ResourceQuotas: the quota admission of pod creates and the status the quota controller keeps,
through the official client, in the API server's words."""

from __future__ import annotations

import subprocess
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from common.quantity import BINARY_SI, DECIMAL_EXPONENT, DECIMAL_SI, format_quantity
from sim.apiserver import RunningApiServer
from sim.apiserver.quota import pod_usage
from tests.conftest import require_executable
from tests.fixtures_sim import core_v1, new_watch, status_of

GPU_MEM = "tritonshare.io/gpu-mem"


def _pod(name: str, *containers: dict[str, Any], init: list[dict[str, Any]] | None = None) -> Any:
    spec: dict[str, Any] = {
        "containers": list(containers) or [{"name": "main", "image": "busybox"}]
    }
    if init:
        spec["initContainers"] = init
    return {"metadata": {"name": name}, "spec": spec}


def _container(name: str, limits: dict[str, str] | None = None, **requests: str) -> Any:
    resources: dict[str, Any] = {}
    if limits:
        resources["limits"] = limits
    if requests:
        resources["requests"] = {k.replace("_", "-"): v for k, v in requests.items()}
    return {"name": name, "image": "busybox", "resources": resources}


def _quota(name: str, **hard: str) -> Any:
    return {"metadata": {"name": name}, "spec": {"hard": hard}}


def _refusal(v1: Any, pod: Any, namespace: str = "default") -> dict[str, Any]:
    with pytest.raises(client.ApiException) as caught:
        v1.create_namespaced_pod(namespace, pod)
    assert caught.value.status == 403
    return status_of(caught.value)


def test_a_pod_past_the_gpu_memory_quota_is_refused_in_the_api_servers_words(
    kube_api: client.ApiClient,
) -> None:
    v1 = core_v1(kube_api)
    v1.create_namespaced_resource_quota("default", _quota("gpu", **{f"requests.{GPU_MEM}": "4Gi"}))
    # A limit alone is the request of an extended resource; 1Gi + 2Gi fill 3Gi of 4Gi.
    v1.create_namespaced_pod("default", _pod("a", _container("m", {GPU_MEM: "1Gi"})))
    v1.create_namespaced_pod("default", _pod("b", _container("m", {GPU_MEM: "2048Mi"})))
    quota = v1.read_namespaced_resource_quota("gpu", "default")
    assert quota.status.hard == {f"requests.{GPU_MEM}": "4Gi"}
    assert quota.status.used == {f"requests.{GPU_MEM}": "3Gi"}

    status = _refusal(v1, _pod("c", _container("m", {GPU_MEM: "2Gi"})))
    assert status["reason"] == "Forbidden"
    assert status["details"] == {"name": "c", "kind": "pods"}
    assert status["message"] == (
        'pods "c" is forbidden: exceeded quota: gpu, requested:'
        f" requests.{GPU_MEM}=2Gi, used: requests.{GPU_MEM}=3Gi,"
        f" limited: requests.{GPU_MEM}=4Gi"
    )
    # Exactly up to the limit is allowed; the refused pod was never stored.
    v1.create_namespaced_pod("default", _pod("d", _container("m", {GPU_MEM: "1Gi"})))
    used = v1.read_namespaced_resource_quota("gpu", "default").status.used
    assert used == {f"requests.{GPU_MEM}": "4Gi"}
    assert sorted(p.metadata.name for p in v1.list_namespaced_pod("default").items) == [
        "a",
        "b",
        "d",
    ]


def test_deleting_or_terminating_a_pod_frees_its_share(
    kube_api: client.ApiClient, apiserver: RunningApiServer
) -> None:
    v1 = core_v1(kube_api)
    v1.create_namespaced_resource_quota(
        "default", _quota("q", pods="2", **{"count/pods": "5", f"requests.{GPU_MEM}": "2Gi"})
    )
    for name in ("a", "b"):
        v1.create_namespaced_pod("default", _pod(name, _container("m", {GPU_MEM: "1Gi"})))
    assert "exceeded quota: q, requested: pods=1," in _refusal(v1, _pod("c"))["message"]

    v1.delete_namespaced_pod("a", "default")  # not bound: removed at once
    used = v1.read_namespaced_resource_quota("q", "default").status.used
    assert used == {"count/pods": "1", "pods": "1", f"requests.{GPU_MEM}": "1Gi"}

    # A pod in a terminal phase keeps only its object count.
    v1.patch_namespaced_pod_status("b", "default", {"status": {"phase": "Succeeded"}})
    used = v1.read_namespaced_resource_quota("q", "default").status.used
    assert used == {"count/pods": "1", "pods": "0", f"requests.{GPU_MEM}": "0"}


def test_the_quota_status_follows_its_spec_and_is_watched(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    created = v1.create_namespaced_resource_quota(
        "default", {**_quota("q", **{f"requests.{GPU_MEM}": "1Gi"}), "status": {"used": {}}}
    )
    v1.create_namespaced_pod("default", _pod("a", _container("m", {GPU_MEM: "1Gi"})))
    watch = new_watch()
    v1.patch_namespaced_resource_quota(
        "q", "default", {"spec": {"hard": {f"requests.{GPU_MEM}": "3072Mi"}}}
    )
    seen = []
    for event in watch.stream(
        v1.list_namespaced_resource_quota,
        "default",
        resource_version=created.metadata.resource_version,
        timeout_seconds=5,
    ):
        seen.append(event["object"].status and event["object"].status.hard)
        if seen[-1] == {f"requests.{GPU_MEM}": "3Gi"}:
            watch.stop()
    assert seen[-1] == {f"requests.{GPU_MEM}": "3Gi"}
    # Now 1Gi + 2Gi fit.
    v1.create_namespaced_pod("default", _pod("b", _container("m", {GPU_MEM: "2Gi"})))
    # A write to the main resource keeps the controller's status.
    quota = v1.read_namespaced_resource_quota("q", "default")
    assert quota.status.used == {f"requests.{GPU_MEM}": "3Gi"}


def test_a_quota_on_cpu_requires_each_container_to_set_it(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    v1.create_namespaced_resource_quota("default", _quota("compute", **{"limits.cpu": "2"}))
    pod = _pod("p", _container("a", {"cpu": "1"}), _container("b", cpu="100m"))
    assert _refusal(v1, pod)["message"] == (
        'pods "p" is forbidden: failed quota: compute: must specify limits.cpu for: b'
    )
    v1.create_namespaced_pod("default", _pod("q", _container("a", {"cpu": "500m"})))
    used = v1.read_namespaced_resource_quota("compute", "default").status.used
    assert used == {"limits.cpu": "500m"}
    message = _refusal(v1, _pod("r", _container("a", {"cpu": "1600m"})))["message"]
    assert message == (
        'pods "r" is forbidden: exceeded quota: compute, requested: limits.cpu=1600m,'
        " used: limits.cpu=500m, limited: limits.cpu=2"
    )


def test_kubectl_prints_use_against_the_limits(
    kube_api: client.ApiClient, apiserver: RunningApiServer, tmp_path: Path
) -> None:
    kubectl = require_executable("kubectl")
    v1 = core_v1(kube_api)
    hard = {f"requests.{GPU_MEM}": "4Gi", "pods": "5", "limits.memory": "1Gi"}
    v1.create_namespaced_resource_quota("default", _quota("gpu", **hard))
    v1.create_namespaced_pod(
        "default", _pod("a", _container("m", {GPU_MEM: "1Gi", "memory": "64Mi"}))
    )
    config = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    printed = subprocess.run(
        [kubectl, "--kubeconfig", str(config), "get", "quota", "--no-headers"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert printed.startswith("gpu ")
    assert f" pods: 1/5, requests.{GPU_MEM}: 1Gi/4Gi " in printed
    assert printed.rstrip().endswith(" limits.memory: 64Mi/1Gi")


def test_a_malformed_or_scoped_quota_is_refused_with_what_to_do(
    kube_api: client.ApiClient,
) -> None:
    v1 = core_v1(kube_api)
    with pytest.raises(client.ApiException) as caught:
        v1.create_namespaced_resource_quota("default", _quota("q", cpu="lots"))
    assert caught.value.status == 400
    assert "quantities must match the regular expression" in status_of(caught.value)["message"]
    for body, words in (
        (_quota("q", gpus="1"), 'spec.hard[gpus]: Invalid value: "gpus": must be a standard'),
        (_quota("q", cpu="-1"), 'spec.hard[cpu]: Invalid value: "-1": must be greater than'),
        (
            {**_quota("q", pods="1"), "spec": {"hard": {"pods": "1"}, "scopes": ["BestEffort"]}},
            "spec.scopes: Forbidden: quota scopes other than PriorityClass are not implemented",
        ),
    ):
        with pytest.raises(client.ApiException) as caught:
            v1.create_namespaced_resource_quota("default", body)
        assert caught.value.status == 422
        assert words in status_of(caught.value)["message"]


def test_a_quota_scoped_by_priority_class_admits_and_counts_only_the_pods_it_selects(
    kube_api: client.ApiClient,
) -> None:
    v1 = core_v1(kube_api)
    scheduling: Any = client.SchedulingV1Api(kube_api)
    for name in ("urgent", "normal"):
        scheduling.create_priority_class(
            {"metadata": {"name": name}, "value": 1000 if name == "urgent" else 10}
        )
    selector = {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In",
                                      "values": ["urgent"]}]}  # fmt: skip
    body = _quota("no-urgent", pods="0")
    body["spec"]["scopeSelector"] = selector
    v1.create_namespaced_resource_quota("default", body)
    exists = _quota("classed", pods="1")
    exists["spec"]["scopes"] = ["PriorityClass"]
    v1.create_namespaced_resource_quota("default", exists)

    def pod(name: str, cls: str = "") -> Any:
        obj = _pod(name)
        if cls:
            obj["spec"]["priorityClassName"] = cls
        return obj

    refusal = _refusal(v1, pod("u", "urgent"))
    assert refusal["message"] == (
        'pods "u" is forbidden: exceeded quota: no-urgent, requested: pods=1, used: pods=0,'
        " limited: pods=0"
    )
    v1.create_namespaced_pod("default", pod("plain"))  # selected by neither
    v1.create_namespaced_pod("default", pod("n", "normal"))  # by "classed" only
    assert "exceeded quota: classed" in _refusal(v1, pod("n2", "normal"))["message"]
    used = {
        q: v1.read_namespaced_resource_quota(q, "default").status.used
        for q in ("no-urgent", "classed")
    }
    assert used == {"no-urgent": {"pods": "0"}, "classed": {"pods": "1"}}


def test_a_pods_usage_counts_as_kubernetes_counts_it() -> None:
    pod = {
        "metadata": {"name": "p"},
        "spec": {
            "initContainers": [_container("load", {GPU_MEM: "3Gi"}, memory="1Gi")],
            "containers": [
                _container("a", {GPU_MEM: "1Gi", "memory": "1Gi"}, cpu="250m", memory="512Mi"),
                _container("b", {GPU_MEM: "1Gi"}, ephemeral_storage="1G"),
            ],
        },
    }
    usage = {name: format_quantity(*value) for name, value in pod_usage(pod).items()}
    assert usage == {
        "count/pods": "1",
        "pods": "1",
        "cpu": "250m",
        "requests.cpu": "250m",
        "memory": "1Gi",  # the init container's 1Gi beats the containers' 512Mi
        "requests.memory": "1Gi",
        "limits.memory": "1Gi",
        "ephemeral-storage": "1G",
        "requests.ephemeral-storage": "1G",
        f"requests.{GPU_MEM}": "3Gi",  # the init container's limit beats the sum of 2Gi
    }


@pytest.mark.parametrize(
    ("value", "form", "text"),
    [
        (3 << 30, BINARY_SI, "3Gi"),
        (1536 << 20, BINARY_SI, "1536Mi"),
        (100, BINARY_SI, "100"),
        (Decimal("0.5"), DECIMAL_SI, "500m"),
        (1_500_000_000, DECIMAL_SI, "1500M"),
        (2000, DECIMAL_EXPONENT, "2e3"),
        (0, BINARY_SI, "0"),
    ],
)
def test_quantities_are_written_as_kubernetes_writes_them(
    value: Decimal | int, form: str, text: str
) -> None:
    assert format_quantity(value, form) == text
