"""A TritonModel's priority against the simulated API server serving the chart's CRD, through the
official client: resolved from its PriorityClass as a pod's is (the class's value and
preemptionPolicy, else the globalDefault, else 0), a class that does not exist refused in the API
server's words (a Placed condition and a FailedScheduling Event) until it does."""

from __future__ import annotations

from typing import Any

import kubernetes.client

from binder.app import Binder
from binder.model import ModelInfo, PodInfo
from binder.priorities import PriorityClassInfo, resolve
from tests.binder import test_tritonmodels
from tests.binder.simcluster import MakeBinder, add_node, eventually
from tests.binder.test_tritonmodels import GROUP, PLURAL, VERSION, model, placed, read

GI = 1 << 30

apiserver = test_tritonmodels.apiserver
custom = test_tritonmodels.custom


def priority_class(
    kube_api: kubernetes.client.ApiClient, name: str, value: int, **extra: Any
) -> None:
    scheduling: Any = kubernetes.client.SchedulingV1Api(kube_api)
    scheduling.create_priority_class(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
            **extra,
        }
    )


def create(custom: Any, name: str, replicas: int = 1, memory: str = "2Gi", **spec: Any) -> None:
    body = model(name, replicas, memory)
    body["spec"].update(spec)
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)


def condition(custom: Any, name: str, kind: str = "Placed") -> dict[str, Any]:
    conditions = (read(custom, name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def model_events(core: Any, name: str, reason: str) -> list[Any]:
    found = core.list_namespaced_event("default", field_selector=f"involvedObject.name={name}")
    return [e for e in found.items if e.reason == reason]


def test_the_class_gives_the_priority_as_the_admission_plugin_does() -> None:
    template = PodInfo(uid="m", namespace="default", name="m")
    classes = {
        "high": PriorityClassInfo("high", 1000, preemption_policy="Never"),
        "a": PriorityClassInfo("a", 50, global_default=True),
        "b": PriorityClassInfo("b", 20, global_default=True),
    }

    def resolved(name: str, known: dict[str, PriorityClassInfo]) -> tuple[int, str, str]:
        info = resolve(ModelInfo("m", "default", "m", 1, 1, template, priority_class=name), known)
        t = info.template
        return t.priority, t.preemption_policy, info.priority_problem

    assert resolved("high", classes) == (1000, "Never", "")
    assert resolved("", classes) == (20, "PreemptLowerPriority", ""), "the lowest default"
    assert resolved("", {}) == (0, "PreemptLowerPriority", "")
    assert resolved("gone", classes) == (
        0,
        "PreemptLowerPriority",
        "no PriorityClass with name gone was found",
    )


async def test_a_model_whose_class_does_not_exist_waits_for_it_and_says_why(
    kube_api: kubernetes.client.ApiClient, custom: Any, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "n1", [16 * GI])
    binder: Binder = await make_binder()
    create(custom, "resnet", priorityClassName="urgent")
    placed_ = await eventually(lambda: condition(custom, "resnet"), what="the Placed condition")
    message = 'tritonmodel "resnet" replica 0: no PriorityClass with name urgent was found'
    assert (placed_["status"], placed_["reason"], placed_["message"]) == (
        "False",
        "PriorityClassNotFound",
        message,
    )
    [event] = await eventually(lambda: model_events(core, "resnet", "FailedScheduling"))
    assert (event.type, event.message) == ("Warning", message)

    priority_class(kube_api, "urgent", 5000, preemptionPolicy="Never")
    obj = await eventually(lambda: placed(custom, "resnet", 1), what="placed once it exists")
    uid = obj["metadata"]["uid"]
    replica = binder.ledger.state.charged_pod(f"{uid}/0")
    assert replica is not None
    assert (replica.priority, replica.preemption_policy) == (5000, "Never")
    assert condition(custom, "resnet")["status"] == "True"
