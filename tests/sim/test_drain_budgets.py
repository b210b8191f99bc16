"""The PodDisruptionBudgets the project ships hold through a `kubectl drain`: evicting the pods of
the binder, the webhook and the example model one by one, through the eviction subresource of the
simulated API server, is refused while it would leave too few Ready pods and allowed otherwise.

The budgets and the pod labels are taken from the shipped manifests (deploy/ as written, the chart
as Helm renders it with its default values, the webhook enabled); the Deployment's controller is
played by the test, which creates its pods, marks them Ready and replaces an evicted one, as a
ReplicaSet would."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from kubernetes import client

from tests.conftest import require_executable
from tests.deploy.rendering import DEPLOY, render_chart
from tests.fixtures_sim import core_v1, status_of

Obj = dict[str, Any]
VIOLATES = "Cannot evict pod as it would violate the pod's disruption budget."


def _documents(path: Path) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _named(objects: Iterable[Obj], kind: str, name: str) -> Obj:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def _shipped() -> dict[str, tuple[Obj, Obj]]:
    """(Deployment, PodDisruptionBudget) of each shipped workload that has a budget."""
    base = _documents(DEPLOY / "base" / "binder-deployment.yaml")
    example = _documents(DEPLOY / "example" / "model-deployment.yaml") + _documents(
        DEPLOY / "example" / "model-pdb.yaml"
    )
    # The webhook is off by default; its budget is rendered with it (two replicas by default).
    chart = render_chart({"webhook": {"enabled": True}})
    return {
        "base binder": (
            _named(base, "Deployment", "tritonshare-binder"),
            _named(base, "PodDisruptionBudget", "tritonshare-binder"),
        ),
        "chart binder": (
            _named(chart, "Deployment", "tritonshare-binder"),
            _named(chart, "PodDisruptionBudget", "tritonshare-binder"),
        ),
        "chart webhook": (
            _named(chart, "Deployment", "tritonshare-webhook"),
            _named(chart, "PodDisruptionBudget", "tritonshare-webhook"),
        ),
        "example model": (
            _named(example, "Deployment", "add-one"),
            _named(example, "PodDisruptionBudget", "add-one"),
        ),
    }


SHIPPED = _shipped()


class Workload:
    """A Deployment's pods, played by the test as its ReplicaSet would create them."""

    def __init__(self, api: client.ApiClient, deployment: Obj, budget: Obj) -> None:
        self.api = api
        self.v1 = core_v1(api)
        self.namespace = deployment["metadata"].get("namespace") or "default"
        self.labels = deployment["spec"]["template"]["metadata"]["labels"]
        self.replicas = int(deployment["spec"].get("replicas", 1))
        self.budget = budget["metadata"]["name"]
        self.owner = str(uuid.uuid4())
        self._count = 0
        try:
            self.v1.create_namespace({"metadata": {"name": self.namespace}})
        except client.ApiException as e:
            assert e.status == 409
        policy: Any = kubernetes.client.PolicyV1Api(api)
        policy.create_namespaced_pod_disruption_budget(self.namespace, budget)

    def start_pod(self, ready: bool) -> str:
        name = f"{self.budget}-{self._count}"
        self._count += 1
        self.v1.create_namespaced_pod(
            self.namespace,
            {
                "metadata": {
                    "name": name,
                    "labels": self.labels,
                    "ownerReferences": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "ReplicaSet",
                            "name": f"{self.budget}-rs",
                            "uid": self.owner,
                            "controller": True,
                        }
                    ],
                },
                "spec": {
                    "nodeName": f"node-{name}",
                    "containers": [{"name": "main", "image": "tritonshare"}],
                },
            },
        )
        self.set_ready(name, ready)
        return name

    def set_ready(self, name: str, ready: bool) -> None:
        self.v1.patch_namespaced_pod_status(
            name,
            self.namespace,
            {
                "status": {
                    "phase": "Running",
                    "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                }
            },
        )

    def evict(self, name: str) -> int:
        """Evict as `kubectl drain` does; the HTTP code (a 429 must carry kube's message)."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}
        try:
            response = self.v1.create_namespaced_pod_eviction(
                name, self.namespace, body, _preload_content=False
            )
        except client.ApiException as e:
            if e.status == 429:
                assert status_of(e)["message"] == VIOLATES
            return int(e.status)
        assert json.loads(response.data)["status"] == "Success"
        return int(response.status)

    def kubelet_finishes(self, name: str) -> None:
        """The node's kubelet ends the terminating pod: the object goes."""
        pod = self.v1.read_namespaced_pod(name, self.namespace)
        assert pod.metadata.deletion_timestamp is not None, f"{name} is not terminating"
        self.v1.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)


@pytest.mark.parametrize("workload", ["base binder", "chart binder", "chart webhook"])
def test_two_replica_budget_holds_one_ready_pod_through_a_drain(
    kube_api: client.ApiClient, workload: str
) -> None:
    deployment, budget = SHIPPED[workload]
    assert deployment["spec"]["replicas"] == 2
    pods = Workload(kube_api, deployment, budget)
    first = pods.start_pod(ready=True)
    second = pods.start_pod(ready=False)
    # Only one Ready: the drain may not take it.
    assert pods.evict(first) == 429
    pods.set_ready(second, True)
    # Both Ready: the first goes; the second is refused while the first terminates.
    assert pods.evict(first) == 201
    assert pods.evict(second) == 429
    pods.kubelet_finishes(first)
    assert pods.evict(second) == 429  # gone, and its replacement not Ready yet
    replacement = pods.start_pod(ready=False)
    assert pods.evict(second) == 429
    pods.set_ready(replacement, True)
    assert pods.evict(second) == 201


def test_example_model_drains_one_pod_at_a_time(kube_api: client.ApiClient) -> None:
    deployment, budget = SHIPPED["example model"]
    pods = Workload(kube_api, deployment, budget)
    # Scaled to two replicas (its ScaledObject may): one eviction at a time.
    first, second = pods.start_pod(ready=True), pods.start_pod(ready=True)
    assert pods.evict(first) == 201
    assert pods.evict(second) == 429
    pods.kubelet_finishes(first)
    pods.set_ready(pods.start_pod(ready=False), True)
    assert pods.evict(second) == 201


def test_example_model_with_one_replica_does_not_block_a_drain(kube_api: client.ApiClient) -> None:
    deployment, budget = SHIPPED["example model"]
    assert deployment["spec"]["replicas"] == 1
    pods = Workload(kube_api, deployment, budget)
    only = pods.start_pod(ready=True)
    assert pods.evict(only) == 201


def _drain(kubeconfig: Path, node: str, timeout: str) -> subprocess.Popen[str]:
    """`kubectl drain` as an operator runs it (the real binary, evicting through the API)."""
    return subprocess.Popen(
        [
            require_executable("kubectl"),
            f"--kubeconfig={kubeconfig}",
            "drain",
            node,
            f"--timeout={timeout}",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish_terminating(pods: Workload, name: str, drain: subprocess.Popen[str]) -> str:
    """Play the kubelet while the drain runs: end the pod once it is terminating. The drain's
    output once it has exited."""
    deadline = time.monotonic() + 30
    while drain.poll() is None and time.monotonic() < deadline:
        try:
            pod = pods.v1.read_namespaced_pod(name, pods.namespace)
        except client.ApiException as e:
            assert e.status == 404
        else:
            if pod.metadata.deletion_timestamp is not None:
                pods.kubelet_finishes(name)
        time.sleep(0.1)
    output, _ = drain.communicate(timeout=30)
    return output


def test_kubectl_drain_waits_on_the_binder_budget(
    kube_api: client.ApiClient, kubeconfig: Path
) -> None:
    deployment, budget = SHIPPED["base binder"]
    pods = Workload(kube_api, deployment, budget)
    first, second = pods.start_pod(ready=True), pods.start_pod(ready=True)
    for name in (first, second):
        pods.v1.create_node({"metadata": {"name": f"node-{name}"}})
    drain = _drain(kubeconfig, f"node-{first}", "20s")
    output = _finish_terminating(pods, first, drain)
    assert drain.returncode == 0, output
    assert f"node/node-{first} drained" in output
    # The replacement is not Ready yet: draining the other node must not take the last binder.
    replacement = pods.start_pod(ready=False)
    refused = _drain(kubeconfig, f"node-{second}", "3s")
    output, _ = refused.communicate(timeout=60)
    assert refused.returncode != 0
    assert VIOLATES in output
    assert pods.v1.read_namespaced_pod(second, pods.namespace).metadata.deletion_timestamp is None
    pods.set_ready(replacement, True)
    drain = _drain(kubeconfig, f"node-{second}", "20s")
    output = _finish_terminating(pods, second, drain)
    assert drain.returncode == 0, output
