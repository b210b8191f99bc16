"""The residency benchmark on a small fleet: the same placement core and the same pods for every
configuration, a closing line with its figures, and fewer GPUs with the tail on-demand."""

from __future__ import annotations

import re

import pytest

from benchmarks import residency


def test_a_small_fleet_needs_fewer_gpus_with_its_tail_on_demand(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["residency", "--models", "300", "--hours", "0.5", "--factors", "1,3", "--rate", "20"]
    monkeypatch.setattr("sys.argv", argv)
    residency.main()
    out = capsys.readouterr().out
    assert "the on-demand tail (models outside the top 20% by rate) takes 5.00 % of requests" in out
    rows = dict(
        re.findall(r"^(all always \(baseline\)|tail on-demand, over-commit \d)\s+(\d+)", out, re.M)
    )
    always, factor_1, factor_3 = (int(rows[k]) for k in rows)
    # Without over-commit the tail still costs only its largest model beside the always ones.
    assert factor_3 < factor_1 <= always
    closing = out.strip().splitlines()[-1]
    match = re.fullmatch(
        r"residency: GPUs all-always (\d+), with the tail on-demand (\d+) \((\d+\.\d)x fewer\) "
        r"at over-commit 3; (\d+\.\d+) % of requests waited for a wake",
        closing,
    )
    assert match is not None, closing
    assert int(match[1]) == always and int(match[2]) == factor_3
    assert 0 < float(match[4]) <= 5.0  # only the tail's requests (5 %) can wait
