"""Backoff with full jitter and the overall deadline, driven by a fake clock and a seeded RNG."""

from __future__ import annotations

import random

from loader.retry import Backoff, Deadline


def test_the_ceiling_doubles_up_to_the_maximum() -> None:
    backoff = Backoff(initial=0.25, maximum=5.0)
    assert [backoff.ceiling(n) for n in range(7)] == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert backoff.ceiling(10_000) == 5.0


def test_delays_are_spread_over_the_whole_range_below_the_ceiling() -> None:
    backoff = Backoff(initial=1.0, maximum=8.0)
    rng = random.Random(7)
    delays = [backoff.delay(3, rng) for _ in range(2000)]
    assert all(0.0 <= d <= 8.0 for d in delays)
    # Full jitter: the draws cover the low and the high end, not a band near the ceiling.
    assert min(delays) < 0.5
    assert max(delays) > 7.5
    assert 3.5 < sum(delays) / len(delays) < 4.5


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_deadline_counts_down_on_its_clock() -> None:
    clock = FakeClock()
    deadline = Deadline(10.0, clock)
    assert deadline.remaining() == 10.0
    assert deadline.bound(30.0) == 10.0
    clock.now += 4.0
    assert deadline.remaining() == 6.0
    assert deadline.elapsed() == 4.0
    assert deadline.bound(2.0) == 2.0
    clock.now += 20.0
    assert deadline.remaining() == 0.0
    assert deadline.bound(2.0) == 0.0
