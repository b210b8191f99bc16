"""What the built-in autoscaler makes of a Deployment (binder/autoscaler/targets.py), from its
annotations and its pod template's: a Deployment of model pods is never scaled below one pod.
At min-scale 0 with on-demand pods, zero is one pod whose model sleeps while idle; with pods
that keep their model loaded, min-scale 0 is refused, saying what to do."""

from __future__ import annotations

from typing import Any

import pytest

from binder.autoscaler.kpa import Decider
from binder.autoscaler.targets import INVALID_SETTINGS, Index, Target
from common.contract import Keys

KEYS = Keys()
KNATIVE = "autoscaling.knative.dev/"


def deployment(min_scale: str | None, residency: str | None) -> dict[str, Any]:
    """An autoscaled Deployment as its informer gives it, its pods' residency written in its
    pod template as the short form has it."""
    annotations = {f"{KNATIVE}target": "1", f"{KNATIVE}window": "6s"}
    if min_scale is not None:
        annotations[f"{KNATIVE}min-scale"] = min_scale
    template: dict[str, Any] = {"metadata": {"labels": {"app": "resnet"}}}
    if residency is not None:
        template["metadata"]["annotations"] = {KEYS.residency: residency}
    return {
        "metadata": {
            "uid": "d1",
            "namespace": "team-a",
            "name": "resnet",
            "generation": 1,
            "annotations": annotations,
        },
        "spec": {"replicas": 1, "template": template},
        "status": {"readyReplicas": 1},
    }


def target_of(obj: dict[str, Any]) -> Target:
    index = Index(KEYS)
    index.apply_deployment("ADDED", obj)
    [target] = index.deployment_targets(lambda uid: True)
    return target


def test_min_scale_0_on_on_demand_model_pods_keeps_one_pod_and_says_why() -> None:
    target = target_of(deployment("0", "on-demand"))
    assert target.scaling is not None and target.problem == ""
    assert target.scaling.min_replicas == 1
    assert target.note == (
        "autoscaling.knative.dev/min-scale 0 on a Deployment of model pods keeps one pod: its "
        "model is unloaded while idle (residency on-demand) and its next request wakes it"
    )
    # A minute without a request, a second a decision: one pod throughout, never none.
    decider = Decider()
    decided = []
    for second in range(60):
        decider.observe(float(second), {"pod": 0.0}, target.scaling)
        decided.append(decider.decide(float(second), target.scaling, 1, 1).replicas)
    assert set(decided) == {1}


@pytest.mark.parametrize("residency", [None, "always"])
def test_min_scale_0_on_model_pods_that_keep_their_model_is_refused(
    residency: str | None,
) -> None:
    target = target_of(deployment("0", residency))
    assert target.scaling is None and target.sources == ()
    assert target.reason == INVALID_SETTINGS
    assert target.problem == (
        "autoscaling.knative.dev/min-scale 0 would leave a Deployment of model pods no pod, its "
        "Service no endpoint and its next request nothing to wait on; its pods keep their model "
        "loaded (residency always), holding its GPU memory all the time: set residency "
        "on-demand on its pods (tritonshare.io/residency: on-demand in its pod template: the "
        "last pod stays and frees its GPU memory while idle), or use a TritonModel with "
        "minReplicas 0"
    )


@pytest.mark.parametrize("residency", [None, "always", "on-demand"])
def test_a_min_scale_above_0_is_acted_on_as_written(residency: str | None) -> None:
    for min_scale, expected in ((None, 1), ("2", 2)):
        target = target_of(deployment(min_scale, residency))
        assert target.scaling is not None and target.scaling.min_replicas == expected
        assert target.note == "" and target.problem == ""
