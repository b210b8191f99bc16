"""Render deploy/'s kustomizations with `kubectl kustomize`, and charts/tritonshare with Helm's own
engine (helm-python-sdk, no helm binary), and walk the objects they produce.

Shared by the deploy tests. Rendering uses whatever `kubectl` is installed; the kustomizations use
`resources` directories and `patches`, which need kubectl 1.21 or newer (kustomize v4 and v5):
Debian 12's kubernetes-client (1.20, kustomize v2.0) is too old, and the failure says so.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import helm_python
import yaml
from helm_python import _native

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
CHART = REPO / "charts" / "tritonshare"
RELEASE = "tritonshare"
KUSTOMIZATIONS = (
    "base",
    "monitoring",
    "example",
    "webhook",
    "overlays/example-keda",
    "overlays/production",
    "overlays/consolidation",
    "overlays/node-autoscaling",
    "overlays/triton-pool",
)

Obj = dict[str, Any]

# The API versions of a cluster with the CRDs the chart can use (the Prometheus Operator, KEDA,
# cert-manager), as `helm install` discovers them and `helm template --api-versions` gives them.
# The chart renders their objects only where the cluster has them.
OPTIONAL_API_VERSIONS = (
    "monitoring.coreos.com/v1",
    "monitoring.coreos.com/v1/PodMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
    "keda.sh/v1alpha1",
    "keda.sh/v1alpha1/ScaledObject",
    "cert-manager.io/v1",
)


@cache
def render(kubectl: str, kustomization: str) -> tuple[Obj, ...]:
    """The objects `kubectl kustomize deploy/<kustomization>` prints, in order."""
    result = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / kustomization)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    too_old = "must be a file" in result.stderr or "patchesStrategicMerge" in result.stderr
    hint = (
        "\n(this kubectl's kustomize is older than v4: use kubectl 1.21 or newer)"
        if too_old
        else ""
    )
    assert result.returncode == 0, (
        f"kubectl kustomize deploy/{kustomization} failed:\n{result.stderr}{hint}"
    )
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def render_templates(
    values: Mapping[str, Any] | None = None,
    *,
    namespace: str = "tritonshare-system",
    release: str = RELEASE,
    chart: Path = CHART,
    api_versions: Sequence[str] = OPTIONAL_API_VERSIONS,
) -> dict[str, str]:
    """Each template's text as `helm template RELEASE charts/tritonshare -n NAMESPACE
    --api-versions ...` renders it with `values` over the chart's defaults (NOTES.txt included).
    `api_versions` are the cluster's besides the built-in ones (by default those of a cluster with
    every optional CRD; empty: a bare cluster).

    Rendering is offline: Helm's `lookup` finds nothing, as in `helm template`."""
    with helm_python.Chart.load(chart) as loaded:
        loaded.validate_schema(dict(values or {}))
        # Chart.render has no api_versions argument; the native render it wraps takes them
        # (Helm's ReleaseOptions' capabilities), as `helm template --api-versions` does.
        options = {
            "name": release,
            "namespace": namespace,
            "is_install": True,
            "api_versions": list(api_versions),
        }
        manifests: dict[str, str] = json.loads(
            _native.call_string(
                "helm_render", loaded._raw(), json.dumps(dict(values or {})), json.dumps(options)
            )
        )
    return manifests


def render_chart(
    values: Mapping[str, Any] | None = None,
    *,
    namespace: str = "tritonshare-system",
    release: str = RELEASE,
    chart: Path = CHART,
    api_versions: Sequence[str] = OPTIONAL_API_VERSIONS,
    include_crds: bool = False,
) -> tuple[Obj, ...]:
    """The objects `render_templates` renders, template by template in file name order
    (NOTES.txt left out); with `include_crds`, the chart's crds/ first, as `helm template
    --include-crds` prints them (Helm installs them as they are, untemplated)."""
    manifests = render_templates(
        values, namespace=namespace, release=release, chart=chart, api_versions=api_versions
    )
    objects: list[Obj] = list(chart_crds(chart)) if include_crds else []
    for template in sorted(manifests):
        if template.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(manifests[template]) if doc)
    return tuple(objects)


def chart_crds(chart: Path = CHART) -> tuple[Obj, ...]:
    """The CustomResourceDefinitions in the chart's crds/ folder, in file name order."""
    objects: list[Obj] = []
    for path in sorted((chart / "crds").glob("*.yaml")):
        objects.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return tuple(objects)


def name_of(obj: Mapping[str, Any]) -> str:
    """kind/namespace/name, for messages."""
    meta = obj.get("metadata", {})
    return f"{obj.get('kind')}/{meta.get('namespace', '-')}/{meta.get('name')}"


def pod_spec(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod template's spec of a workload object, or None for other kinds."""
    kind = obj.get("kind")
    if kind == "Pod":
        spec: Mapping[str, Any] = obj["spec"]
        return spec
    if kind in ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"):
        template: Mapping[str, Any] = obj["spec"]["template"]["spec"]
        return template
    return None


def containers(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Init containers, then main containers."""
    yield from spec.get("initContainers", [])
    yield from spec.get("containers", [])


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of a container argument, for the variables given."""
    for key, replacement in env.items():
        value = value.replace(f"$({key})", replacement)
    return value
