"""The scheduling queue on a fake clock (backoff 1 s doubling to a cap, requeue on change, FIFO),
and the settings parser's errors."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any, cast

import pytest

from binder.cluster.clusterstate import ClusterState
from binder.cluster.ledger import Ledger
from binder.errors import SettingsError
from binder.framework.noderules import NODE_RULES
from binder.framework.queue import SchedulingQueue
from binder.metrics import Metrics
from binder.pods.controller import PodController
from binder.settings import parse_settings
from common.contract import Keys
from common.proofs import KeyRing

KEY_DIR_ENV = {"TRITONSHARE_PLACEMENT_KEY_DIR": "/keys"}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_queue(clock: FakeClock) -> SchedulingQueue:
    return SchedulingQueue(initial_seconds=1.0, max_seconds=120.0, clock=clock)


def test_backoff_doubles_from_one_second_up_to_two_minutes() -> None:
    clock = FakeClock()
    queue = make_queue(clock)
    delays = [queue.backoff("p") for _ in range(10)]
    assert delays == [1, 2, 4, 8, 16, 32, 64, 120, 120, 120]


def test_a_waiting_pod_comes_back_when_its_backoff_ends() -> None:
    clock = FakeClock()
    queue = make_queue(clock)
    queue.add("p")
    assert queue.pop_ready() == "p"
    queue.backoff("p")
    queue.backoff("p")  # second failure: 2 s
    assert queue.pop_ready() is None
    clock.now = 1.999
    assert queue.pop_ready() is None
    clock.now = 2.0
    assert queue.pop_ready() == "p"
    assert queue.pop_ready() is None


def test_a_refused_model_is_retried_on_a_change_only_past_its_backoff() -> None:
    """kube-scheduler's backoff (TritonModels): a change retries a model once min(its wait, 10 s)
    has passed since it failed, at that moment if the change came before; with no change it
    waits out its whole wait. However many changes come, one try per backoff."""
    clock = FakeClock()
    queue = SchedulingQueue(
        initial_seconds=1.0, max_seconds=120.0, clock=clock, event_backoff_max=10.0
    )
    queue.add("m", "a")
    assert queue.pop_ready() == "m"
    for _ in range(5):
        queue.backoff("m")  # fifth failure: a 16 s wait, a 10 s backoff
    clock.now = 1.0
    assert queue.move_all_to_active() == 0, "a change within the backoff waits for its end"
    clock.now = 10.0
    assert queue.pop_ready() == "m", "the change came during the backoff"

    for _ in range(5):
        queue.backoff("m")  # a 120 s wait, a 10 s backoff from 10 s
    clock.now = 20.0
    assert queue.pop_ready() is None, "no change since it failed: it waits for one"
    assert queue.due_in() == 110.0
    for _ in range(100):
        assert queue.move_all_to_active() in (0, 1)
    assert queue.pop_ready() == "m"
    assert queue.pop_ready() is None, "one try, whatever the changes"

    queue.backoff("m")  # 120 s again, from 20 s
    clock.now = 139.9
    assert queue.pop_ready() is None
    clock.now = 140.0
    assert queue.pop_ready() == "m", "no change at all: its whole wait"


def test_pods_and_models_share_one_line_each_with_its_own_backoff() -> None:
    """The binder's one queue: a pod is retried at any helpful change, a model (capped) only
    past its backoff; both kinds of one namespace take that namespace's turns together."""
    clock = FakeClock()
    queue = SchedulingQueue(
        initial_seconds=1.0,
        max_seconds=120.0,
        clock=clock,
        event_backoff_max=10.0,
        capped_by_default=False,
    )
    for uid in ("pod", "model"):
        queue.add(uid, "a")
        assert queue.pop_ready() == uid
    for _ in range(5):
        queue.backoff("pod")
        queue.backoff("model", capped=True)
    clock.now = 1.0
    assert queue.move_all_to_active() == 1
    assert queue.pop_ready() == "pod"
    assert queue.pop_ready() is None, "the model waits out its backoff"
    clock.now = 10.0
    assert queue.pop_ready() == "model", "the change came during its backoff"

    for i in range(3):
        queue.add(f"pod-{i}", "greedy")
        queue.add(f"model-{i}", "greedy")
    queue.add("victim", "team-b")
    order = [queue.pop_ready() for _ in range(3)]
    assert order == ["pod-0", "victim", "model-0"]


def test_a_helpful_change_moves_every_waiting_pod_at_once_keeping_its_count() -> None:
    clock = FakeClock()
    queue = make_queue(clock)
    for uid in ("a", "b"):
        queue.add(uid)
        queue.pop_ready()
        queue.backoff(uid)
    assert queue.move_all_to_active() == 2
    assert [queue.pop_ready(), queue.pop_ready()] == ["a", "b"]
    assert queue.backoff("a") == 2.0, "the failure count survives the requeue"


def test_first_in_first_out_and_no_duplicates() -> None:
    queue = make_queue(FakeClock())
    for uid in ("a", "b", "a", "c"):
        queue.add(uid)
    assert len(queue) == 3
    assert [queue.pop_ready() for _ in range(3)] == ["a", "b", "c"]


def test_removed_pods_are_forgotten() -> None:
    queue = make_queue(FakeClock())
    queue.add("a")
    queue.backoff("b")
    queue.remove("a")
    queue.remove("b")
    assert len(queue) == 0
    assert queue.failures("b") == 0
    assert queue.move_all_to_active() == 0


class SortingQueue:
    """The queue as it was before its heap: every waiting pod sorted on each pop. The heap must
    give the same pods in the same order."""

    def __init__(self, clock: FakeClock) -> None:
        self.inner = make_queue(clock)
        self.clock = clock
        self.waiting: dict[str, float] = {}
        self.active: list[str] = []

    def add(self, uid: str) -> None:
        self.waiting.pop(uid, None)
        if uid not in self.active:
            self.active.append(uid)

    def remove(self, uid: str) -> None:
        self.waiting.pop(uid, None)
        if uid in self.active:
            self.active.remove(uid)

    def backoff(self, uid: str) -> None:
        delay = self.inner.backoff(uid)  # the failure count and delay are not under test
        if uid in self.active:
            self.active.remove(uid)
        self.waiting[uid] = self.clock.now + delay

    def move_all_to_active(self) -> int:
        moved = sorted(self.waiting, key=lambda uid: self.waiting[uid])
        self.waiting.clear()
        self.active.extend(moved)
        return len(moved)

    def pop_ready(self) -> str | None:
        due = sorted((t, uid) for uid, t in self.waiting.items() if t <= self.clock.now)
        for _, uid in due:
            del self.waiting[uid]
            self.active.append(uid)
        return self.active.pop(0) if self.active else None


@pytest.mark.parametrize("seed", range(20))
def test_the_heap_of_due_times_pops_as_sorting_every_waiting_pod_would(seed: int) -> None:
    rng = random.Random(seed)
    clock = FakeClock()
    queue, model = make_queue(clock), SortingQueue(clock)
    uids = [f"p{i}" for i in range(12)]
    for _ in range(600):
        op, uid = rng.random(), rng.choice(uids)
        if op < 0.25:
            queue.add(uid)
            model.add(uid)
        elif op < 0.4:
            queue.remove(uid)
            model.remove(uid)
            model.inner.remove(uid)
        elif op < 0.65:
            queue.backoff(uid)
            model.backoff(uid)
        elif op < 0.68:
            assert queue.move_all_to_active() == model.move_all_to_active()
        elif op < 0.8:
            clock.now += rng.choice((0.0, 0.5, 1.0, 4.0, 30.0))
        else:
            assert queue.pop_ready() == model.pop_ready()
        assert len(queue) == len(model.active) + len(model.waiting)


async def test_pop_waits_for_an_added_pod() -> None:
    queue = SchedulingQueue()
    waiter = asyncio.ensure_future(queue.pop())
    await asyncio.sleep(0)
    assert not waiter.done()
    queue.add("x")
    assert await asyncio.wait_for(waiter, 5) == "x"


async def test_pop_wakes_up_when_a_backoff_ends() -> None:
    queue = SchedulingQueue(initial_seconds=0.05)
    queue.backoff("x")
    assert await asyncio.wait_for(queue.pop(), 5) == "x"


def test_settings_defaults_and_environment() -> None:
    settings = parse_settings(
        [], {"TRITONSHARE_POLICY": "spread", "KUBECONFIG": "/k", **KEY_DIR_ENV}
    )
    assert settings.policy == "spread"
    assert settings.kubeconfig == "/k"
    assert settings.listen_http == ("0.0.0.0", 9200)
    assert settings.keys.gpu_mem == "tritonshare.io/gpu-mem"
    assert settings.backoff_max_seconds == 120.0
    assert settings.watch_failure_grace_seconds == 30.0
    grace = parse_settings(
        ["--watch-failure-grace", "5"], {"TRITONSHARE_WATCH_FAILURE_GRACE": "9", **KEY_DIR_ENV}
    )
    assert grace.watch_failure_grace_seconds == 5.0
    flags = parse_settings(
        ["--key-prefix", "seldon.io/trtis-", "--gpu-mem-reserve", "512Mi", "--policy", "binpack"],
        {"TRITONSHARE_POLICY": "spread", **KEY_DIR_ENV},
    )
    assert flags.placement_key_dir == Path("/keys")
    assert flags.keys.gpu_mem == "seldon.io/trtis-gpu-mem"
    assert flags.gpu_mem_reserve == 512 * 1024**2
    assert flags.policy == "binpack"


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--policy", "random"], "neither 'binpack' nor 'spread'"),
        (["--gpu-mem-reserve", "lots"], "is not a Kubernetes quantity"),
        (["--key-prefix", "Not A Prefix"], "not a valid Kubernetes key prefix"),
        (["--listen-http", "nowhere"], "is not host:port"),
        (["--lease-duration", "5", "--renew-deadline", "6"], "shorter than --lease-duration"),
        (["--backoff-initial", "-1"], "more than 0 seconds"),
        (["--bind-workers", "0"], "--bind-workers: '0' must be a whole number of 1 or more"),
        (["--watch-failure-grace", "0"], "--watch-failure-grace: '0' must be more than 0"),
        (["--no-such-flag"], "unrecognized arguments"),
    ],
)
def test_bad_settings_say_what_to_fix(argv: list[str], fragment: str) -> None:
    with pytest.raises(SettingsError, match=fragment.replace("(", r"\(")):
        parse_settings(argv, KEY_DIR_ENV)


def test_the_binder_does_not_start_without_placement_keys() -> None:
    with pytest.raises(SettingsError, match="--placement-key-dir is required"):
        parse_settings([], {})


def test_why_a_pod_is_pending_is_written_once_per_reason_and_throttled_when_it_changes() -> None:
    clock = FakeClock()
    controller = PodController(
        cast(Any, None),
        Ledger(ClusterState(rules=NODE_RULES, reserve=0)),
        leading=asyncio.Event(),
        keys=Keys(),
        policy="binpack",
        queue=SchedulingQueue(clock=clock),
        metrics=Metrics(state=ClusterState(rules=NODE_RULES, reserve=0)),
        executor=cast(Any, None),
        bind_workers=1,
        identity="test",
        placement_keys=lambda: KeyRing(b"k" * 32),
        report_interval=10.0,
        monotonic=clock,
        inbox=cast(Any, None),
        preempt_replica=lambda victim, by, node: None,
    )
    assert controller._should_report("p", "0/1 nodes: largest free block 2Gi")
    controller._reported["p"] = ("0/1 nodes: largest free block 2Gi", clock.now)
    assert not controller._should_report("p", "0/1 nodes: largest free block 2Gi")
    clock.now = 5.0
    assert not controller._should_report("p", "0/1 nodes: largest free block 1Gi")
    clock.now = 10.0
    assert controller._should_report("p", "0/1 nodes: largest free block 1Gi")
    clock.now = 1000.0
    assert not controller._should_report("p", "0/1 nodes: largest free block 2Gi")


def test_a_namespace_with_thousands_of_pending_pods_delays_anothers_by_one_of_its_own() -> None:
    """Active pods are taken one namespace at a time: before, a namespace creating 2,000 pending
    pods (or having them all made active again by a cluster change) put another namespace's pod
    behind all of them; now behind at most one, and each namespace's own stay first in, first
    out."""
    clock = FakeClock()
    queue = make_queue(clock)
    for i in range(2000):
        queue.add(f"flood-{i}", "greedy")
    queue.add("victim-0", "team-b")
    queue.add("victim-1", "team-b")
    order = [queue.pop_ready() for _ in range(6)]
    assert order == ["flood-0", "victim-0", "flood-1", "victim-1", "flood-2", "flood-3"]

    # Every pod failed and waits; a helpful change makes them all active again at once.
    for waiting in ("victim-0", *(f"flood-{i}" for i in range(2000))):
        queue.backoff(waiting)
    assert queue.move_all_to_active() == 2001
    first = [queue.pop_ready() for _ in range(2)]
    assert "victim-0" in first
    # Re-added with no namespace (the controller giving back a pod it popped), it keeps its own.
    queue.add("victim-0")
    assert queue.pop_ready() != "victim-0"  # greedy's turn first, then team-b's
    assert queue.pop_ready() == "victim-0"
    queue.remove("flood-5")
    assert "flood-5" not in queue
    rest = []
    while (popped := queue.pop_ready()) is not None:
        rest.append(popped)
    assert len(rest) == len(set(rest)) == 2001 - 4
    flood = [int(uid.split("-")[1]) for uid in rest]
    assert flood == sorted(flood)  # one namespace's own, in order
