"""Server-side field validation (`fieldValidation`) through the official client, on the chart's
own TritonModel CRD.

Strict refuses an unknown or duplicate field with the API server's 400 and its words, Warn (also
the default) accepts the object without the field and says so in a Warning header, Ignore drops
it silently. Pruning keeps what `x-kubernetes-preserve-unknown-fields` keeps and names list items
by index. A patch is judged by the object it makes; an unknown `metadata` field of a built-in
kind is caught as well.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client import ApiException

from sim.apiserver import ApiServerSettings, RunningApiServer, start_in_thread
from tests.deploy.rendering import CHART

GROUP, VERSION, PLURAL = "tritonshare.io", "v1alpha1", "tritonmodels"
MODELS = f"/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}"
CANNOT_DECODE = 'TritonModel in version "v1alpha1" cannot be handled as a TritonModel: '


@pytest.fixture(scope="module")
def server() -> Iterator[RunningApiServer]:
    running = start_in_thread(settings=ApiServerSettings(crds=(CHART / "crds",)))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def api(server: RunningApiServer) -> Iterator[kubernetes.client.ApiClient]:
    client = server.api_client()
    try:
        yield client
    finally:
        client.close()  # type: ignore[no-untyped-call]


@pytest.fixture(scope="module")
def custom(api: kubernetes.client.ApiClient) -> Any:
    return kubernetes.client.CustomObjectsApi(api)


def _model(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TritonModel",
        "metadata": {"name": name},
        "spec": {"storageUri": "s3://models/resnet", "gpuMemory": "2Gi", **spec},
    }


def _refusal(error: ApiException) -> tuple[int, str]:
    return error.status, json.loads(error.body or "{}")["message"]


def _send(
    server: RunningApiServer,
    method: str,
    path: str,
    raw: bytes,
    content_type: str = "application/json",
) -> tuple[int, Any, list[str]]:
    """A raw request (the body as given, duplicates and all): code, answer, Warning headers."""
    request = urllib.request.Request(
        server.url + path, data=raw, method=method, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            warnings = response.headers.get_all("Warning") or []
            return response.status, json.loads(response.read()), warnings
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), e.headers.get_all("Warning") or []


def test_strict_refuses_an_unknown_field_in_the_servers_words(custom: Any) -> None:
    with pytest.raises(ApiException) as refused:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, _model("typo", replica=3), field_validation="Strict"
        )
    assert _refusal(refused.value) == (
        400,
        CANNOT_DECODE + 'strict decoding error: unknown field "spec.replica"',
    )
    with pytest.raises(ApiException) as missing:
        custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "typo")
    assert missing.value.status == 404, "a refused create stores nothing"


def test_strict_names_every_unknown_field_at_any_depth(custom: Any) -> None:
    body = _model(
        "many",
        replica=3,
        tolerations=[{"key": "gpu", "operator": "Exists", "efect": "NoSchedule"}],
    )
    body["metadata"]["labelz"] = {"app": "x"}
    with pytest.raises(ApiException) as refused:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, body, field_validation="Strict"
        )
    assert _refusal(refused.value)[1] == CANNOT_DECODE + (
        'strict decoding error: unknown field "metadata.labelz", unknown field "spec.replica",'
        ' unknown field "spec.tolerations[0].efect"'
    )


@pytest.mark.parametrize("directive", ["Warn", None])
def test_warn_accepts_without_the_field_and_says_so(custom: Any, directive: str | None) -> None:
    name = f"warned-{(directive or 'default').lower()}"
    _, code, headers = custom.create_namespaced_custom_object_with_http_info(
        GROUP, VERSION, "default", PLURAL, _model(name, replica=3), field_validation=directive
    )
    assert code == 201
    assert headers["Warning"] == '299 - "unknown field \\"spec.replica\\""'
    stored = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)
    assert "replica" not in stored["spec"] and stored["spec"]["replicas"] == 1


def test_ignore_drops_the_field_silently(custom: Any) -> None:
    created, code, headers = custom.create_namespaced_custom_object_with_http_info(
        GROUP, VERSION, "default", PLURAL, _model("ignored", replica=3), field_validation="Ignore"
    )
    assert code == 201
    assert "Warning" not in headers
    assert "replica" not in created["spec"]


def test_an_unsupported_directive_is_refused(custom: Any) -> None:
    with pytest.raises(ApiException) as refused:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, _model("odd"), field_validation="Loud"
        )
    status, message = _refusal(refused.value)
    assert status == 400 and message.startswith('fieldValidation: Unsupported value: "Loud"')


def test_a_duplicate_field_is_refused_under_strict_and_the_last_kept_under_warn(
    server: RunningApiServer,
) -> None:
    raw = (
        b'{"apiVersion":"tritonshare.io/v1alpha1","kind":"TritonModel",'
        b'"metadata":{"name":"twice"},"spec":{"storageUri":"s3://models/resnet",'
        b'"gpuMemory":"2Gi","replicas":1,"replicas":2}}'
    )
    code, answer, _ = _send(server, "POST", f"{MODELS}?fieldValidation=Strict", raw)
    assert (code, answer["message"]) == (
        400,
        CANNOT_DECODE + 'strict decoding error: duplicate field "spec.replicas"',
    )
    code, answer, warnings = _send(server, "POST", MODELS, raw)
    assert code == 201 and answer["spec"]["replicas"] == 2
    assert warnings == ['299 - "duplicate field \\"spec.replicas\\""']


def test_pruning_keeps_preserved_subtrees_and_drops_the_rest(custom: Any) -> None:
    affinity = {
        "nodeAffinity": {"anything": {"the": "schema leaves open"}},
        "podAfinity": {},
    }
    body = _model(
        "pruned",
        affinity=affinity,
        tolerations=[{"key": "gpu", "operator": "Exists"}, {"key": "b", "colour": "red"}],
    )
    created, _, headers = custom.create_namespaced_custom_object_with_http_info(
        GROUP, VERSION, "default", PLURAL, body, field_validation="Warn"
    )
    assert headers["Warning"] == (
        '299 - "unknown field \\"spec.affinity.podAfinity\\"", '
        '299 - "unknown field \\"spec.tolerations[1].colour\\""'
    )
    spec = created["spec"]
    assert spec["affinity"] == {"nodeAffinity": {"anything": {"the": "schema leaves open"}}}
    assert spec["tolerations"] == [{"key": "gpu", "operator": "Exists"}, {"key": "b"}]
    # What a schema leaves open is no unknown field: Strict accepts it.
    body = _model("preserved", affinity={"nodeAffinity": {"anything": 1}})
    custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, body, field_validation="Strict"
    )


def test_updates_and_patches_are_judged_by_the_object_they_make(custom: Any) -> None:
    created = custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, _model("changed")
    )
    created["spec"]["replica"] = 2
    with pytest.raises(ApiException) as refused:
        custom.replace_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, "changed", created, field_validation="Strict"
        )
    assert _refusal(refused.value) == (
        400,
        CANNOT_DECODE + 'strict decoding error: unknown field "spec.replica"',
    )
    # A merge patch (what kubectl apply sends for a custom object): upstream's patch wording.
    with pytest.raises(ApiException) as refused:
        custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            "default",
            PLURAL,
            "changed",
            {"spec": {"replica": 2}},
            field_validation="Strict",
        )
    assert _refusal(refused.value) == (
        400,
        'strict decoding error: unknown field "spec.replica"',
    )
    patched, _, headers = custom.patch_namespaced_custom_object_with_http_info(
        GROUP, VERSION, "default", PLURAL, "changed", {"spec": {"replica": 2, "replicas": 4}}
    )
    assert headers["Warning"] == '299 - "unknown field \\"spec.replica\\""'
    assert patched["spec"]["replicas"] == 4 and "replica" not in patched["spec"]


def test_a_built_in_kinds_unknown_metadata_field_is_caught(server: RunningApiServer) -> None:
    # Raw requests: the official client refuses to send an unknown field of a built-in kind.
    configmaps = "/api/v1/namespaces/default/configmaps"
    raw = b'{"metadata":{"name":"settings","labelz":{"a":"b"}},"data":{"k":"v"}}'
    code, answer, _ = _send(server, "POST", f"{configmaps}?fieldValidation=Strict", raw)
    assert (code, answer["message"]) == (
        400,
        'ConfigMap in version "v1" cannot be handled as a ConfigMap: strict decoding error:'
        ' unknown field "metadata.labelz"',
    )
    code, answer, warnings = _send(server, "POST", configmaps, raw)
    assert code == 201 and answer["metadata"].keys().isdisjoint({"labelz", "labels"})
    assert answer["data"] == {"k": "v"}
    assert warnings == ['299 - "unknown field \\"metadata.labelz\\""']
    # A strategic merge patch is refused as upstream refuses it: 422, naming the patch.
    code, answer, _ = _send(
        server,
        "PATCH",
        f"{configmaps}/settings?fieldValidation=Strict",
        b'{"metadata":{"labelz":{"a":"b"}}}',
        "application/strategic-merge-patch+json",
    )
    assert (code, answer["message"]) == (
        422,
        ' "" is invalid: patch: Invalid value: "map[metadata:map[labelz:map[a:b]]]": strict'
        ' decoding error: unknown field "metadata.labelz"',
    )
