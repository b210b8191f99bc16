"""The structural-schema rules and the kubectl printers, as pure functions.

The CRD tests cover the chart's schema end to end; these pin the rules it does not exercise
(nullable, int-or-string, nested defaults, pruning under preserve-unknown-fields, array and
string bounds) and the printers of kinds other engineers' resources reach (nodes, deployments,
services, config maps).
"""

from __future__ import annotations

from typing import Any

from sim.apiserver import schema, tables
from sim.apiserver.resources import DEPLOYMENTS, NODES, Resource

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "port": {"x-kubernetes-int-or-string": True},
                "note": {"type": "string", "nullable": True, "maxLength": 3},
                "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}},
                "limits": {"type": "object", "additionalProperties": {"type": "integer"}},
                "nested": {
                    "type": "object",
                    "default": {},
                    "properties": {"level": {"type": "integer", "default": 2, "maximum": 5}},
                },
                "free": {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": True,
                    "properties": {"kept": {"type": "object", "properties": {"a": {}}}},
                },
            },
        }
    },
}


def _decoded(spec: dict[str, Any]) -> dict[str, Any]:
    obj = {"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "n"}, "spec": spec}
    schema.prune(SCHEMA, obj)
    schema.apply_defaults(SCHEMA, obj)
    return obj


def test_pruning_and_defaults_reach_every_depth() -> None:
    obj = _decoded({"free": {"anything": 1, "kept": {"a": 1, "b": 2}}, "gone": True})
    assert obj["spec"] == {
        "free": {"anything": 1, "kept": {"a": 1}},
        "nested": {"level": 2},
    }
    assert obj["metadata"] == {"name": "n"}, "the root's metadata is the server's, never pruned"


def test_each_rule_refuses_in_the_api_servers_words() -> None:
    good = _decoded({"port": "http", "note": None, "tags": ["a"], "limits": {"gpu": 1}})
    assert schema.causes(SCHEMA, good) == []
    bad = _decoded(
        {
            "port": True,
            "note": "long",
            "tags": ["a", "b", 3],
            "limits": {"gpu": "one"},
            "nested": {"level": 6},
        }
    )
    assert schema.causes(SCHEMA, bad) == [
        (
            "spec.port",
            'Invalid value: "boolean": spec.port in body must be of type integer,string: "boolean"',
        ),
        ("spec.note", "Too long: may not be longer than 3"),
        ("spec.tags", "Too many: 3: must have at most 2 items"),
        (
            "spec.tags[2]",
            'Invalid value: "integer": spec.tags[2] in body must be of type string: "integer"',
        ),
        (
            "spec.limits.gpu",
            'Invalid value: "string": spec.limits.gpu in body must be of type integer: "string"',
        ),
        (
            "spec.nested.level",
            "Invalid value: 6: spec.nested.level in body should be less than or equal to 5",
        ),
    ]


def _core(plural: str, kind: str) -> Resource:
    """A core/v1 kind this server may not serve yet: its printer is chosen by name."""
    return Resource(
        group="", version="v1", plural=plural, kind=kind, namespaced=True, field_labels={}
    )


def _cells(resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
    table = tables.table(
        resource, [obj], version="v1", now=100.0, metadata={}, include_object="None"
    )
    names = [c["name"] for c in table["columnDefinitions"]]
    assert "object" not in table["rows"][0]
    return dict(zip(names, table["rows"][0]["cells"], strict=True))


def test_the_printers_fill_the_upstream_columns() -> None:
    stamp = "1970-01-01T00:00:00Z"
    node = {
        "metadata": {"name": "gpu-1", "creationTimestamp": stamp, "labels": {}},
        "spec": {"unschedulable": True},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
            "nodeInfo": {"kubeletVersion": "v1.31.0"},
        },
    }
    assert _cells(NODES, node) == {
        "Name": "gpu-1",
        "Status": "Ready,SchedulingDisabled",
        "Roles": "<none>",
        "Age": "100s",
        "Version": "v1.31.0",
        "Internal-IP": "10.0.0.1",
        "External-IP": "<none>",
        "OS-Image": "<unknown>",
        "Kernel-Version": "<unknown>",
        "Container-Runtime": "<unknown>",
    }
    deployment = {
        "metadata": {"name": "d", "creationTimestamp": stamp},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "d"}},
            "template": {"spec": {"containers": [{"name": "c", "image": "i:1"}]}},
        },
        "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2},
    }
    assert _cells(DEPLOYMENTS, deployment) == {
        "Name": "d",
        "Ready": "2/3",
        "Up-to-date": 3,
        "Available": 2,
        "Age": "100s",
        "Containers": "c",
        "Images": "i:1",
        "Selector": "app=d",
    }
    services = _core("services", "Service")
    service = {
        "metadata": {"name": "model", "creationTimestamp": stamp},
        "spec": {
            "type": "NodePort",
            "clusterIP": "10.96.0.10",
            "ports": [{"port": 8000, "nodePort": 30080, "protocol": "TCP"}],
            "selector": {"app": "model"},
        },
    }
    assert list(_cells(services, service).values()) == [
        "model",
        "NodePort",
        "10.96.0.10",
        "<none>",
        "8000:30080/TCP",
        "100s",
        "app=model",
    ]
    config_maps = _core("configmaps", "ConfigMap")
    config_map = {"metadata": {"name": "c", "creationTimestamp": stamp}, "data": {"a": "1"}}
    assert _cells(config_maps, config_map) == {"Name": "c", "Data": 1, "Age": "100s"}


def test_human_durations_read_as_kubectls() -> None:
    assert [tables.human_duration(s) for s in (5, 119, 150, 600, 3 * 3600 + 60, 9 * 86400)] == [
        "5s",
        "119s",
        "2m30s",
        "10m",
        "3h1m",
        "9d",
    ]
