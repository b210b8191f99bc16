"""benchmarks.host_first_answer: Triton's own load time read from Triton's log, true percentiles
by the nearest rank, and a p95 judged only over the rounds it needs."""

from __future__ import annotations

import pytest

from benchmarks import host_first_answer

ZERO_A = "zero-" + "a" * 24
ZERO_B = "zero-" + "b" * 24
TRITON_LOG = f"""\
I1129 10:00:01.000000 23948 model_lifecycle.cc:472] "loading: {ZERO_A}:1"
I1129 10:00:01.100000 23948 model_lifecycle.cc:472] "loading: tm-1-{"c" * 24}:1"
I1129 10:00:02.250000 23948 model_lifecycle.cc:839] "successfully loaded '{ZERO_A}'"
I1129 10:00:02.500000 23948 model_lifecycle.cc:839] "successfully loaded 'tm-1-{"c" * 24}'"
I1129 10:00:09.000000 23948 model_lifecycle.cc:624] "successfully unloaded '{ZERO_A}' version 1"
I1129 23:59:59.500000 23948 model_lifecycle.cc:472] "loading: {ZERO_B}:1"
I1130 00:00:00.900000 23948 model_lifecycle.cc:839] "successfully loaded '{ZERO_B}'"
"""


def test_triton_s_load_is_read_from_its_log_for_the_model_s_private_names() -> None:
    loads = host_first_answer.triton_loads(TRITON_LOG)
    assert [name for name, _ in loads] == [ZERO_A, f"tm-1-{'c' * 24}", ZERO_B]
    assert host_first_answer.load_of(loads, "zero") == pytest.approx(1.4), "the last, past 0 h"
    assert host_first_answer.load_of(loads, "tm-1") == pytest.approx(1.4)
    with pytest.raises(LookupError, match="no load of tm-10"):
        host_first_answer.load_of(loads, "tm-10")


def test_percentiles_by_the_nearest_rank_need_their_rounds() -> None:
    twenty = [float(i) for i in range(1, 21)]
    assert host_first_answer.percentile(twenty, 0.95) == 19.0, "not the largest"
    assert host_first_answer.percentile(twenty[:5], 0.99) == 5.0
    assert host_first_answer.rounds_for(0.95) == 20
    assert host_first_answer.rounds_for(0.99) == 100


def test_from_zero_a_p95_over_5_rounds_does_not_meet_the_goal() -> None:
    quick = [0.5] * 19 + [3.0]
    assert host_first_answer.check_goals(quick, from_zero=True) == [True, True]
    assert host_first_answer.check_goals(quick[:5], from_zero=True) == [False, True]
    slow = [0.5] * 18 + [1.5, 3.0]
    assert host_first_answer.check_goals(slow, from_zero=True) == [True, False]
    assert host_first_answer.check_goals([0.2, 0.25, 0.9], from_zero=False) == [True]
    assert host_first_answer.check_goals([0.2, 0.35, 0.9], from_zero=False) == [False]
