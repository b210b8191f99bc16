"""The TritonModel CRD: one manifest, served by both the chart and deploy/base, and valid."""

from __future__ import annotations

import re

import kubernetes_validate

from common.contract import is_valid_model_id
from tests.conftest import require_executable
from tests.deploy.rendering import CHART, DEPLOY, chart_crds, render
from tests.deploy.test_manifests import KUBERNETES_VERSION

CRD_NAME = "tritonmodels.tritonshare.io"


def test_the_chart_and_deploy_base_serve_the_same_crd() -> None:
    chart_file = CHART / "crds" / f"{CRD_NAME}.yaml"
    base_file = DEPLOY / "base" / "tritonmodel-crd.yaml"
    assert chart_file.read_bytes() == base_file.read_bytes()
    (crd,) = chart_crds()
    base = render(require_executable("kubectl"), "base")
    rendered = [o for o in base if o["kind"] == crd["kind"]]
    assert rendered == [crd]


def test_the_crd_is_valid_and_shaped_like_a_workload_api() -> None:
    (crd,) = chart_crds()
    for version in (KUBERNETES_VERSION, kubernetes_validate.latest_version()):
        kubernetes_validate.validate(crd, version, strict=True)
    assert crd["metadata"]["name"] == CRD_NAME
    (served,) = crd["spec"]["versions"]
    assert served["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    columns = [c["name"] for c in served["additionalPrinterColumns"]]
    assert columns == [
        "Ready", "Replicas", "GPU-Mem", "Measured", "Residency", "Reason", "Age", "Message"
    ]  # fmt: skip
    # GPU memory as booked and as measured: declared, or learned when spec.gpuMemory is absent.
    by_name = {c["name"]: c["jsonPath"] for c in served["additionalPrinterColumns"]}
    assert by_name["GPU-Mem"] == ".status.gpuMemory.booked"
    assert by_name["Measured"] == ".status.gpuMemory.measured"
    spec = served["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["required"] == ["storageUri"]
    status = served["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert set(status["gpuMemory"]["properties"]) == {
        "source", "booked", "estimate", "measured", "storageUri"
    }  # fmt: skip
    assert spec["properties"]["residency"]["default"] == "always"
    assert spec["properties"]["replicas"] == spec["properties"]["replicas"] | {
        "default": 1,
        "minimum": 0,
    }


def test_namespace_users_manage_tritonmodels_but_never_their_status() -> None:
    """The roles aggregated into Kubernetes' admin, edit and view: a namespace's users create,
    scale and read TritonModels; writing `tritonmodels/status` (tritonshare's alone) is in none."""
    base = render(require_executable("kubectl"), "base")
    aggregated = {
        label.removeprefix("rbac.authorization.k8s.io/aggregate-to-"): obj
        for obj in base
        if obj["kind"] == "ClusterRole"
        for label in obj["metadata"].get("labels", {})
        if label.startswith("rbac.authorization.k8s.io/aggregate-to-")
    }
    assert set(aggregated) == {"admin", "edit", "view"}
    writes = {"create", "update", "patch", "delete", "deletecollection"}
    for role, obj in aggregated.items():
        for rule in obj["rules"]:
            assert rule["apiGroups"] == ["tritonshare.io"]
            if "tritonmodels/status" in rule["resources"]:
                assert not writes & set(rule["verbs"]), f"{role} may write a TritonModel's status"
    (edit_rule,) = aggregated["edit"]["rules"]
    assert {"tritonmodels", "tritonmodels/scale"} == set(edit_rule["resources"])
    assert writes <= set(edit_rule["verbs"])


def test_the_crd_takes_a_model_name_by_the_model_id_grammar_and_keeps_it() -> None:
    """The CRD's rules for spec.modelName (a real API server runs them; the simulated one runs
    no CEL, and the binder refuses the same names) accept exactly the model ids of the
    contract, with messages for people, and refuse a change."""
    (crd,) = chart_crds()
    (served,) = crd["spec"]["versions"]
    field = served["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["modelName"]
    grammar, kept = field["x-kubernetes-validations"]
    assert kept == kept | {"rule": "self == oldSelf"} and "immutable" in kept["message"]
    assert "pattern" not in field and "such as resnet_50" in grammar["message"]
    match = re.fullmatch(r"self\.matches\('(.+)'\) && !self\.startsWith\('\.'\)", grammar["rule"])
    assert match is not None, grammar["rule"]

    def admitted(name: str) -> bool:
        return (
            field["minLength"] <= len(name) <= field["maxLength"]
            and re.search(match.group(1), name) is not None
            and not name.startswith(".")
        )

    names = ["resnet_50", "a", "A.b-c_9", ".hidden", "a/b", "a b", "é", "", "x" * 128, "x" * 129]
    assert [admitted(n) for n in names] == [is_valid_model_id(n) for n in names]
