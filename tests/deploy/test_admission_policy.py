"""The agent's NodeRestriction-like ValidatingAdmissionPolicy decides as intended.

No API server runs here, so the policy's own CEL (match conditions, variables, validations, as
rendered by kustomize) is evaluated with cel-python on admission requests shaped as the real API
server builds them for the agent's writes: its own node and lease pass; another node, another
node's lease, a node's spec or labels, and a token without the pod's node name are refused; other
users are not concerned.
"""

from __future__ import annotations

import copy
import importlib.util
from typing import Any

import pytest

from tests.conftest import require_executable, require_tool
from tests.deploy.rendering import render

AGENT = "system:serviceaccount:tritonshare-system:tritonshare-agent"
NODE_EXTRA = "authentication.kubernetes.io/node-name"


def _policy(name: str = "tritonshare-agent-own-node") -> dict[str, Any]:
    [policy] = [
        o
        for o in render(require_executable("kubectl"), "base")
        if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"] == name
    ]
    return policy


class Policy:
    """Evaluates a ValidatingAdmissionPolicy's CEL on one admission request."""

    def __init__(self, policy: dict[str, Any]) -> None:
        require_tool(
            importlib.util.find_spec("celpy") is not None,
            "cel-python is not installed (pip install cel-python): it evaluates the policy's CEL",
        )
        import celpy

        self._celpy = celpy
        self._env = celpy.Environment()
        self.spec = policy["spec"]

    def _eval(self, expression: str, activation: dict[str, Any]) -> Any:
        program = self._env.program(self._env.compile(expression))
        return program.evaluate(activation)

    def _holds(self, expression: str, activation: dict[str, Any]) -> bool:
        """True only for a CEL `true`; an error (a missing key, say) counts as false, as the API
        server's failurePolicy Fail makes it deny."""
        result = self._eval(expression, activation)
        return isinstance(result, self._celpy.celtypes.BoolType) and bool(result)

    def _matches(self, request: dict[str, Any]) -> bool:
        resource = request["resource"]["resource"]
        if request.get("subResource"):
            resource += "/" + request["subResource"]
        for rule in self.spec["matchConstraints"]["resourceRules"]:
            if (
                request["resource"]["group"] in rule["apiGroups"]
                and resource in rule["resources"]
                and request["operation"] in rule["operations"]
            ):
                return True
        return False

    def denials(
        self, request: dict[str, Any], obj: dict[str, Any], old: dict[str, Any] | None
    ) -> list[str]:
        """The messages of the failed validations; empty when the request is admitted."""
        if not self._matches(request):
            return []
        celpy = self._celpy
        activation: dict[str, Any] = {
            "request": celpy.json_to_cel(request),
            "object": celpy.json_to_cel(obj),
            "oldObject": celpy.json_to_cel(old),
        }
        for condition in self.spec.get("matchConditions", []):
            if not self._holds(condition["expression"], activation):
                return []
        variables: dict[Any, Any] = {}
        for variable in self.spec.get("variables", []):
            variables[celpy.celtypes.StringType(variable["name"])] = self._eval(
                variable["expression"],
                {**activation, "variables": celpy.celtypes.MapType(variables)},
            )
        activation["variables"] = celpy.celtypes.MapType(variables)
        failed = []
        for validation in self.spec["validations"]:
            if not self._holds(validation["expression"], activation):
                failed.append(str(validation["message"]))
        return failed


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy(_policy())


def _request(
    resource: str,
    name: str,
    *,
    operation: str = "UPDATE",
    user: str = AGENT,
    token_node: str | None = "gpu-1",  # noqa: S107 - a node name, not a secret
    group: str = "",
    sub: str = "",
) -> dict[str, Any]:
    extra = {NODE_EXTRA: [token_node]} if token_node else {}
    return {
        "operation": operation,
        "name": name,
        "resource": {"group": group, "version": "v1", "resource": resource},
        "subResource": sub,
        "userInfo": {"username": user, "extra": extra},
    }


NODE = {
    "metadata": {
        "name": "gpu-1",
        "labels": {"nvidia.com/gpu.present": "true"},
        "annotations": {"tritonshare.io/gpus": "[]"},
    },
    "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
}


def _changed(**changes: Any) -> dict[str, Any]:
    node: dict[str, Any] = copy.deepcopy(NODE)
    for path, value in changes.items():
        section, key = path.split("__")
        node[section][key] = value
    return node


def test_the_agent_may_annotate_its_own_node(policy: Policy) -> None:
    new = _changed(metadata__annotations={"tritonshare.io/gpus": '[{"uuid": "GPU-1"}]'})
    assert policy.denials(_request("nodes", "gpu-1"), new, NODE) == []
    assert policy.denials(_request("nodes", "gpu-1", sub="status"), new, NODE) == []


def test_the_agent_may_not_touch_another_node(policy: Policy) -> None:
    other: dict[str, Any] = copy.deepcopy(NODE)
    other["metadata"]["name"] = "gpu-2"
    denied = policy.denials(_request("nodes", "gpu-2"), other, other)
    assert denied == ["the tritonshare agent may change only the node its own pod runs on"]


def test_the_agent_may_not_change_taints_or_labels(policy: Policy) -> None:
    untainted = _changed(spec__taints=[])
    assert any("spec" in m for m in policy.denials(_request("nodes", "gpu-1"), untainted, NODE))
    relabelled = _changed(metadata__labels={"pool": "premium"})
    assert any("labels" in m for m in policy.denials(_request("nodes", "gpu-1"), relabelled, NODE))


def test_the_agent_may_not_touch_other_annotations(policy: Policy) -> None:
    guarded = _changed(
        metadata__annotations={
            "tritonshare.io/gpus": "[]",
            "cluster-autoscaler.kubernetes.io/scale-down-disabled": "true",
        }
    )
    message = "the tritonshare agent may change only its own (tritonshare.io/) node annotations"
    # Adding, changing or removing someone else's annotation is refused.
    assert policy.denials(_request("nodes", "gpu-1"), guarded, NODE) == [message]
    changed = copy.deepcopy(guarded)
    changed["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/scale-down-disabled"] = (
        "no"
    )
    assert policy.denials(_request("nodes", "gpu-1"), changed, guarded) == [message]
    assert policy.denials(_request("nodes", "gpu-1"), NODE, guarded) == [message]
    # A node without annotations gets its first (ours) accepted.
    bare: dict[str, Any] = copy.deepcopy(NODE)
    del bare["metadata"]["annotations"]
    assert policy.denials(_request("nodes", "gpu-1"), NODE, bare) == []


def test_a_token_without_the_pods_node_name_is_refused(policy: Policy) -> None:
    assert policy.denials(_request("nodes", "gpu-1", token_node=None), NODE, NODE)


def test_the_agent_writes_only_its_own_lease(policy: Policy) -> None:
    lease = {"metadata": {"name": "tritonshare-agent-gpu-1"}, "spec": {}}
    for operation in ("CREATE", "UPDATE"):
        mine = _request(
            "leases", "tritonshare-agent-gpu-1", operation=operation, group="coordination.k8s.io"
        )
        assert policy.denials(mine, lease, lease) == []
        theirs = _request(
            "leases", "tritonshare-agent-gpu-2", operation=operation, group="coordination.k8s.io"
        )
        assert policy.denials(theirs, lease, lease) == [
            "the tritonshare agent may write only the lease named after its own node"
        ]


def test_other_users_are_not_concerned(policy: Policy) -> None:
    binder = "system:serviceaccount:tritonshare-system:tritonshare-binder"
    other = _changed(spec__taints=[])
    assert (
        policy.denials(_request("nodes", "gpu-9", user=binder, token_node=None), other, NODE) == []
    )


# The model-pod policy: defence in depth behind the agent's proof of placement.
BINDER = "system:serviceaccount:tritonshare-system:tritonshare-binder"
TENANT = "system:serviceaccount:team-a:default"
CREATED_WITH_NODE = (
    "a tritonshare pod may not be created with spec.nodeName; the tritonshare binder places it"
)
BINDER_ONLY = (
    "only the tritonshare binder writes the tritonshare.io/gpu and tritonshare.io/placement "
    "annotations"
)
MODEL_ID_FIXED = "the model id of a placed tritonshare pod cannot change; create a new pod"


@pytest.fixture(scope="module")
def pod_policy() -> Policy:
    return Policy(_policy("tritonshare-model-pods"))


def _pod(node: str = "", scheduler: str = "tritonshare", **annotations: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": scheduler, "containers": [{"name": "proxy"}]}
    if node:
        spec["nodeName"] = node
    keyed = {f"tritonshare.io/{k.replace('_', '-')}": v for k, v in annotations.items()}
    return {"metadata": {"name": "p", "namespace": "team-a", "annotations": keyed}, "spec": spec}


def _pod_request(operation: str, user: str = TENANT) -> dict[str, Any]:
    return _request("pods", "p", operation=operation, user=user, token_node=None)


def test_a_tritonshare_pod_created_with_node_name_is_refused(pod_policy: Policy) -> None:
    created = _pod(node="gpu-1", model_id="victim")
    assert pod_policy.denials(_pod_request("CREATE"), created, None) == [CREATED_WITH_NODE]
    assert pod_policy.denials(_pod_request("CREATE"), _pod(model_id="mine"), None) == []
    # Other schedulers' pods are not this policy's business.
    assert pod_policy.denials(_pod_request("CREATE"), _pod(node="gpu-1", scheduler="x"), None) == []


def test_only_the_binder_writes_the_gpu_and_the_proof(pod_policy: Policy) -> None:
    pending = _pod(model_id="mine")
    placed = _pod(model_id="mine", gpu="GPU-1", placement="v1.abc")
    assert pod_policy.denials(_pod_request("UPDATE", BINDER), placed, pending) == []
    assert pod_policy.denials(_pod_request("UPDATE"), placed, pending) == [BINDER_ONLY]
    forged = _pod(model_id="mine", gpu="GPU-1", placement="v1.abc")
    assert pod_policy.denials(_pod_request("CREATE"), forged, None) == [BINDER_ONLY]
    bound = {**placed, "spec": {**placed["spec"], "nodeName": "gpu-1"}}
    repinned = _pod(node="gpu-1", model_id="mine", gpu="GPU-2", placement="v1.abc")
    assert pod_policy.denials(_pod_request("UPDATE"), repinned, bound) == [BINDER_ONLY]
    unproved = _pod(node="gpu-1", model_id="mine", gpu="GPU-1")
    assert pod_policy.denials(_pod_request("UPDATE"), unproved, bound) == [BINDER_ONLY]
    # A tenant's own labels and annotations stay its own.
    relabelled = copy.deepcopy(bound)
    relabelled["metadata"]["annotations"]["team.example/owner"] = "alice"
    assert pod_policy.denials(_pod_request("UPDATE"), relabelled, bound) == []


def test_the_model_id_of_a_bound_pod_cannot_change(pod_policy: Policy) -> None:
    bound = _pod(node="gpu-1", model_id="mine", gpu="GPU-1", placement="v1.abc")
    renamed = _pod(node="gpu-1", model_id="victim", gpu="GPU-1", placement="v1.abc")
    assert pod_policy.denials(_pod_request("UPDATE"), renamed, bound) == [MODEL_ID_FIXED]
    # Before binding the user may still fix it.
    assert pod_policy.denials(_pod_request("UPDATE"), _pod(model_id="b"), _pod(model_id="a")) == []
