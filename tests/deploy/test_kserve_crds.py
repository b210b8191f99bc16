"""KServe's CRDs for a cluster without KServe (deploy/kserve-crds, the chart's kserveCRDs.install):
one manifest for both, valid, off in the chart by default and kept by Helm on uninstall, served
by the simulated API server (tests/binder/inferenceservices loads the same file), with the roles
the namespaces' users need."""

from __future__ import annotations

from typing import Any

import helm_python
import kubernetes_validate

from tests.conftest import require_executable
from tests.deploy.rendering import CHART, render
from tests.deploy.test_chart import render_chart
from tests.deploy.test_manifests import KUBERNETES_VERSION

NAMES = {
    "inferenceservices.serving.kserve.io",
    "servingruntimes.serving.kserve.io",
    "clusterservingruntimes.serving.kserve.io",
}


ROLES = {"tritonshare-kserve-edit", "tritonshare-kserve-view"}


def _by_name(objects: Any) -> dict[str, Any]:
    return {o["metadata"]["name"]: o for o in objects if o["metadata"]["name"] in NAMES}


def _roles(objects: Any) -> dict[str, Any]:
    return {
        o["metadata"]["name"]: o["rules"]
        for o in objects
        if o["kind"] == "ClusterRole" and o["metadata"]["name"] in ROLES
    }


def test_the_crds_are_valid_and_serve_the_versions_the_binder_reads() -> None:
    crds = _by_name(render(require_executable("kubectl"), "kserve-crds"))
    assert set(crds) == NAMES
    for crd in crds.values():
        for version in (KUBERNETES_VERSION, kubernetes_validate.latest_version()):
            kubernetes_validate.validate(crd, version, strict=True)
    served = {
        c["spec"]["names"]["kind"]: ([v["name"] for v in c["spec"]["versions"]], c["spec"]["scope"])
        for c in crds.values()
    }
    assert served == {
        "InferenceService": (["v1beta1"], "Namespaced"),
        "ServingRuntime": (["v1alpha1"], "Namespaced"),
        "ClusterServingRuntime": (["v1alpha1"], "Cluster"),
    }
    (isvc,) = crds["inferenceservices.serving.kserve.io"]["spec"]["versions"]
    assert isvc["subresources"] == {"status": {}}, "the binder writes inferenceservices/status"


def test_the_namespaces_users_get_them_as_kserves_roles_give_them() -> None:
    roles = _roles(render(require_executable("kubectl"), "kserve-crds"))
    assert set(roles) == ROLES
    for rules in roles.values():
        for rule in rules:
            assert "clusterservingruntimes" not in rule["resources"]
            if "inferenceservices/status" in rule["resources"]:
                assert set(rule["verbs"]) == {"get", "list", "watch"}


def test_the_chart_installs_them_only_when_asked_and_keeps_them() -> None:
    assert _by_name(render_chart()) == {}
    assert _roles(render_chart()) == {}
    chart = render_chart({"kserveCRDs": {"install": True}})
    installed = _by_name(chart)
    assert _roles(chart) == _roles(render(require_executable("kubectl"), "kserve-crds"))
    files = _by_name(render(require_executable("kubectl"), "kserve-crds"))
    assert set(installed) == NAMES
    for name, ours in installed.items():
        meta = dict(ours["metadata"])
        assert meta.pop("annotations") == {"helm.sh/resource-policy": "keep"}
        assert {**ours, "metadata": meta} == files[name]


def test_the_chart_lints_clean_with_them() -> None:
    values = {"kserveCRDs": {"install": True}}
    report = helm_python.lint(CHART, values, strict=True, kube_version=f"v{KUBERNETES_VERSION}")
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    assert not problems
