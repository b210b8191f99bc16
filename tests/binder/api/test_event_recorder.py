"""The binder records every Event through the one rule (common/events.py): a repeated Event is
one object whose count grows, written through the official client's API against sim/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes.client

from binder.api.kube import Kube
from common.kubeapi.session import RetryPolicy
from tests.fixtures_sim import core_v1


def _events(api: kubernetes.client.ApiClient, namespace: str) -> list[Any]:
    return list(core_v1(api).list_namespaced_event(namespace).items)


def _pending(kube: Kube, message: str) -> None:
    kube.record_event(
        "default",
        "p",
        "uid-p",
        reason="FailedScheduling",
        message=message,
        reporting_instance="binder-0",
    )


def test_a_repeated_binder_event_is_one_event_with_a_growing_count(
    kube_api: kubernetes.client.ApiClient, kubeconfig: Path
) -> None:
    kube = Kube(str(kubeconfig), retry=RetryPolicy())
    try:
        for _ in range(3):
            _pending(kube, "0/1 nodes fit")
        model = {
            "apiVersion": "tritonshare.io/v1alpha1",
            "kind": "TritonModel",
            "namespace": "default",
            "name": "m",
            "uid": "uid-m",
        }
        for _ in range(2):
            kube.record_object_event(
                model,
                reason="FailedScheduling",
                message="0/1 nodes fit",
                reporting_instance="binder-0",
            )
        _pending(kube, "1/1 nodes fit")
    finally:
        kube.close()
    found = sorted(
        (e.involved_object.kind, e.message, e.count, e.reason) for e in _events(kube_api, "default")
    )
    assert found == [
        ("Pod", "0/1 nodes fit", 3, "FailedScheduling"),
        ("Pod", "1/1 nodes fit", 1, "FailedScheduling"),
        ("TritonModel", "0/1 nodes fit", 2, "FailedScheduling"),
    ]


def test_a_repeat_of_a_deleted_event_records_it_again(
    kube_api: kubernetes.client.ApiClient, kubeconfig: Path
) -> None:
    kube = Kube(str(kubeconfig), retry=RetryPolicy())
    try:
        _pending(kube, "none fit")
        (event,) = _events(kube_api, "default")
        core_v1(kube_api).delete_namespaced_event(event.metadata.name, "default")
        _pending(kube, "none fit")
    finally:
        kube.close()
    assert [(e.message, e.count) for e in _events(kube_api, "default")] == [("none fit", 1)]
