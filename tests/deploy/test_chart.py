"""charts/tritonshare renders, with Helm's own engine (helm-python-sdk: Helm v4's Go SDK, no helm
binary), what deploy/ renders with kustomize, validates against the Kubernetes schemas, and
carries every value to every place that names it (namespace, key prefix, ports, images, the
monitoring namespace and labels).

One source of truth: with default values the chart and `kubectl kustomize
deploy/overlays/production` produce the same objects, field for field, except for the differences
INTENDED_DIFFERENCES lists.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import helm_python
import kubernetes.client
import kubernetes_validate
import pytest

from agent.gpus.reserve import DEFAULT_RESERVE
from agent.settings import parse_settings as parse_agent_settings
from binder.settings import parse_settings as parse_binder_settings
from loader.settings import parse_settings as parse_loader_settings
from proxy.gateway.settings import parse_settings as parse_gateway_settings
from proxy.settings import parse_settings as parse_proxy_settings
from sim.apiserver import RunningApiServer
from tests.conftest import require_executable
from tests.deploy.rendering import CHART, DEPLOY, Obj, containers, name_of, pod_spec, render
from tests.deploy.rendering import render_chart as _render_chart
from tests.deploy.test_admission_policy import agent_token, client_with_token, install_policies
from tests.deploy.test_manifests import (
    CUSTOM_API_VERSIONS,
    KUBERNETES_VERSION,
    check_custom_resource,
)
from tests.fixtures_sim import core_v1, status_of

# Labels Helm charts put on the objects they own; kustomize has no release to name.
HELM_LABELS = (
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
)
INTENDED_DIFFERENCES = """
- every chart object carries HELM_LABELS in metadata.labels (never in selectors or pod templates);
- the chart does not create the Namespace: Helm installs into an existing release namespace
  (`--create-namespace`), so the Pod Security label is set with kubectl (NOTES.txt, docs);
- the chart creates the two Secrets (tritonshare-placement-key, tritonshare-triton-admin) that
  the kustomize install asks you to create by hand (placementKey.create, tritonAdminKey.create);
- kustomize does not know that some kinds are cluster-scoped and gives them the base's namespace,
  which the API server drops: the ValidatingAdmissionPolicy kinds (v2.0 and v5 alike) and the
  PriorityClass (v2.0); the chart writes no namespace on them.
"""
CLUSTER_SCOPED_KUSTOMIZE_NAMESPACES = (
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "PriorityClass",
)

# A release that changes every value an operator is likely to change.
CUSTOM_NAMESPACE = "gpu-share"
CUSTOM: dict[str, Any] = {
    "image": {"repository": "registry.example.com/ts", "tag": "9.9.9"},
    "keyPrefix": "seldon.io/trtis-",
    "schedulerName": "shared-gpu",
    "binder": {"policy": "spread", "gpuMemReserve": "512Mi", "port": 9300},
    "agent": {"ports": {"grpc": 8200, "http": 8202}, "tenantCodeNamespaces": ["models", "lab"]},
    "triton": {
        "image": {"tag": "24.12-py3"},
        "ports": {"http": 8010, "grpc": 8011, "metrics": 8012},
        "resources": {"requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"memory": "64Gi"}},
    },
    "monitoring": {"namespace": "observability", "labels": {"release": "prom"}},
    "example": {"enabled": True, "namespace": "team-a", "modelId": "7"},
}


def render_chart(values: Mapping[str, Any] | None = None, **kwargs: Any) -> tuple[Obj, ...]:
    try:
        return _render_chart(values, **kwargs)
    except helm_python.HelmError as e:
        pytest.fail(f"charts/tritonshare does not render with {values}: {e}")


def _by_name(objects: tuple[Obj, ...]) -> dict[str, Obj]:
    return {name_of(o): o for o in objects}


def _the(objects: tuple[Obj, ...], kind: str, name: str) -> Obj:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def _binary_as_bytes(obj: Obj) -> Obj:
    """`obj` with its binaryData decoded: kustomize wraps the base64 text at 70 columns, Helm's
    b64enc does not, and the API server reads both as the same bytes."""
    if "binaryData" not in obj:
        return obj
    decoded = copy.deepcopy(obj)
    decoded["binaryData"] = {k: base64.b64decode(v) for k, v in obj["binaryData"].items()}
    return decoded


def _without_helm_labels(obj: Obj) -> Obj:
    if obj["kind"] == "CustomResourceDefinition":
        return obj  # Helm installs crds/ untemplated: no release labels
    stripped = copy.deepcopy(obj)
    labels = stripped["metadata"].get("labels", {})
    for label in HELM_LABELS:
        assert label in labels, f"{name_of(obj)} lacks the Helm label {label}"
        del labels[label]
    if not labels:
        del stripped["metadata"]["labels"]
    return stripped


def test_the_chart_lints_clean() -> None:
    """`helm lint --strict`: no errors and no warnings, with default and with custom values."""
    for values in (None, CUSTOM, {"webhook": {"enabled": True}}):
        report = helm_python.lint(CHART, values, strict=True, kube_version=f"v{KUBERNETES_VERSION}")
        problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        assert not problems, f"helm lint with {values}: {problems}"


def test_default_values_render_what_kustomize_renders() -> None:
    """The chart and deploy/overlays/production agree object for object and field for field,
    except for what INTENDED_DIFFERENCES lists."""
    kubectl = require_executable("kubectl")
    chart = _by_name(render_chart(include_crds=True))
    kustomize: dict[str, Obj] = {}
    for obj in render(kubectl, "overlays/production"):
        if obj["kind"] in CLUSTER_SCOPED_KUSTOMIZE_NAMESPACES:
            obj = copy.deepcopy(obj)
            assert obj["metadata"].pop("namespace", "tritonshare-system") == "tritonshare-system"
        kustomize[name_of(obj)] = obj
    secrets = {n for n, o in chart.items() if o["kind"] == "Secret"}
    assert secrets == {
        "Secret/tritonshare-system/tritonshare-placement-key",
        "Secret/tritonshare-system/tritonshare-triton-admin",
    }
    namespaces = {n for n, o in kustomize.items() if o["kind"] == "Namespace"}
    assert namespaces == {"Namespace/-/tritonshare-system"}
    assert set(chart) - secrets == set(kustomize) - namespaces
    for name in sorted(set(kustomize) - namespaces):
        ours, theirs = _without_helm_labels(chart[name]), kustomize[name]
        assert ours == theirs, (
            f"{name} differs between the chart and kustomize:\n"
            f"chart:     {json.dumps(ours, sort_keys=True)}\n"
            f"kustomize: {json.dumps(theirs, sort_keys=True)}"
        )


def test_helm_labels_stay_out_of_selectors_and_pod_templates() -> None:
    """A chart upgrade changes app.kubernetes.io/version and helm.sh/chart: in an immutable
    selector that would make `helm upgrade` fail."""
    for obj in render_chart():
        text = json.dumps(obj.get("spec", {}))
        for label in HELM_LABELS:
            assert label not in text, f"{name_of(obj)} uses {label} in its spec"


@pytest.mark.parametrize("version", [KUBERNETES_VERSION, kubernetes_validate.latest_version()])
@pytest.mark.parametrize("values", [None, CUSTOM], ids=["defaults", "custom"])
def test_every_object_validates_against_the_kubernetes_schema(
    version: str, values: dict[str, Any] | None
) -> None:
    objects = render_chart(
        values,
        namespace=CUSTOM_NAMESPACE if values else "tritonshare-system",
        include_crds=True,
    )
    builtin = 0
    for obj in objects:
        if obj["apiVersion"] in CUSTOM_API_VERSIONS:
            check_custom_resource(obj)
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            pytest.fail(
                f"{name_of(obj)} is invalid for Kubernetes {version} at {path}: {e.message}"
            )
        builtin += 1
    assert builtin >= 20


def test_the_values_schema_refuses_mistakes_with_the_field_named() -> None:
    mistakes: list[tuple[dict[str, Any], str]] = [
        ({"keyPrefix": "Not A Prefix"}, "/keyPrefix"),
        ({"binder": {"polcy": "spread"}}, "polcy"),
        ({"binder": {"policy": "random"}}, "/binder/policy"),
        ({"agent": {"ports": {"grpc": 70000}}}, "/agent/ports/grpc"),
        ({"monitoring": {"namespace": "Monitoring"}}, "/monitoring/namespace"),
    ]
    for values, field in mistakes:
        with pytest.raises(helm_python.HelmValuesError, match=re.escape(field)):
            _render_chart(values)


def _args(objects: tuple[Obj, ...], container: str) -> list[str]:
    for obj in objects:
        spec = pod_spec(obj)
        for c in containers(spec) if spec else ():
            if c["name"] == container:
                return list(c["args"])
    raise AssertionError(f"no container {container}")


def test_custom_values_reach_every_place_that_names_them() -> None:
    objects = render_chart(CUSTOM, namespace=CUSTOM_NAMESPACE)
    # (Secrets left out: their random keys could spell anything.)
    text = json.dumps([o for o in objects if o["kind"] != "Secret"])
    # Nothing is left pointing at the defaults (the model-pod label tritonshare.io/role is not
    # a contract key: it is fixed, and model pods carry it whatever the prefix).
    assert "tritonshare-system" not in text
    assert "tritonshare.io/" not in text.replace("tritonshare.io/role", "")
    assert '"monitoring"' not in text and "9100" not in text
    for obj in objects:
        if obj["kind"] in ("ClusterRole", "ClusterRoleBinding", "PriorityClass") or obj[
            "kind"
        ].startswith("ValidatingAdmissionPolicy"):
            assert "namespace" not in obj["metadata"], f"{name_of(obj)} is cluster-scoped"
        elif obj["kind"] == "ConfigMap" and obj["metadata"]["name"] != "add-one-model":
            assert obj["metadata"]["namespace"] == "observability"
        elif obj["kind"] == "Namespace" or obj["metadata"]["name"] in (
            "add-one",
            "add-one-model",
            "tritonshare-model",
        ):
            assert obj["metadata"].get("namespace", "team-a") == "team-a", name_of(obj)
        else:
            assert obj["metadata"]["namespace"] == CUSTOM_NAMESPACE, name_of(obj)
    # The parts parse their arguments into the values given.
    downward = {"NODE_NAME": "gpu-node-1"}
    dedicated = _the(objects, "DaemonSet", "tritonshare-node-tenant-code")
    agent = parse_agent_settings(
        [a.replace("$(NODE_NAME)", downward["NODE_NAME"]) for a in _args((dedicated,), "agent")],
        {},
    )
    assert agent.listen_grpc == "0.0.0.0:8200" and agent.listen_http == "0.0.0.0:8202"
    assert agent.triton_http_url == "127.0.0.1:8010"
    assert agent.triton_grpc_url == "127.0.0.1:8011"
    assert agent.system_namespace == CUSTOM_NAMESPACE
    assert agent.key_prefix == "seldon.io/trtis-" and agent.scheduler_name == "shared-gpu"
    assert set(agent.tenant_code_namespaces) == {"models", "lab"}
    binder = parse_binder_settings(_args(objects, "binder"), {})
    assert binder.system_namespace == CUSTOM_NAMESPACE and binder.policy == "spread"
    assert binder.listen_http == ("0.0.0.0", 9300)
    assert binder.keys.prefix == "seldon.io/trtis-" and binder.scheduler_name == "shared-gpu"
    assert binder.gpu_mem_reserve == 512 * 1024**2
    assert set(binder.tenant_code_namespaces) == {"models", "lab"}
    ds = _the(objects, "DaemonSet", "tritonshare-node")
    by_name = {c["name"]: c for c in ds["spec"]["template"]["spec"]["containers"]}
    assert by_name["agent"]["image"] == "registry.example.com/ts:9.9.9"
    assert by_name["triton"]["image"] == "nvcr.io/nvidia/tritonserver:24.12-py3"
    custom_resources = CUSTOM["triton"]["resources"]
    assert by_name["triton"]["resources"] == {
        **custom_resources,
        "limits": {**custom_resources["limits"], "nvidia.com/gpu": "1"},
    }
    assert {"--http-port=8010", "--grpc-port=8011", "--metrics-port=8012"} <= set(
        by_name["triton"]["args"]
    )
    host_ports = {p["hostPort"] for c in by_name.values() for p in c["ports"] if "hostPort" in p}
    assert host_ports == {8010, 8011, 8200}
    policy = _the(objects, "NetworkPolicy", "tritonshare-node")
    model_rule, monitoring_rule = policy["spec"]["ingress"]
    assert {p["port"] for p in model_rule["ports"]} == {8010, 8011, 8200}
    peers = [peer["podSelector"]["matchLabels"] for peer in model_rule["from"]]
    assert peers == [{"tritonshare.io/role": "model"}, {"seldon.io/trtis-model-host": "true"}]
    assert {p["port"] for p in monitoring_rule["ports"]} == {8012, 8202}
    for name in ("tritonshare-node", "tritonshare-binder"):
        rule = _the(objects, "NetworkPolicy", name)["spec"]["ingress"][-1]
        selector = rule["from"][0]["namespaceSelector"]["matchLabels"]
        assert selector == {"kubernetes.io/metadata.name": "observability"}
    for kind in ("PodMonitor", "PrometheusRule"):
        for obj in (o for o in objects if o["kind"] == kind):
            assert obj["metadata"]["labels"]["release"] == "prom", name_of(obj)
    proxies = _the(objects, "PodMonitor", "tritonshare-model-proxies")
    relabel, node = proxies["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert node == {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}
    # What Prometheus' Kubernetes discovery names the annotation seldon.io/trtis-model-id.
    assert relabel["sourceLabels"] == ["__meta_kubernetes_pod_annotation_seldon_io_trtis_model_id"]
    hosts = _the(objects, "PodMonitor", "tritonshare-model-hosts")["spec"]["selector"]
    assert hosts == {"matchLabels": {"seldon.io/trtis-model-host": "true"}}
    rule = _the(objects, "PrometheusRule", "tritonshare")
    exprs = " ".join(r["expr"] for g in rule["spec"]["groups"] for r in g["rules"])
    assert f'job="{CUSTOM_NAMESPACE}/tritonshare-node"' in exprs


def test_the_node_pods_stop_and_caller_identity_follow_the_values() -> None:
    values = {
        "agent": {"stopDrain": {"seconds": 20, "unrouteSeconds": 5}},
        "gateway": {"callerIdentity": "key"},
    }
    for ds in (o for o in render_chart(values) if o["kind"] == "DaemonSet"):
        by_name = {c["name"]: c for c in ds["spec"]["template"]["spec"]["containers"]}
        args = [
            a.replace("$(POD_NAME)", "node-x").replace("$(NODE_NAME)", "n")
            for a in by_name["agent"]["args"]
        ]
        agent = parse_agent_settings(args, {})
        assert (agent.stop_drain_seconds, agent.stop_unroute_seconds) == (20, 5)
        assert agent.pod_name == "node-x"
        env = {e["name"]: e.get("valueFrom") for e in by_name["agent"]["env"]}
        assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        gateway = parse_gateway_settings(by_name["gateway"]["args"], {})
        assert gateway.caller_identity == "key"
        # Triton and the gateway answer on through the agent's drain, and 2 s more.
        for name in ("triton", "gateway"):
            pause = by_name[name]["lifecycle"]["preStop"]["sleep"]["seconds"]
            assert pause == 27, name_of(ds)
        grace = ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace > pause, "Triton's own stop comes after the pause"


def test_tenant_code_namespaces_get_nodes_of_their_own() -> None:
    """The agents that allow tenant code run only on the nodes labelled as dedicated to it (a
    second DaemonSet), the others everywhere else, and the binder gets the same namespaces."""
    label = "tritonshare.io/tenant-code"
    objects = render_chart({"agent": {"tenantCodeNamespaces": ["lab"]}})
    plain = _the(objects, "DaemonSet", "tritonshare-node")
    dedicated = _the(objects, "DaemonSet", "tritonshare-node-tenant-code")
    assert "--tenant-code-namespaces=lab" not in _args((plain,), "agent")
    assert "--tenant-code-namespaces=lab" in _args((dedicated,), "agent")
    assert "--tenant-code-namespaces=lab" in _args(objects, "binder")

    def terms(daemonset: Obj) -> list[Any]:
        terms: list[Any] = daemonset["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        return terms

    # Each term that finds a GPU node keeps the plain agents off the dedicated ones.
    not_dedicated = {"key": label, "operator": "NotIn", "values": ["true"]}
    assert len(terms(plain)) > 1
    for plain_term, dedicated_term in zip(terms(plain), terms(dedicated), strict=True):
        assert plain_term["matchExpressions"] == [
            *dedicated_term["matchExpressions"],
            not_dedicated,
        ]
    assert dedicated["spec"]["template"]["spec"]["nodeSelector"][label] == "true"
    # Each DaemonSet owns only its own pods: the second's selector is the first's and the label.
    assert dedicated["spec"]["selector"]["matchLabels"] == {
        **plain["spec"]["selector"]["matchLabels"],
        label: "true",
    }
    assert dedicated["spec"]["template"]["metadata"]["labels"][label] == "true"
    # Without tenant code, one DaemonSet per GPU count everywhere and a binder that places none.
    objects = render_chart()
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "DaemonSet"] == [
        "tritonshare-node",
        "tritonshare-node-2gpu",
        "tritonshare-node-4gpu",
        "tritonshare-node-8gpu",
    ]
    assert not any("tenant-code" in a for a in _args(objects, "binder"))


def test_the_example_model_is_deploy_example_and_follows_the_values() -> None:
    """With example.enabled the chart renders `kubectl kustomize deploy/example` (Helm labels
    aside); its pods find the agent and Triton on the ports the node pod publishes, carry the
    prefix's keys, and its autoscaler asks the Prometheus of monitoring.namespace."""
    kubectl = require_executable("kubectl")
    for values, kustomization in (
        ({"enabled": True}, "example"),
        ({"enabled": True, "keda": {"enabled": True}}, "overlays/example-keda"),
    ):
        example = _by_name(render_chart({"example": values}))
        rendered = _by_name(render(kubectl, kustomization))
        assert {n for n in example if n in rendered or "models" in n} == set(rendered)
        for name, obj in rendered.items():
            assert _binary_as_bytes(_without_helm_labels(example[name])) == _binary_as_bytes(obj), (
                f"{name} differs from deploy/{kustomization}"
            )
    assert "Deployment/models/add-one" not in _by_name(render_chart())

    objects = render_chart(
        {**CUSTOM, "example": {**CUSTOM["example"], "keda": {"enabled": True}}},
        namespace=CUSTOM_NAMESPACE,
    )
    # The model's config names the model id the pods carry, as the loader requires.
    config = _the(objects, "ConfigMap", "add-one-model")["data"]["config.pbtxt"]
    assert config.startswith('name: "7"\n'), config
    template = _the(objects, "Deployment", "add-one")["spec"]["template"]
    assert template["metadata"]["annotations"] == {"seldon.io/trtis-model-id": "7"}
    assert template["spec"]["schedulerName"] == "shared-gpu"
    loader, proxy = template["spec"]["initContainers"][1], template["spec"]["containers"][0]
    assert "--agent-address=$(HOST_IP):8200" in loader["args"]
    assert {
        "--agent-address=$(HOST_IP):8200",
        "--triton-http-url=$(HOST_IP):8010",
        "--triton-grpc-url=$(HOST_IP):8011",
    } <= set(proxy["args"])
    assert proxy["resources"]["limits"]["seldon.io/trtis-gpu-mem"] == "1Gi"
    for c in (loader, proxy):
        [model_id] = [e for e in c["env"] if e["name"] == "MODEL_ID"]
        path = model_id["valueFrom"]["fieldRef"]["fieldPath"]
        assert path == "metadata.annotations['seldon.io/trtis-model-id']"
    downward = {"$(HOST_IP)": "10.0.0.5", "$(MODEL_ID)": "7"}

    def expanded(args: list[str]) -> list[str]:
        for variable, value in downward.items():
            args = [a.replace(variable, value) for a in args]
        return args

    assert parse_loader_settings(expanded(loader["args"]), {}).agent_address == "10.0.0.5:8200"
    parsed_proxy = parse_proxy_settings(expanded(proxy["args"]), {})
    assert parsed_proxy.model_id == "7"
    scaled = _the(objects, "ScaledObject", "add-one")
    [trigger] = scaled["spec"]["triggers"]
    assert (
        trigger["metadata"]["serverAddress"] == "http://prometheus-operated.observability.svc:9090"
    )
    assert 'namespace="team-a", model="7"' in trigger["metadata"]["query"]


def test_the_admission_policies_follow_the_namespace_and_the_key_prefix(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient
) -> None:
    """The chart's policies, run by the simulated API server: the binder of the custom namespace
    may write the custom prefix's binder annotations, a tenant may not; the agent of the custom
    namespace may annotate its own node under the custom prefix, and not under the default one;
    only the custom scheduler's pods tolerate the custom prefix's GPU-node taint."""
    objects = render_chart(CUSTOM, namespace=CUSTOM_NAMESPACE)
    assert len(install_policies(kube_api, objects)) == 6
    admin = core_v1(kube_api)
    for namespace in (CUSTOM_NAMESPACE, "models"):
        admin.create_namespace({"metadata": {"name": namespace}})
    admin.create_node({"metadata": {"name": "gpu-1"}})
    tenant_token = apiserver.service_account_token("models", "default")
    binder_token = apiserver.service_account_token(CUSTOM_NAMESPACE, "tritonshare-binder")
    node_token = agent_token(apiserver, CUSTOM_NAMESPACE, "gpu-1")
    with (
        client_with_token(apiserver, tenant_token) as tenant_api,
        client_with_token(apiserver, binder_token) as binder_api,
        client_with_token(apiserver, node_token) as agent_api,
    ):
        tenant, binder, agent = core_v1(tenant_api), core_v1(binder_api), core_v1(agent_api)

        def pod(name: str, scheduler: str, node: str = "") -> dict[str, Any]:
            spec = {"schedulerName": scheduler, "containers": [{"name": "c", "image": "x"}]}
            return {"metadata": {"name": name}, "spec": spec | ({"nodeName": node} if node else {})}

        def refused(call: Any, *args: Any) -> str:
            with pytest.raises(kubernetes.client.ApiException) as raised:
                call(*args)
            assert raised.value.status == 422
            message: str = status_of(raised.value)["message"]
            return message

        message = refused(tenant.create_namespaced_pod, "models", pod("m", "shared-gpu", "gpu-1"))
        assert "spec.nodeName" in message, "spec.nodeName at create must be refused"
        tenant.create_namespaced_pod("models", pod("d", "default-scheduler", "gpu-1"))
        # Any scheduler's pod created on a node with the custom prefix's keys is refused; the
        # default prefix's keys mean nothing here.
        squat = pod("s", "default-scheduler", "gpu-1")
        squat["metadata"]["annotations"] = {"seldon.io/trtis-model-id": "victim"}
        message = refused(tenant.create_namespaced_pod, "models", squat)
        assert "may not carry tritonshare resources (seldon.io/trtis-gpu-mem)" in message
        assert "with schedulerName shared-gpu" in message
        squat["metadata"]["annotations"] = {"tritonshare.io/model-id": "victim"}
        tenant.create_namespaced_pod("models", squat)
        system_pod = pod("n", "default-scheduler", "gpu-1")
        system_pod["metadata"]["annotations"] = {"seldon.io/trtis-model-id": "x"}
        admin.create_namespaced_pod(CUSTOM_NAMESPACE, system_pod)
        tenant.create_namespaced_pod("models", pod("m", "shared-gpu"))
        placed = {"metadata": {"annotations": {"seldon.io/trtis-gpu": "GPU-1"}}}
        assert "seldon.io/trtis-gpu" in refused(tenant.patch_namespaced_pod, "m", "models", placed)
        binder.patch_namespaced_pod("m", "models", placed)

        tolerating = pod("t", "default-scheduler")
        tolerating["spec"]["tolerations"] = [
            {"key": "seldon.io/trtis-gpu-node", "operator": "Exists"}
        ]
        message = refused(tenant.create_namespaced_pod, "models", tolerating)
        assert "may tolerate the seldon.io/trtis-gpu-node taint" in message
        assert "with schedulerName shared-gpu" in message
        tolerating["spec"]["schedulerName"] = "shared-gpu"
        tenant.create_namespaced_pod("models", tolerating)
        other_prefix = pod("o", "default-scheduler")
        other_prefix["spec"]["tolerations"] = [
            {"key": "tritonshare.io/gpu-node", "operator": "Exists"}
        ]
        tenant.create_namespaced_pod("models", other_prefix)

        agent.patch_node("gpu-1", {"metadata": {"annotations": {"seldon.io/trtis-gpus": "[]"}}})
        theirs = {"metadata": {"annotations": {"tritonshare.io/gpus": "[]"}}}
        assert "annotations" in refused(agent.patch_node, "gpu-1", theirs)


def test_the_chart_makes_strong_keys_or_leaves_the_secrets_to_you() -> None:
    """Offline (as `helm template`), `lookup` finds no Secret, so each render makes new random
    keys: at least the 32 bytes the binder and agent require, different every time. With
    create=false the Secrets are left out and the pods still mount them by name."""
    first, second = render_chart(), render_chart()
    for name, key in [
        ("tritonshare-placement-key", "current"),
        ("tritonshare-triton-admin", "key"),
    ]:
        values = [base64.b64decode(_the(r, "Secret", name)["data"][key]) for r in (first, second)]
        assert len(values[0]) >= 32 and values[0] != values[1], name
        assert re.fullmatch(rb"[A-Za-z0-9]+", values[0]), "the key must survive argument parsing"
        assert _the(first, "Secret", name)["metadata"]["annotations"] == {
            "helm.sh/resource-policy": "keep"
        }
    none = render_chart(
        {"placementKey": {"create": False}, "tritonAdminKey": {"create": False, "secretName": "x"}}
    )
    assert not [o for o in none if o["kind"] == "Secret"]
    ds = _the(none, "DaemonSet", "tritonshare-node")
    env = [e for c in ds["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])]
    refs = {
        e["valueFrom"]["secretKeyRef"]["name"]
        for e in env
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert refs == {"x"}


def test_the_placement_key_reaches_both_the_binder_and_the_agent() -> None:
    objects = render_chart({"placementKey": {"secretName": "my-key"}})
    for kind, name, container in [
        ("Deployment", "tritonshare-binder", "binder"),
        ("DaemonSet", "tritonshare-node", "agent"),
    ]:
        spec = _the(objects, kind, name)["spec"]["template"]["spec"]
        [volume] = [v for v in spec["volumes"] if v.get("secret", {}).get("secretName") == "my-key"]
        [c] = [c for c in spec["containers"] if c["name"] == container]
        [mount] = [m for m in c["volumeMounts"] if m["name"] == volume["name"]]
        assert f"--placement-key-dir={mount['mountPath']}" in c["args"]
        assert mount["readOnly"] is True


def test_toggles_leave_out_what_they_name() -> None:
    off = render_chart(
        {
            "admissionPolicies": {"enabled": False},
            "networkPolicy": {"enabled": False},
            "monitoring": {
                "podMonitors": {"enabled": False},
                "alerts": {"enabled": False},
                "modelmeshRules": {"enabled": False},
                "dashboard": {"enabled": False},
            },
            "node": {"priorityClass": {"create": False, "name": ""}},
        }
    )
    kinds = {o["kind"] for o in off}
    for gone in (
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "NetworkPolicy",
        "PodMonitor",
        "PrometheusRule",
        "ConfigMap",
        "PriorityClass",
    ):
        assert gone not in kinds
    assert (
        "priorityClassName"
        not in _the(off, "DaemonSet", "tritonshare-node")["spec"]["template"]["spec"]
    )
    assert {"DaemonSet", "Deployment", "Secret", "ClusterRole"} <= kinds


def test_the_binder_may_evict_only_with_preemption_or_consolidate_moves_set() -> None:
    """binder.preemption (on by default) and binder.consolidateMoves above 0 each grant
    create on pods/eviction and pass their flag; with both off, no eviction is granted."""
    for preemption, moves, granted in (
        (True, 0, True),
        (False, 0, False),
        (False, 3, True),
        (True, 3, True),
    ):
        objects = render_chart({"binder": {"consolidateMoves": moves, "preemption": preemption}})
        role = _the(objects, "ClusterRole", "tritonshare-binder")
        evicts = any(
            "pods/eviction" in rule.get("resources", []) and "create" in rule.get("verbs", [])
            for rule in role["rules"]
        )
        assert evicts is granted, (preemption, moves)
        deployment = _the(objects, "Deployment", "tritonshare-binder")
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        settings = parse_binder_settings(container["args"], {})
        assert (settings.preemption, settings.consolidate_moves) == (preemption, moves)


def test_the_binder_may_patch_nodes_only_with_node_autoscaling() -> None:
    """binder.nodeAutoscaling.enabled grants patch on nodes (the scale-down guards), makes the
    placeholders' PriorityClass and passes the flags; off (the default), none of them."""
    for enabled in (False, True):
        objects = render_chart({"binder": {"nodeAutoscaling": {"enabled": enabled}}})
        role = _the(objects, "ClusterRole", "tritonshare-binder")
        patches_nodes = any(
            "nodes" in rule.get("resources", []) and "patch" in rule.get("verbs", [])
            for rule in role["rules"]
        )
        assert patches_nodes is enabled
        classes = {name_of(o) for o in objects if o["kind"] == "PriorityClass"}
        assert ("PriorityClass/-/tritonshare-placeholder" in classes) is enabled
        deployment = _the(objects, "Deployment", "tritonshare-binder")
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        settings = parse_binder_settings(container["args"], {})
        assert settings.node_autoscaling is enabled
        if enabled:
            [placeholder] = [o for o in objects if name_of(o).endswith("/tritonshare-placeholder")]
            assert (placeholder["value"], placeholder["preemptionPolicy"]) == (-10, "Never")
            assert settings.placeholder_node_selector == (("nvidia.com/gpu.present", "true"),)
            assert settings.placeholder_gpu_memory_label == "tritonshare.io/gpu-memory"


def test_the_dashboard_is_the_one_in_deploy_monitoring() -> None:
    config_map = _the(render_chart(), "ConfigMap", "tritonshare-grafana-dashboard")
    dashboard = (DEPLOY / "monitoring" / "tritonshare-dashboard.json").read_text()
    assert config_map["data"] == {"tritonshare-dashboard.json": dashboard}


def _webhook_objects(values: dict[str, Any], namespace: str = CUSTOM_NAMESPACE) -> dict[str, Obj]:
    objects = render_chart({"webhook": {"enabled": True, **values}}, namespace=namespace)
    for obj in objects:
        if obj["apiVersion"] not in CUSTOM_API_VERSIONS and not obj["apiVersion"].startswith(
            "cert-manager.io/"
        ):
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in objects}


def test_the_webhook_gets_a_certificate_its_configuration_trusts(tmp_path: Path) -> None:
    """Self-managed TLS: the generated serving certificate names the Service and verifies
    against the caBundle the MutatingWebhookConfiguration gives the API server (openssl)."""
    openssl = require_executable("openssl")
    objects = _webhook_objects({})
    secret = objects["Secret/tritonshare-webhook-tls"]
    configuration = objects["MutatingWebhookConfiguration/tritonshare-model-pods"]
    [hook] = configuration["webhooks"]
    assert hook["clientConfig"]["service"] == {
        "name": "tritonshare-webhook",
        "namespace": CUSTOM_NAMESPACE,
        "path": "/mutate-pods",
        "port": 443,
    }
    (tmp_path / "ca.crt").write_bytes(base64.b64decode(hook["clientConfig"]["caBundle"]))
    (tmp_path / "tls.crt").write_bytes(base64.b64decode(secret["data"]["tls.crt"]))
    verified = subprocess.run(
        [openssl, "verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "tls.crt")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert verified.returncode == 0, verified.stdout + verified.stderr
    names = subprocess.run(
        [openssl, "x509", "-noout", "-ext", "subjectAltName", "-in", str(tmp_path / "tls.crt")],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert f"DNS:tritonshare-webhook.{CUSTOM_NAMESPACE}.svc" in names
    # The Deployment mounts that Secret where its arguments look for it.
    spec = objects["Deployment/tritonshare-webhook"]["spec"]["template"]["spec"]
    [volume] = spec["volumes"]
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    [container] = spec["containers"]
    [mount] = container["volumeMounts"]
    assert f"--tls-cert={mount['mountPath']}/tls.crt" in container["args"]
    # The system namespace is never sent to the webhook; only labelled pods are.
    [expression] = hook["namespaceSelector"]["matchExpressions"]
    assert expression["operator"] == "NotIn" and CUSTOM_NAMESPACE in expression["values"]
    assert hook["objectSelector"] == {"matchLabels": {"tritonshare.io/role": "model"}}


def test_with_cert_manager_the_certificate_and_ca_come_from_it() -> None:
    objects = _webhook_objects({"tls": {"certManager": {"enabled": True}}})
    assert "Secret/tritonshare-webhook-tls" not in objects
    certificate = objects["Certificate/tritonshare-webhook"]
    assert certificate["spec"]["secretName"] == "tritonshare-webhook-tls"
    assert f"tritonshare-webhook.{CUSTOM_NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    assert certificate["spec"]["issuerRef"] == {"name": "tritonshare-webhook", "kind": "Issuer"}
    assert objects["Issuer/tritonshare-webhook"]["spec"] == {"selfSigned": {}}
    configuration = objects["MutatingWebhookConfiguration/tritonshare-model-pods"]
    assert configuration["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{CUSTOM_NAMESPACE}/tritonshare-webhook"
    }
    assert "caBundle" not in configuration["webhooks"][0]["clientConfig"]
    own = _webhook_objects(
        {
            "tls": {
                "certManager": {
                    "enabled": True,
                    "issuerRef": {"name": "corp", "kind": "ClusterIssuer"},
                }
            }
        }
    )
    assert "Issuer/tritonshare-webhook" not in own
    assert own["Certificate/tritonshare-webhook"]["spec"]["issuerRef"]["name"] == "corp"


def test_the_webhook_with_cert_manager_is_deploy_webhook() -> None:
    """deploy/webhook (kustomize) is the chart's webhook.enabled with cert-manager TLS, field for
    field (Helm labels aside): one webhook, two ways to install it."""
    kubectl = require_executable("kubectl")
    values = {"webhook": {"enabled": True, "tls": {"certManager": {"enabled": True}}}}
    chart = _by_name(render_chart(values))
    base = _by_name(render_chart())
    rendered = _by_name(render(kubectl, "webhook"))
    assert set(rendered) == set(chart) - set(base)
    for name, obj in rendered.items():
        assert _without_helm_labels(chart[name]) == obj, f"{name} differs from deploy/webhook"


def test_the_gpu_memory_reserve_defaults_to_the_recommended_figure() -> None:
    """The chart and the manifests give the binder agent.gpus.reserve's DEFAULT_RESERVE (not 0,
    which places models on memory Triton itself holds)."""
    kubectl = require_executable("kubectl")
    for objects in (render_chart(), render(kubectl, "overlays/production")):
        [binder] = _the(objects, "Deployment", "tritonshare-binder")["spec"]["template"]["spec"][
            "containers"
        ]
        parsed = parse_binder_settings(list(binder["args"]), {})
        assert parsed.gpu_mem_reserve == DEFAULT_RESERVE
