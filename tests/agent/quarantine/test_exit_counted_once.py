"""Each exit of Triton counts once toward the crash quarantine (agent/quarantine/crashledger.py),
whatever the number of its suspects: several versions of a namespace's model loading together,
each found as its pod asks for it again, each found guilty alone later, and the exits shared
with requests that a version's guilt makes its own. Markers name the Triton process their load
went to (`Marker.triton`); an exit is that process's. The whole path through a real Triton is
tests/agent/quarantine/test_crash_bound.py."""

from __future__ import annotations

from pathlib import Path

from agent.quarantine.crashledger import CrashLedger, Marker

FILES_AFTER = 3
NAMESPACE_AFTER = 2


def ledger_at(directory: Path, wall: list[float] | None = None) -> CrashLedger:
    clock = wall if wall is not None else [100.0]
    ledger = CrashLedger(
        directory,
        FILES_AFTER,
        namespace_quarantine_after=NAMESPACE_AFTER,
        wall=lambda: clock[0],
    )
    ledger.load()
    return ledger


def versions_loading(ledger: CrashLedger, exit: int, count: int = 3) -> list[Marker]:
    """`count` versions of one namespace's model (one byte apart: a digest each) in flight
    together, sent to the Triton process loads go to now."""
    loading = [
        Marker(
            f"killer-{v}-{exit}",
            f"{v:02d}" * 32,
            f"killer-{v}",
            f"team-a/killer-{v}",
            started_at=float(exit),
            triton=ledger.triton,
        )
        for v in range(count)
    ]
    for marker in loading:
        ledger.loading(marker)
    return loading


def namespace_crashes(ledger: CrashLedger) -> int:
    return next((n.crashes for n in ledger.namespaces() if n.namespace == "team-a"), 0)


def test_versions_loading_together_at_one_exit_count_it_once(tmp_path: Path) -> None:
    ledger = ledger_at(tmp_path)
    loading = versions_loading(ledger, 1)
    ledger.triton_exited()
    # Each version's pod asks again at once: each marker left over is counted as it loads again.
    records = [ledger.crashed(marker) for marker in loading]
    assert namespace_crashes(ledger) == 1, "one exit, one crash of the namespace"
    assert [r.crashes for r in records] == [1, 1, 1], "each version's files were at the exit"


def test_a_namespace_is_quarantined_at_exactly_the_bound_of_real_exits(tmp_path: Path) -> None:
    ledger = ledger_at(tmp_path)
    bound = FILES_AFTER + NAMESPACE_AFTER
    for exit in range(1, bound + 1):
        assert ledger.namespace_quarantine("team-a") is None, f"quarantined after {exit - 1}"
        loading = versions_loading(ledger, exit)
        ledger.triton_exited()
        for marker in loading:
            ledger.crashed(marker, alone=marker is loading[-1])
        assert namespace_crashes(ledger) == exit
    assert ledger.namespace_quarantine("team-a") is not None


def test_an_exit_shared_with_requests_counts_once_however_many_versions_are_found_guilty(
    tmp_path: Path,
) -> None:
    ledger = ledger_at(tmp_path)
    ledger.witnessed = lambda marker: ["team-b/busy"]
    loading = versions_loading(ledger, 1)
    ledger.triton_exited()
    for marker in loading:
        assert ledger.explained(marker) == ["team-b/busy"]
    assert namespace_crashes(ledger) == 0, "an exit shared with requests counts against neither"
    ledger.witnessed = None
    for exit, marker in enumerate(loading, start=2):
        # Each version loads again alone, and takes Triton down alone.
        alone = Marker(
            marker.name, marker.digest, marker.model_id, marker.pod, triton=ledger.triton
        )
        ledger.loading(alone)
        ledger.triton_exited()
        ledger.crashed(alone)
        # Its own exit, and the shared one it owed once: 1 + 1, then + 1 for each next version.
        assert namespace_crashes(ledger) == exit, f"version {exit - 1}"


def test_a_held_namespace_s_versions_beside_requests_count_their_exit_once(
    tmp_path: Path,
) -> None:
    ledger = ledger_at(tmp_path)
    for exit in range(FILES_AFTER):  # one version's files quarantined: the namespace is held
        first = versions_loading(ledger, exit, count=1)[0]
        ledger.triton_exited()
        ledger.crashed(first)
    assert ledger.held("team-a") and namespace_crashes(ledger) == FILES_AFTER
    ledger.witnessed = lambda marker: ["team-b/busy"]
    loading = versions_loading(ledger, FILES_AFTER, count=3)
    ledger.triton_exited()
    for marker in loading:
        ledger.explained(marker)
    assert namespace_crashes(ledger) == FILES_AFTER + 1, "a held namespace's exit, once"
    assert ledger.namespace_quarantine("team-a") is None


def test_an_exit_the_liveness_watch_missed_names_the_next_process(tmp_path: Path) -> None:
    ledger = ledger_at(tmp_path)
    first = versions_loading(ledger, 1, count=1)[0]
    # Triton came back between two polls: the marker left over is the only sign of the exit.
    ledger.crashed(first)
    second = versions_loading(ledger, 2, count=1)[0]
    assert second.triton != first.triton, "the reloads went to another Triton"
    ledger.crashed(second)
    assert namespace_crashes(ledger) == 2, "two exits"


def test_an_exit_counted_before_a_restart_of_the_agent_is_not_counted_again(
    tmp_path: Path,
) -> None:
    ledger = ledger_at(tmp_path)
    loading = versions_loading(ledger, 1)
    ledger.triton_exited()
    ledger.crashed(loading[0])
    restarted = ledger_at(tmp_path)
    assert restarted.triton != ledger.triton, "a restarted agent names processes afresh"
    for marker in restarted.markers().values():
        restarted.crashed(marker)
    assert namespace_crashes(restarted) == 1
    assert [r.crashes for r in restarted.records()] == [1, 1, 1]


def test_markers_without_a_process_count_an_exit_each_as_before(tmp_path: Path) -> None:
    ledger = ledger_at(tmp_path)
    older = Marker("m-1", "ab" * 32, "bad", "team-a/bad-1")
    ledger.crashed(older)
    ledger.crashed(older)
    assert namespace_crashes(ledger) == 2
    assert [r.crashes for r in ledger.records()] == [2]
