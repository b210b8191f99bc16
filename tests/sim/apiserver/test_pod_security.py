"""The simulated API server runs Pod Security admission for each namespace's labels, as
kube-apiserver does: `enforce` refuses a pod with 403 and upstream's message, `warn` answers with
`Warning` headers for pods and workloads, `audit` annotates the request's audit record, bad labels
are refused, and a controller whose pods are refused records FailedCreate. Driven through the
official client (the per-rule checks: test_pod_security_standards.py)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from sim.apiserver import RunningApiServer
from sim.controllers.manager import ControllerManager
from sim.processes import wait_until
from tests.fixtures_sim import apps_v1, core_v1, status_of
from tests.sim.apiserver.test_pod_security_standards import restricted_pod

PSA = "pod-security.kubernetes.io/"


def _namespace(api: kubernetes.client.ApiClient, name: str, **modes: str) -> None:
    labels = {PSA + mode: level for mode, level in modes.items()}
    core_v1(api).create_namespace({"metadata": {"name": name, "labels": labels}})


def _gateway_pod(name: str = "node") -> dict[str, Any]:
    """A pod that passes restricted but for its host ports."""
    pod = copy.deepcopy(restricted_pod())
    pod["metadata"]["name"] = name
    gateway = copy.deepcopy(pod["spec"]["containers"][0])
    gateway["name"] = "gateway"
    gateway["ports"] = [{"containerPort": 8010, "hostPort": 8010}]
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": 8100, "hostPort": 8100}]
    pod["spec"]["containers"].append(gateway)
    return pod


def _warnings(headers: Any) -> list[str]:
    """The texts of the response's `Warning: 299 - "<text>"` headers, unquoted."""
    values = headers.getlist("Warning") if hasattr(headers, "getlist") else []
    texts = []
    for value in values:
        assert value.startswith('299 - "') and value.endswith('"'), value
        texts.append(value[7:-1].replace('\\"', '"').replace("\\\\", "\\"))
    return texts


def test_enforce_refuses_a_pod_with_upstreams_status(kube_api: kubernetes.client.ApiClient) -> None:
    _namespace(kube_api, "locked", enforce="restricted")
    with pytest.raises(kubernetes.client.ApiException) as refused:
        core_v1(kube_api).create_namespaced_pod("locked", _gateway_pod())
    assert refused.value.status == 403
    status = status_of(refused.value)
    assert status["reason"] == "Forbidden"
    assert status["message"] == (
        'pods "node" is forbidden: violates PodSecurity "restricted:latest": hostPort'
        ' (containers "app", "gateway" use hostPorts 8010, 8100)'
    )
    # The level below refuses it too (host ports are baseline's); privileged admits it.
    _namespace(kube_api, "base", enforce="baseline", **{"enforce-version": "v1.30"})
    with pytest.raises(kubernetes.client.ApiException) as refused:
        core_v1(kube_api).create_namespaced_pod("base", _gateway_pod())
    assert 'violates PodSecurity "baseline:v1.30": hostPort' in status_of(refused.value)["message"]
    _namespace(kube_api, "open", enforce="privileged")
    core_v1(kube_api).create_namespaced_pod("open", _gateway_pod())
    # A namespace without labels is privileged, as on a cluster with the default configuration.
    core_v1(kube_api).create_namespaced_pod("default", _gateway_pod())


def test_warn_answers_with_warning_headers_for_pods_and_workloads(
    kube_api: kubernetes.client.ApiClient,
) -> None:
    _namespace(kube_api, "watched", enforce="privileged", warn="restricted")
    _, code, headers = core_v1(kube_api).create_namespaced_pod_with_http_info(
        "watched", _gateway_pod()
    )
    assert code == 201
    expected = (
        'would violate PodSecurity "restricted:latest": hostPort (containers "app", "gateway"'
        " use hostPorts 8010, 8100)"
    )
    assert _warnings(headers) == [expected]
    template = _gateway_pod()
    template["metadata"] = {"labels": {"app": "d"}}
    deployment = {
        "metadata": {"name": "d"},
        "spec": {"selector": {"matchLabels": {"app": "d"}}, "replicas": 0, "template": template},
    }
    _, _, headers = apps_v1(kube_api).create_namespaced_deployment_with_http_info(
        "watched", deployment
    )
    assert len(_warnings(headers)) == 1 and "hostPort" in _warnings(headers)[0]
    # An update that leaves the template alone warns no more; one that changes it does.
    _, _, headers = apps_v1(kube_api).patch_namespaced_deployment_with_http_info(
        "d", "watched", {"spec": {"replicas": 0}, "metadata": {"labels": {"x": "y"}}}
    )
    assert _warnings(headers) == []
    passing = restricted_pod()["spec"]
    _, _, headers = apps_v1(kube_api).patch_namespaced_deployment_with_http_info(
        "d", "watched", {"spec": {"template": {"spec": {"containers": passing["containers"]}}}}
    )
    assert _warnings(headers) == []


def test_audit_annotates_the_audit_record(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient
) -> None:
    _namespace(kube_api, "audited", audit="baseline")
    core_v1(kube_api).create_namespaced_pod("audited", _gateway_pod("a"))
    record = next(
        r for r in apiserver.audit if r.verb == "create" and r.resource == "pods" and r.code == 201
    )
    assert dict(record.annotations) == {
        PSA + "audit-violations": 'would violate PodSecurity "baseline:latest": hostPort'
        ' (containers "app", "gateway" use hostPorts 8010, 8100)',
        PSA + "enforce-policy": "privileged:latest",
    }


def test_bad_labels_are_refused(kube_api: kubernetes.client.ApiClient) -> None:
    with pytest.raises(kubernetes.client.ApiException) as refused:
        _namespace(kube_api, "typo", enforce="restriced")
    assert refused.value.status == 422
    assert status_of(refused.value)["message"] == (
        'Namespace "typo" is invalid: metadata.labels[pod-security.kubernetes.io/enforce]:'
        ' Invalid value: "restriced": must be one of privileged, baseline, restricted'
    )


def test_tightening_enforce_warns_about_the_pods_already_there(
    kube_api: kubernetes.client.ApiClient,
) -> None:
    _namespace(kube_api, "old")
    for name in ("p1", "p2"):
        core_v1(kube_api).create_namespaced_pod("old", _gateway_pod(name))
    core_v1(kube_api).create_namespaced_pod("old", restricted_pod())
    _, _, headers = core_v1(kube_api).patch_namespace_with_http_info(
        "old", {"metadata": {"labels": {PSA + "enforce": "restricted"}}}
    )
    warnings = _warnings(headers)
    assert len(warnings) == 2
    assert "violate the new PodSecurity enforce level" in warnings[0]
    assert "p1 (and 1 other pod): hostPort" in warnings[1]


@pytest.fixture
def manager(apiserver: RunningApiServer) -> Iterator[ControllerManager]:
    api = apiserver.api_client()
    running = ControllerManager(api, clock=apiserver.clock.now)
    running.start()
    try:
        assert running.wait_synced(10)
        yield running
    finally:
        running.stop()
        api.close()  # type: ignore[no-untyped-call]


def test_a_replica_set_whose_pods_are_refused_records_failed_create(
    kube_api: kubernetes.client.ApiClient, manager: ControllerManager
) -> None:
    _namespace(kube_api, "locked", enforce="restricted")
    template = _gateway_pod()
    template["metadata"] = {"labels": {"app": "rs"}}
    apps_v1(kube_api).create_namespaced_replica_set(
        "locked",
        {
            "metadata": {"name": "rs"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "rs"}},
                "template": template,
            },
        },
    )

    def failed_create() -> Any:
        events = core_v1(kube_api).list_namespaced_event("locked", _preload_content=False)
        return [e for e in json.loads(events.data)["items"] if e["reason"] == "FailedCreate"]

    event = wait_until("the FailedCreate event", failed_create, 10)[0]
    assert event["type"] == "Warning"
    assert event["involvedObject"]["kind"] == "ReplicaSet"
    assert event["message"].startswith('Error creating: pods "rs-')
    assert 'violates PodSecurity "restricted:latest": hostPort' in event["message"]
    assert core_v1(kube_api).list_namespaced_pod("locked").items == []


def test_a_label_on_a_pod_older_than_its_namespaces_level_passes(
    kube_api: kubernetes.client.ApiClient,
) -> None:
    """Only an update of what Pod Security looks at is checked, as upstream: labels and the
    binder's annotations on a pod that predates its namespace's level pass."""
    _namespace(kube_api, "later")
    core_v1(kube_api).create_namespaced_pod("later", _gateway_pod("old"))
    core_v1(kube_api).patch_namespace(
        "later", {"metadata": {"labels": {PSA + "enforce": "restricted"}}}
    )
    patch = {"metadata": {"labels": {"x": "y"}, "annotations": {"tritonshare.io/gpu": "GPU-1"}}}
    core_v1(kube_api).patch_namespaced_pod("old", "later", patch)
    apparmor = {"container.apparmor.security.beta.kubernetes.io/app": "unconfined"}
    with pytest.raises(kubernetes.client.ApiException) as refused:
        core_v1(kube_api).patch_namespaced_pod(
            "old", "later", {"metadata": {"annotations": apparmor}}
        )
    assert refused.value.status == 403
