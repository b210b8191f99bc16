"""What each call for a model parked on a host (scale to zero, proxy/parking.py) gets, through the
real relays in front of the real Triton, with tritonclient and grpc as the tenant: ModelReady is
answered at once, not ready (REST and gRPC), and wakes nothing; inference and ModelMetadata wait,
counted as the model's demand, and are answered once the loader lists the model served; one
that waits past --wake-timeout-seconds gets REST 503 with Retry-After, or gRPC UNAVAILABLE with
`retry-after` and `grpc-retry-pushback-ms` in its trailing metadata."""

from __future__ import annotations

import asyncio
import json
import queue
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from proxy.grpc.server import GrpcRelay
from proxy.policy.refusals import WakeError
from sim.triton import TritonServer
from tests.proxy.conftest import RunningProxy, proxy_settings, running_proxy, wait_until

pytestmark = pytest.mark.triton

DATA = np.arange(4, dtype=np.float32).reshape(1, 4)


def _write(path: Path, parked: bool, idempotent: bool | None = None) -> None:
    """The models file as the host's loader writes it: add_one parked, or served; its calls
    declared safe to run twice, or not, or (None) as its config in Triton says."""
    entry: dict[str, object] = {"model": "add_one", "maxConcurrency": 2}
    if idempotent is not None:
        entry["idempotent"] = idempotent
    if parked:
        entry["parked"] = True
    partial = path.with_suffix(".new")
    partial.write_text(json.dumps([entry, {"model": "identity"}]))
    partial.replace(path)


def _host(triton: TritonServer, table: Path, wake_timeout: float) -> Iterator[RunningProxy]:
    _write(table, parked=True)
    settings = proxy_settings(
        triton,
        model_id="",
        models_file=table,
        models_check_seconds=0.05,
        wake_timeout_seconds=wake_timeout,
    )
    with running_proxy(settings) as running:
        yield running


@pytest.fixture
def host(served_triton: TritonServer, tmp_path: Path) -> Iterator[RunningProxy]:
    yield from _host(served_triton, tmp_path / "models.json", 60.0)


@pytest.fixture
def impatient(served_triton: TritonServer, tmp_path: Path) -> Iterator[RunningProxy]:
    yield from _host(served_triton, tmp_path / "models.json", 0.3)


def _held(running: RunningProxy) -> int:
    return running.proxy.parking.waiting


def _trailers(error: grpc.RpcError) -> dict[str, str]:
    """The trailing metadata of a failed call."""
    call = cast(grpc.Call, error)
    return {str(key): str(value) for key, value in call.trailing_metadata() or ()}


def _grpc_infer(running: RunningProxy) -> list[float]:
    with grpcclient.InferenceServerClient(running.grpc_url) as client:
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(DATA)
        result = client.infer("add_one", [tensor], client_timeout=30)
        assert result.get_response().model_name == "add_one"
        answer: list[float] = result.as_numpy("OUTPUT0").reshape(-1).tolist()
        return answer


def _grpc_stream_infer(running: RunningProxy) -> list[float]:
    """One request on a ModelStreamInfer stream, and its answer."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with grpcclient.InferenceServerClient(running.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(DATA)
            client.async_stream_infer("add_one", [tensor])
            result, error = answers.get(timeout=30)
        finally:
            client.stop_stream()
    assert error is None, error
    answer: list[float] = result.as_numpy("OUTPUT0").reshape(-1).tolist()
    return answer


def _grpc_metadata(running: RunningProxy) -> str:
    with grpcclient.InferenceServerClient(running.grpc_url) as client:
        name: str = client.get_model_metadata("add_one", client_timeout=30).name
        return name


def _rest_metadata(running: RunningProxy) -> str:
    with urllib.request.urlopen(f"http://{running.http_url}/v2/models/add_one", timeout=30) as r:
        name: str = json.loads(r.read())["name"]
        return name


def test_readiness_says_not_ready_at_once_and_wakes_nothing(host: RunningProxy) -> None:
    rest = httpclient.InferenceServerClient(host.http_url)
    rpc = grpcclient.InferenceServerClient(host.grpc_url)
    try:
        # Not ready (KServe v2: it cannot infer now), answered at once, holding nothing.
        assert not rest.is_model_ready("add_one") and not rpc.is_model_ready("add_one")
        with pytest.raises(urllib.error.HTTPError) as not_ready:
            urllib.request.urlopen(f"http://{host.http_url}/v2/models/add_one/ready", timeout=5)
        assert not_ready.value.code == 400
        assert "scaled to zero and not ready" in not_ready.value.read().decode()
        not_ready.value.close()
        assert _held(host) == 0
        assert host.proxy.table is not None
        assert host.proxy.table.models["add_one"].limiter.concurrency_seconds() == 0
        # Another model of the host is served meanwhile.
        assert rest.is_model_ready("identity") and rpc.is_model_ready("identity")
    finally:
        rest.close()
        rpc.close()


async def test_inference_and_metadata_wait_for_the_wake_counted_as_demand(
    host: RunningProxy, tmp_path: Path
) -> None:
    assert host.proxy.table is not None
    limiter = host.proxy.table.models["add_one"].limiter
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(3) as pool:
        calls: list[asyncio.Future[Any]] = [
            loop.run_in_executor(pool, _grpc_infer, host),
            loop.run_in_executor(pool, _grpc_metadata, host),
            loop.run_in_executor(pool, _rest_metadata, host),
        ]
        await wait_until(lambda: _held(host) == 3, "three calls held")
        assert limiter.held == 3, "each counted as the model's demand"
        assert not any(call.done() for call in calls)
        _write(tmp_path / "models.json", parked=False)  # a replica is ready here
        infer, by_grpc, by_rest = await asyncio.wait_for(asyncio.gather(*calls), 30)
    assert infer == (DATA + 1).reshape(-1).tolist()
    assert by_grpc == by_rest == "add_one"
    with grpcclient.InferenceServerClient(host.grpc_url) as rpc:
        assert rpc.is_model_ready("add_one")


def test_a_call_that_waits_too_long_is_told_when_to_retry(impatient: RunningProxy) -> None:
    started = time.monotonic()
    with grpc.insecure_channel(impatient.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="add_one"), timeout=30)
    error = refused.value
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error
    assert "no replica of it was ready within 0.3 s; retry in 1 s" in str(error.details())
    trailers = _trailers(error)
    assert trailers["retry-after"] == "1", trailers
    assert trailers["grpc-retry-pushback-ms"] == "1000", trailers
    request = urllib.request.Request(
        f"http://{impatient.http_url}/v2/models/add_one/infer",
        data=json.dumps(
            {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [0] * 4}]}
        ).encode(),
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as too_long:
        urllib.request.urlopen(request, timeout=30)
    too_long.value.close()  # its socket, else collected (a ResourceWarning) in a later test
    assert too_long.value.code == 503 and too_long.value.headers["Retry-After"] == "1"
    assert time.monotonic() - started < 10, "answered past the bound, never left hanging"
    assert impatient.proxy.parking.waiting == 0


class Gateway:
    """A stand-in for the node gateway in front of Triton's gRPC port: while `admits` is False
    it closes each connection as it opens (a host whose models are all parked has no proven
    replica on the node, so the gateway knows no caller at its address); then it pipes bytes
    both ways."""

    def __init__(self, triton: str) -> None:
        self.triton = triton
        self.admits = False
        self.refused = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.admits:
            self.refused += 1
            writer.transport.abort()
            return
        host, _, port = self.triton.rpartition(":")
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        self._writers += [writer, up_writer]
        await asyncio.gather(
            _pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True
        )


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


@pytest.mark.parametrize("idempotent", [None, True, False])
async def test_a_held_grpc_call_outlives_the_gateway_closing_its_host_s_connection(
    served_triton: TritonServer, tmp_path: Path, idempotent: bool | None
) -> None:
    """The gRPC relay opens a call at Triton on its headers, before its message names the
    model; the gateway closes the host's connection while the model is parked: the held call
    goes on a new connection once the model is served, not answered UNAVAILABLE. A model whose
    calls may be sent again (declared, or by its config) too: nothing of a held call went, so
    there is nothing to send again but the call itself."""
    table = tmp_path / "models.json"
    _write(table, parked=True, idempotent=idempotent)
    gateway = Gateway(served_triton.grpc_url)
    async with gateway as address:
        settings = proxy_settings(
            served_triton,
            model_id="",
            models_file=table,
            models_check_seconds=0.05,
            wake_timeout_seconds=60.0,
            triton_grpc_url=address,
        )
        with running_proxy(settings) as host:
            loop = asyncio.get_running_loop()
            with ThreadPoolExecutor(3) as pool:
                calls: list[asyncio.Future[Any]] = [
                    loop.run_in_executor(pool, _grpc_infer, host),
                    loop.run_in_executor(pool, _grpc_metadata, host),
                    loop.run_in_executor(pool, _grpc_stream_infer, host),
                ]
                await wait_until(lambda: _held(host) == 3, "three calls held")
                await wait_until(lambda: gateway.refused >= 1, "the host's connection closed")
                relay = host.proxy.grpc
                assert isinstance(relay, GrpcRelay)
                await wait_until(lambda: not relay.channels, "the relay saw its connection go")
                assert not any(call.done() for call in calls)
                gateway.admits = True  # a replica is proven here, then served
                _write(table, parked=False, idempotent=idempotent)
                infer, name, streamed = await asyncio.wait_for(asyncio.gather(*calls), 30)
            assert infer == streamed == (DATA + 1).reshape(-1).tolist() and name == "add_one"


class _Failing:
    """A model asleep whose wake fails as a wake past its timeout does."""

    asleep = True

    async def wake(self) -> None:
        raise WakeError("the model was not loaded within 0 s; retry in 1 s", retry_after=1)


def test_both_grpc_endpoints_say_when_to_retry(served_triton: TritonServer, grpc_mode: str) -> None:
    """A model pod's wake that does not finish, in each `--grpc-mode`: the trailers of the
    parked model's refusal, through the same table."""
    with running_proxy(proxy_settings(served_triton, grpc_mode=grpc_mode)) as running:
        running.proxy.limiter.residency = _Failing()
        with grpc.insecure_channel(running.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            request = service_pb2.ModelInferRequest(model_name="add_one")
            with pytest.raises(grpc.RpcError) as refused:
                stub.ModelInfer(request, timeout=30)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
    trailers = _trailers(refused.value)
    assert trailers["retry-after"] == "1", trailers
    assert trailers["grpc-retry-pushback-ms"] == "1000", trailers
