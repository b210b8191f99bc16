"""The concurrency limit, its queue, and the metrics an autoscaler reads, end to end."""

from __future__ import annotations

import asyncio
import json
import random
import urllib.request

import aiohttp
import grpc
import grpc.aio
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2

from proxy.policy.limiter import Limiter
from proxy.policy.refusals import OverloadedError, QueueTimeoutError
from sim.triton import TritonServer
from tests.proxy.conftest import RunningProxy, proxy_settings, running_proxy, wait_until


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_limit_queue_and_handover_in_order() -> None:
    limiter = Limiter(2, 2, 30.0)
    await limiter.acquire()
    await limiter.acquire()
    order: list[int] = []

    async def waiter(n: int) -> None:
        await limiter.acquire()
        order.append(n)

    waiters = [asyncio.create_task(waiter(n)) for n in (1, 2)]
    await wait_until(lambda: limiter.queued == 2, "two requests queueing")
    with pytest.raises(OverloadedError, match="queue is full"):
        await limiter.acquire()
    limiter.release()
    limiter.release()
    await asyncio.gather(*waiters)
    assert order == [1, 2]
    assert limiter.in_flight == 2 and limiter.queued == 0


async def test_queue_timeout_and_cancellation_leave_no_slot_behind() -> None:
    limiter = Limiter(1, 5, 0.05)
    await limiter.acquire()
    with pytest.raises(QueueTimeoutError, match=r"waited 0\.05 s"):
        await limiter.acquire()
    cancelled = asyncio.create_task(limiter.acquire())
    await wait_until(lambda: limiter.queued == 1, "one request queueing")
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert limiter.queued == 0
    limiter.release()
    assert limiter.in_flight == 0


async def test_unlimited_never_waits() -> None:
    limiter = Limiter(0, 0, 1.0)
    for _ in range(100):
        await limiter.acquire()
    assert limiter.in_flight == 100


async def test_time_weighted_average_concurrency() -> None:
    clock = FakeClock()
    limiter = Limiter(0, 0, 1.0, window=10.0, clock=clock)
    await limiter.acquire()  # 1 in flight for 4 s
    clock.now += 4
    await limiter.acquire()  # 2 in flight for 6 s
    clock.now += 6
    assert limiter.concurrency_seconds() == pytest.approx(4 * 1 + 6 * 2)
    assert limiter.average_concurrency() == pytest.approx(16 / 10)
    limiter.release()
    limiter.release()
    clock.now += 100  # idle for much longer than the window
    assert limiter.average_concurrency() == pytest.approx(0.0)
    assert limiter.concurrency_seconds() == pytest.approx(16)


async def test_waiting_requests_count_from_their_arrival_as_knative_counts_them() -> None:
    """At its limit a replica shows the demand beyond it: a request waiting for a slot counts
    in the integral from its arrival, so an autoscaler on it adds replicas for the queue."""
    clock = FakeClock()
    limiter = Limiter(1, 10, 30.0, window=10.0, clock=clock)
    await limiter.acquire()  # one in flight
    waiting = [asyncio.ensure_future(limiter.acquire()) for _ in range(3)]
    await asyncio.sleep(0)
    assert (limiter.in_flight, limiter.queued, limiter.held) == (1, 3, 4)
    clock.now += 2  # 4 held for 2 s, whatever the limit
    limiter.release()  # the first waiter takes the slot; one request left
    await asyncio.sleep(0)
    assert limiter.held == 3
    clock.now += 1
    waiting[2].cancel()  # a caller gives up waiting: it leaves the count
    with pytest.raises(asyncio.CancelledError):
        await waiting[2]
    clock.now += 1
    assert limiter.concurrency_seconds() == pytest.approx(4 * 2 + 3 * 1 + 2 * 1)
    assert limiter.average_concurrency() == pytest.approx(13 / 4)
    limiter.release()  # the last waiter takes the slot
    await asyncio.sleep(0)
    assert (limiter.in_flight, limiter.queued, limiter.held) == (1, 0, 1)
    limiter.release()
    assert limiter.held == 0
    await asyncio.gather(*waiting[:2])


async def test_a_waiter_timing_out_leaves_the_count_at_its_timeout() -> None:
    clock = FakeClock()
    limiter = Limiter(1, 10, 0.01, window=10.0, clock=clock)
    await limiter.acquire()
    with pytest.raises(QueueTimeoutError):
        await limiter.acquire()
    assert (limiter.held, limiter.queued) == (1, 0)


def test_concurrency_seconds_match_a_step_by_step_integral() -> None:
    """The limiter keeps sums of start and end times instead of integrating every step: over
    random steps and pauses (checkpoints included) the area is the step-by-step integral."""
    for seed in range(50):
        rng = random.Random(seed)
        clock = FakeClock()
        limiter = Limiter(0, 0, 1.0, window=10.0, clock=clock)
        area, in_flight = 0.0, 0
        for _ in range(300):
            pause = rng.choice([0.0, 0.001, 0.3, 0.7, 1.0, 2.5, 15.0])
            clock.now += pause
            area += in_flight * pause
            if rng.random() < 0.5:
                assert limiter.try_acquire()
                in_flight += 1
            elif in_flight:
                limiter.release()
                in_flight -= 1
            assert limiter.in_flight == in_flight
        assert limiter.concurrency_seconds() == pytest.approx(area, rel=1e-9)


def _scrape(running: RunningProxy) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(running.metrics_url, timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _sleepy_body(ms: int) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [ms]}]}
    ).encode()


@pytest.mark.triton
async def test_rest_and_grpc_share_the_limit_and_overflow_is_refused(
    served_triton: TritonServer,
    grpc_mode: str,
) -> None:
    settings = proxy_settings(
        served_triton, grpc_mode=grpc_mode, model_id="sleepy", container_concurrency=2, queue_size=1
    )
    with running_proxy(settings) as running:
        url = f"http://{running.http_url}/v2/models/sleepy/infer"
        async with aiohttp.ClientSession() as session:

            async def rest(ms: int) -> tuple[int, str]:
                async with session.post(url, data=_sleepy_body(ms)) as response:
                    return response.status, await response.text()

            slow = [asyncio.create_task(rest(1500)) for _ in range(3)]  # 2 run, 1 queues
            await wait_until(lambda: running.proxy.limiter.queued == 1, "a request queueing")
            assert (running.proxy.limiter.in_flight, running.proxy.limiter.queued) == (2, 1)
            samples = _scrape(running)
            labels = (("model", "sleepy"),)
            assert samples[("tritonshare_proxy_requests_in_flight", labels)] == 2
            assert samples[("tritonshare_proxy_requests_queued", labels)] == 1
            assert samples[("tritonshare_proxy_concurrency_limit", labels)] == 2

            status, text = await rest(1)
            assert status == 503
            assert "queue is full" in text
            async with grpc.aio.insecure_channel(running.grpc_url) as channel:
                request = service_pb2.ModelInferRequest(model_name="sleepy")
                request.inputs.add(name="DELAY_MS", datatype="INT32", shape=[1])
                request.raw_input_contents.append(np.array([1], np.int32).tobytes())
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await channel.unary_unary(
                        "/inference.GRPCInferenceService/ModelInfer", None, None
                    )(request.SerializeToString(), timeout=10)
                assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "concurrency limit" in (caught.value.details() or "")
                # Readiness and metadata are never queued behind inference.
                ready = await channel.unary_unary(
                    "/inference.GRPCInferenceService/ServerReady", None, None
                )(b"", timeout=5)
                assert service_pb2.ServerReadyResponse.FromString(ready).ready
            assert [s for s, _ in await asyncio.gather(*slow)] == [200, 200, 200]

        samples = _scrape(running)
        requests = "tritonshare_proxy_requests_total"
        model = ("model", "sleepy")
        ok = (("code", "200"), model, ("protocol", "http"), ("route", "infer"))
        assert samples[(requests, ok)] == 3
        overloaded = (("code", "503"), model, ("protocol", "http"), ("route", "infer"))
        assert samples[(requests, overloaded)] == 1
        grpc_refused = (
            ("code", "RESOURCE_EXHAUSTED"),
            model,
            ("protocol", "grpc"),
            ("route", "ModelInfer"),
        )
        assert samples[(requests, grpc_refused)] == 1
        rejected = (
            "tritonshare_proxy_rejected_requests_total",
            (model, ("reason", "OverloadedError")),
        )
        assert samples[rejected] == 2
        # Three requests of about 1.5 s each, with at most two at a time (the third waits its
        # turn, and waiting counts): about 6 s of request-seconds, whatever the machine's noise.
        area = samples[("tritonshare_proxy_concurrency_seconds_total", (("model", "sleepy"),))]
        assert 4.0 < area < 15.0
        count = samples[
            (
                "tritonshare_proxy_request_duration_seconds_count",
                (model, ("protocol", "http"), ("route", "infer")),
            )
        ]
        assert count == 4


@pytest.mark.triton
async def test_queue_timeout_answers_503(served_triton: TritonServer) -> None:
    settings = proxy_settings(
        served_triton,
        model_id="sleepy",
        container_concurrency=1,
        queue_timeout_seconds=0.2,
    )
    with running_proxy(settings) as running:
        url = f"http://{running.http_url}/v2/models/sleepy/infer"
        async with aiohttp.ClientSession() as session:
            slow = asyncio.create_task(session.post(url, data=_sleepy_body(1500)))
            await wait_until(lambda: running.proxy.limiter.in_flight == 1, "a request in flight")
            async with session.post(url, data=_sleepy_body(1)) as response:
                assert response.status == 503
                assert "timed out" in await response.text()
            (await slow).release()
