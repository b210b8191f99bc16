"""The simulated API server runs ValidatingAdmissionPolicies as kube-apiserver does: stored like
other kinds, matched by their constraints and their bindings' resources, evaluated in CEL over
`object`, `oldObject`, `request` (with the caller's userInfo), `namespaceObject` and `variables`,
refusing with upstream's Status, and with failurePolicy deciding what a CEL error means. Driven
through the official client; the policies here are small and made for each case (the project's
own are exercised in tests/deploy/test_admission_policy.py)."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

import kubernetes.client
import pytest

from sim.apiserver import RunningApiServer
from tests.fixtures_sim import core_v1, status_of

API_AUDIENCE = "https://kubernetes.default.svc.cluster.local"
PODS_RULE = {
    "apiGroups": [""],
    "apiVersions": ["v1"],
    "operations": ["CREATE"],
    "resources": ["pods"],
}


def _admission(api: kubernetes.client.ApiClient) -> Any:
    return kubernetes.client.AdmissionregistrationV1Api(api)


def _install(
    api: kubernetes.client.ApiClient,
    name: str,
    validations: Sequence[dict[str, Any]],
    *,
    rules: Sequence[dict[str, Any]] = (PODS_RULE,),
    failure_policy: str | None = None,
    match_conditions: Sequence[dict[str, Any]] = (),
    variables: Sequence[dict[str, Any]] = (),
    constraints: dict[str, Any] | None = None,
    binding: dict[str, Any] | None = None,
) -> None:
    """A policy and one binding of the same name (`binding` adds to the binding's spec)."""
    spec: dict[str, Any] = {
        "matchConstraints": {"resourceRules": list(rules), **(constraints or {})},
        "validations": list(validations),
    }
    if failure_policy:
        spec["failurePolicy"] = failure_policy
    if match_conditions:
        spec["matchConditions"] = list(match_conditions)
    if variables:
        spec["variables"] = list(variables)
    admission = _admission(api)
    admission.create_validating_admission_policy({"metadata": {"name": name}, "spec": spec})
    binding_spec = {"policyName": name, "validationActions": ["Deny"], **(binding or {})}
    admission.create_validating_admission_policy_binding(
        {"metadata": {"name": name}, "spec": binding_spec}
    )


def _pod(name: str = "p", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox"}], **spec},
    }


def _refused(call: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    with pytest.raises(kubernetes.client.ApiException) as raised:
        call(*args, **kwargs)
    status = status_of(raised.value)
    assert raised.value.status == status["code"]
    return status


def _denial(policy: str, message: str, resource: str = "pods", name: str = "p") -> str:
    return (
        f"{resource} \"{name}\" is forbidden: ValidatingAdmissionPolicy '{policy}' with binding"
        f" '{policy}' denied request: {message}"
    )


def _client(apiserver: RunningApiServer, token: str) -> kubernetes.client.ApiClient:
    configuration = kubernetes.client.Configuration()
    configuration.host = apiserver.url
    configuration.api_key = {"authorization": f"Bearer {token}"}
    return kubernetes.client.ApiClient(configuration)


def test_policies_and_bindings_are_stored_like_other_kinds(
    kube_api: kubernetes.client.ApiClient,
) -> None:
    _install(kube_api, "p1", [{"expression": "true"}])
    admission = _admission(kube_api)
    policy = json.loads(
        admission.read_validating_admission_policy("p1", _preload_content=False).data
    )
    # Defaulted as upstream defaults it.
    assert policy["spec"]["failurePolicy"] == "Fail"
    listed = admission.list_validating_admission_policy_binding(_preload_content=False)
    assert [b["metadata"]["name"] for b in json.loads(listed.data)["items"]] == ["p1"]
    admission.delete_validating_admission_policy_binding("p1")
    admission.delete_validating_admission_policy("p1")
    listed = admission.list_validating_admission_policy(_preload_content=False)
    assert json.loads(listed.data)["items"] == []


def test_what_the_sim_does_not_implement_is_refused_when_written(
    kube_api: kubernetes.client.ApiClient,
) -> None:
    admission = _admission(kube_api)
    with_params = {
        "metadata": {"name": "params"},
        "spec": {
            "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            "matchConstraints": {"resourceRules": [PODS_RULE]},
            "validations": [{"expression": "true"}],
        },
    }
    status = _refused(admission.create_validating_admission_policy, with_params)
    assert status["code"] == 422
    assert "policy parameters (paramKind, paramRef) are not implemented" in status["message"]
    binding = {
        "metadata": {"name": "b"},
        "spec": {"policyName": "x", "validationActions": ["Deny", "Warn"]},
    }
    status = _refused(admission.create_validating_admission_policy_binding, binding)
    assert status["code"] == 422 and "must not contain both Deny and Warn" in status["message"]


def test_a_failed_validation_is_refused_with_upstreams_status(
    kube_api: kubernetes.client.ApiClient,
) -> None:
    _install(
        kube_api,
        "no-host-network",
        [
            {"expression": "!has(object.spec.hostNetwork) || !object.spec.hostNetwork"},
            {
                "expression": "object.metadata.name.startsWith('ok-')",
                "messageExpression": "'pod ' + object.metadata.name + ' is not ok'",
                "reason": "Forbidden",
            },
        ],
    )
    core = core_v1(kube_api)
    status = _refused(core.create_namespaced_pod, "default", _pod("ok-1", hostNetwork=True))
    assert (status["code"], status["reason"]) == (422, "Invalid")
    # No message: upstream's "failed expression: ...".
    assert status["message"] == _denial(
        "no-host-network",
        "failed expression: !has(object.spec.hostNetwork) || !object.spec.hostNetwork",
        name="ok-1",
    )
    assert status["details"] == {
        "name": "ok-1",
        "kind": "pods",
        "causes": [{"message": status["message"].split(" is forbidden: ")[1]}],
    }
    # The validation's reason sets the code; messageExpression the message.
    status = _refused(core.create_namespaced_pod, "default", _pod("bad"))
    assert (status["code"], status["reason"]) == (403, "Forbidden")
    assert status["message"] == _denial("no-host-network", "pod bad is not ok", name="bad")
    core.create_namespaced_pod("default", _pod("ok-2"))


def test_cel_sees_who_made_the_request(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient
) -> None:
    who = (
        "request.userInfo.username + '|' + request.userInfo.groups.join(',') + '|' +"
        " ('extra' in request.userInfo ?"
        " request.userInfo.extra['authentication.kubernetes.io/pod-name'][0] + ',' +"
        " request.userInfo.extra['authentication.kubernetes.io/node-name'][0] : '-') + '|' +"
        " ('uid' in request.userInfo ? 'uid' : 'no-uid')"
    )
    lease_rule = {
        "apiGroups": ["coordination.k8s.io"],
        "apiVersions": ["v1"],
        "operations": ["CREATE"],
        "resources": ["leases"],
    }
    _install(
        kube_api, "who", [{"expression": "false", "messageExpression": who}], rules=[lease_rule]
    )
    core = core_v1(kube_api)
    core.create_node({"metadata": {"name": "n1"}})
    core.create_namespaced_pod("default", _pod("agent", serviceAccountName="sa", nodeName="n1"))
    lease = {"metadata": {"name": "l"}, "spec": {}}
    leases: Any = kubernetes.client.CoordinationV1Api(kube_api)
    status = _refused(leases.create_namespaced_lease, "default", lease)
    admin = "kubernetes-admin|system:masters,system:authenticated|-|no-uid"
    assert status["message"].endswith(f"denied request: {admin}")
    token = apiserver.mint_token("default", "agent", audience=API_AUDIENCE)
    with _client(apiserver, token) as api:
        as_pod: Any = kubernetes.client.CoordinationV1Api(api)
        status = _refused(as_pod.create_namespaced_lease, "default", lease)
    assert status["message"].endswith(
        "denied request: system:serviceaccount:default:sa|system:serviceaccounts,"
        "system:serviceaccounts:default,system:authenticated|agent,n1|uid"
    )


@pytest.mark.parametrize("failure_policy", ["Fail", "Ignore"])
def test_failure_policy_decides_what_a_cel_error_means(
    kube_api: kubernetes.client.ApiClient, failure_policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A pod without spec.nodeName: selecting the missing field is a CEL error, not false.
    _install(
        kube_api,
        "errs",
        [{"expression": "object.spec.nodeName == ''", "message": "never seen"}],
        failure_policy=failure_policy,
    )
    core = core_v1(kube_api)
    with caplog.at_level(logging.WARNING, logger="sim.apiserver.admission.policies"):
        if failure_policy == "Ignore":
            core.create_namespaced_pod("default", _pod())
        else:
            status = _refused(core.create_namespaced_pod, "default", _pod())
            assert (status["code"], status["reason"]) == (422, "Invalid")
            assert status["message"] == _denial(
                "errs",
                "expression 'object.spec.nodeName == ''' resulted in error: no such member in"
                " mapping: 'nodeName'",
            )
    assert "ValidatingAdmissionPolicy 'errs' could not be evaluated" in caplog.text.replace(
        '"', "'"
    )
    assert ("denied, failurePolicy Fail" if failure_policy == "Fail" else "ignored") in caplog.text


@pytest.mark.parametrize("failure_policy", ["Fail", "Ignore"])
def test_what_the_sims_cel_lacks_fails_by_failure_policy(
    kube_api: kubernetes.client.ApiClient, failure_policy: str
) -> None:
    _install(
        kube_api,
        "lacks",
        [{"expression": "authorizer.group('').resource('pods').check('get').allowed()"}],
        failure_policy=failure_policy,
        match_conditions=[{"name": "optional", "expression": "object.?spec.hasValue()"}],
    )
    core = core_v1(kube_api)
    if failure_policy == "Ignore":
        core.create_namespaced_pod("default", _pod())
        return
    status = _refused(core.create_namespaced_pod, "default", _pod())
    assert (
        "expression 'object.?spec.hasValue()' resulted in error: compilation failed"
        in (status["message"])
    )
    assert "optional types are not supported by the simulated API server" in status["message"]


def test_match_conditions_and_variables(kube_api: kubernetes.client.ApiClient) -> None:
    _install(
        kube_api,
        "team-pods",
        [
            {"expression": "variables.team != 'blocked'", "message": "team blocked"},
            # Uses the variable that errors: only this validation fails (lazily, as upstream).
            {"expression": "variables.broken == 1 || variables.team != 'broken'"},
        ],
        match_conditions=[
            {"name": "labelled", "expression": "has(object.metadata.labels)"},
            {"name": "not-exempt", "expression": "!('exempt' in object.metadata.labels)"},
        ],
        variables=[
            {"name": "team", "expression": "object.metadata.labels['team']"},
            {"name": "broken", "expression": "1 / 0"},
        ],
    )
    core = core_v1(kube_api)
    core.create_namespaced_pod("default", _pod("unlabelled"))
    exempt = _pod("exempt")
    exempt["metadata"]["labels"] = {"team": "blocked", "exempt": "yes"}
    core.create_namespaced_pod("default", exempt)
    blocked = _pod("b")
    blocked["metadata"]["labels"] = {"team": "blocked"}
    status = _refused(core.create_namespaced_pod, "default", blocked)
    assert status["message"] == _denial("team-pods", "team blocked", name="b")
    fine = _pod("f")
    fine["metadata"]["labels"] = {"team": "fine"}
    core.create_namespaced_pod("default", fine)


def test_rules_subresources_exclusions_and_selectors(
    kube_api: kubernetes.client.ApiClient,
) -> None:
    status_rule = {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["UPDATE"],
        "resources": ["pods/status"],
    }
    _install(
        kube_api,
        "no-failed",
        [{"expression": "object.status.phase != 'Failed'", "message": "no Failed pods"}],
        rules=[status_rule],
        constraints={
            "namespaceSelector": {"matchLabels": {"guarded": "yes"}},
            "objectSelector": {"matchExpressions": [{"key": "free", "operator": "DoesNotExist"}]},
        },
    )
    core = core_v1(kube_api)
    core.create_namespace({"metadata": {"name": "g", "labels": {"guarded": "yes"}}})
    for namespace in ("g", "default"):
        core.create_namespaced_pod(namespace, _pod())
    failed = {"status": {"phase": "Failed"}}
    status = _refused(core.patch_namespaced_pod_status, "p", "g", failed)
    assert status["message"] == _denial("no-failed", "no Failed pods")
    # Not the main resource, not an unlabelled namespace, not a pod the selector leaves out.
    core.patch_namespaced_pod("p", "g", {"metadata": {"labels": {"x": "y"}}})
    core.patch_namespaced_pod_status("p", "default", failed)
    core.patch_namespaced_pod("p", "g", {"metadata": {"labels": {"free": "1"}}})
    core.patch_namespaced_pod_status("p", "g", failed)


def test_bindings_narrow_what_a_policy_matches(kube_api: kubernetes.client.ApiClient) -> None:
    every_pod_write = {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["*"],
        "resources": ["pods"],
    }
    _install(
        kube_api,
        "frozen",
        [{"expression": "false", "message": "frozen"}],
        rules=[every_pod_write],
        constraints={
            "excludeResourceRules": [{**every_pod_write, "operations": ["CREATE"]}],
        },
        binding={"matchResources": {"namespaceSelector": {"matchLabels": {"frozen": "yes"}}}},
    )
    core = core_v1(kube_api)
    core.create_namespace({"metadata": {"name": "f", "labels": {"frozen": "yes"}}})
    core.create_namespaced_pod("f", _pod())
    core.create_namespaced_pod("default", _pod())
    status = _refused(core.delete_namespaced_pod, "p", "f")
    assert status["message"] == _denial("frozen", "frozen")
    core.read_namespaced_pod("p", "f")
    core.delete_namespaced_pod("p", "default")
    # A binding for another policy changes nothing.
    _admission(kube_api).create_validating_admission_policy_binding(
        {"metadata": {"name": "other"}, "spec": {"policyName": "x", "validationActions": ["Deny"]}}
    )
    core.create_namespaced_pod("default", _pod("q"))


def test_a_binding_is_admitted_as_pods_binding(kube_api: kubernetes.client.ApiClient) -> None:
    binding_rule = {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["CREATE"],
        "resources": ["pods/binding"],
    }
    _install(
        kube_api,
        "not-n2",
        [
            {
                "expression": "object.target.name != 'n2'",
                "messageExpression": "request.kind.kind + ' to ' + object.target.name",
            }
        ],
        rules=[binding_rule],
    )
    core = core_v1(kube_api)
    core.create_namespaced_pod("default", _pod())
    body = {"metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n2"}}
    status = _refused(
        core.create_namespaced_pod_binding, "p", "default", body, _preload_content=False
    )
    assert status["message"] == _denial("not-n2", "Binding to n2")
    body["target"]["name"] = "n1"
    core.create_namespaced_pod_binding("p", "default", body, _preload_content=False)
    assert core.read_namespaced_pod("p", "default").spec.node_name == "n1"


def test_warn_and_audit_actions_let_the_request_through(
    kube_api: kubernetes.client.ApiClient, caplog: pytest.LogCaptureFixture
) -> None:
    _install(
        kube_api,
        "advice",
        [{"expression": "false", "message": 'consider a "smaller" pod'}],
        binding={"validationActions": ["Warn", "Audit"]},
    )
    core = core_v1(kube_api)
    with caplog.at_level(logging.WARNING, logger="sim.apiserver.admission.policies"):
        response = core.create_namespaced_pod("default", _pod(), _preload_content=False)
    assert response.status == 201
    assert response.headers["Warning"] == (
        "299 - \"Validation failed for ValidatingAdmissionPolicy 'advice' with binding 'advice':"
        ' consider a \\"smaller\\" pod"'
    )
    assert "would deny CREATE pods default/p (audit only)" in caplog.text


def _post(apiserver: RunningApiServer, plural: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST a body the official client's models would refuse to send; the Status answered."""
    request = urllib.request.Request(
        f"{apiserver.url}/apis/admissionregistration.k8s.io/v1/{plural}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=10)
    status: dict[str, Any] = json.loads(raised.value.read())
    assert raised.value.code == status["code"]
    return status


def test_malformed_policies_are_refused_when_written_so_writes_never_fail_on_them(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient
) -> None:
    malformed: list[dict[str, Any]] = [
        {"matchConstraints": {"resourceRules": [PODS_RULE]}, "validations": "true"},
        {"matchConstraints": {"resourceRules": "pods"}, "validations": [{"expression": "true"}]},
        {
            "matchConstraints": {"resourceRules": [PODS_RULE]},
            "validations": [{"expression": "true", "reason": "Teapot"}],
        },
        {
            "matchConstraints": {"resourceRules": [PODS_RULE]},
            "variables": [{"name": "v"}],
            "validations": [{"expression": "true"}],
        },
        {"validations": [{"expression": "true"}]},
    ]
    for i, spec in enumerate(malformed):
        body = {"metadata": {"name": f"m{i}"}, "spec": spec}
        status = _post(apiserver, "validatingadmissionpolicies", body)
        assert (status["code"], status["reason"]) == (422, "Invalid"), spec
    binding = {"metadata": {"name": "b"}, "spec": {"policyName": "p", "validationActions": ["X"]}}
    status = _post(apiserver, "validatingadmissionpolicybindings", binding)
    assert 'Unsupported value: "X": supported values: "Audit", "Deny", "Warn"' in status["message"]
    core_v1(kube_api).create_namespaced_pod("default", _pod())
