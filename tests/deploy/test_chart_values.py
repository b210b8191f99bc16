"""The chart's knobs operators expect: where the binder's and webhook's pods run, their
annotations, common labels, the webhook's disruption budget and spread, Triton's extra flags, and
an install on a cluster without the monitoring or KEDA CRDs. Each renders, reaches the object it
names, and validates against the Kubernetes schemas (tests/deploy/test_chart.py checks the rest)."""

from __future__ import annotations

from typing import Any

import helm_python
import kubernetes_validate
import pytest

from tests.deploy.rendering import Obj, name_of, pod_spec, render_templates
from tests.deploy.rendering import render_chart as _render_chart
from tests.deploy.test_chart import _the, render_chart
from tests.deploy.test_manifests import CUSTOM_API_VERSIONS, KUBERNETES_VERSION

TOLERATION = {"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}
AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["infra"]}]}
            ]
        }
    }
}
PLACED = {
    "nodeSelector": {"pool": "infra"},
    "tolerations": [TOLERATION],
    "affinity": AFFINITY,
    "podAnnotations": {"example.com/team": "platform"},
}
VALUES: dict[str, Any] = {
    "commonLabels": {"example.com/cost-center": "ml-platform"},
    "binder": PLACED,
    "webhook": {"enabled": True, **PLACED},
    "triton": {"extraArgs": ["--pinned-memory-pool-byte-size=0", "--log-verbose=1"]},
    "example": {"enabled": True},
}


def _validate(objects: tuple[Obj, ...]) -> None:
    for obj in objects:
        if obj["apiVersion"] in CUSTOM_API_VERSIONS:
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            pytest.fail(f"{name_of(obj)} is invalid at {path}: {e.message}")


def test_placement_annotations_and_labels_reach_the_binder_and_webhook_pods() -> None:
    objects = render_chart(VALUES)
    _validate(objects)
    for name in ("tritonshare-binder", "tritonshare-webhook"):
        template = _the(objects, "Deployment", name)["spec"]["template"]
        spec = template["spec"]
        assert spec["nodeSelector"] == {"pool": "infra"}
        assert spec["tolerations"] == [TOLERATION]
        assert spec["affinity"] == AFFINITY, "the values' affinity replaces the default"
        assert template["metadata"]["annotations"] == {"example.com/team": "platform"}
        assert template["metadata"]["labels"]["example.com/cost-center"] == "ml-platform"
    node = _the(objects, "DaemonSet", "tritonshare-node")["spec"]["template"]["metadata"]
    assert node["labels"]["example.com/cost-center"] == "ml-platform"
    for obj in objects:
        labels = obj["metadata"].get("labels", {})
        assert labels.get("example.com/cost-center") == "ml-platform", name_of(obj)
    # Selectors never take them: an upgrade that changes a common label changes no selector.
    binder = _the(objects, "Deployment", "tritonshare-binder")
    assert "example.com/cost-center" not in binder["spec"]["selector"]["matchLabels"]


def test_the_defaults_leave_the_pods_where_the_cluster_puts_them() -> None:
    objects = render_chart({"webhook": {"enabled": True}})
    binder = _the(objects, "Deployment", "tritonshare-binder")["spec"]["template"]
    assert not {"nodeSelector", "tolerations", "affinity"} & set(binder["spec"])
    assert "annotations" not in binder["metadata"]
    webhook = _the(objects, "Deployment", "tritonshare-webhook")["spec"]["template"]["spec"]
    [term] = webhook["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "tritonshare-webhook"
    }


def test_the_webhook_keeps_a_replica_through_drains_when_it_has_two() -> None:
    budget = _the(
        render_chart({"webhook": {"enabled": True}}), "PodDisruptionBudget", "tritonshare-webhook"
    )
    assert budget["spec"] == {
        "minAvailable": 1,
        "selector": {"matchLabels": {"app.kubernetes.io/name": "tritonshare-webhook"}},
    }
    for values in ({"replicas": 1}, {"podDisruptionBudget": {"enabled": False}}):
        objects = render_chart({"webhook": {"enabled": True, **values}})
        assert not [
            o
            for o in objects
            if o["kind"] == "PodDisruptionBudget" and o["metadata"]["name"] == "tritonshare-webhook"
        ], values


def test_triton_extra_args_follow_the_charts_and_cannot_undo_the_isolation() -> None:
    node = _the(render_chart(VALUES), "DaemonSet", "tritonshare-node")
    [triton] = [c for c in node["spec"]["template"]["spec"]["containers"] if c["name"] == "triton"]
    assert triton["args"][-2:] == ["--pinned-memory-pool-byte-size=0", "--log-verbose=1"]
    assert "--http-address=127.0.0.1" in triton["args"]
    for flag in ("--http-address=0.0.0.0", "--grpc-restricted-protocol=health:x=y"):
        with pytest.raises(helm_python.HelmError, match=f"triton.extraArgs: {flag.split('=')[0]}"):
            _render_chart({"triton": {"extraArgs": [flag]}})


def test_without_the_monitoring_and_keda_crds_their_objects_are_left_out() -> None:
    """A cluster without the Prometheus Operator or KEDA: `helm install` would fail on a
    PodMonitor, PrometheusRule or ScaledObject, so the chart renders none; the rest is whole."""
    example = {"example": {"enabled": True, "keda": {"enabled": True}}}
    bare = render_chart(example, api_versions=())
    kinds = {o["kind"] for o in bare}
    assert not {"PodMonitor", "PrometheusRule", "ScaledObject"} & kinds
    assert {"DaemonSet", "Deployment", "Service", "ConfigMap", "NetworkPolicy"} <= kinds
    _validate(bare)
    full = render_chart(example)
    assert {"PodMonitor", "PrometheusRule", "ScaledObject"} <= {o["kind"] for o in full}
    assert {name_of(o) for o in bare} == {
        name_of(o)
        for o in full
        if o["kind"] not in {"PodMonitor", "PrometheusRule", "ScaledObject"}
    }


def test_the_install_notes_name_the_ports_model_pods_use() -> None:
    """NOTES.txt tells where model pods reach Triton: the gateway's ports, as the values set."""
    notes = render_templates({"gateway": {"ports": {"http": 8110, "grpc": 8111}}})
    [text] = [t for name, t in notes.items() if name.endswith("NOTES.txt")]
    assert "$(HOST_IP):8110 (REST) and 8111 (gRPC)" in text
    assert "$(HOST_IP):8100" in text, "the agent's port"
    assert "8000" not in text and "8001" not in text, "Triton's own ports are loopback only"


DIGEST = "sha256:" + "ab" * 32
TRITON_DIGEST = "sha256:" + "cd" * 32


def _containers(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in spec.get("initContainers", []) + spec["containers"]}


def test_image_digests_replace_the_tags_everywhere() -> None:
    """A digest pins every tritonshare container (and what the webhook writes into model pods)
    and Triton's by content; no tag is left to drift."""
    objects = render_chart(
        {
            "image": {"digest": DIGEST},
            "triton": {"image": {"digest": TRITON_DIGEST}},
            "webhook": {"enabled": True},
            "example": {"enabled": True},
        }
    )
    _validate(objects)
    pinned = f"ghcr.io/tritonshare/tritonshare@{DIGEST}"
    images = set()
    for obj in objects:
        spec = pod_spec(obj)
        for container in _containers(dict(spec)).values() if spec else ():
            images.add(container["image"])
    assert images == {pinned, f"nvcr.io/nvidia/tritonserver@{TRITON_DIGEST}"}
    [webhook] = _the(objects, "Deployment", "tritonshare-webhook")["spec"]["template"]["spec"][
        "containers"
    ]
    assert {"name": "TRITONSHARE_IMAGE", "value": pinned} in webhook["env"]
    with pytest.raises(helm_python.HelmError):
        _render_chart({"image": {"digest": "latest"}})


def test_priority_classes_and_update_strategies_reach_their_workloads() -> None:
    rolling = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    objects = render_chart(
        {
            "binder": {"priorityClassName": "system-cluster-critical"},
            "webhook": {
                "enabled": True,
                "priorityClassName": "system-cluster-critical",
                "updateStrategy": rolling,
            },
            "node": {"updateStrategy": rolling},
        }
    )
    _validate(objects)
    for name in ("tritonshare-binder", "tritonshare-webhook"):
        spec = _the(objects, "Deployment", name)["spec"]
        assert spec["template"]["spec"]["priorityClassName"] == "system-cluster-critical"
    assert _the(objects, "Deployment", "tritonshare-webhook")["spec"]["strategy"] == rolling
    assert _the(objects, "DaemonSet", "tritonshare-node")["spec"]["updateStrategy"] == rolling
    defaults = render_chart({"webhook": {"enabled": True}})
    node = _the(defaults, "DaemonSet", "tritonshare-node")
    assert node["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert (
        "priorityClassName"
        not in _the(defaults, "Deployment", "tritonshare-binder")["spec"]["template"]["spec"]
    )
    assert "strategy" not in _the(defaults, "Deployment", "tritonshare-webhook")["spec"]


def test_extra_env_volumes_and_mounts_reach_their_containers() -> None:
    env = [{"name": "HTTPS_PROXY", "value": "http://proxy.corp:3128"}]
    volume = [{"name": "corp-ca", "configMap": {"name": "corp-ca"}}]
    mount = [{"name": "corp-ca", "mountPath": "/etc/corp-ca", "readOnly": True}]
    extra = {"extraEnv": env, "extraVolumeMounts": mount}
    objects = render_chart(
        {
            "binder": {**extra, "extraVolumes": volume},
            "webhook": {"enabled": True, **extra, "extraVolumes": volume},
            "node": {"extraVolumes": volume},
            "agent": extra,
            "gateway": extra,
            "triton": extra,
        }
    )
    _validate(objects)
    for kind, name, containers in (
        ("Deployment", "tritonshare-binder", ("binder",)),
        ("Deployment", "tritonshare-webhook", ("webhook",)),
        ("DaemonSet", "tritonshare-node", ("triton", "agent", "gateway")),
    ):
        spec = _the(objects, kind, name)["spec"]["template"]["spec"]
        assert volume[0] in spec["volumes"], name
        for container in (_containers(spec)[c] for c in containers):
            assert env[0] in container["env"], f"{name}/{container['name']}"
            assert mount[0] in container["volumeMounts"], f"{name}/{container['name']}"
    # Appended: the chart's own entries stay first and whole.
    agent = _containers(_the(objects, "DaemonSet", "tritonshare-node")["spec"]["template"]["spec"])
    assert agent["agent"]["env"][0]["name"] == "NODE_NAME"
    assert agent["agent"]["env"][-1] == env[0]


def test_the_webhook_answers_only_on_its_port_and_sends_nothing() -> None:
    assert "NetworkPolicy/tritonshare-system/tritonshare-webhook" not in {
        name_of(o) for o in render_chart()
    }
    objects = render_chart({"webhook": {"enabled": True, "port": 8443}})
    _validate(objects)
    policy = _the(objects, "NetworkPolicy", "tritonshare-webhook")["spec"]
    assert policy["podSelector"] == {
        "matchLabels": {"app.kubernetes.io/name": "tritonshare-webhook"}
    }
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert policy["ingress"] == [{"ports": [{"port": 8443, "protocol": "TCP"}]}]
    assert policy["egress"] == []
    webhook = _the(objects, "Deployment", "tritonshare-webhook")["spec"]["template"]
    assert webhook["metadata"]["labels"]["app.kubernetes.io/name"] == "tritonshare-webhook"
    [container] = webhook["spec"]["containers"]
    assert container["ports"][0]["containerPort"] == 8443


def test_the_example_fetches_from_a_storage_uri_when_given_one() -> None:
    """example.storageUri: KServe's storage initializer fetches the URI in place of the shipped
    ConfigMap, and nothing of the ConfigMap is left."""
    objects = render_chart({"example": {"enabled": True, "storageUri": "s3://models/add_one"}})
    _validate(objects)
    assert "ConfigMap/models/add-one-model" not in {name_of(o) for o in objects}
    spec = _the(objects, "Deployment", "add-one")["spec"]["template"]["spec"]
    initializer, loader = spec["initContainers"]
    assert initializer["name"] == "storage-initializer" and loader["name"] == "loader"
    assert initializer["args"] == ["s3://models/add_one", "/mnt/models"]
    assert {v["name"] for v in spec["volumes"]} == {"model", "tmp", "agent-token"}
    with pytest.raises(helm_python.HelmError):
        _render_chart({"example": {"enabled": True, "storageUri": "ftp://models/add_one"}})
