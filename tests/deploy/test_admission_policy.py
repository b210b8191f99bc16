"""The project's ValidatingAdmissionPolicies, as kustomize renders them from deploy/base, refuse at
the API server what they are written to refuse, and nothing else.

They are applied to a running simulated API server, which evaluates their CEL as kube-apiserver
does (sim/apiserver/admission/policies.py), and every request goes through the official client
as the user it would come from on a real cluster: a tenant's service account (full rights in its
namespace), the binder's service account, the agent's pod-bound token (whose `extra` names the
node its pod runs on). Each refusal is checked for kube-apiserver's status code and message.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import kubernetes.client
import pytest

from sim.apiserver import RunningApiServer
from tests.conftest import require_executable
from tests.deploy.rendering import Obj, render
from tests.fixtures_sim import coordination_v1, core_v1, status_of

API_AUDIENCE = "https://kubernetes.default.svc.cluster.local"
SYSTEM = "tritonshare-system"
TENANT_NAMESPACE = "team-a"

CREATED_WITH_NODE = (
    "a tritonshare pod may not be created with spec.nodeName; the tritonshare binder places it"
)
BINDER_ONLY = (
    "only the tritonshare binder writes the tritonshare.io/gpu, tritonshare.io/placement and "
    "tritonshare.io/nomination annotations"
)
CARRIES_TRITONSHARE = (
    "a pod created with spec.nodeName may not carry tritonshare resources (tritonshare.io/gpu-mem) "
    "or annotations (tritonshare.io/model-id, tritonshare.io/gpu, tritonshare.io/placement), "
    "whatever its schedulerName; create it without spec.nodeName and with schedulerName "
    "tritonshare, and the tritonshare binder places it"
)
MODEL_ID_FIXED = "the model id of a placed tritonshare pod cannot change; create a new pod"
OWN_NODE = "the tritonshare agent may change only the node its own pod runs on"
NODE_SPEC = "the tritonshare agent may not change a node's spec (taints, unschedulable, podCIDR)"
NODE_LABELS = "the tritonshare agent may not change a node's labels (they steer scheduling)"
NODE_ANNOTATIONS = (
    "the tritonshare agent may change only its own (tritonshare.io/) node annotations"
)
OWN_LEASE = "the tritonshare agent may write only the lease named after its own node"


@dataclass
class Cluster:
    """A simulated API server running the project's policies, and a client per user."""

    apiserver: RunningApiServer
    admin: Any
    tenant: Any
    binder: Any
    agent: Any
    """The agent on node gpu-1, with its pod's bound token."""
    agent_leases: Any
    admin_leases: Any


def client_with_token(apiserver: RunningApiServer, token: str) -> kubernetes.client.ApiClient:
    """An official client that calls `apiserver` with a bearer token; close it when done."""
    configuration = kubernetes.client.Configuration()
    configuration.host = apiserver.url
    configuration.api_key = {"authorization": f"Bearer {token}"}
    return kubernetes.client.ApiClient(configuration)


def install_policies(api: kubernetes.client.ApiClient, objects: Iterable[Obj]) -> list[str]:
    """Create the ValidatingAdmissionPolicies and bindings among `objects`; their names."""
    admission: Any = kubernetes.client.AdmissionregistrationV1Api(api)
    names = []
    for obj in objects:
        if obj["kind"] == "ValidatingAdmissionPolicy":
            admission.create_validating_admission_policy(obj, _preload_content=False)
        elif obj["kind"] == "ValidatingAdmissionPolicyBinding":
            admission.create_validating_admission_policy_binding(obj, _preload_content=False)
        else:
            continue
        names.append(f"{obj['kind']}/{obj['metadata']['name']}")
    return names


def agent_token(apiserver: RunningApiServer, namespace: str, node: str) -> str:
    """The API token of the agent's pod on `node`, as the DaemonSet's pod holds it: bound to the
    pod, so its `extra` names the node. Creates that pod first (as the admin)."""
    pod = f"tritonshare-node-{node}"
    with apiserver.api_client() as api:
        core_v1(api).create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": pod},
                "spec": {
                    "serviceAccountName": "tritonshare-agent",
                    "nodeName": node,
                    "containers": [{"name": "agent", "image": "tritonshare"}],
                },
            },
        )
    return apiserver.mint_token(namespace, pod, audience=API_AUDIENCE)


def _node(name: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {"nvidia.com/gpu.present": "true"},
            "annotations": {"tritonshare.io/gpus": "[]"},
        },
        "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
    }


@pytest.fixture
def cluster(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient
) -> Iterator[Cluster]:
    installed = install_policies(kube_api, render(require_executable("kubectl"), "base"))
    assert len(installed) == 6, installed
    admin = core_v1(kube_api)
    admin.create_namespace({"metadata": {"name": TENANT_NAMESPACE}})
    for name in ("gpu-1", "gpu-2"):
        admin.create_node(_node(name))
    tokens = {
        "tenant": apiserver.service_account_token(TENANT_NAMESPACE, "default"),
        "binder": apiserver.service_account_token(SYSTEM, "tritonshare-binder"),
        "agent": agent_token(apiserver, SYSTEM, "gpu-1"),
    }
    with contextlib.ExitStack() as stack:
        clients = {
            user: stack.enter_context(client_with_token(apiserver, token))
            for user, token in tokens.items()
        }
        yield Cluster(
            apiserver,
            admin,
            core_v1(clients["tenant"]),
            core_v1(clients["binder"]),
            core_v1(clients["agent"]),
            coordination_v1(clients["agent"]),
            coordination_v1(kube_api),
        )


def _model_pod(name: str = "m", node: str = "", **annotations: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "tritonshare",
        "containers": [{"name": "proxy", "image": "tritonshare"}],
    }
    if node:
        spec["nodeName"] = node
    keyed = {f"tritonshare.io/{k.replace('_', '-')}": v for k, v in annotations.items()}
    return {"metadata": {"name": name, "annotations": keyed}, "spec": spec}


def _refused(call: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """The Status of a call the API server must refuse."""
    with pytest.raises(kubernetes.client.ApiException) as raised:
        call(*args, **kwargs)
    status = status_of(raised.value)
    assert raised.value.status == status["code"]
    return status


def _denied_by(policy: str, message: str, resource: str, name: str) -> str:
    return (
        f"{resource} \"{name}\" is forbidden: ValidatingAdmissionPolicy '{policy}' with binding"
        f" '{policy}' denied request: {message}"
    )


def _pod_denial(message: str, name: str = "m") -> str:
    return _denied_by("tritonshare-model-pods", message, "pods", name)


def _annotate_pod(core: Any, name: str, **annotations: str | None) -> Any:
    keyed = {f"tritonshare.io/{k.replace('_', '-')}": v for k, v in annotations.items()}
    return core.patch_namespaced_pod(
        name, TENANT_NAMESPACE, {"metadata": {"annotations": keyed}}, _preload_content=False
    )


# The model-pod policy.


def test_a_tenant_cannot_create_a_tritonshare_pod_with_a_node_name(cluster: Cluster) -> None:
    status = _refused(
        cluster.tenant.create_namespaced_pod,
        TENANT_NAMESPACE,
        _model_pod(node="gpu-1", model_id="victim"),
    )
    assert (status["code"], status["reason"]) == (422, "Invalid")
    assert status["message"] == _pod_denial(CREATED_WITH_NODE)
    assert status["details"]["kind"] == "pods" and status["details"]["name"] == "m"
    # Nothing was stored.
    assert cluster.admin.list_namespaced_pod(TENANT_NAMESPACE).items == []
    # The same pod for the binder to place, and another scheduler's pod with a node, are fine.
    cluster.tenant.create_namespaced_pod(TENANT_NAMESPACE, _model_pod(model_id="mine"))
    other = _model_pod("other", node="gpu-1")
    other["spec"]["schedulerName"] = "default-scheduler"
    cluster.tenant.create_namespaced_pod(TENANT_NAMESPACE, other)


def _on_node(
    name: str,
    *,
    scheduler: str = "default-scheduler",
    limits: dict[str, str] | None = None,
    init_limits: dict[str, str] | None = None,
    **annotations: str,
) -> dict[str, Any]:
    """A pod created straight onto gpu-1, by any scheduler name."""
    pod = _model_pod(name, node="gpu-1", **annotations)
    pod["spec"]["schedulerName"] = scheduler
    if limits:
        pod["spec"]["containers"][0]["resources"] = {"limits": limits}
    if init_limits:  # an extended resource's request must equal its limit
        resources = {"limits": init_limits, "requests": init_limits}
        pod["spec"]["initContainers"] = [
            {"name": "init", "image": "busybox", "resources": resources}
        ]
    return pod


def test_no_pod_created_on_a_node_carries_tritonshare_resources_or_annotations(
    cluster: Cluster,
) -> None:
    """A pod created with spec.nodeName and a big gpu-mem (or a victim's model id)
    under another schedulerName slipped past the policy. The binder does not charge such a pod
    any more; this refuses it where the tenant creates it, whatever its schedulerName."""
    attempts = [
        _on_node("hog", limits={"tritonshare.io/gpu-mem": "80Gi"}),
        _on_node("init-hog", init_limits={"tritonshare.io/gpu-mem": "80Gi"}),
        _on_node("squat", model_id="victim"),
        _on_node("gpu", gpu="GPU-1"),
        _on_node("copied", placement="v1.0123456789abcdef.1.sig"),
        _on_node("mine", scheduler="my-scheduler", limits={"tritonshare.io/gpu-mem": "1"}),
    ]
    for pod in attempts:
        name = pod["metadata"]["name"]
        status = _refused(cluster.tenant.create_namespaced_pod, TENANT_NAMESPACE, pod)
        assert (status["code"], status["message"]) == (
            422,
            _pod_denial(CARRIES_TRITONSHARE, name),
        ), name
    assert cluster.admin.list_namespaced_pod(TENANT_NAMESPACE).items == []
    # What stays allowed: a pod on a node with nothing of tritonshare's (another prefix's keys
    # are not ours), the same resources for a scheduler to place, and the system namespace's
    # and the binder's own pods.
    cluster.tenant.create_namespaced_pod(
        TENANT_NAMESPACE, _on_node("plain", limits={"example.com/gpu-mem": "1Gi"})
    )
    placed_later = _on_node("later", limits={"tritonshare.io/gpu-mem": "1Gi"}, model_id="mine")
    del placed_later["spec"]["nodeName"]
    cluster.tenant.create_namespaced_pod(TENANT_NAMESPACE, placed_later)
    cluster.admin.create_namespaced_pod(
        SYSTEM, _on_node("system", limits={"tritonshare.io/gpu-mem": "1Gi"}, model_id="x")
    )
    cluster.binder.create_namespaced_pod(TENANT_NAMESPACE, _on_node("by-binder", model_id="x"))
    # And the admin is held to it like anyone else outside the system namespace.
    status = _refused(cluster.admin.create_namespaced_pod, TENANT_NAMESPACE, attempts[0])
    assert status["message"] == _pod_denial(CARRIES_TRITONSHARE, "hog")


def test_only_the_binder_writes_the_gpu_and_the_placement(cluster: Cluster) -> None:
    forged = _model_pod(model_id="mine", gpu="GPU-1")
    status = _refused(cluster.tenant.create_namespaced_pod, TENANT_NAMESPACE, forged)
    assert (status["code"], status["message"]) == (422, _pod_denial(BINDER_ONLY))
    cluster.tenant.create_namespaced_pod(TENANT_NAMESPACE, _model_pod(model_id="mine"))
    for written in ({"gpu": "GPU-1"}, {"placement": "v1.k.1.sig"}, {"nomination": "{}"}):
        status = _refused(_annotate_pod, cluster.tenant, "m", **written)
        assert (status["code"], status["message"]) == (422, _pod_denial(BINDER_ONLY))
    # The binder writes both and binds; the tenant can neither change nor remove them.
    _annotate_pod(cluster.binder, "m", gpu="GPU-1", placement="v1.k.1.sig")
    binding = {"metadata": {"name": "m"}, "target": {"kind": "Node", "name": "gpu-1"}}
    cluster.binder.create_namespaced_pod_binding(
        "m", TENANT_NAMESPACE, binding, _preload_content=False
    )
    changes: list[dict[str, str | None]] = [{"gpu": "GPU-2"}, {"placement": None}]
    for annotation in changes:
        status = _refused(_annotate_pod, cluster.tenant, "m", **annotation)
        assert status["message"] == _pod_denial(BINDER_ONLY)
    pod = cluster.admin.read_namespaced_pod("m", TENANT_NAMESPACE)
    assert pod.metadata.annotations["tritonshare.io/gpu"] == "GPU-1"
    assert pod.spec.node_name == "gpu-1"
    # A tenant's own annotations stay its own.
    cluster.tenant.patch_namespaced_pod(
        "m", TENANT_NAMESPACE, {"metadata": {"annotations": {"team.example/owner": "alice"}}}
    )


def test_the_model_id_of_a_bound_pod_cannot_change(cluster: Cluster) -> None:
    cluster.tenant.create_namespaced_pod(TENANT_NAMESPACE, _model_pod(model_id="draft"))
    # Before binding the tenant may still fix it.
    _annotate_pod(cluster.tenant, "m", model_id="mine")
    _annotate_pod(cluster.binder, "m", gpu="GPU-1", placement="v1.k.1.sig")
    binding = {"metadata": {"name": "m"}, "target": {"kind": "Node", "name": "gpu-1"}}
    cluster.binder.create_namespaced_pod_binding(
        "m", TENANT_NAMESPACE, binding, _preload_content=False
    )
    for model_id in ("victim", None):
        status = _refused(_annotate_pod, cluster.tenant, "m", model_id=model_id)
        assert (status["code"], status["message"]) == (422, _pod_denial(MODEL_ID_FIXED))
    # A full update (PUT) is held to the same rule.
    pod = cluster.tenant.read_namespaced_pod("m", TENANT_NAMESPACE)
    pod.metadata.annotations["tritonshare.io/model-id"] = "victim"
    status = _refused(cluster.tenant.replace_namespaced_pod, "m", TENANT_NAMESPACE, pod)
    assert status["message"] == _pod_denial(MODEL_ID_FIXED)
    pod = cluster.admin.read_namespaced_pod("m", TENANT_NAMESPACE)
    assert pod.metadata.annotations["tritonshare.io/model-id"] == "mine"


# The agent's NodeRestriction-like policy.


def _annotate_node(core: Any, name: str, annotations: dict[str, str | None]) -> Any:
    return core.patch_node(name, {"metadata": {"annotations": annotations}}, _preload_content=False)


def _node_denial(message: str, name: str) -> str:
    return _denied_by("tritonshare-agent-own-node", message, "nodes", name)


def test_the_agent_may_annotate_only_its_own_node(cluster: Cluster) -> None:
    gpus = json.dumps([{"uuid": "GPU-1", "index": 0}])
    _annotate_node(cluster.agent, "gpu-1", {"tritonshare.io/gpus": gpus})
    cluster.agent.patch_node_status(
        "gpu-1", {"metadata": {"annotations": {"tritonshare.io/gpu-mem-total": "1"}}}
    )
    node = cluster.admin.read_node("gpu-1")
    assert node.metadata.annotations["tritonshare.io/gpus"] == gpus
    status = _refused(_annotate_node, cluster.agent, "gpu-2", {"tritonshare.io/gpus": gpus})
    assert (status["code"], status["reason"]) == (422, "Invalid")
    assert status["message"] == _node_denial(OWN_NODE, "gpu-2")
    assert cluster.admin.read_node("gpu-2").metadata.annotations["tritonshare.io/gpus"] == "[]"


def test_the_agent_may_not_change_taints_labels_or_others_annotations(cluster: Cluster) -> None:
    status = _refused(cluster.agent.patch_node, "gpu-1", {"spec": {"taints": []}})
    assert status["message"] == _node_denial(NODE_SPEC, "gpu-1")
    status = _refused(cluster.agent.patch_node, "gpu-1", {"metadata": {"labels": {"pool": "x"}}})
    assert status["message"] == _node_denial(NODE_LABELS, "gpu-1")
    autoscaler = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
    status = _refused(_annotate_node, cluster.agent, "gpu-1", {autoscaler: "true"})
    assert status["message"] == _node_denial(NODE_ANNOTATIONS, "gpu-1")
    # The admin set it; the agent may neither change nor remove it.
    _annotate_node(cluster.admin, "gpu-1", {autoscaler: "true"})
    for value in ("false", None):
        status = _refused(_annotate_node, cluster.agent, "gpu-1", {autoscaler: value})
        assert status["message"] == _node_denial(NODE_ANNOTATIONS, "gpu-1")


def _lease(node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"tritonshare-agent-{node}"},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 40},
    }


def test_the_agent_writes_only_its_own_lease(cluster: Cluster) -> None:
    leases = cluster.agent_leases
    leases.create_namespaced_lease(SYSTEM, _lease("gpu-1"))
    leases.patch_namespaced_lease(
        "tritonshare-agent-gpu-1", SYSTEM, {"spec": {"leaseDurationSeconds": 30}}
    )
    status = _refused(leases.create_namespaced_lease, SYSTEM, _lease("gpu-2"))
    assert status["message"] == _denied_by(
        "tritonshare-agent-own-node",
        OWN_LEASE,
        "leases.coordination.k8s.io",
        "tritonshare-agent-gpu-2",
    )
    coordination_v1_admin = cluster.admin_leases
    coordination_v1_admin.create_namespaced_lease(SYSTEM, _lease("gpu-2"))
    status = _refused(leases.delete_namespaced_lease, "tritonshare-agent-gpu-2", SYSTEM)
    assert status["message"] == _denied_by(
        "tritonshare-agent-own-node",
        OWN_LEASE,
        "leases.coordination.k8s.io",
        "tritonshare-agent-gpu-2",
    )
    leases.delete_namespaced_lease("tritonshare-agent-gpu-1", SYSTEM)


def test_an_agent_token_not_bound_to_a_pod_on_a_node_is_refused(cluster: Cluster) -> None:
    token = cluster.apiserver.service_account_token(SYSTEM, "tritonshare-agent")
    with client_with_token(cluster.apiserver, token) as api:
        status = _refused(
            _annotate_node, core_v1(api), "gpu-1", {"tritonshare.io/gpus": '[{"index": 0}]'}
        )
    assert status["message"] == _node_denial(OWN_NODE, "gpu-1")


def test_other_users_are_not_concerned_by_the_agent_policy(cluster: Cluster) -> None:
    # The binder's service account and the admin change any node (RBAC, not this policy, limits
    # them on a real cluster).
    cluster.binder.patch_node("gpu-2", {"metadata": {"labels": {"pool": "premium"}}})
    cluster.admin.patch_node("gpu-2", {"spec": {"taints": []}})
    assert cluster.admin.read_node("gpu-2").metadata.labels["pool"] == "premium"


OWN_PODS = "the tritonshare agent may change the status of pods bound to its own node only"


def test_the_agent_sets_conditions_only_on_pods_bound_to_its_own_node(cluster: Cluster) -> None:
    for name, node in (("mine", "gpu-1"), ("theirs", "gpu-2")):
        cluster.tenant.create_namespaced_pod(TENANT_NAMESPACE, _model_pod(name))
        binding = {"metadata": {"name": name}, "target": {"kind": "Node", "name": node}}
        cluster.binder.create_namespaced_pod_binding(
            name, TENANT_NAMESPACE, binding, _preload_content=False
        )
    condition = {"type": "tritonshare.io/ModelLoaded", "status": "False", "reason": "ModelMissing"}
    body = {"status": {"conditions": [condition]}}
    cluster.agent.patch_namespaced_pod_status("mine", TENANT_NAMESPACE, body)
    status = _refused(cluster.agent.patch_namespaced_pod_status, "theirs", TENANT_NAMESPACE, body)
    assert status["message"] == _denied_by("tritonshare-agent-own-node", OWN_PODS, "pods", "theirs")
    conditions = cluster.admin.read_namespaced_pod("theirs", TENANT_NAMESPACE).status.conditions
    assert not any(c.type == "tritonshare.io/ModelLoaded" for c in conditions or [])
