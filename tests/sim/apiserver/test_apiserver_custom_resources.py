"""Custom resources through the official client's CustomObjectsApi, on the chart's own CRD.

The chart's TritonModel CRD is served from the start (`--crds`): created with its schema's
defaults and unknown fields pruned, refused with the API server's 422 wording, its `status` and
`scale` subresources split as upstream splits them, `metadata.generation` counting spec changes
only, watched, selected, patched and conflicted as built-in kinds are. A CRD created through the
API is served at once (discovery included) and takes its objects with it when deleted.
"""

from __future__ import annotations

import json
import socket
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client import ApiException

from sim.apiserver import ApiServerSettings, RunningApiServer, start_in_thread
from tests.deploy.rendering import CHART
from tests.fixtures_sim import new_watch, status_of

GROUP, VERSION, PLURAL = "tritonshare.io", "v1alpha1", "tritonmodels"


@pytest.fixture(scope="module")
def server() -> Iterator[RunningApiServer]:
    running = start_in_thread(settings=ApiServerSettings(crds=(CHART / "crds",)))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def custom(server: RunningApiServer) -> Iterator[Any]:
    api = server.api_client()
    try:
        yield kubernetes.client.CustomObjectsApi(api)
    finally:
        api.close()  # type: ignore[no-untyped-call]


def _model(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TritonModel",
        "metadata": {"name": name},
        "spec": {"storageUri": "s3://models/resnet", "gpuMemory": "2Gi", **spec},
    }


def _create(custom: Any, body: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
    created: dict[str, Any] = custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )
    return created


def test_a_model_gets_its_defaults_and_loses_unknown_fields(custom: Any) -> None:
    body = _model("defaults", surprise=True)
    body["status"] = {"readyReplicas": 5}
    created = _create(custom, body)
    assert created["spec"] == {
        "storageUri": "s3://models/resnet",
        "gpuMemory": "2Gi",
        "residency": "always",
        "replicas": 1,
        "replicaSpread": "GPU",
    }
    assert "status" not in created, "a create may not write the status"
    assert created["metadata"]["generation"] == 1
    read = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "defaults")
    assert read == created


def test_a_bad_model_is_refused_with_every_field_named(custom: Any) -> None:
    body = _model("bad", residency="sometimes", replicas=-1, storageUri="ftp://x")
    del body["spec"]["gpuMemory"]  # optional: the binder learns it
    with pytest.raises(ApiException) as refused:
        _create(custom, body)
    assert refused.value.status == 422
    status = status_of(refused.value)
    assert status["reason"] == "Invalid"
    assert status["message"].startswith('TritonModel.tritonshare.io "bad" is invalid: [')
    causes = {c["field"]: c["message"] for c in status["details"]["causes"]}
    assert causes == {
        "spec.storageUri": 'Invalid value: "string": must be s3://BUCKET/PATH, gs://BUCKET/PATH'
        " or https://HOST/FILE (an archive such as model.tar.gz), naming the bucket or host after"
        " the scheme",
        "spec.residency": 'Unsupported value: "sometimes": supported values: "always", "on-demand"',
        "spec.replicas": "Invalid value: -1: spec.replicas in body should be greater than or"
        " equal to 0",
    }
    with pytest.raises(ApiException) as wrong_type:
        _create(custom, _model("typed", replicas="two"))
    assert status_of(wrong_type.value)["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "string": spec.replicas in body must be of type integer:'
            ' "string"',
            "field": "spec.replicas",
        }
    ]


@pytest.mark.parametrize(
    ("field", "value", "sentence"),
    [
        (
            "storageUri",
            "pvc://claim/models",
            "a running host cannot mount a new PersistentVolumeClaim",
        ),
        ("storageUri", "http://models.example.com/m.tgz", "publish it over https://"),
        ("storageUri", "s3://", "naming the bucket or host after the scheme"),
        ("storageUri", "hf://org/model", "must be s3://BUCKET/PATH, gs://BUCKET/PATH or https://"),
        ("storageSecret", "S3_Creds", "must be the name of a Secret in the model's namespace"),
    ],
)
def test_each_unserved_storage_is_refused_with_a_sentence(
    custom: Any, field: str, value: str, sentence: str
) -> None:
    """The CRD's CEL rules (x-kubernetes-validations) say what is wrong and what to do, worded
    as kube-apiserver words a failed rule: the field, the type and the rule's message."""
    with pytest.raises(ApiException) as refused:
        _create(custom, _model("unserved", **{field: value}))
    assert refused.value.status == 422
    [cause] = status_of(refused.value)["details"]["causes"]
    assert cause["field"] == f"spec.{field}"
    assert cause["reason"] == "FieldValueInvalid"
    assert cause["message"].startswith('Invalid value: "string": ')
    assert sentence in cause["message"]


def test_every_scheme_a_host_fetches_is_accepted(custom: Any) -> None:
    for number, uri in enumerate(
        ("s3://models/resnet", "gs://models/resnet", "https://models.example.com/resnet.tar.gz")
    ):
        _create(custom, _model(f"served-{number}", storageUri=uri, storageSecret="creds"))


def test_status_and_spec_are_written_through_their_own_endpoints(custom: Any) -> None:
    name = "split"
    _create(custom, _model(name))
    # The main endpoint keeps the stored status; a spec change bumps the generation.
    patched = custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        name,
        {"spec": {"residency": "on-demand"}, "status": {"readyReplicas": 9}},
    )
    assert patched["spec"]["residency"] == "on-demand"
    assert "status" not in patched
    assert patched["metadata"]["generation"] == 2
    # /status writes only the status: spec and labels stay, the generation stays.
    status = {"replicas": 1, "readyReplicas": 1, "selector": "model=split", "observedGeneration": 2}
    written = custom.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        name,
        {"status": status, "spec": {"replicas": 7}, "metadata": {"labels": {"x": "y"}}},
    )
    assert written["status"] == status
    assert written["spec"]["replicas"] == 1
    assert "labels" not in written["metadata"]
    assert written["metadata"]["generation"] == 2
    # Metadata alone through the main endpoint does not bump the generation either.
    labelled = custom.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, name, {"metadata": {"labels": {"team": "a"}}}
    )
    assert labelled["metadata"]["generation"] == 2
    assert labelled["status"] == status


def test_the_scale_subresource_maps_through_the_crd_paths(custom: Any) -> None:
    name = "scaled"
    _create(custom, _model(name, replicas=2))
    custom.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        name,
        {"status": {"replicas": 2, "selector": "tritonshare.io/model=scaled"}},
    )
    scale = custom.get_namespaced_custom_object_scale(GROUP, VERSION, "default", PLURAL, name)
    assert scale["kind"] == "Scale" and scale["apiVersion"] == "autoscaling/v1"
    assert scale["spec"] == {"replicas": 2}
    assert scale["status"] == {"replicas": 2, "selector": "tritonshare.io/model=scaled"}
    patched = custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, "default", PLURAL, name, {"spec": {"replicas": 5}}
    )
    assert patched["spec"] == {"replicas": 5}
    model = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)
    assert model["spec"]["replicas"] == 5
    assert model["metadata"]["generation"] == 2
    stale = dict(scale, spec={"replicas": 3})
    with pytest.raises(ApiException) as conflict:
        custom.replace_namespaced_custom_object_scale(
            GROUP, VERSION, "default", PLURAL, name, stale
        )
    assert conflict.value.status == 409
    with pytest.raises(ApiException) as negative:
        custom.patch_namespaced_custom_object_scale(
            GROUP, VERSION, "default", PLURAL, name, {"spec": {"replicas": -1}}
        )
    assert negative.value.status == 422


def test_a_scale_patch_applies_to_the_object_as_it_is_when_the_patch_arrives(
    custom: Any, server: RunningApiServer
) -> None:
    """A patch naming no resourceVersion is applied to the latest object: a status write that
    lands while the patch's body is still on its way is no conflict (as an HPA's scale patch
    beside the controller writing the object's status)."""
    name = "raced"
    _create(custom, _model(name, replicas=1))
    body = json.dumps({"spec": {"replicas": 4}}).encode()
    address = urllib.parse.urlsplit(server.url)
    path = f"/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}/{name}/scale"
    with socket.create_connection((address.hostname, address.port), timeout=30) as sock:
        sock.sendall(
            f"PATCH {path} HTTP/1.1\r\nHost: {address.netloc}\r\n"
            f"Content-Type: application/merge-patch+json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        # The headers are in; the body is not: another writer changes the object meanwhile.
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, "default", PLURAL, name, {"status": {"replicas": 1}}
        )
        sock.sendall(body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    model = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)
    assert model["spec"]["replicas"] == 4 and model["status"]["replicas"] == 1


def test_updates_conflict_and_patch_as_for_built_in_kinds(custom: Any) -> None:
    name = "patched"
    created = _create(custom, _model(name))
    json_patched = custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        name,
        [{"op": "replace", "path": "/spec/gpuMemory", "value": "4Gi"}],
        _content_type="application/json-patch+json",
    )
    assert json_patched["spec"]["gpuMemory"] == "4Gi"
    with pytest.raises(ApiException) as strategic:
        custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            "default",
            PLURAL,
            name,
            {"spec": {"gpuMemory": "8Gi"}},
            _content_type="application/strategic-merge-patch+json",
        )
    assert strategic.value.status == 415, "a custom object has no strategy to merge by"
    with pytest.raises(ApiException) as conflict:
        custom.replace_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name, created)
    assert conflict.value.status == 409
    assert status_of(conflict.value)["message"] == (
        'Operation cannot be fulfilled on tritonmodels.tritonshare.io "patched": the object has'
        " been modified; please apply your changes to the latest version and try again"
    )
    with pytest.raises(ApiException) as missing:
        custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "absent")
    assert status_of(missing.value)["message"] == 'tritonmodels.tritonshare.io "absent" not found'


def test_lists_select_and_watches_follow(custom: Any, server: RunningApiServer) -> None:
    namespace = "kube-public"
    start = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
    first = _model("first")
    first["metadata"]["labels"] = {"team": "a"}
    _create(custom, first, namespace)
    _create(custom, _model("second"), namespace)
    by_label = custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, label_selector="team=a"
    )
    assert [o["metadata"]["name"] for o in by_label["items"]] == ["first"]
    by_field = custom.list_cluster_custom_object(
        GROUP, VERSION, PLURAL, field_selector="metadata.namespace=kube-public,metadata.name=second"
    )
    assert [o["metadata"]["name"] for o in by_field["items"]] == ["second"]
    custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, namespace, PLURAL, "first", {"spec": {"replicas": 3}}
    )
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "second")
    seen = []
    watch = new_watch()
    for event in watch.stream(
        custom.list_namespaced_custom_object,
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        resource_version=start["metadata"]["resourceVersion"],
        timeout_seconds=5,
    ):
        obj = event["object"]
        seen.append((event["type"], obj["metadata"]["name"], obj["spec"]["replicas"]))
        if event["type"] == "DELETED":
            watch.stop()
    assert seen == [
        ("ADDED", "first", 1),
        ("ADDED", "second", 1),
        ("MODIFIED", "first", 3),
        ("DELETED", "second", 1),
    ]


def _crd(plural: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Cluster",
            "names": {"plural": plural, "kind": plural.capitalize().rstrip("s")},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                }
                            },
                        }
                    },
                }
            ],
        },
    }


def _discovered(server: RunningApiServer, path: str) -> Any:
    try:
        with urllib.request.urlopen(server.url + path) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code


def test_a_crd_created_through_the_api_is_served_until_deleted(
    custom: Any, server: RunningApiServer
) -> None:
    api = server.api_client()
    extensions: Any = kubernetes.client.ApiextensionsV1Api(api)
    try:
        created = extensions.create_custom_resource_definition(_crd("widgets"))
        conditions = {c.type: c.status for c in created.status.conditions}
        assert conditions == {"NamesAccepted": "True", "Established": "True"}
        document = _discovered(server, "/apis/example.com/v1")
        assert [r["name"] for r in document["resources"]] == ["widgets"]
        groups = {g["name"]: g for g in _discovered(server, "/apis")["groups"]}
        assert groups["example.com"]["preferredVersion"]["version"] == "v1"
        assert [v["version"] for v in groups["tritonshare.io"]["versions"]] == ["v1alpha1"]
        widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
        widget["spec"] = {"anything": {"goes": [1]}}
        made = custom.create_cluster_custom_object("example.com", "v1", "widgets", widget)
        assert made["spec"] == {"anything": {"goes": [1]}}
        extensions.delete_custom_resource_definition("widgets.example.com")
        assert _discovered(server, "/apis/example.com/v1") == 404
        extensions.create_custom_resource_definition(_crd("widgets"))
        again = custom.list_cluster_custom_object("example.com", "v1", "widgets")
        assert again["items"] == [], "a deleted CRD's objects go with it"
        extensions.delete_custom_resource_definition("widgets.example.com")
        bad = _crd("gadgets")
        bad["metadata"]["name"] = "gadgets"
        with pytest.raises(ApiException) as refused:
            extensions.create_custom_resource_definition(bad)
        assert status_of(refused.value)["message"] == (
            'CustomResourceDefinition.apiextensions.k8s.io "gadgets" is invalid: metadata.name:'
            ' Invalid value: "gadgets": must be spec.names.plural+"."+spec.group'
        )
    finally:
        api.close()  # type: ignore[no-untyped-call]


def test_a_deleted_namespace_takes_its_custom_objects(
    custom: Any, server: RunningApiServer
) -> None:
    api = server.api_client()
    try:
        core: Any = kubernetes.client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": "team-gone"}})
        _create(custom, _model("doomed"), "team-gone")
        core.delete_namespace("team-gone")
        listed = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        assert "team-gone" not in {o["metadata"]["namespace"] for o in listed["items"]}
    finally:
        api.close()  # type: ignore[no-untyped-call]
