"""A request that meets a Triton started again before the node gateway saw it go, on the real
processes.

A Triton started again has none of the node's models until the agent loads them, and answers a
request `unknown model` (404 / NOT_FOUND). The gateway's sentinel sees a death at once, but only
on its turn on the event loop: a request whose turn comes first reaches the new Triton. The
gateway then answers it as unanswered (Triton did not run it) and holds its model's requests until
it is READY; an idempotent model's proxy (marked so, or marked neither way with a config that
allows it) sends it again, so its client is answered once the model
is back. Here the sentinel's connection is kept from being read (its turn never comes) while
Triton is killed and started again; the test loads the model a moment later, as the agent would.
With Triton the same, an answer that it lacks a model, or a version, passes on as Triton said it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import cast

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from common.callers import Caller
from proxy.gateway.tenants import Tenant
from sim.triton import TritonServer
from tests.conftest import copy_model
from tests.proxy.conftest import RunningProxy, proxy_settings, running_proxy
from tests.proxy.gateway.conftest import RunningGateway, gateway_settings, publish, running_gateway
from tests.proxy.gateway.test_neighbour_rows import INFER, until
from tests.proxy.gateway.test_private_names import _load, fetch

pytestmark = pytest.mark.triton

HOST = "127.1.9.7"
HOST_POD = "team-h/tritonshare-host-0123456789abcdef"
PRIVATE = "team-h.a.0a0a0a0a"
ROW = Caller(HOST, "a", HOST_POD, "uid-a/0", 0, PRIVATE)


def _restart_unseen(running: Host) -> None:
    """Kill Triton and start it again, on the same ports and without the model, with the
    gateway's sentinel connection not read meanwhile (its turn on the event loop not come)."""
    sentinel = running.gateway.gateway.witness.sentinel
    held = sentinel.held
    assert held is not None, "the sentinel holds its connection"
    transport = cast(asyncio.Transport, held.transport)
    running.gateway.loop.call_soon_threadsafe(transport.pause_reading)
    running.triton.restart()
    until(lambda: not _ready(running.triton) and sentinel.closed_now(), "the new Triton")


def _unload(triton: TritonServer) -> None:
    request = urllib.request.Request(
        f"http://{triton.http_url}/v2/repository/models/{PRIVATE}/unload", method="POST"
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200
    until(lambda: not _ready(triton), "Triton's unload")


def _ready(triton: TritonServer) -> bool:
    try:
        with urllib.request.urlopen(
            f"http://{triton.http_url}/v2/models/{PRIVATE}/ready", timeout=5
        ) as response:
            return bool(response.status == 200)
    except OSError:
        return False


class Host:
    def __init__(self, triton: TritonServer, gateway: RunningGateway, proxy: RunningProxy):
        self.triton = triton
        self.gateway = gateway
        self.proxy = proxy

    def tenant(self) -> Tenant:
        tenant = next((t for t in self.gateway.gateway.tenants if t.caller.address == HOST), None)
        assert tenant is not None
        return tenant

    def held(self) -> bool:
        """Whether the gateway holds model a's new requests until it is READY."""
        return self.tenant().members["a"].limiter.restoring is not None


def host(
    triton: TritonServer, model_repository: Path, tmp_path: Path, idempotent: bool | None
) -> Iterator[Host]:
    copy_model("add_one", model_repository, as_name=PRIVATE)
    _load(triton, PRIVATE)
    table, models = tmp_path / "callers.json", tmp_path / "hosted-models"
    publish(table, ROW)
    said = {} if idempotent is None else {"idempotent": idempotent}
    models.write_text(json.dumps([{"model": "a", **said}]))
    with running_gateway(gateway_settings(triton, table, table_max_age_seconds=3600)) as gateway:
        settings = proxy_settings(
            triton,
            model_id="",
            models_file=models,
            triton_http_url=gateway.http_url,
            triton_grpc_url=gateway.grpc_url,
            source_address=HOST,
            grpc_mode="relay",
        )
        with running_proxy(settings) as proxy:
            running = Host(triton, gateway, proxy)
            assert rest(running) == "200"  # the host's tenant is made
            yield running


@pytest.fixture(params=[True, None], ids=["marked", "unmarked"])
def idempotent_host(
    request: pytest.FixtureRequest, triton: TritonServer, model_repository: Path, tmp_path: Path
) -> Iterator[Host]:
    """Marked idempotent, or marked neither way: add_one has no sequence batcher, so its
    proxy sends a lost call again once it has read its config in Triton."""
    for running in host(triton, model_repository, tmp_path, idempotent=request.param):
        table = running.proxy.app.table
        until(lambda: table.models["a"].resend, "the proxy's read of model a's config")  # noqa: B023
        yield running


@pytest.fixture
def other_host(triton: TritonServer, model_repository: Path, tmp_path: Path) -> Iterator[Host]:
    yield from host(triton, model_repository, tmp_path, idempotent=False)


def rest(running: Host, path: str = "/v2/models/a/infer") -> str:
    status, _, body = fetch(running.proxy.http_url, "POST", path, INFER)
    if status == 200:
        assert json.loads(body)["outputs"][0]["data"] == [2, 3, 4]
        return "200"
    return f"{status} {body.decode(errors='replace')}"


def grpc(running: Host) -> str:
    client = grpcclient.InferenceServerClient(running.proxy.grpc_url)
    data = np.array([[1, 2, 3]], dtype=np.float32)
    tensor = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
    tensor.set_data_from_numpy(data)
    try:
        result = client.infer("a", [tensor], client_timeout=30)
        assert np.array_equal(result.as_numpy("OUTPUT0"), data + 1)
        return "OK"
    except InferenceServerException as e:
        return f"{e.status()} {e.message()}"
    finally:
        client.close()


CALLS: dict[str, Callable[[Host], str]] = {"rest": rest, "grpc": grpc}


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_an_idempotent_models_request_meeting_a_restarted_triton_is_answered_once_it_is_back(
    idempotent_host: Host, protocol: str
) -> None:
    running = idempotent_host
    _restart_unseen(running)
    with ThreadPoolExecutor(1) as pool:
        answer: Future[str] = pool.submit(CALLS[protocol], running)
        until(running.held, "the gateway's hold of model a")
        time.sleep(0.3)  # the proxy's request sent again, waiting at the gateway meanwhile
        assert not answer.done(), answer.result()
        threading.Thread(target=_load, args=(running.triton, PRIVATE)).start()
        outcome = answer.result(30)
    assert outcome in ("200", "OK"), outcome
    until(lambda: not running.held(), "the hold's end")


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_another_models_request_fails_as_unanswered_and_the_next_waits_for_the_model(
    other_host: Host, protocol: str
) -> None:
    """A model not marked idempotent is not sent again by its proxy: its client gets 502 /
    UNAVAILABLE, which says to retry, never Triton's 404 that says the model does not exist;
    its next request waits until the model is back."""
    running = other_host
    _restart_unseen(running)
    outcome = CALLS[protocol](running)
    assert outcome.startswith(("502 ", "StatusCode.UNAVAILABLE ")), outcome
    # The pod's proxy passes the gateway's words on, over REST as over gRPC.
    assert "did not have model a loaded again" in outcome, outcome
    assert running.held()
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(CALLS[protocol], running)
        time.sleep(0.3)
        assert not answer.done(), answer.result()
        _load(running.triton, PRIVATE)
        assert answer.result(30) in ("200", "OK")


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_the_same_triton_lacking_the_model_is_passed_on(other_host: Host, protocol: str) -> None:
    """Unloaded behind the gateway's back, by a Triton that did not restart: the gateway has
    no reason to hold the model, and Triton's answer reaches the client as Triton gave it."""
    _unload(other_host.triton)
    outcome = CALLS[protocol](other_host)
    assert outcome.startswith(("404 ", "StatusCode.NOT_FOUND ")), outcome
    assert "Request for unknown model: 'a'" in outcome, outcome
    assert not other_host.held()


def test_a_version_triton_lacks_is_the_clients_error_and_holds_nothing(other_host: Host) -> None:
    outcome = rest(other_host, "/v2/models/a/versions/9/infer")
    assert outcome.startswith("404 ") and "version 9 is not found" in outcome, outcome
    assert not other_host.held()
    assert rest(other_host) == "200"
