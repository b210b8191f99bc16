"""Every shipped manifest and chart variant passes Pod Security admission at the level its
namespace declares, on the simulated API server (which enforces it as kube-apiserver does): each
rendered Namespace is created with its labels, then a pod from each workload's template, through
the official client. The node pod's host ports are the one thing in the system namespace beyond
`restricted` (its `warn` level says so once); the binder and the webhook pass `restricted`; Helm's
namespace is labelled as the docs say, and the same as kustomize's."""

from __future__ import annotations

import copy
import json
import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

import kubernetes.client
import pytest
import yaml

from binder.tritonmodels.hostpod import host_spec
from common.contract import DEFAULT_SYSTEM_NAMESPACE, Keys
from common.modelpod import NodeAccess
from sim.apiserver import start_in_thread
from sim.apiserver.admission.podsecurity import policy_of
from sim.apiserver.admission.podsecuritystandards import LATEST, evaluate
from tests.conftest import require_executable
from tests.deploy.rendering import (
    CHART,
    DEPLOY,
    KUSTOMIZATIONS,
    REPO,
    Obj,
    name_of,
    render,
    render_chart,
    render_templates,
)
from tests.deploy.test_chart_gpu_access import POOLS
from tests.fixtures_sim import core_v1
from webhook.mutation import complete
from webhook.settings import Settings as WebhookSettings

PSA = "pod-security.kubernetes.io/"
WORKLOAD_KINDS = ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job")
NODE_POD_WARNING = (
    'would violate PodSecurity "restricted:latest": hostPort (containers "agent", "gateway" use'
    " hostPorts 8010, 8011, 8100)"
)
CHART_VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "pools": {"node": {"pools": POOLS}},
    "dra": {"node": {"gpuAccess": "dra"}},
    "env": {"node": {"gpuAccess": "env"}},
    "tenant code": {"agent": {"tenantCodeNamespaces": ["models"]}},
    "webhook and example": {
        "webhook": {"enabled": True},
        "example": {"enabled": True, "keda": {"enabled": True}},
    },
}
DOCUMENTS = ("docs/deploy.md", "docs/quickstart.md", "charts/tritonshare/README.md")


def shipped_labels() -> dict[str, str]:
    """deploy/base/namespace.yaml's Pod Security labels."""
    namespace = yaml.safe_load((DEPLOY / "base" / "namespace.yaml").read_text())
    labels = namespace["metadata"].get("labels") or {}
    return {k: v for k, v in labels.items() if k.startswith(PSA)}


def label_commands(text: str) -> list[dict[str, str]]:
    """The labels of each `kubectl label namespace ...` command in `text` (continuations
    joined)."""
    text = text.replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        start = line.find("kubectl label namespace")
        if start < 0:
            continue
        words = shlex.split(line[start:].split("#")[0])
        pairs = (w.split("=", 1) for w in words if "=" in w and not w.startswith("-"))
        found.append({key: value for key, value in pairs})
    return found


def _workload_pods(objects: Iterable[Obj]) -> list[tuple[str, Obj]]:
    """(namespace, pod) for each workload's template, as its controller would create it."""
    pods = []
    for obj in objects:
        if obj.get("kind") not in WORKLOAD_KINDS:
            continue
        template = copy.deepcopy(obj["spec"]["template"])
        metadata = template.get("metadata") or {}
        metadata["name"] = obj["metadata"]["name"]
        pods.append(
            (
                obj["metadata"].get("namespace") or "default",
                {"metadata": metadata, "spec": template["spec"]},
            )
        )
    return pods


def _warnings(headers: Mapping[str, Any]) -> list[str]:
    values = headers.getlist("Warning") if hasattr(headers, "getlist") else []
    return [v[7:-1].replace('\\"', '"') for v in values]


def apply_pods(
    objects: Iterable[Obj], namespace_labels: Mapping[str, Mapping[str, str]]
) -> dict[str, list[str]]:
    """Create the namespaces (with `namespace_labels`, and each rendered Namespace's own),
    PriorityClasses, then each workload's pod, in a fresh simulated API server; each pod's
    warnings by `namespace/name`. A refused pod fails the test with the server's message."""
    objects = list(objects)
    labels = {name: dict(given) for name, given in namespace_labels.items()}
    for obj in objects:
        if obj["kind"] == "Namespace":
            labels[obj["metadata"]["name"]] = obj["metadata"].get("labels") or {}
    pods = _workload_pods(objects)
    assert pods, "nothing to check: no workloads rendered"
    warnings: dict[str, list[str]] = {}
    with start_in_thread() as server:
        api = server.api_client()
        try:
            core = core_v1(api)
            for namespace in sorted({ns for ns, _ in pods} | set(labels)):
                body = {"metadata": {"name": namespace, "labels": labels.get(namespace, {})}}
                if namespace in ("default", DEFAULT_SYSTEM_NAMESPACE):
                    core.patch_namespace(namespace, body)
                else:
                    core.create_namespace(body)
            for obj in objects:
                if obj["kind"] == "PriorityClass":
                    scheduling: Any = kubernetes.client.SchedulingV1Api(api)
                    scheduling.create_priority_class(obj)
            for namespace, pod in pods:
                key = f"{namespace}/{pod['metadata']['name']}"
                try:
                    response = core.create_namespaced_pod(namespace, pod, _preload_content=False)
                except kubernetes.client.ApiException as e:
                    message = json.loads(e.body or "{}").get("message", e.reason)
                    pytest.fail(f"the pod of {key} is refused: {message}")
                warnings[key] = _warnings(response.headers)
        finally:
            api.close()  # type: ignore[no-untyped-call]
    return warnings


def _check_system_namespace(warnings: dict[str, list[str]]) -> set[str]:
    """Only the node pods go beyond restricted there, and only by their host ports; the pods
    checked there."""
    system = {k: v for k, v in warnings.items() if k.startswith(DEFAULT_SYSTEM_NAMESPACE + "/")}
    for key, given in system.items():
        if key.startswith(f"{DEFAULT_SYSTEM_NAMESPACE}/tritonshare-node"):
            assert given == [NODE_POD_WARNING], key
        else:
            assert given == [], f"{key} goes beyond restricted: {given}"
    others = {k: v for k, v in warnings.items() if v and k not in system}
    assert not others, f"pods beyond their namespace's warn level: {others}"
    return {k.partition("/")[2] for k in system}


@pytest.fixture(scope="module")
def kubectl() -> str:
    return require_executable("kubectl")


@pytest.mark.parametrize("kustomization", [*KUSTOMIZATIONS, "overlays/dra"])
def test_each_kustomization_passes_its_namespaces_pod_security(
    kubectl: str, kustomization: str
) -> None:
    base = {name_of(o): o for o in render(kubectl, "base")}
    namespaces = {
        o["metadata"]["name"]: o["metadata"].get("labels") or {}
        for o in base.values()
        if o["kind"] == "Namespace"
    }
    objects = render(kubectl, kustomization)
    if not any(o["kind"] in WORKLOAD_KINDS for o in objects):
        pytest.skip(f"deploy/{kustomization} has no workloads")
    priority_classes = [o for o in base.values() if o["kind"] == "PriorityClass"]
    rendered = {name_of(o) for o in objects}
    extra = [o for o in priority_classes if name_of(o) not in rendered]
    checked = _check_system_namespace(apply_pods([*objects, *extra], namespaces))
    if kustomization in ("base", "overlays/production"):
        assert {"tritonshare-node", "tritonshare-binder"} <= checked


def documented_labels(text: str) -> list[dict[str, str]]:
    """The Pod Security labels each documented way of making Helm's namespace gives it:
    `kubectl apply -f deploy/base/namespace.yaml` (the shipped labels) or `kubectl label
    namespace ...`."""
    applied = [shipped_labels()] if "kubectl apply -f deploy/base/namespace.yaml" in text else []
    return applied + label_commands(text)


@pytest.mark.parametrize("variant", CHART_VARIANTS)
def test_each_chart_variant_passes_in_a_namespace_labelled_as_documented(variant: str) -> None:
    labels = documented_labels((REPO / "docs" / "deploy.md").read_text())
    assert labels, "docs/deploy.md does not say how to label Helm's namespace"
    objects = render_chart(CHART_VARIANTS[variant])
    checked = _check_system_namespace(apply_pods(objects, {DEFAULT_SYSTEM_NAMESPACE: labels[0]}))
    assert {"tritonshare-node", "tritonshare-binder"} <= checked
    if variant == "webhook and example":
        assert "tritonshare-webhook" in checked


def test_every_documented_label_command_labels_as_kustomize_does() -> None:
    shipped = shipped_labels()
    policy = policy_of(shipped)
    # The node pod's host ports need `privileged`; everything else there is held to restricted.
    assert (policy.enforce.level, policy.warn.level, policy.audit.level) == (
        "privileged",
        "restricted",
        "restricted",
    )
    texts = {path: (REPO / path).read_text() for path in DOCUMENTS}
    texts["NOTES.txt"] = next(v for k, v in render_templates().items() if k.endswith("NOTES.txt"))
    for where, text in texts.items():
        commands = documented_labels(text)
        assert commands, f"{where} does not say how to label Helm's namespace"
        for command in commands:
            assert command == shipped, f"{where} labels the namespace {command}, not {shipped}"
    assert not re.search(r"enforce=restricted", (CHART / "README.md").read_text())


def test_the_pods_tritonshare_writes_pass_restricted() -> None:
    """A model host as the binder builds it (a storage Secret mounted), and pods the webhook
    completes (a bare short form, a Deployment's placeholder, a pvc:// model) as the API server
    hands them over: their securityContext defaulted to {}."""
    access = NodeAccess(8100, 8010, 8011, "tritonshare-agent")
    host = host_spec("gpu-1", "tritonshare", "tritonshare:test", access, Keys(), 2, ["creds"])
    pods: list[tuple[str, Any, Any]] = [("model host", {}, host)]
    for name, uri, containers in [
        ("short form", "https://models.example.com/a.tar.gz", []),
        ("placeholder", "s3://bucket/a", [{"name": "proxy", "image": "registry.example.com/ts"}]),
        ("pvc", "pvc://claim/models/a", []),
    ]:
        annotations = {"tritonshare.io/model-uri": uri, "tritonshare.io/gpu-mem": "1Gi"}
        written = {
            "metadata": {"labels": {"tritonshare.io/role": "model"}, "annotations": annotations},
            "spec": {"containers": containers, "securityContext": {}},
        }
        done = complete(written, WebhookSettings())
        pods.append((name, done["metadata"], done["spec"]))
    for name, metadata, spec in pods:
        assert evaluate("restricted", LATEST, metadata, spec) == [], name
