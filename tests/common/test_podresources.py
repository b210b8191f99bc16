"""A pod's effective requests and host ports, as Kubernetes counts them (cases after
k8s.io/component-helpers resource.PodRequests' tests and kube-scheduler's NodePorts)."""

from __future__ import annotations

from typing import Any

import pytest

from common.podresources import host_ports, node_allocatable, pod_requests, ports_conflict
from common.quantity import QuantityError


def ctr(name: str, requests: dict[str, str] | None = None, **kw: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if "limits" in kw:
        resources["limits"] = kw.pop("limits")
    return {"name": name, "resources": resources, **kw}


def test_containers_add_up_and_cpu_counts_in_millicores() -> None:
    spec = {"containers": [ctr("a", {"cpu": "250m", "memory": "1Gi"}), ctr("b", {"cpu": "1"})]}
    assert pod_requests(spec) == {"cpu": 1250, "memory": 1024**3}


def test_a_limit_stands_for_a_missing_request_and_a_request_wins_over_its_limit() -> None:
    spec = {"containers": [ctr("a", {"cpu": "100m"}, limits={"cpu": "2", "memory": "1Gi"})]}
    assert pod_requests(spec) == {"cpu": 100, "memory": 1024**3}


def test_the_largest_init_container_wins_over_a_smaller_sum() -> None:
    spec = {
        "initContainers": [ctr("i1", {"cpu": "3"}), ctr("i2", {"cpu": "1"})],
        "containers": [ctr("a", {"cpu": "1"}), ctr("b", {"cpu": "1"})],
    }
    assert pod_requests(spec) == {"cpu": 3000}


def test_sidecars_add_to_the_containers_and_to_the_init_containers_after_them() -> None:
    spec = {
        "initContainers": [
            ctr("side", {"cpu": "1"}, restartPolicy="Always"),
            ctr("init", {"cpu": "2"}),
        ],
        "containers": [ctr("a", {"cpu": "500m"})],
    }
    # Containers 0.5 + sidecar 1 = 1.5; the init container runs beside the sidecar: 3.
    assert pod_requests(spec) == {"cpu": 3000}


def test_overhead_is_added_and_fractions_round_up() -> None:
    spec = {"containers": [ctr("a", {"cpu": "0.0001"})], "overhead": {"cpu": "100m"}}
    assert pod_requests(spec) == {"cpu": 101}


def test_an_unreadable_quantity_names_the_container_and_the_resource() -> None:
    with pytest.raises(QuantityError, match="container 'a': memory request: 'lots'"):
        pod_requests({"containers": [ctr("a", {"memory": "lots"})]})
    with pytest.raises(QuantityError, match="negative"):
        pod_requests({"containers": [ctr("a", {"memory": "-1"})]})


def test_a_node_allocatable_quantity_that_does_not_parse_offers_nothing() -> None:
    status = {"allocatable": {"cpu": "3500m", "memory": "x", "pods": "110"}}
    assert node_allocatable(status) == {"cpu": 3500, "memory": 0, "pods": 110}


def test_host_ports_read_as_kube_scheduler_reads_them() -> None:
    spec = {
        "initContainers": [{"name": "i", "ports": [{"containerPort": 1, "hostPort": 9000}]}],
        "containers": [
            {
                "name": "a",
                "ports": [
                    {"containerPort": 80},  # no host port
                    {"containerPort": 81, "hostPort": 8081, "protocol": "UDP"},
                    {"containerPort": 82, "hostPort": 8082, "hostIP": "10.0.0.1"},
                ],
            }
        ],
    }
    assert host_ports(spec) == (
        ("0.0.0.0", "TCP", 9000),
        ("0.0.0.0", "UDP", 8081),
        ("10.0.0.1", "TCP", 8082),
    )


@pytest.mark.parametrize(
    ("wanted", "used", "conflict"),
    [
        (("0.0.0.0", "TCP", 80), ("0.0.0.0", "TCP", 80), True),
        (("127.0.0.1", "TCP", 80), ("0.0.0.0", "TCP", 80), True),
        (("0.0.0.0", "TCP", 80), ("127.0.0.1", "TCP", 80), True),
        (("127.0.0.1", "TCP", 80), ("127.0.0.2", "TCP", 80), False),
        (("0.0.0.0", "UDP", 80), ("0.0.0.0", "TCP", 80), False),
        (("0.0.0.0", "TCP", 81), ("0.0.0.0", "TCP", 80), False),
    ],
)
def test_ports_conflict_on_the_same_protocol_port_and_address_or_wildcard(
    wanted: tuple[str, str, int], used: tuple[str, str, int], conflict: bool
) -> None:
    assert ports_conflict(wanted, used) is conflict
