"""The GPU-node policy (deploy/base/gpu-node-admission-policy.yaml): a tenant's pod that can run on
a tritonshare GPU node (it tolerates the tritonshare.io/gpu-node taint) is a model pod the binder
places and reaches no GPU beside tritonshare's accounting.

One test per way to the node's GPUs, each a tenant creating a model pod that would otherwise be
placed there, through the official client against the simulated API server running the
kustomize-rendered policies (the `cluster` fixture of test_admission_policy); then what stays
allowed: the webhook-shaped model pod the binder places, the node pod in the system namespace,
node daemons in the exempt namespaces, and pods that cannot reach a GPU node.
"""

from __future__ import annotations

import copy
from typing import Any

import kubernetes.client
import pytest
import yaml

from binder.tritonmodels.hostpod import host_spec
from common.contract import Keys
from common.modelpod import NodeAccess
from tests.deploy.rendering import DEPLOY
from tests.deploy.test_admission_policy import SYSTEM, TENANT_NAMESPACE, Cluster
from tests.deploy.test_admission_policy import cluster as cluster
from tests.fixtures_sim import status_of
from webhook.mutation import complete
from webhook.settings import Settings

POLICY = "tritonshare-gpu-nodes"
TOLERATION = Keys().gpu_node_toleration()
ON_GPU_NODE = "a pod that can run on a tritonshare GPU node may not"
NOT_A_MODEL_POD = (
    "only tritonshare's model pods may tolerate the tritonshare.io/gpu-node taint by its key, ask "
    "for tritonshare.io/ resources or publish host ports (GPU nodes run the node pod and model "
    "pods alone, on the node pod's ports); remove them, or make it a model pod with "
    "schedulerName tritonshare for the tritonshare binder to place"
)
NODE_NAME = (
    "a pod that tolerates the tritonshare.io/gpu-node taint may not be created with "
    "spec.nodeName; the tritonshare binder places it"
)


def _model_pod(name: str = "m") -> dict[str, Any]:
    """A model pod as the webhook completes it: the binder's scheduler, the GPU-node toleration."""
    return {
        "metadata": {"name": name, "annotations": {"tritonshare.io/model-id": name}},
        "spec": {
            "schedulerName": "tritonshare",
            "tolerations": [dict(TOLERATION)],
            "containers": [
                {
                    "name": "proxy",
                    "image": "tritonshare",
                    "resources": {"limits": {"tritonshare.io/gpu-mem": "1Gi"}},
                }
            ],
            "initContainers": [{"name": "loader", "image": "tritonshare"}],
        },
    }


def _with(path: str, value: Any, name: str = "m") -> dict[str, Any]:
    """`_model_pod` with `value` set at the dotted `path` of its spec (list indexes as numbers)."""
    pod = _model_pod(name)
    *parents, last = path.split(".")
    here: Any = pod["spec"]
    for part in parents:
        here = here[int(part)] if part.isdigit() else here[part]
    if last.isdigit():
        here[int(last)] = value
    else:
        here[last] = value
    return pod


def _refusal(cluster: Cluster, pod: dict[str, Any]) -> str:
    """The message of the API server's refusal of the tenant's `pod`; nothing is stored."""
    with pytest.raises(kubernetes.client.ApiException) as raised:
        cluster.tenant.create_namespaced_pod(TENANT_NAMESPACE, pod)
    status = status_of(raised.value)
    assert (raised.value.status, status["code"]) == (422, 422)
    names = [p.metadata.name for p in cluster.admin.list_namespaced_pod(TENANT_NAMESPACE).items]
    assert pod["metadata"]["name"] not in names
    prefix = (
        f'pods "{pod["metadata"]["name"]}" is forbidden: ValidatingAdmissionPolicy'
        f" '{POLICY}' with binding '{POLICY}' denied request: "
    )
    message = str(status["message"])
    assert message.startswith(prefix), message
    return message.removeprefix(prefix)


ENV = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]


@pytest.mark.parametrize(
    ("where", "env"),
    [
        ("containers.0.env", ENV),
        ("containers.0.env", [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute"}]),
        ("initContainers.0.env", ENV),
    ],
    ids=["visible-devices", "driver-capabilities", "init-container"],
)
def test_nvidia_variables_are_refused_in_any_container(
    cluster: Cluster, where: str, env: list[dict[str, Any]]
) -> None:
    message = _refusal(cluster, _with(where, env))
    assert message.startswith(f"{ON_GPU_NODE} set NVIDIA_ environment variables"), message
    assert "NVIDIA_VISIBLE_DEVICES and NVIDIA_DRIVER_CAPABILITIES" in message


def test_an_ephemeral_container_cannot_add_them_later(cluster: Cluster) -> None:
    """`kubectl debug` on a placed model pod: the pods/ephemeralcontainers subresource."""
    cluster.tenant.create_namespaced_pod(TENANT_NAMESPACE, _model_pod())
    debug = {"name": "debug", "image": "cuda", "env": ENV}
    with pytest.raises(kubernetes.client.ApiException) as raised:
        cluster.tenant.patch_namespaced_pod_ephemeralcontainers(
            "m", TENANT_NAMESPACE, {"spec": {"ephemeralContainers": [debug]}}
        )
    message = str(status_of(raised.value)["message"])
    assert f"denied request: {ON_GPU_NODE} set NVIDIA_ environment variables" in message
    pod = cluster.admin.read_namespaced_pod("m", TENANT_NAMESPACE)
    assert not pod.spec.ephemeral_containers
    del debug["env"]
    cluster.tenant.patch_namespaced_pod_ephemeralcontainers(
        "m", TENANT_NAMESPACE, {"spec": {"ephemeralContainers": [debug]}}
    )


def test_env_from_that_could_name_an_nvidia_variable_is_refused(cluster: Cluster) -> None:
    for prefix in (None, "", "NV", "NVIDIA_VISIBLE_"):
        source: dict[str, Any] = {"configMapRef": {"name": "settings"}}
        if prefix is not None:
            source["prefix"] = prefix
        message = _refusal(cluster, _with("containers.0.envFrom", [source]))
        assert message.startswith(
            "a pod that can run on a tritonshare GPU node may take environment variables from a"
            " ConfigMap or Secret (envFrom) only with a prefix that cannot make an NVIDIA_ name"
        ), prefix
        assert "set one such as APP_" in message
    safe = _with("containers.0.envFrom", [{"configMapRef": {"name": "s"}, "prefix": "APP_"}])
    cluster.tenant.create_namespaced_pod(TENANT_NAMESPACE, safe)


@pytest.mark.parametrize("path", ["/dev/nvidia0", "/dev", "/var/run/nvidia-container-devices"])
def test_host_path_volumes_are_refused(cluster: Cluster, path: str) -> None:
    volume = {"name": "host", "hostPath": {"path": path}}
    message = _refusal(cluster, _with("volumes", [volume]))
    assert message.startswith(f"{ON_GPU_NODE} mount hostPath volumes"), message


def test_a_volume_at_the_toolkits_device_list_path_is_refused(cluster: Cluster) -> None:
    """The toolkit's volume-mounts strategy hands a container the devices named by the paths its
    volumes are mounted at, whatever the volume: an emptyDir there asks for every GPU."""
    pod = _with("volumes", [{"name": "all", "emptyDir": {}}])
    mount = {"name": "all", "mountPath": "/var/run/nvidia-container-devices/all"}
    pod["spec"]["containers"][0]["volumeMounts"] = [mount]
    message = _refusal(cluster, pod)
    assert message.startswith(f"{ON_GPU_NODE} mount a volume at the NVIDIA container"), message


def test_privileged_containers_are_refused(cluster: Cluster) -> None:
    message = _refusal(cluster, _with("initContainers.0.securityContext", {"privileged": True}))
    assert message.startswith(f"{ON_GPU_NODE} run privileged containers"), message


@pytest.mark.parametrize("resource", ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"])
def test_nvidia_resources_are_refused(cluster: Cluster, resource: str) -> None:
    resources = {"limits": {resource: "1"}}
    message = _refusal(cluster, _with("containers.0.resources", resources))
    assert message.startswith(f"{ON_GPU_NODE} request nvidia.com/ resources"), message


def test_dynamic_resource_allocation_claims_are_refused(cluster: Cluster) -> None:
    claim = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    message = _refusal(cluster, _with("resourceClaims", claim))
    assert message.startswith(f"{ON_GPU_NODE} claim devices through Dynamic Resource"), message
    pod = _with("containers.0.resources", {"claims": [{"name": "gpu"}]})
    message = _refusal(cluster, pod)
    assert message.startswith(f"{ON_GPU_NODE} claim devices through Dynamic Resource"), message


@pytest.mark.parametrize("key", ["cdi.k8s.io/gpu", "nvidia.cdi.k8s.io/gpu"])
def test_cdi_device_annotations_are_refused(cluster: Cluster, key: str) -> None:
    pod = _model_pod()
    pod["metadata"]["annotations"][key] = "nvidia.com/gpu=all"
    message = _refusal(cluster, pod)
    assert message.startswith(f"{ON_GPU_NODE} carry CDI device annotations"), message


@pytest.mark.parametrize("capability", ["SYS_ADMIN", "SYS_PTRACE", "CAP_SYS_RAWIO", "ALL"])
def test_capabilities_beyond_the_baseline_are_refused(cluster: Cluster, capability: str) -> None:
    context = {"capabilities": {"add": ["NET_BIND_SERVICE", capability]}}
    message = _refusal(cluster, _with("containers.0.securityContext", context))
    assert message.startswith(
        "a pod that can run on a tritonshare GPU node may add only the capabilities"
    ), message
    baseline = _with(
        "containers.0.securityContext", {"capabilities": {"add": ["NET_BIND_SERVICE"]}}, "ok"
    )
    cluster.tenant.create_namespaced_pod(TENANT_NAMESPACE, baseline)
    cluster.admin.delete_namespaced_pod("ok", TENANT_NAMESPACE, grace_period_seconds=0)


@pytest.mark.parametrize("namespace", ["hostPID", "hostIPC", "hostNetwork"])
def test_the_nodes_namespaces_are_refused(cluster: Cluster, namespace: str) -> None:
    message = _refusal(cluster, _with(namespace, True))
    assert message.startswith(f"{ON_GPU_NODE} share the node's process, IPC or network"), message


def test_only_model_pods_placed_by_the_binder_tolerate_the_taint(cluster: Cluster) -> None:
    plain = _model_pod("plain")
    plain["spec"]["schedulerName"] = "default-scheduler"
    assert _refusal(cluster, plain) == NOT_A_MODEL_POD
    # Tolerating every taint (an empty key) tolerates this one.
    everything = _model_pod("everything")
    del everything["spec"]["schedulerName"]
    everything["spec"]["tolerations"] = [{"operator": "Exists"}]
    assert _refusal(cluster, everything) == NOT_A_MODEL_POD
    assert _refusal(cluster, _with("nodeName", "gpu-1", name="pinned")) == NODE_NAME
    # Nor can a pending pod add the toleration later, to be scheduled onto a GPU node.
    pending = copy.deepcopy(plain)
    pending["metadata"]["name"] = "pending"
    del pending["spec"]["tolerations"]
    created = cluster.tenant.create_namespaced_pod(TENANT_NAMESPACE, pending)
    # Added to those it has (the API server's defaults): a pending pod's tolerations only grow.
    tolerations = [*cluster.tenant.api_client.sanitize_for_serialization(
        created.spec.tolerations
    ), dict(TOLERATION)]  # fmt: skip
    with pytest.raises(kubernetes.client.ApiException) as raised:
        cluster.tenant.patch_namespaced_pod(
            "pending", TENANT_NAMESPACE, {"spec": {"tolerations": tolerations}}
        )
    assert NOT_A_MODEL_POD in status_of(raised.value)["message"]


def test_the_model_pod_the_binder_places_and_the_node_pod_are_accepted(cluster: Cluster) -> None:
    cluster.tenant.create_namespaced_pod(TENANT_NAMESPACE, _model_pod())
    # The binder writes its annotations and binds the tolerating pod.
    cluster.binder.patch_namespaced_pod(
        "m",
        TENANT_NAMESPACE,
        {"metadata": {"annotations": {"tritonshare.io/gpu": "GPU-1"}}},
        _preload_content=False,
    )
    binding = {"metadata": {"name": "m"}, "target": {"kind": "Node", "name": "gpu-1"}}
    cluster.binder.create_namespaced_pod_binding(
        "m", TENANT_NAMESPACE, binding, _preload_content=False
    )
    assert cluster.admin.read_namespaced_pod("m", TENANT_NAMESPACE).spec.node_name == "gpu-1"
    # The node pod, with its GPUs and the taint's toleration, in the system namespace.
    daemonset = yaml.safe_load((DEPLOY / "base" / "node" / "node-daemonset.yaml").read_text())
    spec = {**daemonset["spec"]["template"]["spec"], "nodeName": "gpu-2"}
    del spec["priorityClassName"]  # not installed here
    node_pod = {"metadata": {"name": "node-gpu-2"}, "spec": spec}
    assert TOLERATION in node_pod["spec"]["tolerations"]
    cluster.admin.create_namespaced_pod(SYSTEM, node_pod)
    # A node daemon in an exempt namespace: every taint tolerated, privileged, the host's /dev.
    daemon = _with("volumes", [{"name": "dev", "hostPath": {"path": "/dev"}}], "daemon")
    daemon["spec"]["schedulerName"] = "default-scheduler"
    daemon["spec"]["tolerations"] = [{"operator": "Exists"}]
    daemon["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    cluster.admin.create_namespaced_pod("kube-system", daemon)
    # A pod that cannot reach a GPU node is no concern of this policy.
    elsewhere = _with("containers.0.env", ENV, "elsewhere")
    del elsewhere["spec"]["tolerations"]
    elsewhere["spec"]["schedulerName"] = "default-scheduler"
    cluster.tenant.create_namespaced_pod(TENANT_NAMESPACE, elsewhere)


def test_only_the_binder_creates_a_tolerating_pod_on_its_node(cluster: Cluster) -> None:
    # A model host as the binder builds it, on its node (the tenant's own copy is refused).
    access = NodeAccess(8100, 8010, 8011, "tritonshare-agent")
    spec = host_spec("gpu-1", "tritonshare", "tritonshare:test", access, Keys(), 2)
    host = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tritonshare-host-0123"}}
    host["spec"] = spec
    assert _refusal(cluster, copy.deepcopy(host)) == NODE_NAME
    cluster.binder.create_namespaced_pod(TENANT_NAMESPACE, host, _preload_content=False)
    stored = cluster.admin.read_namespaced_pod("tritonshare-host-0123", TENANT_NAMESPACE)
    assert stored.spec.node_name == "gpu-1"
    # The binder gets no pass on the ways to a GPU.
    with pytest.raises(kubernetes.client.ApiException) as raised:
        cluster.binder.create_namespaced_pod(
            TENANT_NAMESPACE,
            _with("containers.0.env", ENV, name="tritonshare-host-4567"),
            _preload_content=False,
        )
    assert "NVIDIA_" in str(status_of(raised.value)["message"])


def test_the_example_and_the_webhooks_model_pods_are_accepted(cluster: Cluster) -> None:
    """What tenants create in practice tolerates the taint and passes: deploy/example's model pod
    and a pod the webhook completes from its annotations."""
    [deployment] = [
        d
        for d in yaml.safe_load_all((DEPLOY / "example" / "model-deployment.yaml").read_text())
        if d and d["kind"] == "Deployment"
    ]
    template = deployment["spec"]["template"]
    example = {"metadata": {**template["metadata"], "name": "example"}, "spec": template["spec"]}
    assert TOLERATION in example["spec"]["tolerations"]
    cluster.tenant.create_namespaced_pod(TENANT_NAMESPACE, example)
    short_form = {
        "metadata": {
            "name": "completed",
            "labels": {"tritonshare.io/role": "model"},
            "annotations": {
                "tritonshare.io/model-uri": "gs://models/add_one",
                "tritonshare.io/gpu-mem": "1Gi",
            },
        },
        "spec": {"containers": []},
    }
    completed = complete(short_form, Settings())
    assert TOLERATION in completed["spec"]["tolerations"]
    cluster.tenant.create_namespaced_pod(TENANT_NAMESPACE, completed)
