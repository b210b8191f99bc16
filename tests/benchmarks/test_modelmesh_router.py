"""benchmarks.modelmesh_router judges the local case's c=1 latency through modelmesh-serving
against the model's own Service by the median of per-round differences, and reports the relayed
case without a goal."""

from __future__ import annotations

import pytest

from benchmarks import modelmesh_router
from benchmarks.proxy_latency import Results


def _results(added: float) -> Results:
    results: Results = {}
    for measure in modelmesh_router.MEASURES:
        base = 1000.0 if measure.endswith("16") else 1.0
        for name in ("own", "service"):
            results[(measure, name)] = [base, base, base]
        results[(measure, "mesh")] = [base + added, base + added, base + 0.5]
        results[(measure, "relayed")] = [base + 0.3] * 3
    return results


def test_the_local_case_is_held_to_its_goal_and_the_relayed_one_is_reported(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert modelmesh_router.check_goals(_results(0.01)) == [True, True]
    out = capsys.readouterr().out
    assert "relayed: modelmesh-serving" in out and "+0.300 ms" in out
    assert modelmesh_router.check_goals(_results(0.2)) == [False, False]
    assert "NOT MET" in capsys.readouterr().out
