"""The request crash quarantine's rules on their own: counting the gateway's suspects in a row
(`agent.quarantine.suspects`), keeping them in the crash ledger across restarts and on the Node,
clearing them, and reading the witnesses of one exit (`agent.status.requestcrash`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from agent.kube.events import PodEvents
from agent.metrics import AgentMetrics
from agent.quarantine.crashledger import CrashLedger, CrashRecord, Marker
from agent.quarantine.published import annotation, from_annotation
from agent.quarantine.suspects import CallerRecord, at_exit, counted, merged, message
from agent.status.requestcrash import RequestCrashes
from common.crashwitness import (
    MAX_RECORDS,
    Suspect,
    Witness,
    WitnessError,
    decode,
    read_witnesses,
    write_witnesses,
)
from tests.agent.nodeview import no_replicas

ATTACKER = Suspect("team-a/bad", "uid-bad", "10.1.0.5", "bad", 1)
NEIGHBOUR = Suspect("team-b/good", "uid-good", "10.1.0.6", "good", 1)
BUSY = Suspect("team-c/busy", "uid-busy", "10.1.0.7", "busy", 8)


def run(
    crashes: list[list[Suspect]], after: int = 3, probation: float = 600.0
) -> dict[str, CallerRecord]:
    """The records after `crashes`, one exit a minute."""
    records: dict[str, CallerRecord] = {}
    for minute, suspects in enumerate(crashes):
        records = counted(records, suspects, after, now=60.0 * minute, probation_seconds=probation)
    return records


def wired(
    tmp_path: Path, quarantine_after: int, wall: Callable[[], float]
) -> tuple[Path, CrashLedger, RequestCrashes, PodEvents]:
    """A crash ledger settling loads for 60 s by the `wall` clock and the request rule reading
    the witness file, wired as the agent wires them: (witness file, ledger, request rule, its
    Events, to close)."""
    path = tmp_path / "crash-witness.json"
    ledger = CrashLedger(tmp_path / "state", quarantine_after, settle_seconds=60.0, wall=wall)
    ledger.load()
    events = PodEvents(Recorded(), "tritonshare-agent/node", replicas=no_replicas)
    crashes = RequestCrashes("127.0.0.1:1", ledger, path, events, AgentMetrics(), lambda: None)
    ledger.witnessed = crashes.requests_at
    return path, ledger, crashes, events


def test_a_pod_alone_at_k_exits_in_a_row_is_quarantined() -> None:
    records = run([[ATTACKER], [ATTACKER]])
    assert (records[ATTACKER.pod].crashes, records[ATTACKER.pod].quarantined) == (2, False)
    records = counted(records, [ATTACKER], 3)
    assert (records[ATTACKER.pod].crashes, records[ATTACKER.pod].quarantined) == (3, True)


def test_an_exit_with_several_pods_counts_against_none_and_puts_them_on_probation() -> None:
    records = run([[ATTACKER], [ATTACKER, NEIGHBOUR]])
    assert records[ATTACKER.pod].crashes == 1, "an ambiguous exit neither grows nor ends a run"
    assert records[NEIGHBOUR.pod].crashes == 0
    assert records[ATTACKER.pod].on_probation(60.0) and records[NEIGHBOUR.pod].on_probation(60.0)
    assert records[NEIGHBOUR.pod].probation_until == 60.0 + 600.0
    assert not records[NEIGHBOUR.pod].on_probation(660.0), "it lapses"


def test_probation_is_renewed_by_an_ambiguous_exit_and_not_ended_by_an_absent_one() -> None:
    records = run([[ATTACKER, NEIGHBOUR], [ATTACKER], [ATTACKER, NEIGHBOUR]], after=5)
    assert records[NEIGHBOUR.pod].probation_until == 120.0 + 600.0
    records = run([[ATTACKER, NEIGHBOUR], [ATTACKER]], after=5)
    assert records[NEIGHBOUR.pod].on_probation(60.0), "absent from the second exit: still on"
    records = run([[ATTACKER, NEIGHBOUR], [ATTACKER]], after=5, probation=30.0)
    assert NEIGHBOUR.pod not in records, "its probation lapsed and it has no run: forgotten"


def test_an_exit_without_the_pod_ends_its_run() -> None:
    records = run([[ATTACKER], [ATTACKER], [], [ATTACKER], [ATTACKER]])
    assert (records[ATTACKER.pod].crashes, records[ATTACKER.pod].quarantined) == (2, False)
    records = run([[NEIGHBOUR], [ATTACKER], [ATTACKER]])
    assert NEIGHBOUR.pod not in records


def test_a_busy_neighbour_at_every_exit_is_never_quarantined() -> None:
    """However many exits an attacker causes with a never idle neighbour beside it, none counts
    against the neighbour: it is present with the attacker at each."""
    records = run([[ATTACKER, BUSY]] * 20)
    assert not records[ATTACKER.pod].quarantined and not records[BUSY.pod].quarantined
    assert records[BUSY.pod].crashes == 0


def test_the_attacker_is_quarantined_after_k_exits_it_was_alone_at() -> None:
    """Once the gateway serializes the probationers, the attacker's exits find it alone."""
    records = run([[ATTACKER, BUSY], [ATTACKER], [ATTACKER, BUSY], [ATTACKER], [ATTACKER]])
    assert (records[ATTACKER.pod].crashes, records[ATTACKER.pod].quarantined) == (3, True)
    assert records[ATTACKER.pod].probation_until == 0.0, "quarantined: no longer on probation"
    assert not records[BUSY.pod].quarantined and records[BUSY.pod].on_probation(240.0)


def test_a_quarantine_stays_whatever_follows() -> None:
    records = run([[ATTACKER]] * 3 + [[], [NEIGHBOUR]])
    assert records[ATTACKER.pod].quarantined and records[ATTACKER.pod].crashes == 3


def test_several_records_of_one_exit_count_each_pod_once() -> None:
    busier = replace(ATTACKER, in_flight=3)
    assert merged([[ATTACKER, NEIGHBOUR], [busier], [ATTACKER]]) == [busier, NEIGHBOUR]


def test_the_ledger_keeps_quarantined_pods_across_restarts_and_on_the_node(
    tmp_path: Path,
) -> None:
    now = [1000.0]
    ledger = CrashLedger(tmp_path, 2, probation_seconds=600.0, wall=lambda: now[0])
    ledger.load()
    assert ledger.requests_crashed([ATTACKER, NEIGHBOUR]) == []
    assert ledger.requests_crashed([ATTACKER]) == []
    quarantined = ledger.requests_crashed([ATTACKER])
    assert [r.pod for r in quarantined] == [ATTACKER.pod]
    assert ledger.requests_crashed([ATTACKER]) == [], "reported once, when it is quarantined"

    restarted = CrashLedger(tmp_path, 2, wall=lambda: now[0])
    restarted.load()
    record = restarted.caller_quarantine(ATTACKER.pod)
    assert record is not None and record.crashes == 2
    assert restarted.caller_quarantine(NEIGHBOUR.pod) is None
    assert restarted.caller_probation(NEIGHBOUR.pod) is not None, "probation survives a restart"
    assert restarted.caller_probation(ATTACKER.pod) is None, "quarantined, not on probation"
    now[0] += 600.0
    assert restarted.caller_probation(NEIGHBOUR.pod) is None, "it lapsed"

    # A node pod replacement: the Node's annotation brings it back beside a model quarantine.
    model = CrashRecord("ab" * 32, "m", "team-x/m-0", 3, True)
    shown = annotation([model], restarted.callers())
    assert from_annotation(shown) == ([model], [record])
    fresh = CrashLedger(tmp_path / "new", 2)
    fresh.load()
    fresh.restore(*from_annotation(shown))
    assert fresh.caller_quarantine(ATTACKER.pod) == record

    # Cleared by its pod, or by namespace/model id.
    assert fresh.clear_callers(["team-a/other"]) == []
    assert fresh.clear_callers([" team-a/bad "]) == [record]
    assert fresh.caller_quarantine(ATTACKER.pod) is None
    assert fresh.clear(["team-a/bad"]) == [], "model quarantines are another matter"


def test_the_message_says_what_happened_and_how_it_is_cleared() -> None:
    said = message(CallerRecord("team-a/bad", "bad", "uid", 3, True))
    assert "3 times in a row" in said
    assert "tritonshare quarantine clear <node> team-a/bad" in said


def test_the_witness_file_keeps_the_newest_records_and_says_when_it_is_unreadable(
    tmp_path: Path,
) -> None:
    path = tmp_path / "crash-witness.json"
    assert read_witnesses(path) == []
    records = [Witness(float(i), (ATTACKER,)) for i in range(MAX_RECORDS + 5)]
    write_witnesses(path, records)
    assert read_witnesses(path) == records[-MAX_RECORDS:]
    for bad in (b"[]", b'{"format": "other"}', b'{"format": "tritonshare.io/crash-witness/v1"}'):
        try:
            decode(bad)
        except WitnessError as e:
            assert "witness" in str(e)
        else:
            raise AssertionError(f"{bad!r} was read")


class Recorded:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    async def record_pod_event(
        self,
        namespace: str,
        name: str,
        uid: str,
        *,
        reason: str,
        message: str,
        component: str,
        event_type: str = "Warning",
    ) -> None:
        self.events.append((f"{namespace}/{name}", reason, message))


async def test_the_agent_counts_the_witnesses_of_each_exit_once(tmp_path: Path) -> None:
    path = tmp_path / "crash-witness.json"
    ledger = CrashLedger(tmp_path / "state", 2)
    ledger.load()
    recorded = Recorded()
    events = PodEvents(recorded, "tritonshare-agent/node", replicas=no_replicas)
    told: list[int] = []
    crashes = RequestCrashes(
        "127.0.0.1:1",
        ledger,
        path,
        events,
        AgentMetrics(),
        lambda: told.append(1),
        slack_seconds=1.0,
    )
    write_witnesses(path, [Witness(100.0, (ATTACKER, BUSY))])
    assert crashes.exited(50.0, 80.0) == [], "no record near this exit: nobody is counted"
    assert ledger.callers() == []
    assert crashes.exited(99.5, 100.2) == []
    assert {r.pod: r.crashes for r in ledger.callers()} == {ATTACKER.pod: 0, BUSY.pod: 0}
    assert crashes.on_probation(ATTACKER.pod) and crashes.on_probation(BUSY.pod)
    assert not crashes.on_probation(NEIGHBOUR.pod)
    assert told == [1], "the caller table is rewritten: the gateway serializes the two"
    assert crashes.exited(99.5, 100.2) == [], "a record is counted once"
    assert {r.pod: r.crashes for r in ledger.callers()} == {ATTACKER.pod: 0, BUSY.pod: 0}
    # Serialized, the attacker's next exits find it alone.
    witnesses = [Witness(100.0, (ATTACKER, BUSY)), Witness(200.0, (ATTACKER,))]
    write_witnesses(path, witnesses)
    assert crashes.exited(199.9, 200.5) == []
    write_witnesses(path, [*witnesses, Witness(300.0, (ATTACKER,))])
    quarantined = crashes.exited(299.9, 300.5)
    assert [r.pod for r in quarantined] == [ATTACKER.pod]
    assert told == [1, 1], "the caller table is rewritten"
    assert "2 times in a row" in crashes.quarantine_of(ATTACKER.pod)
    assert crashes.quarantine_of(BUSY.pod) == "" and crashes.on_probation(BUSY.pod)
    await events.close()
    assert [(pod, reason) for pod, reason, _ in recorded.events] == [
        (ATTACKER.pod, "RequestsCrashedTriton")
    ]
    path.write_text(json.dumps({"format": "nonsense"}))
    assert crashes.exited(399.0, 400.0) == [], "an unreadable file counts nothing"


SENDER = Suspect("team-b/good", "uid-good", "10.1.0.6", "good", 0)
"""The neighbour as the last sender before an exit: its request was answered."""


def test_a_load_in_flight_comes_before_the_pods_that_sent() -> None:
    """Its exit counts against no answered sender; pods with requests at Triton share it with
    the load (ambiguous); with neither, the load alone is the suspect."""
    crasher = {"team-c/crasher"}
    assert at_exit([SENDER], loading=True) == ([], False)
    assert at_exit([ATTACKER], loading=True) == ([ATTACKER], True)
    assert at_exit([SENDER], loading=False, settling=crasher) == ([], False), "what changed"
    own = at_exit([ATTACKER], loading=False, settling={ATTACKER.pod})
    assert own == ([ATTACKER], False), "its own load settles: its requests are what is left"
    assert at_exit([SENDER], loading=False) == ([SENDER], False)
    restoring = at_exit([SENDER], loading=False, restoring=True)
    assert restoring == ([], False), "beside a reload, an answered sender is no evidence either"
    restoring = at_exit([ATTACKER], loading=False, restoring=True)
    assert restoring == ([ATTACKER], False), "but a reload shares no exit with requests"
    assert at_exit([ATTACKER, BUSY], loading=False) == ([ATTACKER, BUSY], True)


def test_a_request_that_harms_after_its_answer_shares_the_exit_with_a_busy_neighbour() -> None:
    """The attacker's request was answered a moment before the exit, the neighbour's was at
    Triton: the gateway names both, and neither is counted alone, even beside the attacker's own
    freshly loaded model."""
    for settling in ((), {SENDER.pod}, {SENDER.pod, BUSY.pod}):
        assert at_exit([BUSY, SENDER], loading=False, settling=settling) == ([BUSY, SENDER], True)
    assert at_exit([BUSY, SENDER], loading=True) == ([BUSY], True), "beside a load, no evidence"


def test_a_settling_load_shares_the_exit_with_another_pods_requests() -> None:
    """A model that kills Triton seconds after its load is READY, while a busy neighbour's
    request happens to be at Triton: nothing tells the two apart, so the neighbour is on
    probation and counted for nothing. Before, the neighbour was counted alone (and the load,
    explained by its request, never suspected again)."""
    shared = at_exit([BUSY], loading=False, settling={"team-c/crasher"})
    assert shared == ([BUSY], True)
    after = counted({}, shared[0], 2, now=0.0, probation_seconds=600.0, ambiguous=shared[1])
    assert after[BUSY.pod].crashes == 0 and after[BUSY.pod].on_probation(1.0)
    after = counted({}, [ATTACKER], 1, now=0.0, probation_seconds=600.0, ambiguous=True)
    assert after[ATTACKER.pod].crashes == 0 and after[ATTACKER.pod].on_probation(1.0)


async def test_an_exit_under_a_load_counts_no_request(tmp_path: Path) -> None:
    path = tmp_path / "crash-witness.json"
    ledger = CrashLedger(tmp_path / "state", 1, settle_seconds=60.0, wall=lambda: 100.5)
    ledger.load()
    told: list[int] = []
    events = PodEvents(Recorded(), "tritonshare-agent/node", replicas=no_replicas)
    crashes = RequestCrashes(
        "127.0.0.1:1", ledger, path, events, AgentMetrics(), lambda: told.append(1)
    )
    ledger.witnessed = crashes.requests_at  # as the agent wires them
    loading = Marker("m-1", "d" * 64, "crasher", "team-c/crasher", started_at=99.0)
    ledger.loading(loading)
    write_witnesses(path, [Witness(100.0, (SENDER,))])
    assert crashes.exited(99.5, 100.2) == [], "the neighbour that sent last is no evidence"
    assert ledger.callers() == []
    assert crashes.requests_at(loading) == [], "and no request explains the load's exit"
    write_witnesses(path, [Witness(100.0, (SENDER,)), Witness(100.4, (ATTACKER,))])
    assert crashes.requests_at(loading) == [ATTACKER.pod]
    assert ledger.explained(loading) == [ATTACKER.pod], "its requests explain the exit"
    assert ledger.markers() == {} and ledger.count(loading.digest) == 0, "the load not counted"
    assert crashes.exited(100.3, 100.45) == [], "nor are the requests: the load shared it"
    assert crashes.on_probation(ATTACKER.pod) and told == [1]
    # A load sent to the Triton that came back was not there.
    ledger.loading(replace(loading, started_at=200.0))
    write_witnesses(path, [Witness(150.0, (ATTACKER,))])
    assert [r.pod for r in crashes.exited(149.5, 150.2)] == [ATTACKER.pod]
    await events.close()


async def test_a_settling_load_beside_other_pods_requests_stays_a_suspect(tmp_path: Path) -> None:
    """The files of a load that had finished when Triton died with another pod's requests at
    it are neither counted nor cleared: they load again alone, under watch. Its own pod's
    requests there explain it (the requests' rule counts them). Before, any pod's requests
    cleared the load, so a model that kills Triton a few seconds after each READY was reloaded
    unwatched ever after, and never counted."""
    path, ledger, _, events = wired(tmp_path, 2, lambda: 100.5)
    settling = Marker("m-1", "d" * 64, "crasher", "team-c/crasher", 96.0, 95.0)
    own = Marker("m-2", "e" * 64, "busy", BUSY.pod, 96.0, 95.0)
    ledger.loading(settling)
    ledger.loading(own)
    write_witnesses(path, [Witness(100.0, (BUSY,))])
    assert ledger.explained(settling) == [] and ledger.at_triton(settling) == [BUSY.pod]
    assert ledger.explained(own) == [BUSY.pod]
    assert set(ledger.markers()) == {"m-1"}, "only the explained load is cleared"
    record = ledger.crashed(settling, alone=False)
    assert record.crashes == 0 and ledger.suspected(settling.digest)
    await events.close()


async def test_an_exit_the_gateway_records_after_the_agent_saw_triton_back_is_counted(
    tmp_path: Path,
) -> None:
    """On a busy node the gateway's witness may write its record after the agent has seen
    Triton exit and come back: the agent waits for it. Before, it counted no pod for the exit,
    and the record, late, was never counted."""
    path = tmp_path / "crash-witness.json"
    ledger = CrashLedger(tmp_path / "state", 1)
    ledger.load()
    events = PodEvents(Recorded(), "tritonshare-agent/node", replicas=no_replicas)
    told = asyncio.Event()
    crashes = RequestCrashes("127.0.0.1:1", ledger, path, events, AgentMetrics(), told.set)
    died = time.time()
    crashes._gone(died)
    crashes._back()
    await asyncio.sleep(0.3)
    assert ledger.callers() == [], "not counted yet: no record"
    write_witnesses(path, [Witness(died, (ATTACKER,))])
    async with asyncio.timeout(10):
        await told.wait()
    assert [(r.pod, r.quarantined) for r in ledger.callers()] == [(ATTACKER.pod, True)]
    await events.close()


async def test_a_suspect_reload_that_shares_a_second_exit_with_requests_is_theirs(
    tmp_path: Path,
) -> None:
    """An attacker's requests kill Triton while a neighbour's model settles (loaded, or woken,
    a moment before): that exit is shared (the attacker on probation, the neighbour's files
    only suspected, loaded again alone). When the suspect reload shares the next exit with
    requests too, the exit is theirs: the attacker is counted and the reload cleared. Without
    that, every exit was shared and the attacker never counted, Triton down again and again."""
    now = [100.5]
    path, ledger, crashes, events = wired(tmp_path, 1, lambda: now[0])
    settling = Marker("m-1", "n" * 64, "good", NEIGHBOUR.pod, 90.0, 89.0)
    ledger.loading(settling)
    write_witnesses(path, [Witness(100.0, (ATTACKER,))])
    assert crashes.exited(99.5, 100.2) == [] and crashes.on_probation(ATTACKER.pod)
    assert ledger.explained(settling) == [], "shared: only suspected"
    ledger.crashed(settling, alone=False)  # as the reconciler does
    reload = replace(settling, started_at=110.0, finished_at=111.0)
    ledger.loading(reload)
    now[0] = 115.5
    write_witnesses(path, [Witness(100.0, (ATTACKER,)), Witness(115.0, (ATTACKER,))])
    assert ledger.explained(reload) == [ATTACKER.pod] and "m-1" not in ledger.markers()
    assert [r.pod for r in crashes.exited(114.5, 115.2)] == [ATTACKER.pod]
    assert ledger.count(settling.digest) == 0 and ledger.quarantined(settling.digest) is None
    await events.close()


async def test_an_exit_the_agents_watch_saw_only_as_a_drop_is_counted_from_the_gateways_record(
    tmp_path: Path,
) -> None:
    """The agent's loop stalled past Triton's restart: its connection only saw a drop, and its
    new connection was accepted by the new Triton. The gateway's record of the death counts it,
    once; a drop the gateway recorded no death for counts nothing. Before, such an exit was
    never counted."""
    path = tmp_path / "crash-witness.json"
    ledger = CrashLedger(tmp_path / "state", 2)
    ledger.load()
    events = PodEvents(Recorded(), "tritonshare-agent/node", replicas=no_replicas)
    told = asyncio.Event()
    metrics = AgentMetrics()
    crashes = RequestCrashes(
        "127.0.0.1:1", ledger, path, events, metrics, told.set, witness_wait_seconds=0.5
    )

    def exits() -> float | None:
        return metrics.registry.get_sample_value("tritonshare_agent_triton_exits_witnessed_total")

    crashes._up()
    await asyncio.sleep(0.01)
    crashes._dropped(time.time())  # an idle close: nothing recorded
    await asyncio.sleep(1.0)
    assert exits() == 0 and ledger.callers() == []
    died = time.time()
    write_witnesses(path, [Witness(died, (ATTACKER,))])
    crashes._dropped(died + 3.0)  # seen late: the new Triton accepted the new connection
    crashes._up()
    assert exits() == 1
    assert [(r.pod, r.crashes) for r in ledger.callers()] == [(ATTACKER.pod, 1)]
    crashes._dropped(time.time())
    await asyncio.sleep(1.0)
    assert exits() == 1, "a record is counted once"
    # The next exit, seen as it happens, is counted as before, and the first not again.
    write_witnesses(path, [Witness(died, (ATTACKER,)), Witness(time.time(), (ATTACKER,))])
    crashes._gone(time.time() - 0.1)
    crashes._back()
    async with asyncio.timeout(10):
        await told.wait()
    assert exits() == 2
    assert [(r.pod, r.quarantined) for r in ledger.callers()] == [(ATTACKER.pod, True)]
    await events.close()


async def test_a_trial_reload_sharing_a_second_exit_with_requests_counts_against_neither(
    tmp_path: Path,
) -> None:
    """The suspect's reload was a trial: probationers were kept from Triton through its
    settling window, so the requests beside its second exit are no probationer's (a neighbour
    busy since, or one the hold failed to keep out): the exit is ambiguous again, never theirs
    for being the second in a row. Before, the pod at Triton at both was counted."""
    now = [100.5]
    path, ledger, crashes, events = wired(tmp_path, 1, lambda: now[0])
    settling = Marker("m-1", "n" * 64, "late", ATTACKER.pod, 90.0, 89.0)
    ledger.loading(settling)
    write_witnesses(path, [Witness(100.0, (BUSY,))])
    assert crashes.exited(99.5, 100.2) == [] and crashes.on_probation(BUSY.pod)
    ledger.crashed(settling, alone=False)
    trial = replace(settling, started_at=110.0, finished_at=111.0, trial=True)
    ledger.loading(trial)
    now[0] = 115.5
    write_witnesses(path, [Witness(100.0, (BUSY,)), Witness(115.0, (BUSY,))])
    assert ledger.explained(trial) == [], "not the requests': the trial stays a suspect"
    assert crashes.exited(114.5, 115.2) == []
    assert {r.pod: r.crashes for r in ledger.callers()} == {BUSY.pod: 0}
    await events.close()


async def test_a_reload_sent_after_the_agent_saw_triton_go_is_not_at_that_exit(
    tmp_path: Path,
) -> None:
    """Once Triton is back the agent reloads what it held, while it may still wait for the
    gateway's record: those reloads began after its own connection closed, so they were not at
    the exit, however close within the clocks' slack. Before, such a reload made the exit look
    like one under a load, and the attacker sending alone was never counted."""
    path = tmp_path / "crash-witness.json"
    now = [100.5]
    ledger = CrashLedger(tmp_path / "state", 1, settle_seconds=60.0, wall=lambda: now[0])
    ledger.load()
    events = PodEvents(Recorded(), "tritonshare-agent/node", replicas=no_replicas)
    crashes = RequestCrashes("127.0.0.1:1", ledger, path, events, AgentMetrics(), lambda: None)
    reload = Marker("m-1", "n" * 64, "good", NEIGHBOUR.pod, 0.0, 100.3, restore=True)
    ledger.loading(reload)
    write_witnesses(path, [Witness(100.0, (replace(ATTACKER, in_flight=0),))])
    assert crashes.exited(99.5, 100.0) == [], "without when it saw the exit: a reload in flight"
    assert {r.pod: r.crashes for r in ledger.callers()} == {}
    write_witnesses(path, [Witness(100.0, (ATTACKER,)), Witness(110.0, (ATTACKER,))])
    reload = replace(reload, started_at=110.3)
    ledger.loading(reload)
    quarantined = crashes.exited(109.9, 110.0, gone_at=110.1)
    assert [r.pod for r in quarantined] == [ATTACKER.pod]
    await events.close()
