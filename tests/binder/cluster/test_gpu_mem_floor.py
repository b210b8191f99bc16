"""A model asks at least `--min-gpu-mem` of GPU memory, so a GPU-memory quota bounds what a
namespace loads: a TritonModel or a model pod asking one byte is placed nowhere and says why,
against the simulated API server serving the chart's CRD, through the official client. The CRD
carries the same floor as a validation rule for real API servers (the simulated one runs no CEL)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from binder.app import Binder
from binder.cluster.modelviews import model_from_api
from common.contract import DEFAULT_MIN_GPU_MEM, MIN_GPU_MEM
from common.quantity import parse_quantity
from tests.binder.objects import KEYS
from tests.binder.simcluster import add_pod, eventually, node_of, scheduled_condition
from tests.binder.tritonmodels.test_tritonmodels import (  # noqa: F401 (fixtures)
    GROUP,
    PLURAL,
    VERSION,
    apiserver,
    binder,
    custom,
    hosts,
    model,
    placed,
    read,
)
from tests.deploy.rendering import CHART


def _refused(models: Any, name: str) -> dict[str, Any] | None:
    status = read(models, name).get("status") or {}
    for condition in status.get("conditions") or []:
        if condition["type"] == "Placed" and condition["status"] == "False":
            return dict(condition)
    return None


async def test_a_one_byte_tritonmodel_is_refused_at_create_and_the_floor_is_placed(
    binder: Binder,  # noqa: F811 (the fixtures imported above)
    custom: Any,  # noqa: F811
) -> None:
    with pytest.raises(ApiException) as refused:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, model("tiny", 3, "1")
        )
    assert refused.value.status == 422
    assert f"must be at least {DEFAULT_MIN_GPU_MEM}" in str(refused.value.body)
    custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, model("least", 1, DEFAULT_MIN_GPU_MEM)
    )
    await eventually(lambda: placed(custom, "least", 1), what="the 64Mi model placed")


def test_the_binder_places_no_one_byte_tritonmodel_it_reads() -> None:
    """Defence in depth: an object the API server let through (a CRD without the rule, or a
    binder whose --min-gpu-mem is above the CRD's) is not placed."""
    found = model_from_api(
        {**model("tiny", 3, "1"), "metadata": {"name": "tiny", "uid": "u"}}, KEYS, "tritonshare"
    )
    assert "--min-gpu-mem" in found.template.problem
    assert f"under the {MIN_GPU_MEM} bytes" in found.template.problem


async def test_a_one_byte_model_pod_is_not_bound_and_says_why(
    binder: Binder,  # noqa: F811 (the fixtures imported above)
    core: Any,
) -> None:
    add_pod(core, "tiny", mem="1", model="tiny")

    def refused() -> Any:
        condition = scheduled_condition(core, "tiny")
        return condition if condition is not None and condition.status == "False" else None

    condition = await eventually(refused, what="PodScheduled=False")
    assert "--min-gpu-mem" in condition.message, condition.message
    assert not node_of(core, "tiny")


def test_the_crd_refuses_what_the_binder_refuses() -> None:
    crd = yaml.safe_load((CHART / "crds" / "tritonmodels.tritonshare.io.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    [rule] = schema["properties"]["spec"]["properties"]["gpuMemory"]["x-kubernetes-validations"]
    assert rule["rule"] == f"quantity(self).compareTo(quantity('{DEFAULT_MIN_GPU_MEM}')) >= 0"
    assert parse_quantity(DEFAULT_MIN_GPU_MEM) == MIN_GPU_MEM
