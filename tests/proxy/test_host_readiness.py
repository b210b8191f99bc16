"""A model host's readiness (REST /v2/health/ready, gRPC ServerReady) is its own: while every
model of its table is parked at zero replicas or asleep (on-demand, unloaded while idle), the
proxy answers ready without asking Triton, which no longer has any of them loaded (through the
node gateway, which then no longer knows the host, the answer would be 502), so that the host
stays behind its models' Services and their next requests reach it and wake them. With one
model loaded the question goes to Triton; an empty table and a draining proxy are not ready.

The proxy here fronts no Triton at all (a closed port, no retry): whatever reaches "Triton" is
answered 502 / UNAVAILABLE, so a ready answer can only be the proxy's own."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from proxy.app import Proxy
from proxy.policy import admission
from proxy.residency import ASLEEP, LOADED
from proxy.settings import Settings, parse_settings
from tests.proxy.conftest import RunningProxy, running_proxy, wait_until

PARKED: dict[str, object] = {"model": "parked", "parked": True}
LOADED_ENTRY: dict[str, object] = {"model": "loaded"}


def _write(path: Path, entries: list[dict[str, object]]) -> None:
    partial = path.with_suffix(".new")
    partial.write_text(json.dumps(entries))
    partial.replace(path)


def _proxy(table: Path, *flags: str) -> Proxy:
    urls = ["--triton-http-url", "t:1", "--triton-grpc-url", "t:2"]
    return Proxy(parse_settings([*urls, "--models-file", str(table), *flags], env={}))


def _readiness(proxy: Proxy) -> int:
    """The verdict on the host's readiness call (REST and gRPC ask the same)."""
    return admission.admit(True, False, False, False, proxy.limiter, proxy.state)


def test_a_host_whose_every_model_is_parked_answers_its_readiness_itself(tmp_path: Path) -> None:
    table = tmp_path / "models.json"
    proxy = _proxy(table)
    proxy.table.reread(table)
    assert _readiness(proxy) == admission.FORWARD, "no table yet: Triton says (not ready)"
    _write(table, [PARKED])
    proxy.table.reread(table)
    assert _readiness(proxy) == admission.ASLEEP
    _write(table, [PARKED, LOADED_ENTRY])
    proxy.table.reread(table)
    assert _readiness(proxy) == admission.FORWARD, "one model is Triton's: Triton says"
    _write(table, [PARKED])
    proxy.table.reread(table)  # nothing in flight: the loaded one goes at once
    assert _readiness(proxy) == admission.ASLEEP
    # A replica of it is ready here again: Triton has it, and says.
    _write(table, [{"model": "parked"}])
    proxy.table.reread(table)
    assert _readiness(proxy) == admission.FORWARD
    _write(table, [PARKED])
    proxy.table.reread(table)
    assert _readiness(proxy) == admission.ASLEEP
    proxy.state.draining = True
    assert _readiness(proxy) == admission.DRAINING, "draining comes first"
    proxy.state.draining = False
    _write(table, [])
    proxy.table.reread(table)
    assert _readiness(proxy) == admission.FORWARD, "an empty table is never ready by itself"


def test_a_host_whose_models_are_parked_or_asleep_answers_its_readiness_itself(
    tmp_path: Path,
) -> None:
    table = tmp_path / "models.json"
    _write(table, [PARKED, {"model": "lazy", "residency": "on-demand"}])
    agent = ["--agent-address", "127.0.0.1:9", "--token-file", str(tmp_path / "token")]
    proxy = _proxy(table, *agent)
    proxy.table.reread(table)
    lazy = proxy.residencies.models["lazy"]
    assert _readiness(proxy) == admission.FORWARD, "the on-demand model is loaded"
    lazy._set(ASLEEP)
    assert _readiness(proxy) == admission.ASLEEP
    assert "model lazy is asleep" in proxy.readiness.ready_text()
    assert "model parked is parked" in proxy.readiness.ready_text()
    lazy._set(LOADED)  # woken by a request
    assert _readiness(proxy) == admission.FORWARD


def _closed_port() -> str:
    """An address where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def host(tmp_path: Path) -> Iterator[tuple[RunningProxy, Path]]:
    """A host's proxy before a Triton that never answers, and its models file."""
    table = tmp_path / "hosted-models"
    nowhere = _closed_port()
    settings = Settings(
        model_id="",
        models_file=table,
        models_check_seconds=0.05,
        triton_http_url=nowhere,
        triton_grpc_url=nowhere,
        connect_retry_seconds=0.0,
        grpc_mode="relay",
        listen_http=("127.0.0.1", 0),
        listen_grpc=("127.0.0.1", 0),
        listen_metrics=("127.0.0.1", 0),
        drain_seconds=0.0,
        finish_timeout_seconds=5.0,
    )
    with running_proxy(settings) as running:
        yield running, table


def _answers(running: RunningProxy) -> tuple[int, bool, int, str]:
    """REST readiness, gRPC ServerReady (False when refused), and /readyz's status and text."""
    try:
        with urllib.request.urlopen(
            f"http://{running.http_url}/v2/health/ready", timeout=10
        ) as answer:
            rest = answer.status
            assert json.loads(answer.read()) == {"ready": True}
    except urllib.error.HTTPError as e:
        rest = e.code
    try:
        with grpcclient.InferenceServerClient(running.grpc_url) as client:
            grpc_ready = bool(client.is_server_ready(client_timeout=10))
    except InferenceServerException:
        grpc_ready = False
    readyz = running.metrics_url.replace("/metrics", "/readyz")
    try:
        with urllib.request.urlopen(readyz, timeout=10) as answer:
            probe, text = answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        probe, text = e.code, e.read().decode()
    return rest, grpc_ready, probe, text


async def test_a_host_s_readiness_on_the_wire(host: tuple[RunningProxy, Path]) -> None:
    running, table = host
    proxy = running.proxy

    async def table_is(names: set[str]) -> None:
        await wait_until(lambda: proxy.table.names == names, f"the table {sorted(names)}")

    rest, grpc_ready, probe, _ = _answers(running)
    assert (rest != 200, grpc_ready, probe) == (True, False, 503), "no model yet: not ready"
    _write(table, [PARKED])
    await table_is({"parked"})
    rest, grpc_ready, probe, text = _answers(running)
    assert (rest, grpc_ready, probe) == (200, True, 200), "parked: ready without Triton"
    assert "model parked is parked" in text, text
    _write(table, [PARKED, LOADED_ENTRY])
    await table_is({"parked", "loaded"})
    rest, grpc_ready, probe, _ = _answers(running)
    assert (rest, grpc_ready, probe) == (502, False, 503), "asked of Triton, which is down"
    _write(table, [PARKED])
    await table_is({"parked"})
    assert _answers(running)[:3] == (200, True, 200)
    proxy.state.draining = True
    rest, grpc_ready, probe, _ = _answers(running)
    assert (rest, grpc_ready, probe) == (503, False, 503), "draining: not ready"
    proxy.state.draining = False
    _write(table, [])
    await table_is(set())
    rest, grpc_ready, probe, _ = _answers(running)
    assert (rest != 200, grpc_ready, probe) == (True, False, 503), "an empty table: not ready"
