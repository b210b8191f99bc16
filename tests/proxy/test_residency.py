"""An on-demand model's residency in its proxy (proxy/residency.py, with the limiter every
inference request passes): it sleeps only after the idle time with nothing held, one wake serves
every request that waits for it, a wake past the bound or a failed one is refused with a
Retry-After, and a model the node reports asleep is not reinstalled."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest
import tritonclient.grpc as grpcclient

from proxy.agentclient import ModelOnNode
from proxy.http1.framing import answer_bytes
from proxy.metrics import ProxyMetrics
from proxy.policy import refusals
from proxy.policy.limiter import Limiter
from proxy.policy.refusals import WakeError
from proxy.processflags import ProxyState
from proxy.reinstall import LoaderRun, Reinstaller, ReinstallTiming
from proxy.residency import (
    ASLEEP,
    LOADED,
    RETRY_SECONDS,
    SUSPECT_SECONDS,
    AgentAnswer,
    IdlePolicy,
    Residencies,
    Residency,
)
from proxy.settings import SettingsError, parse_settings
from sim.triton import TritonServer
from tests.proxy.conftest import proxy_settings, running_proxy


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeAgent:
    """Answers sleeps and wakes as told; a wake waits for `release` when it is not set."""

    def __init__(self) -> None:
        self.sleeps = 0
        self.wakes = 0
        self.sleep_answer = AgentAnswer(True)
        self.wake_answer = AgentAnswer(True)
        self.release = asyncio.Event()
        self.release.set()

    async def sleep(self) -> AgentAnswer:
        self.sleeps += 1
        return self.sleep_answer

    async def wake(self) -> AgentAnswer:
        self.wakes += 1
        await self.release.wait()
        return self.wake_answer


def residency(
    clock: Clock, agent: FakeAgent, *, limit: int = 0, wake_timeout: float = 5.0
) -> tuple[Residency, Limiter, ProxyState, list[float]]:
    limiter = Limiter(limit, 10 * limit, 5.0, clock=clock)
    state = ProxyState()
    woke: list[float] = []
    model = Residency(
        "add_one",
        agent,
        limiter,
        state,
        IdlePolicy(idle_seconds=60.0, check_seconds=15.0, wake_timeout_seconds=wake_timeout),
        clock=clock,
        on_wake=woke.append,
    )
    limiter.residency = model
    return model, limiter, state, woke


async def test_the_model_sleeps_only_after_the_idle_time_with_nothing_held() -> None:
    clock, agent = Clock(), FakeAgent()
    model, limiter, _, _ = residency(clock, agent)
    await limiter.acquire()
    clock.now += 600
    await model.check_idle()
    assert agent.sleeps == 0, "a request held (a stream open) keeps the model loaded"
    limiter.release()
    clock.now += 59
    await model.check_idle()
    assert agent.sleeps == 0 and model.state == LOADED
    clock.now += 1
    await model.check_idle()
    assert (agent.sleeps, model.state, model.sleeps) == (1, ASLEEP, 1)
    assert limiter.residency is model and not limiter.try_acquire(), "asleep: wake first"
    assert model.asleep, "the proxy's readiness reads this (`Proxy.sleep_changed`)"


async def test_no_sleep_while_draining_and_a_refused_sleep_waits_another_idle_period() -> None:
    clock, agent = Clock(), FakeAgent()
    model, _, state, _ = residency(clock, agent)
    clock.now += 61
    state.draining = True
    await model.check_idle()
    assert agent.sleeps == 0
    state.draining = False
    agent.sleep_answer = AgentAnswer(False, "UNAVAILABLE", "the agent is restarting")
    await model.check_idle()
    assert (agent.sleeps, model.state, model.asleep) == (1, LOADED, False)
    assert model.refused_sleeps == 1
    clock.now += 30
    await model.check_idle()
    assert agent.sleeps == 1, "not asked again before another whole idle period"
    clock.now += 31
    await model.check_idle()
    assert agent.sleeps == 2


async def test_a_permanent_refusal_of_the_sleep_stops_the_asking() -> None:
    clock, agent = Clock(), FakeAgent()
    model, _, _, _ = residency(clock, agent)
    agent.sleep_answer = AgentAnswer(False, "FAILED_PRECONDITION", "the pod is always resident")
    for _ in range(3):
        clock.now += 61
        await model.check_idle()
    assert (agent.sleeps, model.state) == (1, LOADED)
    assert "always resident" in model.given_up


async def test_one_wake_serves_every_request_that_finds_the_model_asleep() -> None:
    clock, agent = Clock(), FakeAgent()
    model, limiter, _, woke = residency(clock, agent, limit=2)
    clock.now += 61
    await model.check_idle()
    agent.release.clear()
    waiting = [asyncio.create_task(limiter.acquire()) for _ in range(5)]
    for _ in range(3):  # the waiters start, then the wake's own task
        await asyncio.sleep(0)
    assert agent.wakes == 1 and limiter.held == 5, "the waiters count as concurrency"
    clock.now += 0.5
    agent.release.set()
    done, pending = await asyncio.wait(waiting, timeout=1)
    assert len(done) == 2 and limiter.in_flight == 2, "then the limit and queue apply"
    for _ in range(3):  # each answer hands its slot to the next waiter
        limiter.release()
    await asyncio.wait(pending, timeout=1)
    assert all(task.done() and task.exception() is None for task in waiting)
    assert limiter.in_flight == 2
    assert (agent.wakes, model.wakes, model.state, model.asleep) == (1, 1, LOADED, False)
    assert woke == [0.5]


async def test_a_request_past_the_wake_timeout_gets_a_retry_after_and_the_wake_goes_on() -> None:
    clock, agent = Clock(), FakeAgent()
    model, limiter, _, _ = residency(clock, agent, wake_timeout=0.05)
    clock.now += 61
    await model.check_idle()
    agent.release.clear()
    with pytest.raises(WakeError, match=r"not ready within 0\.05 s") as refused:
        await limiter.acquire()
    assert refusals.retry_after(refused.value) == 1
    assert refusals.http_status(refused.value) == 503
    assert refusals.grpc_code(refused.value).name == "UNAVAILABLE"
    assert limiter.held == 0, "the refused request is no longer counted"
    agent.release.set()
    await limiter.acquire()  # joins the same wake, which ends now
    assert (agent.wakes, model.state) == (1, LOADED)


async def test_a_failed_wake_answers_its_waiters_with_the_reason_then_retries_later() -> None:
    clock, agent = Clock(), FakeAgent()
    model, limiter, _, _ = residency(clock, agent)
    clock.now += 61
    await model.check_idle()
    agent.wake_answer = AgentAnswer(False, "RESOURCE_EXHAUSTED", "GPU 0 has no room")
    agent.release.clear()
    waiting = [asyncio.create_task(limiter.acquire()) for _ in range(3)]
    await asyncio.sleep(0)
    agent.release.set()
    await asyncio.wait(waiting, timeout=1)
    for task in waiting:
        error = task.exception()
        assert isinstance(error, WakeError) and "GPU 0 has no room" in str(error)
        assert error.retry_after == int(RETRY_SECONDS)
    with pytest.raises(WakeError, match="RESOURCE_EXHAUSTED"):
        await limiter.acquire()
    assert (agent.wakes, model.failed_wakes, model.state) == (1, 1, ASLEEP)
    clock.now += RETRY_SECONDS
    agent.wake_answer = AgentAnswer(True)
    await limiter.acquire()
    assert (agent.wakes, model.state) == (2, LOADED)


async def test_an_unexpected_agent_failure_is_a_refusal_not_a_crash() -> None:
    clock, agent = Clock(), FakeAgent()
    model, limiter, _, _ = residency(clock, agent)
    model.found_asleep("evicted")

    async def broken() -> AgentAnswer:
        raise RuntimeError("channel closed")

    agent.wake = broken  # type: ignore[method-assign]
    with pytest.raises(WakeError, match="channel closed"):
        await limiter.acquire()


async def test_a_model_the_node_reports_asleep_is_marked_so_and_never_reinstalled() -> None:
    clock, agent = Clock(), FakeAgent()
    model, _, _, _ = residency(clock, agent)
    loads: list[int] = []
    ready = [False]

    class Node:
        async def model_on_node(self, model_id: str, channel: object) -> ModelOnNode:
            return ModelOnNode("INSTALLED", sleeping=True)

    async def own_model_ready() -> bool:
        return ready[0]

    async def run_loader() -> LoaderRun:
        loads.append(1)
        return LoaderRun(0, "READY")

    watch = Reinstaller(
        "add_one",
        Node(),  # type: ignore[arg-type]
        own_model_ready,
        run_loader,
        ReinstallTiming(2.0, 60.0),
        clock=clock,
        residency=model,
    )
    await watch.check_once(None)  # type: ignore[arg-type]
    assert (loads, watch.reason, model.state) == ([], "", ASLEEP)
    ready[0] = True  # loaded by another way (a reinstall, a wake the agent ran)
    await watch.check_once(None)  # type: ignore[arg-type]
    assert model.state == LOADED


async def test_a_host_looks_a_model_up_when_it_joins_or_seems_unloaded() -> None:
    clock, agent = Clock(), FakeAgent()
    model, _, _, _ = residency(clock, agent)
    asked: list[str] = []
    on_node = {"add_one": False}

    async def look(model_id: str) -> bool | None:
        asked.append(model_id)
        return on_node[model_id]

    residencies = Residencies(look)
    residencies.add(model)
    await residencies.check()
    assert (asked, model.state) == (["add_one"], LOADED)
    await residencies.check()
    assert asked == ["add_one"], "looked up only when it joins or is suspected"
    on_node["add_one"] = True  # the agent evicted it for another model's wake
    model.suspect()
    await residencies.check()
    assert model.state == ASLEEP and residencies.asleep("add_one")
    assert agent.sleeps == 0, "not put to sleep by this proxy"
    assert residencies.period() == SUSPECT_SECONDS
    residencies.remove("add_one")
    assert not residencies.asleep("add_one") and residencies.period() == 1.0


def test_a_rest_refusal_carries_retry_after() -> None:
    answer = answer_bytes(503, "application/json", b"{}", False, retry_after=5)
    assert b"\r\nRetry-After: 5\r\n" in answer.partition(b"\r\n\r\n")[0] + b"\r\n"
    assert b"Retry-After" not in answer_bytes(503, "application/json", b"{}", False)


def test_on_demand_needs_the_agent() -> None:
    base = ["--model-id=m", "--triton-http-url=h:1", "--triton-grpc-url=h:2"]
    with pytest.raises(SettingsError, match="--residency on-demand is set but --agent-address"):
        parse_settings([*base, "--residency=on-demand"], env={})
    settings = parse_settings(
        [*base, "--residency=on-demand", "--agent-address=h:3", "--token-file=/t"], env={}
    )
    assert (settings.idle_seconds, settings.wake_timeout_seconds) == (300.0, 30.0)


async def test_an_inference_answered_as_for_a_missing_model_has_the_check_look_at_once() -> None:
    clock, agent = Clock(), FakeAgent()
    model, limiter, _, _ = residency(clock, agent)
    metrics = ProxyMetrics(limiter, "add_one")
    metrics.on_not_usable = model.suspect
    metrics.observe("http", "infer", "200", 0.001)
    metrics.observe("http", "metadata", "400", 0.001)
    assert not model.look_now.is_set(), "a served request, or no inference, says nothing"
    metrics.observe("grpc", "ModelInfer", "NOT_FOUND", 0.001)
    assert model.look_now.is_set()
    model.look_now.clear()
    metrics.observe("http", "infer", "400", 0.001)
    assert not model.look_now.is_set(), "at most one look per SUSPECT_SECONDS"
    clock.now += SUSPECT_SECONDS
    metrics.observe("http", "infer", "503", 0.001)
    assert model.look_now.is_set()

    checks: list[float] = []

    class Node:
        async def model_on_node(self, model_id: str, channel: object) -> ModelOnNode:
            return ModelOnNode("INSTALLED", sleeping=True)

    async def own_model_ready() -> bool:
        checks.append(clock.now)
        return False

    async def run_loader() -> LoaderRun:
        raise AssertionError("a sleeping model is not reinstalled")

    watch = Reinstaller(
        "add_one",
        Node(),  # type: ignore[arg-type]
        own_model_ready,
        run_loader,
        ReinstallTiming(3600.0, 3600.0),
        clock=clock,
        residency=model,
    )
    model.look_now.clear()
    stopping = asyncio.Event()
    task = asyncio.create_task(watch._pause(stopping))
    await asyncio.sleep(0)
    model.look_now.set()
    await asyncio.wait_for(task, 5)  # not the hour-long period
    assert not model.look_now.is_set()
    await watch.check_once(None)  # type: ignore[arg-type]
    assert model.state == ASLEEP, "then the next request wakes it"


@pytest.mark.triton
def test_an_asleep_model_s_pod_answers_ready_on_every_readiness_path(
    served_triton: TritonServer, grpc_mode: str
) -> None:
    # A model Triton does not have, as an asleep one is not loaded: ready only while asleep.
    settings = proxy_settings(served_triton, "not_loaded", grpc_mode=grpc_mode)
    with running_proxy(settings) as running:
        ready_url = f"http://{running.http_url}/v2/health/ready"
        readyz = running.metrics_url.replace("/metrics", "/readyz")

        def answers() -> tuple[int, bool, int, str]:
            try:
                rest = urllib.request.urlopen(ready_url, timeout=5).status
            except urllib.error.HTTPError as e:
                rest = e.code
            with grpcclient.InferenceServerClient(running.grpc_url) as client:
                grpc_ready = client.is_server_ready()
            try:
                with urllib.request.urlopen(readyz, timeout=5) as answer:
                    probe, text = answer.status, answer.read().decode()
            except urllib.error.HTTPError as e:
                probe, text = e.code, e.read().decode()
            return rest, grpc_ready, probe, text

        rest, grpc_ready, probe, _ = answers()
        assert (rest != 200, grpc_ready, probe) == (True, False, 503)
        running.proxy.state.model_asleep = True
        rest, grpc_ready, probe, text = answers()
        assert (rest, grpc_ready, probe) == (200, True, 200)
        assert "model not_loaded is asleep" in text
        with urllib.request.urlopen(ready_url, timeout=5) as answer:
            assert answer.headers["Content-Type"] == "application/json"
            assert json.loads(answer.read()) == {"ready": True}
