"""The proxy's reinstall watch (proxy/reinstall.py): it reinstalls only a model the agent reports
ABSENT, never one the node refused, gives up for good on a permanent loader failure, backs off
after a transient one, and runs the real loader as a child whose one-line outcome comes back."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from proxy.agentclient import AgentUnavailableError, ModelOnNode
from proxy.reinstall import LoaderProcess, LoaderRun, Reinstaller, ReinstallTiming, loader_flags


class FakeAgent:
    """The agent's answers about the model, in order (the last one repeats)."""

    def __init__(self, *answers: ModelOnNode | Exception) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def model_on_node(self, model_id: str, channel: Any) -> ModelOnNode:
        self.calls += 1
        answer = self.answers[min(self.calls, len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def watcher(
    agent: FakeAgent, ready: list[bool], runs: list[LoaderRun], clock: Clock
) -> tuple[Reinstaller, list[int]]:
    started: list[int] = []

    async def own_model_ready() -> bool:
        return ready[0]

    async def run_loader() -> LoaderRun:
        started.append(1)
        return runs.pop(0)

    reinstaller = Reinstaller(
        "add_one",
        agent,  # type: ignore[arg-type]
        own_model_ready,
        run_loader,
        ReinstallTiming(check_seconds=2.0, backoff_max_seconds=60.0),
        clock=clock,
    )
    return reinstaller, started


async def test_a_served_model_costs_no_agent_call_and_no_reinstall() -> None:
    agent = FakeAgent(ModelOnNode("ABSENT"))
    reinstaller, started = watcher(agent, [True], [], Clock())
    for _ in range(3):
        await reinstaller.check_once(None)  # type: ignore[arg-type]
    assert (agent.calls, started, reinstaller.reason) == (0, [], "")


async def test_a_model_missing_on_the_node_is_reinstalled_once_and_then_served() -> None:
    ready = [False]
    agent = FakeAgent(ModelOnNode("ABSENT"))
    reinstaller, started = watcher(agent, ready, [LoaderRun(0, "model add_one is READY")], Clock())
    await reinstaller.check_once(None)  # type: ignore[arg-type]
    assert started == [1] and reinstaller.reinstalls == 1 and reinstaller.reason == ""
    ready[0] = True
    await reinstaller.check_once(None)  # type: ignore[arg-type]
    assert started == [1]


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (ModelOnNode("FAILED", "Triton: bad config"), "failed on the node"),
        (ModelOnNode("REFUSED", "pod models/a has terminated (Failed)"), "refuses this pod"),
        (ModelOnNode("LOADING"), "LOADING on the node"),
        (AgentUnavailableError("the agent at 10.0.0.1:8100 did not answer"), "did not answer"),
    ],
)
async def test_only_absent_starts_a_reinstall(answer: ModelOnNode | Exception, words: str) -> None:
    reinstaller, started = watcher(FakeAgent(answer), [False], [], Clock())
    for _ in range(3):
        await reinstaller.check_once(None)  # type: ignore[arg-type]
    assert started == []
    assert words in reinstaller.reason


async def test_a_permanent_loader_failure_is_not_tried_again_from_this_container() -> None:
    clock = Clock()
    runs = [LoaderRun(4, "the agent refused: pod models/b may act only on model 'b'")]
    reinstaller, started = watcher(FakeAgent(ModelOnNode("ABSENT")), [False], runs, clock)
    for _ in range(5):
        await reinstaller.check_once(None)  # type: ignore[arg-type]
        clock.now += 3600
    assert started == [1]
    assert "not trying again" in reinstaller.reason and "may act only on" in reinstaller.reason


async def test_a_transient_failure_waits_a_doubling_delay_before_the_next_run() -> None:
    clock = Clock()
    runs = [LoaderRun(7, "agent unreachable")] * 40
    reinstaller, started = watcher(FakeAgent(ModelOnNode("ABSENT")), [False], runs, clock)
    # 30 checks, 2 s apart: the delay doubles from 4 s (jittered down to half, capped at 60 s),
    # so runs start at most at 0, 2, 6, 14, 30 and 60 s, and at least at 0, 4, 12 and 28 s.
    for _ in range(30):
        await reinstaller.check_once(None)  # type: ignore[arg-type]
        clock.now += 2.0
    assert 4 <= len(started) <= 6, len(started)
    assert "reinstalling it failed (exit 7: agent unreachable)" in reinstaller.reason


async def test_the_watch_ends_when_stopping_is_set() -> None:
    reinstaller, _ = watcher(FakeAgent(ModelOnNode("ABSENT")), [True], [], Clock())

    class Channel:
        async def __aenter__(self) -> Channel:
            return self

        async def __aexit__(self, *exc: object) -> None:
            return None

    reinstaller._agent.channel = Channel  # type: ignore[assignment]
    stopping = asyncio.Event()
    task = asyncio.create_task(reinstaller.watch(stopping))
    await asyncio.sleep(0.05)
    stopping.set()
    await asyncio.wait_for(task, 2)


async def test_the_real_loader_runs_as_a_child_and_its_outcome_comes_back(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    # No model directory: the loader ends at once with its own exit code and reason.
    flags = loader_flags(
        tmp_path / "missing",
        "add_one",
        "127.0.0.1:1",
        token,
        log_level="WARNING",
        log_format="text",
    )
    outcome = await LoaderProcess(flags).run()
    assert outcome.exit_code in (2, 3), outcome
    assert "missing" in outcome.message, outcome
    assert sys.executable  # the child is this interpreter


async def test_stopping_the_loader_ends_its_child(tmp_path: Path) -> None:
    model = tmp_path / "add_one"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('name: "add_one"\nbackend: "python"\n')
    (model / "1" / "model.py").write_text("x = 1\n")
    token = tmp_path / "token"
    token.write_text("t")
    # Nobody listens: the loader retries until stopped.
    flags = loader_flags(
        model, "add_one", "127.0.0.1:1", token, log_level="WARNING", log_format="text"
    )
    loader = LoaderProcess(flags)
    run = asyncio.create_task(loader.run())
    await asyncio.sleep(1.5)
    assert not run.done()
    await loader.stop(grace=5.0)
    outcome = await asyncio.wait_for(run, 10)
    assert outcome.exit_code == 143, outcome


async def test_readyz_says_why_the_model_is_not_served() -> None:
    from proxy.processflags import ProxyState
    from proxy.readiness import OwnModel, Readiness
    from proxy.settings import parse_settings

    settings = parse_settings(
        ["--model-id=add_one", "--triton-http-url=127.0.0.1:1", "--triton-grpc-url=127.0.0.1:1"],
        {},
    )
    own_model = OwnModel(settings, ProxyState())
    why = [""]
    readiness = Readiness(ProxyState(), own_model, {"add_one"}, lambda: why[0])
    await own_model.start()
    try:
        assert await readiness.not_ready() == ["model add_one is not ready in Triton"]
        why[0] = "model add_one is missing on the node: reinstalling it"
        assert await readiness.not_ready() == [
            "model add_one is missing on the node: reinstalling it"
        ]
    finally:
        await own_model.stop()
