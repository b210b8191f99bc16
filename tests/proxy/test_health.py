"""The Open Inference Protocol's REST health and readiness answers through a model pod's proxy:
Triton's status, with the protocol's JSON body (Triton sends none), as KServe's SDK reads it."""

from __future__ import annotations

import http.client
import json

import pytest

from sim.triton import TritonServer
from tests.proxy.conftest import proxy_settings, running_proxy

pytestmark = pytest.mark.triton
INFER = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
)
SUCCESSES = [
    ("/v2/health/live", {"live": True}),
    ("/v2/health/ready", {"ready": True}),
    ("/v2/models/add_one/ready", {"name": "add_one", "ready": True}),
    ("/v2/models/add_one/versions/1/ready", {"name": "add_one", "ready": True}),
    ("/v2/health/live?x=1", {"live": True}),
]


def exchange(
    connection: http.client.HTTPConnection, method: str, path: str, body: str | None = None
) -> tuple[int, str, bytes]:
    connection.request(method, path, body=body)
    response = connection.getresponse()
    return response.status, response.getheader("Content-Type", ""), response.read()


def test_health_and_readiness_answers_carry_the_protocols_json_bodies(
    served_triton: TritonServer,
) -> None:
    with running_proxy(proxy_settings(served_triton)) as running:
        host, port = running.http_url.split(":")
        # One keep-alive connection: the first call opens the proxy's connection to Triton,
        # the others reuse it, and inference between them is untouched.
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            for path, body in SUCCESSES:
                status, content_type, answer = exchange(connection, "GET", path)
                assert (status, content_type, json.loads(answer)) == (
                    200,
                    "application/json",
                    body,
                ), path
                status, _, answer = exchange(connection, "POST", "/v2/models/add_one/infer", INFER)
                assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [2.0]
            # Not ready: Triton's status and its error body, as for any model it lacks.
            status, _, answer = exchange(connection, "GET", "/v2/models/add_one/versions/9/ready")
            assert (status, json.loads(answer)) == (400, {"error": "Model version not ready"})
            # Other methods are Triton's to answer (405).
            assert exchange(connection, "POST", "/v2/health/live", "")[0] == 405
        finally:
            connection.close()


def test_a_pod_whose_model_is_not_ready_answers_not_ready(served_triton: TritonServer) -> None:
    with running_proxy(proxy_settings(served_triton, model_id="not_loaded")) as running:
        host, port = running.http_url.split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            status, _, answer = exchange(connection, "GET", "/v2/health/ready")
            assert (status, json.loads(answer)) == (400, {"error": "Model version not ready"})
            status, content_type, answer = exchange(connection, "GET", "/v2/health/live")
            assert (status, content_type, json.loads(answer)) == (
                200,
                "application/json",
                {"live": True},
            )
        finally:
            connection.close()
