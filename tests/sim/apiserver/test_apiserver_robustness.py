"""Arbitrary input never breaks the server: selectors, patches and bodies get 2xx or 4xx, never
a 500, and a refused write changes nothing."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.apiserver import RunningApiServer, start_in_thread

SELECTOR_ALPHABET = "abc=!,()<> in notin\\-_./0123456789xyz"
# The fixture is one server for the module, shared on purpose by every example.
FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
# Keys the server reads, so generated bodies reach its code paths, and a few it does not.
KEYS = st.sampled_from(
    [
        "metadata",
        "name",
        "generateName",
        "namespace",
        "labels",
        "annotations",
        "finalizers",
        "resourceVersion",
        "uid",
        "spec",
        "status",
        "containers",
        "image",
        "nodeName",
        "terminationGracePeriodSeconds",
        "conditions",
        "type",
        "phase",
        "podIPs",
        "target",
        "kind",
        "audiences",
        "expirationSeconds",
        "boundObjectRef",
        "token",
        "$patch",
        "$retainKeys",
        "$deleteFromPrimitiveList/finalizers",
        "op",
        "path",
        "value",
        "from",
    ]
) | st.text("abcxyz", max_size=3)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.sampled_from(["", "p", "n1", "Pod", "add", "remove", "/metadata/labels", "/spec", "-"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=4),
    max_leaves=16,
)


@pytest.fixture(scope="module")
def server() -> Iterator[RunningApiServer]:
    running = start_in_thread()
    try:
        body = {
            "metadata": {"name": "p", "labels": {"a": "b"}},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        }
        assert _call(running, "POST", "/api/v1/namespaces/default/pods", body)[0] == 201
        yield running
    finally:
        running.stop()


def _call(
    server: RunningApiServer,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    data = (
        None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    )
    request = urllib.request.Request(
        server.url + path, data=data, method=method, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _pod_version(server: RunningApiServer) -> str:
    code, pod = _call(server, "GET", "/api/v1/namespaces/default/pods/p")
    assert code == 200
    return str(pod["metadata"]["resourceVersion"])


@FUZZ
@given(selector=st.text(SELECTOR_ALPHABET, max_size=24))
def test_any_label_selector_is_answered_200_or_400(server: RunningApiServer, selector: str) -> None:
    query = urllib.parse.urlencode({"labelSelector": selector})
    code, body = _call(server, "GET", f"/api/v1/pods?{query}")
    assert code in (200, 400), body
    if code == 400:
        assert body["reason"] == "BadRequest" and body["message"]


@FUZZ
@given(selector=st.text(SELECTOR_ALPHABET + "spec.nodeName", max_size=30))
def test_any_field_selector_is_answered_200_or_400(server: RunningApiServer, selector: str) -> None:
    query = urllib.parse.urlencode({"fieldSelector": selector})
    code, body = _call(server, "GET", f"/api/v1/pods?{query}")
    assert code in (200, 400), body


@FUZZ
@given(
    patch=json_values,
    content_type=st.sampled_from(
        [
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ]
    ),
)
def test_any_patch_is_applied_or_refused_without_a_500(
    server: RunningApiServer, patch: Any, content_type: str
) -> None:
    before = _pod_version(server)
    code, body = _call(
        server, "PATCH", "/api/v1/namespaces/default/pods/p/status", patch, content_type
    )
    assert code in (200, 400, 409, 422), body
    if code != 200:
        assert body["kind"] == "Status"
        assert _pod_version(server) == before


@FUZZ
@given(body=json_values)
def test_any_create_body_is_created_or_refused_without_a_500(
    server: RunningApiServer, body: Any
) -> None:
    code, answer = _call(server, "POST", "/api/v1/nodes", body)
    assert code in (201, 400, 404, 409, 422), answer


@FUZZ
@given(
    body=json_values,
    path=st.sampled_from(
        [
            "/api/v1/namespaces/default/pods/p/binding",
            "/api/v1/namespaces/default/bindings",
            "/api/v1/namespaces/default/serviceaccounts/default/token",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            "/api/v1/namespaces/default/pods",
            "/apis/coordination.k8s.io/v1/namespaces/default/leases",
            "/api/v1/namespaces/default/events",
        ]
    ),
)
def test_any_body_posted_anywhere_is_answered_without_a_500(
    server: RunningApiServer, body: Any, path: str
) -> None:
    code, answer = _call(server, "POST", path, body)
    assert code < 500, answer


@FUZZ
@given(
    body=json_values,
    method=st.sampled_from(["PUT", "DELETE"]),
    path=st.sampled_from(
        [
            # Not the pod "p" the patch test relies on: a DELETE here could remove it.
            "/api/v1/namespaces/default/pods/q",
            "/api/v1/namespaces/default/pods/q/status",
            "/api/v1/nodes/n1",
            "/apis/coordination.k8s.io/v1/namespaces/default/leases/l1",
        ]
    ),
)
def test_any_update_or_delete_body_is_answered_without_a_500(
    server: RunningApiServer, body: Any, method: str, path: str
) -> None:
    code, answer = _call(server, method, path, body)
    assert code < 500, answer


@FUZZ
@given(
    query=st.dictionaries(
        st.sampled_from(
            ["limit", "continue", "resourceVersion", "resourceVersionMatch", "timeoutSeconds"]
        ),
        st.sampled_from(["", "0", "1", "-1", "99999999", "x", "Exact", "NotOlderThan", "e30="]),
        max_size=4,
    )
)
def test_any_list_query_is_answered_without_a_500(
    server: RunningApiServer, query: dict[str, str]
) -> None:
    code, answer = _call(server, "GET", f"/api/v1/pods?{urllib.parse.urlencode(query)}")
    assert code < 500 or code == 504, answer
    if code == 504:
        assert answer["reason"] == "Timeout"  # a resourceVersion from the future
