"""The isolation table run against the gateway for a pod whose model Triton knows by a private
name: every row must hold exactly as for a model loaded under its own id.

Triton has add_one twice: as `add_one`, and as a copy under PRIVATE (the agent's kind of name).
The caller table gives 127.0.0.1 the model id add_one with PRIVATE as its name in Triton. The
rows that compare the gateway's answer with Triton's own for add_one therefore compare Triton's
answer for PRIVATE, renamed by the gateway, with Triton's answer for the model under its public id:
byte for byte the same status, content type and body (metadata, config, infer, readiness, 405s),
or the gateway leaked the private name or framed the renamed answer wrongly.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from sim.triton import TritonServer
from tests.conftest import copy_model
from tests.proxy.gateway.conftest import (
    RunningGateway,
    caller,
    gateway_settings,
    publish,
    running_gateway,
)
from tests.proxy.test_isolation import (  # noqa: F401 - collected here against the gateway
    test_adversarial_paths_get_the_same_answer_as_from_triton,
    test_another_model_is_answered_as_triton_answers_an_unknown_one,
    test_grpc_another_model_is_answered_as_triton_answers_an_unknown_one,
    test_grpc_duplicated_name_cannot_smuggle_another_model,
    test_grpc_infer_for_another_model_matches_triton,
    test_grpc_platform_apis_are_refused,
    test_grpc_unknown_methods_and_services_are_unimplemented,
    test_own_model_routes_answer_as_triton_does,
    test_platform_apis_are_refused_and_never_reach_triton,
    test_statistics_of_all_models_are_narrowed,
    test_unknown_routes_are_not_found,
)

pytestmark = pytest.mark.triton

PRIVATE = "team-a.add_one.5f0c2d91e4"


def _repository_call(triton: TritonServer, action: str, name: str) -> None:
    request = urllib.request.Request(
        f"http://{triton.http_url}/v2/repository/models/{name}/{action}", method="POST"
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200, f"Triton did not {action} {name}"


@pytest.fixture(scope="module")
def private_add_one(served_triton: TritonServer) -> Iterator[str]:
    """add_one loaded a second time, under PRIVATE."""
    copy_model("add_one", served_triton.model_repository, as_name=PRIVATE)
    _repository_call(served_triton, "load", PRIVATE)
    try:
        yield PRIVATE
    finally:
        _repository_call(served_triton, "unload", PRIVATE)


@pytest.fixture(scope="module")
def proxy(
    served_triton: TritonServer, private_add_one: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    """The gateway, in the place the isolation tests give the proxy, for a pod whose add_one is
    PRIVATE in Triton."""
    table = tmp_path_factory.mktemp("gateway-private") / "callers.json"
    publish(table, replace(caller("127.0.0.1", "add_one"), triton_name=private_add_one))
    settings = gateway_settings(served_triton, table, table_max_age_seconds=3600)
    with running_gateway(settings) as running:
        yield running


def test_the_private_copy_is_what_the_gateway_reaches(
    proxy: RunningGateway, served_triton: TritonServer
) -> None:
    """The rows above compare like with like only if the gateway reaches the private copy: its
    statistics count the gateway's requests, the public model's do not."""
    import json

    from tests.proxy.test_isolation import INFER_BODY, fetch

    def count(name: str) -> int:
        body = fetch(served_triton.http_url, "GET", f"/v2/models/{name}/stats")[2]
        return int(json.loads(body)["model_stats"][0]["inference_stats"]["success"]["count"])

    before = count(PRIVATE), count("add_one")
    assert fetch(proxy.http_url, "POST", "/v2/models/add_one/infer", INFER_BODY)[0] == 200
    # Triton counts an inference a moment after its answer has gone: read until it has.
    deadline = time.monotonic() + 10
    while count(PRIVATE) == before[0] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (count(PRIVATE), count("add_one")) == (before[0] + 1, before[1])
    assert Path(served_triton.model_repository / PRIVATE).is_dir()
