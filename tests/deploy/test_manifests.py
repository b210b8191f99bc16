"""deploy/ renders with kubectl kustomize, validates against the Kubernetes schemas, locks every
container down, and follows the contract (scheduler name, GPU memory, model id, agent token)."""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs; only the deploy tests use it
import kubernetes_validate
import pytest
import yaml

from binder.settings import parse_settings as parse_binder_settings
from common.contract import (
    DEFAULT_AGENT_AUDIENCE,
    DEFAULT_AGENT_GRPC_PORT,
    DEFAULT_AGENT_HTTP_PORT,
    DEFAULT_GATEWAY_GRPC_PORT,
    DEFAULT_GATEWAY_HTTP_PORT,
    DEFAULT_GATEWAY_METRICS_PORT,
    DEFAULT_PROXY_GRPC_PORT,
    DEFAULT_PROXY_HTTP_PORT,
    DEFAULT_SCHEDULER_NAME,
    DEFAULT_SYSTEM_NAMESPACE,
    Keys,
    validate_model_id,
)
from common.quantity import parse_quantity
from proxy.gateway import budget
from proxy.gateway.settings import parse_settings as gateway_settings
from tests.conftest import require_executable
from tests.deploy.rendering import (
    DEPLOY,
    KUSTOMIZATIONS,
    Obj,
    containers,
    expand,
    name_of,
    pod_spec,
    render,
)
from tests.e2e.test_rbac import grants_for

# The oldest Kubernetes the manifests support: ValidatingAdmissionPolicy v1 and the pod's node name
# in service-account tokens (agent-admission-policy.yaml), and the preStop sleep action.
KUBERNETES_VERSION = "1.30.0"
TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"
KEYS = Keys()
# Ports that daemons commonly listen on in the node's own network namespace (hostNetwork): a
# hostPort on the same number would capture their traffic to the node's IP.
NODE_DAEMON_PORTS = {
    9100: "node-exporter (kube-prometheus-stack)",
    9400: "dcgm-exporter (GPU Operator)",
    10250: "the kubelet",
    10256: "kube-proxy health",
    10249: "kube-proxy metrics",
}


@pytest.fixture(scope="module")
def kubectl() -> str:
    return require_executable("kubectl")


def everything(kubectl: str) -> list[Obj]:
    seen: dict[str, Obj] = {}
    for kustomization in KUSTOMIZATIONS:
        for obj in render(kubectl, kustomization):
            seen.setdefault(name_of(obj), obj)
    return list(seen.values())


def workloads(kubectl: str) -> list[tuple[Obj, Mapping[str, Any]]]:
    return [(obj, spec) for obj in everything(kubectl) if (spec := pod_spec(obj)) is not None]


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_each_kustomization_renders(kubectl: str, kustomization: str) -> None:
    objects = render(kubectl, kustomization)
    assert objects, f"deploy/{kustomization} rendered nothing"
    names = [name_of(o) for o in objects]
    assert len(names) == len(set(names)), f"duplicate objects in deploy/{kustomization}: {names}"


def test_the_production_overlay_holds_the_whole_system(kubectl: str) -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in render(kubectl, "overlays/production")}
    for expected in [
        ("Namespace", DEFAULT_SYSTEM_NAMESPACE),
        ("DaemonSet", "tritonshare-node"),
        ("Deployment", "tritonshare-binder"),
        ("PodDisruptionBudget", "tritonshare-binder"),
        ("ValidatingAdmissionPolicy", "tritonshare-agent-own-node"),
        ("PodMonitor", "tritonshare-model-proxies"),
        ("PodMonitor", "tritonshare-model-hosts"),
        ("PrometheusRule", "tritonshare"),
        ("ConfigMap", "tritonshare-grafana-dashboard"),
    ]:
        assert expected in kinds, f"the production overlay lacks {expected}"


@pytest.mark.parametrize("version", [KUBERNETES_VERSION, kubernetes_validate.latest_version()])
def test_every_builtin_object_validates_against_the_kubernetes_schema(
    kubectl: str, version: str
) -> None:
    """Strictly (unknown fields fail), on the oldest supported and the newest known Kubernetes."""
    validated = 0
    for obj in everything(kubectl):
        if obj["apiVersion"] in CUSTOM_API_VERSIONS:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            pytest.fail(
                f"{name_of(obj)} is invalid for Kubernetes {version} at {path}: {e.message}"
            )
        validated += 1
    assert validated >= 20


# Custom resources have no schema in kubernetes-validate. These check the fields the manifests (and
# the Helm chart) use against the shapes the Prometheus Operator (monitoring.coreos.com/v1) and KEDA
# (keda.sh/v1alpha1) CRDs define, rejecting unknown fields; fields we do not use are not described.
_LABEL_SELECTOR = {
    "type": "object",
    "properties": {"matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}},
    "additionalProperties": False,
}
_POD_MONITOR = {
    "type": "object",
    "required": ["spec"],
    "properties": {
        "spec": {
            "type": "object",
            "required": ["selector", "podMetricsEndpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": _LABEL_SELECTOR,
                "namespaceSelector": {
                    "type": "object",
                    "properties": {"any": {"type": "boolean"}},
                    "additionalProperties": False,
                },
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["port"],
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "relabelings": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {
                                        "sourceLabels": {
                                            "type": "array",
                                            "items": {"type": "string"},
                                        },
                                        "targetLabel": {"type": "string"},
                                    },
                                },
                            },
                        },
                    },
                },
            },
        }
    },
}
_SCALED_OBJECT = {
    "type": "object",
    "required": ["spec"],
    "properties": {
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {"name": {"type": "string"}},
                    "additionalProperties": False,
                },
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "pollingInterval": {"type": "integer"},
                "cooldownPeriod": {"type": "integer"},
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"const": "prometheus"},
                            "metadata": {
                                "type": "object",
                                "required": ["serverAddress", "query", "threshold"],
                                "additionalProperties": {"type": "string"},
                            },
                        },
                    },
                },
            },
        }
    },
}
_DURATION = {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"}
_PROMETHEUS_RULE = {
    "type": "object",
    "required": ["spec"],
    "properties": {
        "spec": {
            "type": "object",
            "required": ["groups"],
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string"},
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["expr"],
                                    # An alerting rule, or a recording one (the operator's
                                    # CRD: Prometheus refuses a rule with both or neither).
                                    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                    "additionalProperties": False,
                                    "properties": {
                                        "alert": {"type": "string"},
                                        "record": {"type": "string"},
                                        "expr": {"type": "string"},
                                        "for": _DURATION,
                                        "labels": {
                                            "type": "object",
                                            "additionalProperties": {"type": "string"},
                                        },
                                        "annotations": {
                                            "type": "object",
                                            "additionalProperties": {"type": "string"},
                                        },
                                    },
                                },
                            },
                        },
                    },
                }
            },
        }
    },
}
# cert-manager's Issuer and Certificate, as far as deploy/webhook uses them (cert-manager.io/v1).
_ISSUER = {
    "type": "object",
    "required": ["spec"],
    "properties": {
        "spec": {
            "type": "object",
            "minProperties": 1,
            "maxProperties": 1,
            "properties": {"selfSigned": {"type": "object"}, "ca": {"type": "object"}},
        }
    },
}
_CERTIFICATE = {
    "type": "object",
    "required": ["spec"],
    "properties": {
        "spec": {
            "type": "object",
            "required": ["secretName", "issuerRef"],
            "properties": {
                "secretName": {"type": "string", "minLength": 1},
                "dnsNames": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                "issuerRef": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string"},
                        "kind": {"enum": ["Issuer", "ClusterIssuer"]},
                    },
                },
            },
        }
    },
}
CRD_SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "PodMonitor"): _POD_MONITOR,
    ("monitoring.coreos.com/v1", "PrometheusRule"): _PROMETHEUS_RULE,
    ("keda.sh/v1alpha1", "ScaledObject"): _SCALED_OBJECT,
    ("cert-manager.io/v1", "Issuer"): _ISSUER,
    ("cert-manager.io/v1", "Certificate"): _CERTIFICATE,
}
CUSTOM_API_VERSIONS = {api_version for api_version, _ in CRD_SCHEMAS}


def check_custom_resource(obj: Mapping[str, Any]) -> None:
    """Fail unless `obj` has the shape its operator's CRD defines (as far as CRD_SCHEMAS says)."""
    schema = CRD_SCHEMAS.get((obj["apiVersion"], obj["kind"]))
    assert schema is not None, f"{name_of(obj)}: no schema for this custom resource kind"
    try:
        jsonschema.validate(obj, schema)
    except jsonschema.ValidationError as e:
        pytest.fail(f"{name_of(obj)}: {e.message} at {list(e.path)}")


def test_custom_resources_have_the_shape_their_operators_expect(kubectl: str) -> None:
    custom = [o for o in everything(kubectl) if o["apiVersion"] in CUSTOM_API_VERSIONS]
    assert {o["kind"] for o in custom} == {
        "PodMonitor",
        "PrometheusRule",
        "ScaledObject",
        "Issuer",
        "Certificate",
    }
    for obj in custom:
        check_custom_resource(obj)
    deployments = {o["metadata"]["name"] for o in everything(kubectl) if o["kind"] == "Deployment"}
    for scaled in (o for o in custom if o["kind"] == "ScaledObject"):
        assert scaled["spec"]["scaleTargetRef"]["name"] in deployments


def test_every_container_is_locked_down(kubectl: str) -> None:
    for obj, spec in workloads(kubectl):
        pod_security = spec.get("securityContext", {})
        assert pod_security.get("runAsNonRoot") is True, f"{name_of(obj)} may run as root"
        assert pod_security.get("seccompProfile", {}).get("type") == "RuntimeDefault"
        for flag in ("hostNetwork", "hostPID", "hostIPC"):
            assert not spec.get(flag), f"{name_of(obj)} sets {flag}"
        for volume in spec.get("volumes", []):
            assert "hostPath" not in volume, f"{name_of(obj)} mounts a hostPath"
        for c in containers(spec):
            where = f"{name_of(obj)} container {c['name']}"
            sc = c.get("securityContext", {})
            assert sc.get("allowPrivilegeEscalation") is False, f"{where} may escalate privileges"
            assert sc.get("readOnlyRootFilesystem") is True, f"{where} has a writable root fs"
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], f"{where} keeps capabilities"
            assert not sc.get("capabilities", {}).get("add"), f"{where} adds capabilities"
            assert not sc.get("privileged"), f"{where} is privileged"
            assert sc.get("runAsUser", pod_security.get("runAsUser", 0)) != 0, f"{where} is root"
            requests = c.get("resources", {}).get("requests", {})
            assert {"cpu", "memory"} <= set(requests), f"{where} lacks cpu/memory requests"
            assert "memory" in c.get("resources", {}).get("limits", {}), f"{where}: no memory limit"


def test_images_are_pinned(kubectl: str) -> None:
    for obj, spec in workloads(kubectl):
        for c in containers(spec):
            image = c["image"]
            tag = image.rsplit(":", 1)[-1] if ":" in image.rsplit("/", 1)[-1] else ""
            assert tag and tag != "latest", f"{name_of(obj)} {c['name']}: {image} is not pinned"


def test_editing_the_overlays_image_tag_upgrades_every_tritonshare_container(
    kubectl: str, tmp_path: Path
) -> None:
    """The production overlay's `images` entry is what pins our image: a new tag there reaches
    the agent, the binder and nothing else."""
    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy)
    kustomization = copy / "overlays" / "production" / "kustomization.yaml"
    overlay = yaml.safe_load(kustomization.read_text())
    overlay["images"][0]["newTag"] = "9.9.9"
    kustomization.write_text(yaml.safe_dump(overlay))
    rendered = subprocess.run(
        [kubectl, "kustomize", str(copy / "overlays" / "production")],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    images = {
        c["name"]: c["image"]
        for obj in yaml.safe_load_all(rendered.stdout)
        if obj and (spec := pod_spec(obj)) is not None
        for c in containers(spec)
    }
    assert images == {
        "triton": TRITON_IMAGE,
        "agent": f"{overlay['images'][0]['newName']}:9.9.9",
        "gateway": f"{overlay['images'][0]['newName']}:9.9.9",
        "binder": f"{overlay['images'][0]['newName']}:9.9.9",
        "nvml-relay": f"{overlay['images'][0]['newName']}:9.9.9",
    }


def _the(kubectl: str, kind: str, name: str) -> Obj:
    found = [o for o in everything(kubectl) if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def test_the_node_daemonset_runs_a_restricted_explicit_triton_on_gpu_nodes(kubectl: str) -> None:
    ds = _the(kubectl, "DaemonSet", "tritonshare-node")
    spec = ds["spec"]["template"]["spec"]
    assert ds["metadata"]["namespace"] == DEFAULT_SYSTEM_NAMESPACE
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms and all(t["matchExpressions"] for t in terms), "limited to GPU nodes"
    by_name = {c["name"]: c for c in spec["containers"]}
    triton, agent = by_name["triton"], by_name["agent"]
    assert triton["image"] == TRITON_IMAGE
    args = triton["args"]
    assert "--model-control-mode=explicit" in args
    for flag in ("--http-restricted-api=", "--grpc-restricted-protocol="):
        [restricted] = [a for a in args if a.startswith(flag)]
        apis, _, header = restricted.removeprefix(flag).partition(":")
        assert set(apis.split(",")) == {"model-repository", "shared-memory", "trace", "logging"}
        assert re.fullmatch(r"[a-z-]+=\$\([A-Z_]+\)", header), f"bad restriction {header!r}"
    # Triton's inference listens on the pod's loopback: the gateway beside it is the one way in.
    assert {"--http-address=127.0.0.1", "--grpc-address=127.0.0.1"} <= set(args)
    gateway = by_name["gateway"]
    assert "--triton-http-url=127.0.0.1:8000" in gateway["args"]
    assert "--triton-grpc-url=127.0.0.1:8001" in gateway["args"]
    # Tenants reach no metrics port through the node; only the gateway and the agent's gRPC.
    ports = [p for c in spec["containers"] for p in c["ports"]]
    host_ports = {p["containerPort"] for p in ports if "hostPort" in p}
    assert host_ports == {
        DEFAULT_GATEWAY_HTTP_PORT,
        DEFAULT_GATEWAY_GRPC_PORT,
        DEFAULT_AGENT_GRPC_PORT,
    }
    assert not any(p["containerPort"] in (8000, 8001) for p in ports)
    # The caller table: written by the agent, read-only for the gateway, mounted by no one else.
    [table] = [a for a in agent["args"] if a.startswith("--gateway-table=")]
    [read] = [a for a in gateway["args"] if a.startswith("--caller-table=")]
    assert table.partition("=")[2] == read.partition("=")[2]
    mounts = {c["name"]: m for c in spec["containers"] for m in c.get("volumeMounts", [])
              if m["name"] == "gateway-callers"}  # fmt: skip
    assert set(mounts) == {"agent", "gateway"}
    assert mounts["gateway"]["readOnly"] is True and not mounts["agent"].get("readOnly")
    taken = host_ports & set(NODE_DAEMON_PORTS)
    assert not taken, f"hostPorts {taken} collide with {[NODE_DAEMON_PORTS[p] for p in taken]}"
    # Triton reads the repository the agent writes, through a read-only mount of the same volume.
    [triton_repo] = [m for m in triton["volumeMounts"] if m["name"] == "repository"]
    [agent_repo] = [m for m in agent["volumeMounts"] if m["name"] == "repository"]
    assert triton_repo["readOnly"] is True and not agent_repo.get("readOnly")
    assert f"--model-repository={triton_repo['mountPath']}" in args
    assert f"--model-repository={agent_repo['mountPath']}/{triton_repo['subPath']}" in agent["args"]


def test_the_gateways_memory_limit_holds_its_worst_case_from_its_flags(kubectl: str) -> None:
    """docs/proxy.md, "Worst-case memory": the limit holds the base, twice the node's byte budget
    and the slack, however many pods call, with the flags the manifest gives (the chart's
    defaults render the same)."""
    ds = _the(kubectl, "DaemonSet", "tritonshare-node")
    [gateway] = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "gateway"]
    settings = gateway_settings(gateway["args"], {})
    limit = parse_quantity(gateway["resources"]["limits"]["memory"])
    assert budget.worst_case(settings) <= limit
    # The budget is not arbitrary: four pods at their own worst would pass the limit without it,
    # and the flag's default is what the manifest runs.
    assert 4 * budget.per_pod(settings) > limit
    assert (
        settings.max_buffered_bytes
        == gateway_settings(["--caller-table=/t"], {}).max_buffered_bytes
    )
    # The limit is not arbitrary either: without the manifest's connection bound one pod alone
    # (at the flag's default) could take it.
    assert budget.per_pod(gateway_settings(["--caller-table=/t"], {})) > limit


def test_the_node_pod_admits_only_model_pods_and_monitoring(kubectl: str) -> None:
    policy = _the(kubectl, "NetworkPolicy", "tritonshare-node")
    ds = _the(kubectl, "DaemonSet", "tritonshare-node")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= (
        ds["spec"]["template"]["metadata"]["labels"].items()
    )
    model_rule, monitoring_rule = policy["spec"]["ingress"]
    assert model_rule["from"][0]["podSelector"]["matchLabels"] == {"tritonshare.io/role": "model"}
    assert {p["port"] for p in model_rule["ports"]} == {
        DEFAULT_GATEWAY_HTTP_PORT,
        DEFAULT_GATEWAY_GRPC_PORT,
        DEFAULT_AGENT_GRPC_PORT,
    }
    assert {p["port"] for p in monitoring_rule["ports"]} == {
        8002,
        DEFAULT_GATEWAY_METRICS_PORT,
        DEFAULT_AGENT_HTTP_PORT,
    }


def test_the_binder_runs_two_replicas_with_a_disruption_budget(kubectl: str) -> None:
    binder = _the(kubectl, "Deployment", "tritonshare-binder")
    pdb = _the(kubectl, "PodDisruptionBudget", "tritonshare-binder")
    assert binder["spec"]["replicas"] >= 2
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= (
        binder["spec"]["template"]["metadata"]["labels"].items()
    )


def _binder_grants_and_moves(objects: tuple[Obj, ...]) -> tuple[bool, int]:
    """Whether the binder's ClusterRole may create pods/eviction, and its --consolidate-moves."""
    [role] = [o for o in objects if name_of(o) == "ClusterRole/-/tritonshare-binder"]
    evicts = any(
        "pods/eviction" in rule.get("resources", []) and "create" in rule.get("verbs", [])
        for rule in role["rules"]
    )
    [deployment] = [
        o for o in objects if name_of(o) == "Deployment/tritonshare-system/tritonshare-binder"
    ]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return evicts, parse_binder_settings(container["args"], {}).consolidate_moves


def test_the_binder_evicts_for_preemption_everywhere_and_consolidates_only_where_asked(
    kubectl: str,
) -> None:
    """Preemption (on by default, as kube-scheduler's) needs eviction in every overlay; the
    consolidation overlay adds only the flag that turns consolidation on."""
    assert _binder_grants_and_moves(render(kubectl, "base")) == (True, 0)
    assert _binder_grants_and_moves(render(kubectl, "overlays/production")) == (True, 0)
    assert _binder_grants_and_moves(render(kubectl, "overlays/consolidation")) == (True, 4)


def test_only_the_node_autoscaling_overlay_lets_the_binder_patch_nodes(kubectl: str) -> None:
    """The overlay adds the flag, the placeholders' PriorityClass and patch on nodes, bound to
    the binder alone; the base grants no node write."""

    def grants(objects: tuple[Obj, ...]) -> set[tuple[str, str, str]]:
        return {
            (g.api_group, g.resource, g.verb) for g in grants_for("tritonshare-binder", objects)
        }

    base = render(kubectl, "base")
    overlay = render(kubectl, "overlays/node-autoscaling")
    assert grants(overlay) - grants(base) == {("", "nodes", "patch")}
    [deployment] = [
        o for o in overlay if name_of(o) == "Deployment/tritonshare-system/tritonshare-binder"
    ]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert parse_binder_settings(container["args"], {}).node_autoscaling
    assert "PriorityClass/-/tritonshare-placeholder" in {name_of(o) for o in overlay}


def test_the_example_model_follows_the_contract(kubectl: str) -> None:
    deployment = _the(kubectl, "Deployment", "add-one")
    template = deployment["spec"]["template"]
    spec = template["spec"]
    assert spec["schedulerName"] == DEFAULT_SCHEDULER_NAME
    validate_model_id(template["metadata"]["annotations"][KEYS.model_id])
    assert template["metadata"]["labels"]["tritonshare.io/role"] == "model"
    limits = [c["resources"].get("limits", {}).get(KEYS.gpu_mem) for c in spec["containers"]]
    assert [parse_quantity(q) for q in limits if q] == [1024**3]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    # Any cluster runs it: no label only some clouds' GPU nodes carry.
    assert "nodeSelector" not in spec and "affinity" not in spec
    init_names = [c["name"] for c in spec["initContainers"]]
    assert init_names == ["model-files", "loader"], "the model must be fetched, then loaded"
    # The token the loader and proxy present to the agent: projected, with the agent's audience.
    [token_volume] = [v for v in spec["volumes"] if v["name"] == "agent-token"]
    [source] = token_volume["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == DEFAULT_AGENT_AUDIENCE
    proxy = next(c for c in spec["containers"] if c["name"] == "proxy")
    assert proxy["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert proxy["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert "preStop" in proxy["lifecycle"]
    assert spec["terminationGracePeriodSeconds"] >= 30
    for c in spec["containers"] + spec["initContainers"][1:]:
        env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
        assert env["HOST_IP"] == "status.hostIP"
        assert env["MODEL_ID"] == f"metadata.annotations['{KEYS.model_id}']"
    service = _the(kubectl, "Service", "add-one")
    port_names = {p["name"] for p in proxy["ports"]}
    assert {p["port"] for p in service["spec"]["ports"]} == {
        DEFAULT_PROXY_HTTP_PORT,
        DEFAULT_PROXY_GRPC_PORT,
    }
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names


def test_model_pods_have_no_kubernetes_api_access(kubectl: str) -> None:
    deployment = _the(kubectl, "Deployment", "add-one")
    spec = deployment["spec"]["template"]["spec"]
    account = _the(kubectl, "ServiceAccount", spec["serviceAccountName"])
    assert account["automountServiceAccountToken"] is False
    assert spec["automountServiceAccountToken"] is False
    bound = {
        s["name"]
        for o in everything(kubectl)
        if o["kind"] in ("RoleBinding", "ClusterRoleBinding")
        for s in o["subjects"]
    }
    assert spec["serviceAccountName"] not in bound


def _part_of(container: Mapping[str, Any]) -> str | None:
    command = container.get("command", [])
    if command[:2] == ["python", "-m"] and len(command) == 3:
        return str(command[2])
    return None


def test_every_part_accepts_the_arguments_the_manifests_give_it(kubectl: str) -> None:
    """Each `python -m <part>` container's args parse with that part's own settings parser."""
    downward = {"NODE_NAME": "gpu-node-1", "HOST_IP": "10.0.0.5", "MODEL_ID": "add_one"}
    checked: set[str] = set()
    missing: list[str] = []
    for obj, spec in workloads(kubectl):
        for c in containers(spec):
            part = _part_of(c)
            if part is None:
                continue
            try:
                settings = importlib.import_module(f"{part}.settings")
            except ModuleNotFoundError:
                missing.append(part)
                continue
            args = [expand(a, downward) for a in c.get("args", [])]
            env = {
                e["name"]: expand(e["value"], downward | {"TRITON_ADMIN_KEY": "secret"})
                for e in c.get("env", [])
                if "value" in e and e["name"].startswith("TRITONSHARE_")
            }
            try:
                parsed = settings.parse_settings(args, env)
            except Exception as e:
                pytest.fail(f"{name_of(obj)} container {c['name']}: {part} refuses {args}: {e}")
            if part == "agent":
                # The same header name Triton's --http-restricted-api names, with the same key.
                assert parsed.triton_admin_header == ("tritonshare-admin-key", "secret")
            checked.add(part)
    if missing:
        pytest.skip(f"parts without a settings module yet: {sorted(set(missing))}")
    assert checked == {"agent", "binder", "loader", "proxy", "proxy.gateway", "webhook"}


def _doc_block(starting: str) -> str:
    """The ```sh block of docs/deploy.md whose first line is `starting`."""
    text = (DEPLOY.parent / "docs" / "deploy.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL)
    [block] = [b for b in blocks if b.startswith(starting)]
    return str(block)


def test_the_documented_overlay_moves_monitoring_to_another_namespace(
    kubectl: str, tmp_path: Path
) -> None:
    """docs/deploy.md's own commands (your overlay, then the monitoring patches), pasted in order
    into one shell with `kubectl apply -k` as `kubectl kustomize`, render with the installed
    kubectl, and move what names the monitoring namespace and release."""
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    patches = _doc_block("N='namespaceSelector/")
    assert "kubectl apply -k my-cluster" in patches
    script = _doc_block("mkdir -p my-cluster\n") + patches.replace(
        "kubectl apply -k", f"{kubectl} kustomize"
    )
    rendered = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    objects = {name_of(o): o for o in yaml.safe_load_all(rendered.stdout) if o}
    assert "ConfigMap/observability/tritonshare-grafana-dashboard" in objects
    for name in ("tritonshare-node", "tritonshare-binder"):
        policy = objects[f"NetworkPolicy/tritonshare-system/{name}"]
        named = {
            peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
            for rule in policy["spec"]["ingress"]
            for peer in rule["from"]
            if "matchLabels" in peer.get("namespaceSelector", {})
        }
        assert named == {"observability"}, f"{name} admits {named}"
    selected = [o for o in objects.values() if o["kind"] in ("PodMonitor", "PrometheusRule")]
    assert len(selected) == 6
    for obj in selected:  # the four PodMonitors and the two rules: what Prometheus selects
        assert obj["metadata"]["labels"]["release"] == "prometheus", name_of(obj)
    images = {c["image"] for o in objects.values() if (s := pod_spec(o)) for c in containers(s)}
    assert "registry.example.com/tritonshare:0.1.0" in images


def test_every_mount_names_a_volume_of_its_pod_and_every_volume_is_mounted(kubectl: str) -> None:
    """The schema cannot see it: a mount of a missing volume fails only when the pod is created,
    and a volume nothing mounts is left over from an edit."""
    for obj, spec in workloads(kubectl):
        volumes = {v["name"] for v in spec.get("volumes", [])}
        mounted = {m["name"] for c in containers(spec) for m in c.get("volumeMounts", [])}
        assert mounted <= volumes, f"{name_of(obj)} mounts {sorted(mounted - volumes)}, no volume"
        assert volumes <= mounted, f"{name_of(obj)} mounts none of {sorted(volumes - mounted)}"


def test_the_documented_overlay_moves_the_image_the_webhook_writes_into_model_pods(
    kubectl: str, tmp_path: Path
) -> None:
    """deploy.md's overlay, with deploy/webhook added: its `images:` alone moves the image the
    webhook writes into model pods (TRITONSHARE_IMAGE) with the webhook's own."""
    (tmp_path / "deploy").symlink_to(DEPLOY)
    subprocess.run(
        ["bash", "-euo", "pipefail", "-c", _doc_block("mkdir -p my-cluster\n")],
        cwd=tmp_path, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    overlay = tmp_path / "my-cluster" / "kustomization.yaml"
    overlay.write_text(
        overlay.read_text().replace("resources:\n", "resources:\n- ../deploy/webhook\n")
    )
    rendered = subprocess.run(
        [kubectl, "kustomize", str(overlay.parent)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    [webhook] = [
        o
        for o in yaml.safe_load_all(rendered.stdout)
        if o and o["kind"] == "Deployment" and o["metadata"]["name"] == "tritonshare-webhook"
    ]
    [container] = webhook["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example.com/tritonshare:0.1.0"
    env = {var["name"]: var["value"] for var in container["env"]}
    assert env["TRITONSHARE_IMAGE"] == "registry.example.com/tritonshare:0.1.0"
