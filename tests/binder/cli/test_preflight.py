"""`tritonshare preflight [--pre]` against simulated API servers shaped as the clusters users have:
a kubeadm cluster with node-exporter, fluent-bit and calico-node, EKS (the AWS VPC CNI,
k8s.amazonaws.com/accelerator) and GKE (cloud.google.com/gke-accelerator, 4-GPU nodes). Each
problem is named with its fix and makes the exit status 1; once fixed, it exits 0. The GPU-node
policy is deploy/base's, installed in the API server, which judges the DaemonSets' pods itself."""

from __future__ import annotations

import base64
import copy
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml

from binder.cli.main import main as cli
from tests.binder.objects import node_obj
from tests.binder.simcluster import add_node
from tests.fixtures_sim import apps_v1, core_v1

ROOT = Path(__file__).resolve().parents[3]
POLICY = ROOT / "deploy" / "base" / "gpu-node-admission-policy.yaml"
NODE_DAEMONSET = sorted(ROOT.glob("deploy/base/**/node-daemonset.yaml"))[0]
SYSTEM = "tritonshare-system"
TAINT = {"key": "tritonshare.io/gpu-node", "value": "true", "effect": "NoExecute"}
EVERYTHING = [{"operator": "Exists"}]


def run(kubeconfig: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    out = io.StringIO()
    code = cli(["--kubeconfig", str(kubeconfig), "preflight", *args], out=out)
    return code, out.getvalue()


def report(kubeconfig: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> dict[str, Any]:
    """The JSON report's checks by name (with the exit status and the verdict)."""
    code, text = run(kubeconfig, monkeypatch, *args, "-o", "json")
    document = json.loads(text)
    assert code == (1 if document["status"] == "fail" else 0)
    return {"code": code, "status": document["status"]} | {c["name"]: c for c in document["checks"]}


def daemonset(
    namespace: str,
    name: str,
    spec: dict[str, Any],
    account: str = "default",
) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"serviceAccountName": account, **spec},
            },
        },
    }


def container(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": f"example.com/{name}:1", **extra}


# Representative node daemons, as their charts render them.
CALICO = daemonset(
    "kube-system",
    "calico-node",
    {
        "hostNetwork": True,
        "tolerations": EVERYTHING,
        "containers": [container("calico-node", securityContext={"privileged": True})],
    },
    "calico-node",
)
NODE_EXPORTER = daemonset(
    "monitoring",
    "node-exporter",
    {
        "hostNetwork": True,
        "hostPID": True,
        "tolerations": EVERYTHING,
        "containers": [
            container("node-exporter", volumeMounts=[{"name": "root", "mountPath": "/host"}])
        ],
        "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
    },
    "node-exporter",
)
FLUENT_BIT = daemonset(
    "logging",
    "fluent-bit",
    {
        "tolerations": EVERYTHING,
        "containers": [
            container("fluent-bit", volumeMounts=[{"name": "log", "mountPath": "/var/log"}])
        ],
        "volumes": [{"name": "log", "hostPath": {"path": "/var/log"}}],
    },
    "fluent-bit",
)
GPU_BURN = daemonset(
    "team-a",
    "gpu-burn",
    {
        "tolerations": EVERYTHING,
        "containers": [container("burn", resources={"limits": {"nvidia.com/gpu": "1"}})],
    },
)
AWS_NODE = daemonset(
    "kube-system", "aws-node", {"hostNetwork": True, "containers": [container("aws-node")]}
)


def gpu_node(
    name: str, gpus: int, cpu: str, memory: str, labels: dict[str, str], taint: bool = True
) -> dict[str, Any]:
    allocatable = {"cpu": cpu, "memory": memory, "pods": "110", "nvidia.com/gpu": str(gpus)}
    return node_obj(name, labels=labels, taints=[TAINT] if taint else None, allocatable=allocatable)


def create_all(api: kubernetes.client.ApiClient, objects: list[dict[str, Any]]) -> None:
    """Create each object (its namespace first, where missing) through the official client."""
    core, apps = core_v1(api), apps_v1(api)
    admission: Any = kubernetes.client.AdmissionregistrationV1Api(api)
    scheduling: Any = kubernetes.client.SchedulingV1Api(api)
    for obj in objects:
        namespace = obj["metadata"].get("namespace")
        if namespace and namespace not in {n.metadata.name for n in core.list_namespace().items}:
            core.create_namespace({"metadata": {"name": namespace}})
        kind = obj["kind"]
        if kind == "Node":
            core.create_node(obj)
        elif kind == "DaemonSet":
            apps.create_namespaced_daemon_set(namespace, obj)
        elif kind == "Pod":
            core.create_namespaced_pod(namespace, obj)
        elif kind == "Secret":
            core.create_namespaced_secret(namespace, obj)
        elif kind == "PriorityClass":
            scheduling.create_priority_class(obj)
        elif kind == "ValidatingAdmissionPolicy":
            admission.create_validating_admission_policy(obj)
        elif kind == "ValidatingAdmissionPolicyBinding":
            admission.create_validating_admission_policy_binding(obj)
        elif kind == "MutatingWebhookConfiguration":
            admission.create_mutating_webhook_configuration(obj)
        else:
            raise AssertionError(f"no create for {kind}")


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture
def certificates(tmp_path: Path) -> dict[str, bytes]:
    """A CA (a year), a serving certificate it issued (a year), and another CA."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    key = ("-newkey", "rsa:2048", "-nodes", "-keyout")
    for ca in ("ca", "other"):
        crt = str(tmp_path / f"{ca}.crt")
        openssl(
            "req", "-x509", "-days", "365", "-subj", f"/CN={ca}", *key, crt + ".key", "-out", crt
        )
    serving = "/CN=tritonshare-webhook.tritonshare-system.svc"
    openssl(
        "req", "-subj", serving, *key, str(tmp_path / "tls.key"), "-out", str(tmp_path / "tls.csr")
    )
    openssl("x509", "-req", "-in", str(tmp_path / "tls.csr"), "-CA", str(tmp_path / "ca.crt"),
            "-CAkey", str(tmp_path / "ca.crt.key"), "-CAcreateserial", "-days", "365",
            "-out", str(tmp_path / "tls.crt"))  # fmt: skip
    return {name: (tmp_path / f"{name}.crt").read_bytes() for name in ("ca", "other", "tls")}


def webhook(ca: bytes, serving: bytes) -> list[dict[str, Any]]:
    """The webhook configuration with `ca` as its caBundle, and the serving Secret."""
    encoded = base64.b64encode
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "tritonshare-model-pods"},
            "webhooks": [
                {
                    "name": "model-pods.tritonshare.io",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "clientConfig": {
                        "service": {"name": "tritonshare-webhook", "namespace": SYSTEM},
                        "caBundle": encoded(ca).decode(),
                    },
                    "objectSelector": {"matchLabels": {"tritonshare.io/role": "model"}},
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                        }
                    ],
                }
            ],
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "tritonshare-webhook-tls", "namespace": SYSTEM},
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": encoded(serving).decode(), "tls.key": encoded(b"key").decode()},
        },
    ]


def installed(pools: list[tuple[str, dict[str, str], int, str]]) -> list[dict[str, Any]]:
    """tritonshare as installed: the node DaemonSet of deploy/base for each pool (name, node
    selector, GPU count, Triton's memory request), its PriorityClass and the GPU-node policy."""
    base = yaml.safe_load(NODE_DAEMONSET.read_text())
    objects: list[dict[str, Any]] = list(yaml.safe_load_all(POLICY.read_text()))
    objects.append(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "tritonshare-node-critical"},
            "value": 1000000000,
        }
    )
    for name, selector, gpus, memory in pools:
        ds = copy.deepcopy(base)
        ds["metadata"]["name"] = name
        spec = ds["spec"]["template"]["spec"]
        spec.pop("affinity", None)
        spec["nodeSelector"] = selector
        triton = next(c for c in spec["containers"] if c["name"] == "triton")
        triton["resources"] = {
            "requests": {"cpu": "2", "memory": memory},
            "limits": {"memory": memory, "nvidia.com/gpu": str(gpus)},
        }
        objects.append(ds)
    return objects


def admitted(api: kubernetes.client.ApiClient, ds: dict[str, Any]) -> bool:
    """Whether the API server creates a pod of the DaemonSet for real (then deletes it)."""
    core = core_v1(api)
    pod = {"metadata": {"name": "probe", **ds["spec"]["template"]["metadata"]},
           "spec": ds["spec"]["template"]["spec"]}  # fmt: skip
    try:
        core.create_namespaced_pod(ds["metadata"]["namespace"], pod)
    except kubernetes.client.ApiException:
        return False
    core.delete_namespaced_pod("probe", ds["metadata"]["namespace"], grace_period_seconds=0)
    return True


def exempt(api: kubernetes.client.ApiClient, namespaces: list[str]) -> None:
    """Leave `namespaces` out of the GPU-node policy's binding, as its values document."""
    admission: Any = kubernetes.client.AdmissionregistrationV1Api(api)
    binding = admission.read_validating_admission_policy_binding("tritonshare-gpu-nodes")
    body = api.sanitize_for_serialization(binding)  # type: ignore[no-untyped-call]
    for expression in body["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]:
        if expression["key"] == "kubernetes.io/metadata.name" and expression["operator"] == "NotIn":
            expression["values"] += namespaces
    admission.replace_validating_admission_policy_binding("tritonshare-gpu-nodes", body)


def test_kubeadm_cluster_with_node_daemons(
    kubeconfig: Path,
    kube_api: kubernetes.client.ApiClient,
    certificates: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpu = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-A10"}
    create_all(
        kube_api,
        [
            node_obj("control-plane", allocatable={"cpu": "4", "memory": "16Gi"}),
            gpu_node("gpu-1", 1, "16", "64Gi", gpu | {"nvidia.com/gpu.count": "1"}),
            gpu_node("gpu-4", 4, "48", "192Gi", gpu | {"nvidia.com/gpu.count": "4"}),
            CALICO,
            NODE_EXPORTER,
            FLUENT_BIT,
            GPU_BURN,
        ],
    )
    # Before installing: the daemons the policy will judge, named; nothing installed is checked.
    before = report(kubeconfig, monkeypatch, "--pre")
    assert before["gpu-nodes"]["status"] == "ok"
    assert before["node-pod-fit"]["status"] == "ok"
    judged = "\n".join(before["gpu-node-policy"]["details"])
    for name in ("monitoring/node-exporter", "logging/fluent-bit", "team-a/gpu-burn"):
        assert name in judged
    assert "kube-system/calico-node" not in judged
    assert before["cni"]["message"].startswith("Calico: hostPorts through the CNI portmap plugin")
    assert "webhook-certificate" not in before and "images" not in before
    assert before["code"] == 0

    create_all(
        kube_api,
        installed(
            [
                (
                    "tritonshare-node",
                    {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "1"},
                    1,
                    "32Gi",
                )
            ]
        )
        + webhook(certificates["other"], certificates["tls"]),
    )
    core_v1(kube_api).patch_namespace(
        SYSTEM, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline"}}}
    )
    code, text = run(kubeconfig, monkeypatch)
    assert code == 1
    after = report(kubeconfig, monkeypatch)
    # Pod Security: the node pod's hostPorts need privileged.
    assert after["pod-security"]["status"] == "fail"
    label = "pod-security.kubernetes.io/enforce=privileged"
    assert after["pod-security"]["fix"] == f"kubectl label namespace {SYSTEM} {label} --overwrite"
    # The 4-GPU node runs no node pod: the only pool is for 1-GPU nodes.
    fit = after["node-pod-fit"]
    assert fit["status"] == "fail" and "run no node pod (gpu-4)" in fit["message"]
    assert "node.pools" in fit["fix"]
    # Which DaemonSets the policy refuses is what the API server says for real pods.
    policy = after["gpu-node-policy"]
    assert policy["status"] == "fail"
    refused = {
        d.partition(" ")[0] for d in policy["details"] if "policy tritonshare-gpu-nodes:" in d
    }
    assert "team-a/gpu-burn" in refused
    for ds in (CALICO, NODE_EXPORTER, FLUENT_BIT, GPU_BURN):
        key = f"{ds['metadata']['namespace']}/{ds['metadata']['name']}"
        assert (key in refused) == (not admitted(kube_api, ds)), key
    assert "service account" in policy["fix"]
    # The caBundle does not issue the serving certificate.
    assert after["webhook-certificate"]["status"] == "fail"
    assert "not issued by the webhook's caBundle" in after["webhook-certificate"]["message"]
    # The text names each problem with its fix.
    for line in ("[fail] pod-security:", "[fail] node-pod-fit:", "[fail] gpu-node-policy:"):
        assert line in text
    assert "    fix: kubectl label namespace" in text

    # Fixed, as each fix says.
    core_v1(kube_api).patch_namespace(
        SYSTEM, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}
    )
    create_all(
        kube_api, installed([("tritonshare-node-4", {"nvidia.com/gpu.count": "4"}, 4, "32Gi")])[-1:]
    )
    apps_v1(kube_api).delete_namespaced_daemon_set("gpu-burn", "team-a")
    exempt(kube_api, sorted(k.partition("/")[0] for k in refused - {"team-a/gpu-burn"}))
    admission: Any = kubernetes.client.AdmissionregistrationV1Api(kube_api)
    admission.delete_mutating_webhook_configuration("tritonshare-model-pods")
    core_v1(kube_api).delete_namespaced_secret("tritonshare-webhook-tls", SYSTEM)
    create_all(kube_api, webhook(certificates["ca"], certificates["tls"]))
    fixed = report(kubeconfig, monkeypatch)
    assert fixed["code"] == 0, json.dumps(fixed, indent=1)
    for name in (
        "pod-security",
        "node-pod-fit",
        "gpu-node-policy",
        "webhook-certificate",
        "images",
    ):
        assert fixed[name]["status"] == "ok", fixed[name]


def test_eks_cluster(
    kubeconfig: Path,
    kube_api: kubernetes.client.ApiClient,
    certificates: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """g4dn.xlarge nodes (4 vCPU, 16 GiB, one T4) with EKS's labels and no GPU Operator: found,
    but too small for the node pod's defaults; the AWS VPC CNI is named."""
    eks = {
        "k8s.amazonaws.com/accelerator": "nvidia-tesla-t4",
        "node.kubernetes.io/instance-type": "g4dn.xlarge",
    }
    create_all(
        kube_api, [gpu_node("ip-10-0-1-7", 1, "3920m", "15155Mi", eks, taint=False), AWS_NODE]
    )
    before = report(kubeconfig, monkeypatch, "--pre")
    assert before["code"] == 1
    nodes = before["gpu-nodes"]
    assert nodes["status"] == "warn"  # not tainted for tritonshare
    assert nodes["details"] == [
        "ip-10-0-1-7: 1 GPU (allocatable nvidia.com/gpu=1, "
        "k8s.amazonaws.com/accelerator=nvidia-tesla-t4); not tainted tritonshare.io/gpu-node"
    ]
    assert nodes["fix"] == "kubectl taint node ip-10-0-1-7 tritonshare.io/gpu-node=true:NoExecute"
    fit = before["node-pod-fit"]
    assert fit["status"] == "fail" and "does not fit on ip-10-0-1-7" in fit["message"]
    assert fit["details"] == [
        "ip-10-0-1-7: node pod asks 2.6 CPU, 32.2Gi; 3.92 CPU, 14.8Gi free (too little memory)"
    ]
    assert before["cni"]["message"].startswith("AWS VPC CNI: hostPorts through the CNI portmap")

    # Fixed: the node tainted, and a pool with Triton's requests sized for it.
    core_v1(kube_api).patch_node("ip-10-0-1-7", {"spec": {"taints": [TAINT]}})
    create_all(
        kube_api,
        installed(
            [("tritonshare-node", {"k8s.amazonaws.com/accelerator": "nvidia-tesla-t4"}, 1, "8Gi")]
        )
        + webhook(certificates["ca"], certificates["tls"]),
    )
    spec_patch = {
        "spec": {
            "template": {
                "spec": {
                    "containers": [{"name": "triton", "resources": {"requests": {"cpu": "1"}}}]
                }
            }
        }
    }
    apps_v1(kube_api).patch_namespaced_daemon_set("tritonshare-node", SYSTEM, spec_patch)
    fixed = report(kubeconfig, monkeypatch)
    assert fixed["code"] == 0, json.dumps(fixed, indent=1)
    assert fixed["node-pod-fit"]["status"] == "ok"


def test_gke_cluster_with_four_gpu_nodes(
    kubeconfig: Path,
    kube_api: kubernetes.client.ApiClient,
    certificates: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """g2-standard-48 nodes (4 L4s) with GKE's labels only: found by them; the 1-GPU pool of the
    defaults runs on none of them until a pool selects them; a node pod that cannot pull its
    image fails the images check."""
    gke = {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    nodes = [gpu_node(f"gke-gpu-{i}", 4, "47", "180Gi", gke) for i in range(2)]
    create_all(kube_api, nodes)
    assert report(kubeconfig, monkeypatch, "--pre")["gpu-nodes"]["details"] == [
        f"gke-gpu-{i}: 4 GPUs (allocatable nvidia.com/gpu=4, "
        "cloud.google.com/gke-accelerator=nvidia-l4)"
        for i in range(2)
    ]
    # The room is what the node's pods leave (an old node pod of tritonshare's aside).
    for namespace, name, memory in (("team-a", "big", "160Gi"), (SYSTEM, "old-node-pod", "32Gi")):
        asks = {"requests": {"cpu": "1", "memory": memory}}
        spec = {"nodeName": "gke-gpu-0", "containers": [container("c", resources=asks)]}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
        }
        create_all(kube_api, [pod | {"spec": spec}])
    fit = report(kubeconfig, monkeypatch, "--pre")["node-pod-fit"]
    assert fit["status"] == "fail"
    assert fit["details"][0] == (
        "gke-gpu-0: node pod asks 8.6 CPU, 128.2Gi; 46 CPU, 20Gi free (too little memory)"
    )
    core_v1(kube_api).delete_namespaced_pod("big", "team-a", grace_period_seconds=0)
    core_v1(kube_api).delete_namespaced_pod("old-node-pod", SYSTEM, grace_period_seconds=0)
    create_all(
        kube_api,
        installed(
            [
                (
                    "tritonshare-node",
                    {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "1"},
                    1,
                    "32Gi",
                )
            ]
        )
        + webhook(certificates["ca"], certificates["tls"]),
    )
    core_v1(kube_api).patch_namespace(
        SYSTEM, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}
    )
    after = report(kubeconfig, monkeypatch)
    fit = after["node-pod-fit"]
    assert fit["status"] == "fail"
    assert "2 GPU node(s) run no node pod (gke-gpu-0, gke-gpu-1)" in fit["message"]

    apps_v1(kube_api).delete_namespaced_daemon_set("tritonshare-node", SYSTEM)
    create_all(kube_api, installed([("tritonshare-node", gke, 4, "32Gi")])[-1:])
    # A node pod whose image does not pull.
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "tritonshare-node-x1", "namespace": SYSTEM},
        "spec": {
            "containers": [container("triton")],
            "tolerations": [{"key": TAINT["key"], "operator": "Exists"}],
        },
    }
    create_all(kube_api, [pod])
    waiting = {
        "reason": "ImagePullBackOff",
        "message": 'Back-off pulling image "example.com/triton:1"',
    }
    triton = {"name": "triton", "image": "example.com/triton:1", "ready": False}
    triton |= {"restartCount": 0, "imageID": "", "state": {"waiting": waiting}}
    status = {"containerStatuses": [triton]}
    core_v1(kube_api).patch_namespaced_pod_status("tritonshare-node-x1", SYSTEM, {"status": status})
    failing = report(kubeconfig, monkeypatch)
    assert failing["node-pod-fit"]["status"] == "ok"
    assert failing["images"]["status"] == "fail"
    assert failing["images"]["details"] == [
        f"{SYSTEM}/tritonshare-node-x1 triton: ImagePullBackOff example.com/triton:1: "
        'Back-off pulling image "example.com/triton:1"'
    ]
    core_v1(kube_api).delete_namespaced_pod("tritonshare-node-x1", SYSTEM, grace_period_seconds=0)
    assert report(kubeconfig, monkeypatch)["code"] == 0


def test_text_output_and_an_old_cluster(kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU node fails (its fix named); the text report ends with the counts."""
    code, text = run(kubeconfig, monkeypatch, "--pre")
    assert code == 1
    assert "[fail] gpu-nodes: no GPU node found" in text
    assert (
        "    fix: add GPU nodes with the NVIDIA GPU Operator or your cloud's NVIDIA device plugin"
        in text
    )
    assert text.rstrip().endswith("failed.")


def test_a_node_whose_agent_publishes_gpus_is_a_gpu_node(
    kubeconfig: Path, kube_api: kubernetes.client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No label, no device plugin: the GPUs tritonshare's agent publishes find it, and the
    missing device plugin is named."""
    add_node(kube_api, "gpu-1", [16 << 30, 16 << 30])
    nodes = report(kubeconfig, monkeypatch, "--pre")["gpu-nodes"]
    assert nodes["status"] == "warn"
    assert nodes["details"][0].startswith(
        "gpu-1: 2 GPUs (2 published by tritonshare's agent (tritonshare.io/gpus))"
    )
    assert "advertise no allocatable nvidia.com/gpu (gpu-1)" in nodes["message"]


def test_a_pool_that_selects_no_node_is_named(
    kubeconfig: Path, kube_api: kubernetes.client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool selecting GPU feature discovery's count on EKS nodes without GFD runs no node
    pod: preflight names it, with its selector; a pool by instance type selects the node."""
    eks = {
        "k8s.amazonaws.com/accelerator": "nvidia-tesla-t4",
        "node.kubernetes.io/instance-type": "g4dn.xlarge",
    }
    create_all(kube_api, [gpu_node("ip-10-0-1-7", 1, "64", "256Gi", eks)])
    create_all(
        kube_api,
        installed(
            [
                ("tritonshare-node-gfd", {"nvidia.com/gpu.count": "1"}, 1, "8Gi"),
                (
                    "tritonshare-node-t4",
                    {"node.kubernetes.io/instance-type": "g4dn.xlarge"},
                    1,
                    "8Gi",
                ),
            ]
        ),
    )
    pools = report(kubeconfig, monkeypatch)["node-pools"]
    assert pools["status"] == "warn", pools
    assert pools["message"].endswith("select no node, so run no node pod: tritonshare-node-gfd")
    assert pools["details"] == ["tritonshare-node-gfd: nodeSelector {'nvidia.com/gpu.count': '1'}"]
    assert report(kubeconfig, monkeypatch, "--pre")["node-pools"]["status"] == "ok"
