"""A model host: one proxy serving a table of models (--models-file), end to end against the real
Triton, with tritonclient as the tenant: each model answers, names outside the table are refused
as Triton refuses unknown models, each model has its own limit and metrics, and the table is
followed as its file changes (a model removed drains, one added is served)."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import queue
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from proxy.settings import SettingsError, parse_settings
from proxy.table import TableError, read_models
from sim.triton import TritonServer
from tests.proxy.conftest import RunningProxy, proxy_settings, running_proxy, wait_until

pytestmark = pytest.mark.triton

TABLE = ("add_one", "identity", "sleepy")


def write_table(path: Path, models: tuple[str, ...]) -> None:
    """The models file as the downward API projects the hosted-models annotation (the other
    keys are the binder's, ignored by the proxy); replaced whole, as the kubelet does."""
    entries = [{"model": m, "replica": f"{m}-0", "gpu": "GPU-0", "proof": "p"} for m in models]
    temporary = path.with_suffix(".new")
    temporary.write_text(json.dumps(entries))
    temporary.replace(path)


@pytest.fixture
def host(served_triton: TritonServer, tmp_path: Path) -> Iterator[RunningProxy]:
    """A proxy serving add_one, identity and sleepy from a models file, one in flight each."""
    table = tmp_path / "hosted-models"
    write_table(table, TABLE)
    settings = proxy_settings(
        served_triton,
        model_id="",
        models_file=table,
        models_check_seconds=0.1,
        container_concurrency=1,
        queue_size=0,
    )
    with running_proxy(settings) as running:
        yield running


def _scrape(running: RunningProxy) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(running.metrics_url, timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _infer_add_one_and_identity(running: RunningProxy) -> None:
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    rest = httpclient.InferenceServerClient(running.http_url)
    rpc = grpcclient.InferenceServerClient(running.grpc_url)
    try:
        for client, module in ((rest, httpclient), (rpc, grpcclient)):
            tensor = module.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(data)
            result = client.infer("add_one", [tensor])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + 1)
            flat = np.arange(5, dtype=np.float32)
            tensor = module.InferInput("INPUT_FP32", [5], "FP32")
            tensor.set_data_from_numpy(flat)
            result = client.infer("identity", [tensor])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT_FP32"), flat)
            # text_stream is loaded in Triton but not in the table: refused as Triton refuses a
            # model it does not have.
            tensor = module.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(data)
            with pytest.raises(InferenceServerException, match="unknown model: 'text_stream'"):
                client.infer("text_stream", [tensor])
            assert client.is_model_ready("identity") and not client.is_model_ready("text_stream")
            assert client.is_server_ready()
    finally:
        rest.close()
        rpc.close()


def test_each_model_of_the_table_is_served_and_no_other(host: RunningProxy) -> None:
    _infer_add_one_and_identity(host)
    # Statistics are narrowed to one named model of the table; all of Triton's are refused.
    rest = httpclient.InferenceServerClient(host.http_url)
    rpc = grpcclient.InferenceServerClient(host.grpc_url)
    try:
        assert rest.get_inference_statistics("identity")["model_stats"][0]["name"] == "identity"
        with pytest.raises(InferenceServerException, match="name one"):
            rest.get_inference_statistics()
        with pytest.raises(InferenceServerException, match="name one"):
            rpc.get_inference_statistics()
        with pytest.raises(InferenceServerException, match="not available"):
            rpc.get_inference_statistics("text_stream")
    finally:
        rest.close()
        rpc.close()
    with urllib.request.urlopen(host.metrics_url.replace("/metrics", "/readyz")) as response:
        assert response.status == 200


async def test_each_model_has_its_own_limit_and_metrics(host: RunningProxy) -> None:
    table = host.proxy.table
    assert table is not None
    sleepy = table.models["sleepy"].limiter
    url = f"http://{host.http_url}/v2/models/sleepy/infer"
    body = json.dumps(
        {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [4000]}]}
    )
    async with aiohttp.ClientSession() as session:
        slow = asyncio.create_task(session.post(url, data=body))
        await wait_until(lambda: sleepy.in_flight == 1, "sleepy's request in flight")
        async with session.post(url, data=body) as response:  # sleepy's one slot is taken
            assert response.status == 503
            assert "queue is full" in await response.text()
        async with grpc.aio.insecure_channel(host.grpc_url) as channel:
            request = service_pb2.ModelInferRequest(model_name="sleepy")
            request.inputs.add(name="DELAY_MS", datatype="INT32", shape=[1])
            request.raw_input_contents.append(np.array([1], np.int32).tobytes())
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await channel.unary_unary("/inference.GRPCInferenceService/ModelInfer", None, None)(
                    request.SerializeToString(), timeout=10
                )
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        samples = _scrape(host)
        assert samples[("tritonshare_proxy_requests_in_flight", (("model", "sleepy"),))] == 1
        assert samples[("tritonshare_proxy_requests_in_flight", (("model", "add_one"),))] == 0
        # add_one's limit is its own: it answers while sleepy's slot is taken.
        await asyncio.to_thread(_infer_add_one_and_identity, host)
        response = await slow
        assert response.status == 200
        response.release()
    samples = _scrape(host)
    requests = "tritonshare_proxy_requests_total"
    http_infer = (("protocol", "http"), ("route", "infer"))
    assert samples[(requests, (("code", "200"), ("model", "sleepy"), *http_infer))] == 1
    assert samples[(requests, (("code", "503"), ("model", "sleepy"), *http_infer))] == 1
    assert samples[(requests, (("code", "200"), ("model", "add_one"), *http_infer))] == 1
    assert (requests, (("code", "503"), ("model", "add_one"), *http_infer)) not in samples
    rejected = "tritonshare_proxy_rejected_requests_total"
    assert samples[(rejected, (("model", "sleepy"), ("reason", "OverloadedError")))] == 2


async def test_a_removed_model_drains_and_an_added_one_is_served(
    served_triton: TritonServer, tmp_path: Path
) -> None:
    path = tmp_path / "hosted-models"
    write_table(path, ("add_one", "sleepy"))
    settings = proxy_settings(
        served_triton, model_id="", models_file=path, models_check_seconds=0.1
    )
    with running_proxy(settings) as running:
        table = running.proxy.table
        assert table is not None
        base = f"http://{running.http_url}/v2/models"
        body = json.dumps(
            {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [3000]}]}
        )
        kept = http.client.HTTPConnection(running.http_url, timeout=10)  # one connection

        def identity_ready() -> int:
            kept.request("GET", "/v2/models/identity/ready")
            response = kept.getresponse()
            response.read()
            return response.status

        with contextlib.closing(kept):
            async with aiohttp.ClientSession() as session:
                # Not in the table: Triton's "not ready".
                assert await asyncio.to_thread(identity_ready) == 400
                in_flight = asyncio.create_task(session.post(f"{base}/sleepy/infer", data=body))
                await wait_until(
                    lambda: table.models["sleepy"].limiter.in_flight == 1, "sleepy in flight"
                )
                write_table(path, ("add_one", "identity"))
                await wait_until(lambda: "identity" in table.names, "identity joining the table")
                assert "sleepy" not in table.names and "sleepy" in table.models  # draining
                async with session.post(f"{base}/sleepy/infer", data=body) as response:
                    # Served elsewhere now: the client retries through the Service.
                    assert response.status == 503
                    assert response.headers["Retry-After"] == "1"
                    assert "no longer served on this host" in await response.text()
                # On the same connection, the same request now finds the model.
                assert await asyncio.to_thread(identity_ready) == 200
                response = await in_flight  # sent before the model left: it finishes
                assert response.status == 200
                response.release()
        await wait_until(lambda: "sleepy" not in table.models, "sleepy removed once drained")
        assert not any(dict(labels).get("model") == "sleepy" for _, labels in _scrape(running))
        await asyncio.to_thread(_infer_add_one_and_identity, running)


def test_a_stream_counts_against_the_model_it_names(
    served_triton: TritonServer, tmp_path: Path
) -> None:
    """ModelStreamInfer on a host: each request counts against its model's limiter (not the
    host's), its slot goes back once its requests are answered, and another model is refused
    in-stream."""
    path = tmp_path / "hosted-models"
    write_table(path, ("add_one", "text_stream"))
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    settings = proxy_settings(served_triton, model_id="", models_file=path)
    with running_proxy(settings) as running:
        table = running.proxy.table
        assert table is not None
        client = grpcclient.InferenceServerClient(running.grpc_url)
        try:
            client.start_stream(callback=lambda result, error: answers.put((result, error)))
            text = grpcclient.InferInput("text_input", [1], "BYTES")
            text.set_data_from_numpy(np.array([b"hi"], dtype=object))
            repeat = grpcclient.InferInput("repeat", [1], "INT32")
            repeat.set_data_from_numpy(np.array([2], dtype=np.int32))
            client.async_stream_infer("text_stream", [text, repeat], request_id="mine")
            client.async_stream_infer("sleepy", [text, repeat], request_id="other")
            seen: list[str] = []
            errors: list[str] = []
            while len(seen) < 2 or not errors:
                result, error = answers.get(timeout=30)
                if error is not None:
                    errors.append(str(error))
                else:
                    seen.append(result.as_numpy("text_output")[0].decode())
            assert seen == ["hi 0", "hi 1"]
            assert errors == [
                "Request for unknown model: 'sleepy' is not found; "
                "this host serves 'add_one', 'text_stream'"
            ]
            # Its requests answered, the open stream holds no slot.
            idle = table.models["text_stream"].limiter
            asyncio.run(
                wait_until(lambda: idle.in_flight == 0, "the idle stream's slot given back")
            )
        finally:
            client.stop_stream()
            client.close()
        limiters = [table.models["text_stream"].limiter, running.proxy.limiter]
        stream_limiter = limiters[0]
        asyncio.run(
            wait_until(lambda: stream_limiter.in_flight == 0, "the stream's slot given back")
        )
        assert [limiter.in_flight for limiter in limiters] == [0, 0]


def test_the_models_file_says_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "hosted-models"
    with pytest.raises(TableError, match=r"the host.s loader writes it"):
        read_models(path)
    for text, message in (
        ("{", "is not JSON"),
        ('{"model": "a"}', "no JSON list"),
        ('[{"replica": "a-0"}]', "entry 1 .* has no `model`"),
        ('[{"model": "a/b"}]', "entry 1"),
    ):
        path.write_text(text)
        with pytest.raises(TableError, match=message):
            read_models(path)
    path.write_text('[{"model": "a"}, {"model": "b"}, {"model": "a"}]')
    assert [entry.model for entry in read_models(path)] == ["a", "b"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([], "--model-id is required .* or --models-file"),
        (["--model-id", "m", "--models-file", "/t"], "both set"),
        (["--models-file", "/t", "--residency", "on-demand"], "--residency on-demand works with"),
        (["--models-file", "/t", "--model-dir", "/m"], "--model-dir works with"),
        (["--models-file", "/t", "--grpc-mode", "grpcio"], "--grpc-mode grpcio works with"),
    ],
)
def test_a_host_s_flags_say_what_is_wrong(flags: list[str], message: str) -> None:
    urls = ["--triton-http-url", "t:1", "--triton-grpc-url", "t:2"]
    agent = ["--agent-address", "a:1", "--token-file", "/token"]
    with pytest.raises(SettingsError, match=message):
        parse_settings([*urls, *agent, *flags], env={})
    assert parse_settings([*urls, "--models-file", "/t"], env={}).model_id == ""


def test_the_autoscaling_counts_answer_every_model_in_one_read(host: RunningProxy) -> None:
    """/autoscaling: each model's held request-seconds and inference requests answered."""
    _infer_add_one_and_identity(host)
    url = host.metrics_url.replace("/metrics", "/autoscaling")
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("application/json")
        counts = json.loads(response.read())
    assert set(counts) == set(TABLE)
    # Two inferences each (REST and gRPC); the refused text_stream counts for no model here.
    assert counts["add_one"][1] == 2 and counts["identity"][1] == 2
    assert counts["add_one"][0] > 0
    assert counts["sleepy"] == [0, 0]
