"""The GPU-node policy lets the cluster's node daemons run on GPU nodes and still keeps the GPUs
to the node pod.

Each daemon is the pod its DaemonSet makes, as its usual chart or manifest writes it (its
tolerations, host paths, host network and privileges), in its usual namespace and service
account, created through the official client against the simulated API server running the
policies: kustomize's deploy/base (the `cluster` fixture of test_admission_policy) and the chart's,
with a node daemon added by one value. The same pod under another service account, or in a
tenant's namespace, is refused: the listing trusts a namespace's service account, not a shape.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from sim.apiserver import RunningApiServer
from tests.deploy.rendering import render_chart
from tests.deploy.test_admission_policy import TENANT_NAMESPACE, Cluster, install_policies
from tests.deploy.test_admission_policy import cluster as cluster
from tests.fixtures_sim import core_v1, status_of

EVERY_TAINT = {"operator": "Exists"}
DENIED = "ValidatingAdmissionPolicy 'tritonshare-gpu-nodes' with binding"


def _host(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "hostPath": {"path": path}}


def _mount(name: str, path: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "mountPath": path, **extra}


def _pod(
    namespace: str, account: str, containers: list[dict[str, Any]], **spec: Any
) -> tuple[str, dict[str, Any]]:
    name = containers[0]["name"]
    body = {
        "metadata": {
            "name": f"{name}-gpu-1",
            "labels": {"app.kubernetes.io/name": name},
        },
        "spec": {
            "serviceAccountName": account,
            "tolerations": [dict(EVERY_TAINT)],
            "containers": containers,
            **spec,
        },
    }
    return namespace, body


def node_exporter() -> tuple[str, dict[str, Any]]:
    """kube-prometheus-stack's node-exporter, told to tolerate every taint."""
    mounts = [
        _mount("proc", "/host/proc", readOnly=True),
        _mount("sys", "/host/sys", readOnly=True),
        _mount("root", "/host/root", readOnly=True, mountPropagation="HostToContainer"),
    ]
    container = {
        "name": "node-exporter",
        "image": "quay.io/prometheus/node-exporter:v1.8.2",
        "args": ["--path.procfs=/host/proc", "--path.sysfs=/host/sys", "--path.rootfs=/host/root"],
        "ports": [{"name": "http-metrics", "containerPort": 9100, "hostPort": 9100}],
        "securityContext": {"readOnlyRootFilesystem": True},
        "volumeMounts": mounts,
    }
    volumes = [_host("proc", "/proc"), _host("sys", "/sys"), _host("root", "/")]
    return _pod(
        "monitoring",
        "kube-prometheus-stack-prometheus-node-exporter",
        [container],
        hostNetwork=True,
        hostPID=True,
        securityContext={"runAsNonRoot": True, "runAsUser": 65534, "fsGroup": 65534},
        volumes=volumes,
    )


def fluent_bit() -> tuple[str, dict[str, Any]]:
    """The fluent-bit chart's DaemonSet, told to tolerate every taint."""
    container = {
        "name": "fluent-bit",
        "image": "cr.fluentbit.io/fluent/fluent-bit:3.1.9",
        "volumeMounts": [
            _mount("varlog", "/var/log"),
            _mount("varlibdockercontainers", "/var/lib/docker/containers", readOnly=True),
            _mount("etcmachineid", "/etc/machine-id", readOnly=True),
        ],
    }
    volumes = [
        _host("varlog", "/var/log"),
        _host("varlibdockercontainers", "/var/lib/docker/containers"),
        {"name": "etcmachineid", "hostPath": {"path": "/etc/machine-id", "type": "File"}},
    ]
    return _pod("logging", "fluent-bit", [container], volumes=volumes)


def datadog_agent() -> tuple[str, dict[str, Any]]:
    """The Datadog chart's agent (release `datadog`): the container runtime's socket, /proc and
    the cgroups; DogStatsD on a hostPort."""
    container = {
        "name": "agent",
        "image": "gcr.io/datadoghq/agent:7.58.0",
        "env": [
            {
                "name": "DD_KUBERNETES_KUBELET_HOST",
                "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}},
            }
        ],
        "ports": [
            {"name": "dogstatsdport", "containerPort": 8125, "hostPort": 8125, "protocol": "UDP"}
        ],
        "volumeMounts": [
            _mount("runtimesocketdir", "/host/var/run", readOnly=True),
            _mount("procdir", "/host/proc", readOnly=True),
            _mount("cgroups", "/host/sys/fs/cgroup", readOnly=True),
        ],
    }
    volumes = [
        _host("runtimesocketdir", "/var/run"),
        _host("procdir", "/proc"),
        _host("cgroups", "/sys/fs/cgroup"),
    ]
    return _pod("datadog", "datadog", [container], volumes=volumes)


def calico_node() -> tuple[str, dict[str, Any]]:
    """The Tigera operator's calico-node: privileged, on the host's network."""
    container = {
        "name": "calico-node",
        "image": "quay.io/calico/node:v3.28.2",
        "securityContext": {"privileged": True},
        "volumeMounts": [
            _mount("lib-modules", "/lib/modules", readOnly=True),
            _mount("var-run-calico", "/var/run/calico"),
            _mount("var-lib-calico", "/var/lib/calico"),
            _mount("cni-net-dir", "/host/etc/cni/net.d"),
        ],
    }
    volumes = [
        _host("lib-modules", "/lib/modules"),
        _host("var-run-calico", "/var/run/calico"),
        _host("var-lib-calico", "/var/lib/calico"),
        _host("cni-net-dir", "/etc/cni/net.d"),
    ]
    namespace, pod = _pod(
        "calico-system", "calico-node", [container], hostNetwork=True, volumes=volumes
    )
    pod["spec"]["tolerations"] = [
        {"effect": "NoSchedule", "operator": "Exists"},
        {"key": "CriticalAddonsOnly", "operator": "Exists"},
        {"effect": "NoExecute", "operator": "Exists"},
    ]
    return namespace, pod


def cilium_agent() -> tuple[str, dict[str, Any]]:
    """Cilium's agent in kube-system (an exempt namespace): host network, its capabilities, BPF."""
    capabilities = ["CHOWN", "KILL", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "SYS_MODULE", "SYS_ADMIN"]
    container = {
        "name": "cilium-agent",
        "image": "quay.io/cilium/cilium:v1.16.3",
        "securityContext": {"capabilities": {"add": capabilities, "drop": ["ALL"]}},
        "volumeMounts": [
            _mount("bpf-maps", "/sys/fs/bpf", mountPropagation="HostToContainer"),
            _mount("cilium-run", "/var/run/cilium"),
        ],
    }
    volumes = [_host("bpf-maps", "/sys/fs/bpf"), _host("cilium-run", "/var/run/cilium")]
    return _pod("kube-system", "cilium", [container], hostNetwork=True, volumes=volumes)


def calico_csi_node_driver() -> tuple[str, dict[str, Any]]:
    """Calico's CSI node plugin: privileged, the kubelet's directory with bidirectional mounts."""
    container = {
        "name": "calico-csi",
        "image": "quay.io/calico/csi:v3.28.2",
        "securityContext": {"privileged": True},
        "volumeMounts": [
            _mount("kubelet-dir", "/var/lib/kubelet", mountPropagation="Bidirectional"),
            _mount("socket-dir", "/csi"),
            _mount("varrun", "/var/run"),
        ],
    }
    volumes = [
        _host("kubelet-dir", "/var/lib/kubelet"),
        _host("socket-dir", "/var/lib/kubelet/plugins/csi.tigera.io"),
        _host("varrun", "/var/run"),
    ]
    return _pod("calico-system", "csi-node-driver", [container], volumes=volumes)


def ebs_csi_node() -> tuple[str, dict[str, Any]]:
    """The AWS EBS CSI driver's node plugin in kube-system: privileged, /dev, the kubelet's dir."""
    container = {
        "name": "ebs-plugin",
        "image": "public.ecr.aws/ebs-csi-driver/aws-ebs-csi-driver:v1.35.0",
        "securityContext": {"privileged": True},
        "volumeMounts": [
            _mount("kubelet-dir", "/var/lib/kubelet", mountPropagation="Bidirectional"),
            _mount("device-dir", "/dev"),
        ],
    }
    volumes = [_host("kubelet-dir", "/var/lib/kubelet"), _host("device-dir", "/dev")]
    return _pod("kube-system", "ebs-csi-node-sa", [container], volumes=volumes)


def dcgm_exporter() -> tuple[str, dict[str, Any]]:
    """NVIDIA's dcgm-exporter chart outside the GPU Operator: every GPU, SYS_ADMIN, the kubelet's
    pod-resources socket."""
    container = {
        "name": "exporter",
        "image": "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.8-3.6.0-ubuntu22.04",
        "env": [
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "DCGM_EXPORTER_KUBERNETES", "value": "true"},
        ],
        "securityContext": {"runAsUser": 0, "capabilities": {"add": ["SYS_ADMIN"]}},
        "volumeMounts": [
            _mount("pod-gpu-resources", "/var/lib/kubelet/pod-resources", readOnly=True)
        ],
    }
    volumes = [_host("pod-gpu-resources", "/var/lib/kubelet/pod-resources")]
    return _pod("monitoring", "dcgm-exporter", [container], volumes=volumes)


DAEMONS = {
    "node-exporter": node_exporter,
    "fluent-bit": fluent_bit,
    "datadog-agent": datadog_agent,
    "calico-node": calico_node,
    "cilium": cilium_agent,
    "calico-csi-node-driver": calico_csi_node_driver,
    "ebs-csi-node": ebs_csi_node,
    "dcgm-exporter": dcgm_exporter,
}


def _ensure_namespace(admin: Any, namespace: str) -> None:
    try:
        admin.create_namespace({"metadata": {"name": namespace}})
    except kubernetes.client.ApiException as e:
        if e.status != 409:
            raise


def _denial(create: Any, namespace: str, pod: dict[str, Any]) -> str:
    with pytest.raises(kubernetes.client.ApiException) as raised:
        create(namespace, pod)
    assert raised.value.status == 422
    message = str(status_of(raised.value)["message"])
    assert DENIED in message, message
    return message


@pytest.mark.parametrize("daemon", sorted(DAEMONS))
def test_the_common_node_daemons_run_on_gpu_nodes(cluster: Cluster, daemon: str) -> None:
    namespace, pod = DAEMONS[daemon]()
    _ensure_namespace(cluster.admin, namespace)
    cluster.admin.create_namespaced_pod(namespace, pod)
    stored = cluster.admin.read_namespaced_pod(pod["metadata"]["name"], namespace)
    assert stored.spec.service_account_name == pod["spec"]["serviceAccountName"]


@pytest.mark.parametrize("daemon", sorted(d for d in DAEMONS if DAEMONS[d]()[0] != "kube-system"))
def test_the_same_pod_under_another_account_is_refused(cluster: Cluster, daemon: str) -> None:
    """The listing names a namespace's service account: another account there (or a tenant's
    copy of the daemon in its own namespace) gets no pass to the host or the GPUs."""
    namespace, pod = DAEMONS[daemon]()
    _ensure_namespace(cluster.admin, namespace)
    impostor = copy.deepcopy(pod)
    impostor["spec"]["serviceAccountName"] = "default"
    _denial(cluster.admin.create_namespaced_pod, namespace, impostor)
    tenants = copy.deepcopy(pod)
    _denial(cluster.tenant.create_namespaced_pod, TENANT_NAMESPACE, tenants)
    names = [p.metadata.name for p in cluster.admin.list_namespaced_pod(namespace).items]
    assert pod["metadata"]["name"] not in names


def test_a_daemon_that_reaches_neither_host_nor_gpus_needs_no_listing(cluster: Cluster) -> None:
    """A pod that tolerates every taint and uses none of the ways to the GPUs runs as on any
    node; the same pod with one of them is refused, and so is the taint's own key."""
    probe: dict[str, Any] = {
        "metadata": {"name": "probe"},
        "spec": {
            "tolerations": [dict(EVERY_TAINT)],
            "containers": [{"name": "probe", "image": "busybox", "ports": [{"containerPort": 80}]}],
        },
    }
    cluster.tenant.create_namespaced_pod(TENANT_NAMESPACE, probe)
    for way in (
        {"hostNetwork": True},
        {"volumes": [_host("root", "/")]},
        {"tolerations": [{"key": "tritonshare.io/gpu-node", "operator": "Exists"}]},
    ):
        attempt = copy.deepcopy(probe)
        attempt["metadata"]["name"] = "probe-2"
        attempt["spec"].update(way)
        _denial(cluster.tenant.create_namespaced_pod, TENANT_NAMESPACE, attempt)
    # tritonshare's GPU memory goes through the binder only.
    attempt = copy.deepcopy(probe)
    attempt["metadata"]["name"] = "probe-3"
    attempt["spec"]["containers"][0]["resources"] = {"limits": {"tritonshare.io/gpu-mem": "1Gi"}}
    message = _denial(cluster.tenant.create_namespaced_pod, TENANT_NAMESPACE, attempt)
    assert "for tritonshare.io/ resources" in message
    # Nor may it take the node pod's ports (the agent's 8100, the gateway's 8010 and 8011).
    attempt = copy.deepcopy(probe)
    attempt["metadata"]["name"] = "probe-4"
    attempt["spec"]["containers"][0]["ports"] = [{"containerPort": 8100, "hostPort": 8100}]
    message = _denial(cluster.tenant.create_namespaced_pod, TENANT_NAMESPACE, attempt)
    assert "publish host ports" in message


def test_a_daemon_that_keeps_off_gpu_nodes_is_no_concern(cluster: Cluster) -> None:
    """kube-prometheus-stack's default tolerates every NoSchedule taint only: it cannot run on a
    node tainted tritonshare.io/gpu-node:NoExecute, so the policy leaves it alone wherever it is."""
    _, pod = node_exporter()
    pod["spec"]["tolerations"] = [{"effect": "NoSchedule", "operator": "Exists"}]
    pod["spec"]["serviceAccountName"] = "node-exporter"
    cluster.tenant.create_namespaced_pod(TENANT_NAMESPACE, pod)


@pytest.fixture
def chart_cluster(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient
) -> Iterator[Any]:
    """The chart's policies with a node daemon of the operator's own listed by one value."""
    values = {"admissionPolicies": {"gpuNodeDaemons": {"observability": ["node-exporter"]}}}
    install_policies(kube_api, render_chart(values))
    admin = core_v1(kube_api)
    for namespace in ("observability", "monitoring"):
        admin.create_namespace({"metadata": {"name": namespace}})
    yield admin


def test_one_value_lists_another_daemon_and_keeps_the_defaults(chart_cluster: Any) -> None:
    namespace, pod = node_exporter()
    pod["spec"]["serviceAccountName"] = "node-exporter"
    chart_cluster.create_namespaced_pod("observability", pod)
    _denial(chart_cluster.create_namespaced_pod, "monitoring", copy.deepcopy(pod))
    default = node_exporter()[1]
    chart_cluster.create_namespaced_pod(namespace, default)
