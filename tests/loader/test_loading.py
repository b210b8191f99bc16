"""The decision flow (skip, send, load, poll, retry, give up) on a fake clock.

The agent here is a scripted stand-in for the Agent protocol so that minutes of backoff run in
milliseconds; the real agent, Triton and sim/ are exercised by test_process.py.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

from common.manifest import Manifest
from loader.agentclient import InstallResult, ModelState, ModelStatus
from loader.errors import (
    AgentFailedError,
    AgentUnreachableError,
    ExitCode,
    ModelRejectedError,
    RefusedError,
    TimedOutError,
    TransientError,
)
from loader.loading import Loading, Timing
from loader.manifest import build_manifest
from loader.retry import Backoff
from loader.validate import ModelDirectory, validate_model_directory
from tests.conftest import copy_model


class FakeTime:
    """A clock that moves only when the flow sleeps or an agent call takes time."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


Step = Callable[[], ModelStatus]
T = TypeVar("T")


@dataclass
class ScriptedAgent:
    """Answers each call from a script; records the calls."""

    time: FakeTime
    get: list[Step | Exception] = field(default_factory=list)
    load_answers: list[ModelStatus | Exception] = field(default_factory=list)
    install_answers: list[InstallResult | Exception] = field(default_factory=list)
    kept_answers: list[InstallResult | Exception | None] = field(default_factory=lambda: [None])
    calls: list[str] = field(default_factory=list)
    address: str = "10.0.0.5:9100"
    call_seconds: float = 0.01

    def _take(self, script: list[T | Exception], name: str) -> T:
        """The next scripted answer; the last one repeats forever."""
        self.calls.append(name)
        self.time.now += self.call_seconds
        answer = script.pop(0) if len(script) > 1 else script[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def get_model(self, model_id: str, time_limit: float) -> ModelStatus:
        return self._take(self.get, "get")()

    async def load(self, model_id: str, time_limit: float) -> ModelStatus:
        return self._take(self.load_answers, "load")

    async def install(
        self, model: ModelDirectory, manifest: Manifest, time_limit: float
    ) -> InstallResult:
        return self._take(self.install_answers, "install")

    async def install_kept(
        self, model_id: str, manifest: Manifest, time_limit: float
    ) -> InstallResult | None:
        return self._take(self.kept_answers, "install_kept")

    async def unload(self, model_id: str, time_limit: float) -> ModelStatus:
        self.calls.append("unload")
        return ModelStatus(model_id, ModelState.ABSENT)


@pytest.fixture
def model(tmp_path: Path) -> ModelDirectory:
    return validate_model_directory(copy_model("add_one", tmp_path), "add_one", 10**9)


@pytest.fixture
def manifest(model: ModelDirectory) -> Manifest:
    return build_manifest(model.files)


def status(state: ModelState, digest: str = "", reason: str = "") -> Step:
    return lambda: ModelStatus("add_one", state, reason=reason, manifest_digest=digest)


def ready(digest: str) -> ModelStatus:
    return ModelStatus("add_one", ModelState.READY, manifest_digest=digest)


def installed(manifest: Manifest, sent: int) -> InstallResult:
    return InstallResult(manifest.digest, unchanged=False, bytes_written=sent, bytes_sent=sent)


def loading(
    agent: ScriptedAgent,
    model: ModelDirectory,
    manifest: Manifest,
    total: float = 60.0,
    unreachable: float = float("inf"),
) -> Loading:
    timing = Timing(
        total_seconds=total,
        attempt_seconds=5.0,
        poll_seconds=0.5,
        backoff=Backoff(0.25, 4.0),
        unreachable_seconds=unreachable,
    )
    return Loading(
        agent,
        model,
        manifest,
        timing,
        clock=agent.time.clock,
        sleep=agent.time.sleep,
        rng=random.Random(1),
    )


async def test_an_absent_model_is_sent_then_loaded(
    model: ModelDirectory, manifest: Manifest
) -> None:
    agent = ScriptedAgent(FakeTime(), get=[status(ModelState.ABSENT)])
    agent.install_answers = [installed(manifest, manifest.total_bytes)]
    agent.load_answers = [ready(manifest.digest)]
    outcome = await loading(agent, model, manifest).run()
    assert agent.calls == ["get", "install_kept", "install", "load"]
    assert outcome.installed
    assert outcome.bytes_sent == manifest.total_bytes
    assert outcome.status.state is ModelState.READY
    assert "sent 2 files" in outcome.summary()


async def test_files_the_node_kept_are_installed_from_its_copy_without_sending(
    model: ModelDirectory, manifest: Manifest
) -> None:
    agent = ScriptedAgent(FakeTime(), get=[status(ModelState.ABSENT)])
    agent.kept_answers = [installed(manifest, manifest.total_bytes)]
    agent.install_answers = [AssertionError("the files were sent")]
    agent.load_answers = [ready(manifest.digest)]
    outcome = await loading(agent, model, manifest).run()
    assert agent.calls == ["get", "install_kept", "load"]
    assert outcome.installed and outcome.kept
    assert outcome.bytes_sent == 0
    assert "the node's kept copy, nothing sent" in outcome.summary()
    assert outcome.status.state is ModelState.READY


async def test_a_ready_model_with_the_same_digest_is_only_confirmed(
    model: ModelDirectory, manifest: Manifest
) -> None:
    agent = ScriptedAgent(FakeTime(), get=[status(ModelState.READY, manifest.digest)])
    agent.load_answers = [ready(manifest.digest)]
    outcome = await loading(agent, model, manifest).run()
    assert agent.calls == ["get", "load"]
    assert not outcome.installed
    assert outcome.bytes_sent == 0
    assert "nothing sent" in outcome.summary()


async def test_installed_files_with_the_same_digest_are_loaded_without_sending(
    model: ModelDirectory, manifest: Manifest
) -> None:
    agent = ScriptedAgent(FakeTime(), get=[status(ModelState.INSTALLED, manifest.digest)])
    agent.load_answers = [ready(manifest.digest)]
    outcome = await loading(agent, model, manifest).run()
    assert agent.calls == ["get", "load"]
    assert outcome.bytes_sent == 0


async def test_a_ready_model_with_other_files_is_unloaded_replaced_and_reloaded(
    model: ModelDirectory, manifest: Manifest
) -> None:
    agent = ScriptedAgent(FakeTime(), get=[status(ModelState.READY, "0" * 64)])
    agent.install_answers = [installed(manifest, 10)]
    agent.load_answers = [ready(manifest.digest)]
    await loading(agent, model, manifest).run()
    assert agent.calls == ["get", "unload", "install_kept", "install", "load"]


async def test_installed_other_files_are_replaced_without_an_unload(
    model: ModelDirectory, manifest: Manifest
) -> None:
    agent = ScriptedAgent(FakeTime(), get=[status(ModelState.INSTALLED, "0" * 64)])
    agent.install_answers = [installed(manifest, 10)]
    agent.load_answers = [ready(manifest.digest)]
    await loading(agent, model, manifest).run()
    assert agent.calls == ["get", "install_kept", "install", "load"]


async def test_an_agent_that_is_not_up_yet_is_waited_for_with_growing_delays(
    model: ModelDirectory, manifest: Manifest
) -> None:
    down = TransientError("UNAVAILABLE: connection refused", reached_agent=False)
    time = FakeTime()
    agent = ScriptedAgent(time, get=[down, down, down, down, down, status(ModelState.ABSENT)])
    agent.install_answers = [installed(manifest, 5)]
    agent.load_answers = [ready(manifest.digest)]
    outcome = await loading(agent, model, manifest).run()
    assert outcome.attempts == 6
    assert len(time.sleeps) == 5
    ceilings = [Backoff(0.25, 4.0).ceiling(n) for n in range(5)]
    assert all(0 <= s <= c for s, c in zip(time.sleeps, ceilings, strict=True))


async def test_a_model_still_loading_is_polled_until_ready(
    model: ModelDirectory, manifest: Manifest
) -> None:
    time = FakeTime()
    agent = ScriptedAgent(time)
    agent.install_answers = [installed(manifest, 5)]
    agent.load_answers = [ModelStatus("add_one", ModelState.LOADING)]
    agent.get = [
        status(ModelState.ABSENT),
        status(ModelState.LOADING),
        status(ModelState.LOADING),
        status(ModelState.READY, manifest.digest),
    ]
    outcome = await loading(agent, model, manifest).run()
    assert agent.calls == ["get", "install_kept", "install", "load", "get", "get", "get"]
    assert time.sleeps == [0.5, 0.5, 0.5]
    assert outcome.status.state is ModelState.READY


async def test_a_model_triton_rejects_fails_at_once_with_its_reason(
    model: ModelDirectory, manifest: Manifest
) -> None:
    agent = ScriptedAgent(FakeTime(), get=[status(ModelState.ABSENT)])
    agent.install_answers = [installed(manifest, 5)]
    agent.load_answers = [
        ModelStatus("add_one", ModelState.FAILED, reason="unexpected datatype TYPE_FP99")
    ]
    with pytest.raises(ModelRejectedError, match="TYPE_FP99") as e:
        await loading(agent, model, manifest).run()
    assert e.value.exit_code == ExitCode.MODEL_REJECTED
    assert agent.calls == ["get", "install_kept", "install", "load"]


async def test_a_refused_token_is_not_retried(model: ModelDirectory, manifest: Manifest) -> None:
    agent = ScriptedAgent(FakeTime(), get=[RefusedError("the agent refused the token")])
    with pytest.raises(RefusedError):
        await loading(agent, model, manifest).run()
    assert agent.calls == ["get"]


async def test_an_agent_that_never_answers_ends_as_unreachable(
    model: ModelDirectory, manifest: Manifest
) -> None:
    time = FakeTime()
    down = TransientError("UNAVAILABLE: connection refused", reached_agent=False)
    agent = ScriptedAgent(time, get=[down])
    with pytest.raises(AgentUnreachableError, match=r"10\.0\.0\.5:9100 did not answer") as e:
        await loading(agent, model, manifest, total=30.0).run()
    assert e.value.exit_code == ExitCode.AGENT_UNREACHABLE
    assert time.now <= 30.0
    # The last delay would have crossed the deadline, so the loader stopped instead of sleeping.
    assert time.now > 25.0


async def test_a_load_that_never_finishes_ends_as_timed_out(
    model: ModelDirectory, manifest: Manifest
) -> None:
    time = FakeTime()
    agent = ScriptedAgent(time)
    agent.load_answers = [ModelStatus("add_one", ModelState.LOADING)]
    agent.get = [status(ModelState.INSTALLED, manifest.digest), status(ModelState.LOADING)]
    with pytest.raises(TimedOutError, match="was not READY after") as e:
        await loading(agent, model, manifest, total=20.0).run()
    assert e.value.exit_code == ExitCode.TIMED_OUT
    assert time.now <= 20.5


async def test_an_agent_disagreeing_on_the_digest_is_reported(
    model: ModelDirectory, manifest: Manifest
) -> None:
    agent = ScriptedAgent(FakeTime(), get=[status(ModelState.ABSENT)])
    agent.install_answers = [InstallResult("f" * 64, False, 1, 1)]
    with pytest.raises(AgentFailedError, match="disagree on the manifest format"):
        await loading(agent, model, manifest).run()


async def test_an_agent_restarted_mid_install_is_asked_again(
    model: ModelDirectory, manifest: Manifest
) -> None:
    agent = ScriptedAgent(FakeTime(), get=[status(ModelState.ABSENT)])
    agent.install_answers = [
        TransientError("UNAVAILABLE: connection reset", reached_agent=False),
        installed(manifest, 7),
    ]
    agent.load_answers = [ready(manifest.digest)]
    outcome = await loading(agent, model, manifest).run()
    attempt = ["install_kept", "install"]
    assert agent.calls == ["get", *attempt, "get", *attempt, "load"]
    assert outcome.attempts == 2


async def test_deadlines_without_any_answer_mean_unreachable_not_timed_out(
    model: ModelDirectory, manifest: Manifest
) -> None:
    silent = TransientError("GetModel: DEADLINE_EXCEEDED", reached_agent=False)
    agent = ScriptedAgent(FakeTime(), get=[silent])
    with pytest.raises(AgentUnreachableError):
        await loading(agent, model, manifest, total=10.0).run()


async def test_a_load_cut_by_deadlines_after_an_answer_is_timed_out(
    model: ModelDirectory, manifest: Manifest
) -> None:
    agent = ScriptedAgent(FakeTime(), get=[status(ModelState.INSTALLED, manifest.digest)])
    agent.load_answers = [TransientError("LoadModel: DEADLINE_EXCEEDED", reached_agent=False)]
    with pytest.raises(TimedOutError, match="LoadModel: DEADLINE_EXCEEDED"):
        await loading(agent, model, manifest, total=10.0).run()


async def test_no_connection_for_the_unreachable_budget_ends_as_unreachable_long_before_timeout(
    model: ModelDirectory, manifest: Manifest
) -> None:
    gone = TransientError("GetModel: no connection", reached_agent=False, no_connection=True)
    agent = ScriptedAgent(FakeTime(), get=[gone])
    with pytest.raises(AgentUnreachableError, match="--agent-unreachable-seconds 30") as error:
        await loading(agent, model, manifest, total=600, unreachable=30).run()
    assert "the node's agent at 10.0.0.5:9100 is unreachable" in str(error.value)
    assert 30 <= agent.time.now < 31


async def test_an_answer_between_failures_restarts_the_unreachable_budget(
    model: ModelDirectory, manifest: Manifest
) -> None:
    gone = TransientError("GetModel: no connection", reached_agent=False, no_connection=True)
    busy = TransientError("GetModel: UNAVAILABLE: busy", reached_agent=False)
    # 20 s without a connection, an answer ("busy"), 20 s more: never 30 s in a row.
    time = FakeTime()
    agent = ScriptedAgent(time, call_seconds=1.0)
    agent.get = [*[gone] * 8, busy, *[gone] * 8, status(ModelState.ABSENT)]
    agent.install_answers = [installed(manifest, manifest.total_bytes)]
    agent.load_answers = [ready(manifest.digest)]
    outcome = await loading(agent, model, manifest, total=600, unreachable=30).run()
    assert outcome.status.state is ModelState.READY and time.now > 30


async def test_busy_answers_never_spend_the_unreachable_budget(
    model: ModelDirectory, manifest: Manifest
) -> None:
    busy = TransientError("GetModel: UNAVAILABLE: busy", reached_agent=False)
    agent = ScriptedAgent(FakeTime(), get=[busy])
    with pytest.raises(AgentUnreachableError, match="did not answer for"):
        await loading(agent, model, manifest, total=100, unreachable=5).run()
    assert agent.time.now > 90


async def test_a_black_holed_agent_spends_the_budget_in_its_first_attempt(
    model: ModelDirectory, manifest: Manifest
) -> None:
    # Each GetModel waits 20 s for a connection that never completes, then fails.
    gone = TransientError("GetModel: no connection", reached_agent=False, no_connection=True)
    agent = ScriptedAgent(FakeTime(), get=[gone], call_seconds=20.0)
    with pytest.raises(AgentUnreachableError, match="no connection for 40 s"):
        await loading(agent, model, manifest, total=600, unreachable=30).run()
    assert agent.calls == ["get", "get"]
