"""The caller table's format (`common.callers`) and how the gateway follows it (`CallerBook`):
what it lets in, what it revokes and when, and that it fails closed. A clock is injected, so
staleness is tested without waiting."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from common.callers import Caller, CallerTable, CallerTableError, decode, encode, write_table
from proxy.gateway.callerbook import CallerBook

A = Caller("10.1.0.5", "add_one", "team-a/add-one", "uid-a")
B = Caller("10.1.0.6", "identity", "team-b/identity", "uid-b")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_table_survives_the_round_trip() -> None:
    table = CallerTable("node-1", 12.5, (B, A))
    decoded = decode(encode(table))
    assert decoded.node == "node-1" and decoded.written_at == 12.5
    assert set(decoded.callers) == {A, B}


def test_a_pods_declared_concurrency_survives_the_round_trip_and_old_tables_read() -> None:
    limited = Caller("10.1.0.7", "add_one", "team-a/limited", "uid-c", 4)
    assert decode(encode(CallerTable("node-1", 1.0, (limited,)))).callers == (limited,)
    # An agent before the field wrote none: its callers declare nothing (the gateway's default).
    old = {"format": "tritonshare.io/callers/v1", "node": "n", "writtenAt": 1,
           "callers": [{"address": "10.0.0.1", "modelId": "m", "pod": "p",
                        "uid": "u"}]}  # fmt: skip
    assert decode(json.dumps(old).encode()).callers[0].concurrency == 0


def test_a_private_triton_name_survives_the_round_trip_and_old_tables_use_the_model_id() -> None:
    private = Caller("10.1.0.8", "resnet50", "team-a/r", "uid-d", 0, "resnet50.0123abcd")
    decoded = decode(encode(CallerTable("node-1", 1.0, (private, A)))).callers
    assert {c.address: c.name_in_triton for c in decoded} == {
        "10.1.0.8": "resnet50.0123abcd",
        A.address: "add_one",
    }
    assert private in decoded


@pytest.mark.parametrize("name", ["../other", ".hidden", 3])
def test_a_triton_name_outside_the_model_id_grammar_is_refused(name: object) -> None:
    document = {"format": "tritonshare.io/callers/v1", "node": "n", "writtenAt": 1,
                "callers": [{"address": "10.0.0.1", "modelId": "m", "pod": "p", "uid": "u",
                             "tritonName": name}]}  # fmt: skip
    with pytest.raises(CallerTableError):
        decode(json.dumps(document).encode())


@pytest.mark.parametrize("concurrency", [-1, "4", 2.5, True])
def test_a_concurrency_that_is_no_whole_number_is_refused(concurrency: object) -> None:
    document = {"format": "tritonshare.io/callers/v1", "node": "n", "writtenAt": 1,
                "callers": [{"address": "10.0.0.1", "modelId": "m", "pod": "p", "uid": "u",
                             "concurrency": concurrency}]}  # fmt: skip
    with pytest.raises(CallerTableError, match="concurrency"):
        decode(json.dumps(document).encode())


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({"format": "something/else", "node": "n", "writtenAt": 1, "callers": []}, "format"),
        ({"format": "tritonshare.io/callers/v1", "node": "n", "callers": []}, "malformed"),
        (
            {"format": "tritonshare.io/callers/v1", "node": "n", "writtenAt": 1,
             "callers": [{"address": "10.0.0.1\n", "modelId": "m", "pod": "p", "uid": "u"}]},
            "not an IP address",
        ),
        (
            {"format": "tritonshare.io/callers/v1", "node": "n", "writtenAt": 1,
             "callers": [{"address": "10.0.0.1", "modelId": "m\n", "pod": "p", "uid": "u"}]},
            "malformed",
        ),
    ],
)  # fmt: skip
def test_anything_but_a_well_formed_table_is_refused(document: object, problem: str) -> None:
    with pytest.raises(CallerTableError, match=problem):
        decode(json.dumps(document).encode())


def test_no_table_means_no_caller(tmp_path: Path) -> None:
    book = CallerBook(tmp_path / "callers.json", max_age=60)
    book.check()
    assert book.lookup(A.address) is None
    assert "no caller table" in book.problem


def test_callers_changes_and_revocations(tmp_path: Path) -> None:
    path, clock = tmp_path / "callers.json", Clock()
    revoked: list[set[str]] = []
    book = CallerBook(path, max_age=60, on_revoke=revoked.append, clock=clock)
    write_table(path, CallerTable("n", clock.now, (A, B)))
    book.check()
    assert book.lookup(A.address) == {A.model_id: A} and book.lookup(B.address) == {B.model_id: B}
    assert book.lookup("10.1.0.7") is None
    assert revoked == []
    # B's pod is deleted; A's address now belongs to another pod with another model.
    moved = Caller(A.address, "other", "team-c/other", "uid-c")
    write_table(path, CallerTable("n", clock.now, (moved,)))
    book.check()
    assert revoked == [{A.address, B.address}]
    assert book.lookup(A.address) == {moved.model_id: moved} and book.lookup(B.address) is None


def test_a_later_unreadable_table_keeps_the_last_good_one_while_it_is_fresh(
    tmp_path: Path,
) -> None:
    path, clock = tmp_path / "callers.json", Clock()
    revoked: list[set[str]] = []
    book = CallerBook(path, max_age=60, on_revoke=revoked.append, clock=clock)
    write_table(path, CallerTable("n", clock.now, (A,)))
    book.check()
    path.write_text("{ not json")
    os.utime(path, ns=(1, 1))
    book.check()
    assert book.lookup(A.address) == {A.model_id: A}
    clock.now += 61
    book.check()
    assert book.lookup(A.address) is None and revoked == [{A.address}]


def test_a_stale_table_refuses_everyone_until_the_agent_writes_again(tmp_path: Path) -> None:
    path, clock = tmp_path / "callers.json", Clock()
    revoked: list[set[str]] = []
    book = CallerBook(path, max_age=60, on_revoke=revoked.append, clock=clock)
    write_table(path, CallerTable("n", clock.now, (A, B)))
    book.check()
    clock.now += 59
    book.check()
    assert book.lookup(A.address) == {A.model_id: A}
    clock.now += 2
    book.check()
    assert book.lookup(A.address) is None and "not refreshing" in book.problem
    assert revoked == [{A.address, B.address}]
    write_table(path, CallerTable("n", clock.now, (A, B)))
    book.check()
    assert book.lookup(A.address) == {A.model_id: A} and not book.problem


def test_a_table_already_stale_when_read_lets_no_one_in(tmp_path: Path) -> None:
    path, clock = tmp_path / "callers.json", Clock()
    write_table(path, CallerTable("n", clock.now - 3600, (A,)))
    book = CallerBook(path, max_age=60, clock=clock)
    book.check()
    assert book.lookup(A.address) is None
    assert book.callers == {}


def test_a_stale_table_serves_only_the_last_fresh_callers_until_the_grace_ends(
    tmp_path: Path,
) -> None:
    path, clock = tmp_path / "callers.json", Clock()
    revoked: list[set[str]] = []
    book = CallerBook(path, max_age=60, stale_grace=300, on_revoke=revoked.append, clock=clock)
    written = clock.now
    write_table(path, CallerTable("n", written, (A, B)))
    book.check()
    clock.now += 61
    book.check()
    assert book.lookup(A.address) == {A.model_id: A} and book.lookup(B.address) == {B.model_id: B}
    assert not book.problem and "serving only the pods of the last fresh table" in book.stale
    assert revoked == []
    # A table read while stale (here an old one put back) may take callers away, never add.
    newcomer = Caller("10.1.0.7", "add_one", "team-a/new", "uid-n")
    write_table(path, CallerTable("n", written, (A, newcomer)))
    book.check()
    assert book.lookup(newcomer.address) is None and book.lookup(B.address) is None
    assert book.lookup(A.address) == {A.model_id: A} and revoked == [{B.address}]
    clock.now = written + 60 + 300
    book.check()
    assert book.lookup(A.address) == {A.model_id: A}
    clock.now += 1
    book.check()
    assert book.lookup(A.address) is None and "--table-stale-grace (300 s)" in book.problem
    assert not book.stale and revoked == [{B.address}, {A.address}]
    # The agent is back: its fresh table serves, and a later loss has a grace again.
    write_table(path, CallerTable("n", clock.now, (A,)))
    book.check()
    assert book.lookup(A.address) == {A.model_id: A} and not book.problem and not book.stale


def test_a_missing_table_ends_the_grace_at_once_for_good(tmp_path: Path) -> None:
    path, clock = tmp_path / "callers.json", Clock()
    book = CallerBook(path, max_age=60, stale_grace=300, clock=clock)
    write_table(path, CallerTable("n", clock.now, (A,)))
    book.check()
    clock.now += 61
    book.check()
    assert book.lookup(A.address) == {A.model_id: A}
    table = path.read_bytes()
    path.unlink()
    book.check()
    assert book.lookup(A.address) is None and "no caller table" in book.problem
    # The same stale table back in place is no fresh table: it serves no one.
    path.write_bytes(table)
    book.check()
    assert book.lookup(A.address) is None and "never saw it fresh" in book.problem


def test_a_table_stale_at_start_gets_no_grace(tmp_path: Path) -> None:
    path, clock = tmp_path / "callers.json", Clock()
    write_table(path, CallerTable("n", clock.now - 61, (A,)))
    book = CallerBook(path, max_age=60, stale_grace=300, clock=clock)
    book.check()
    assert book.lookup(A.address) is None and not book.stale
    assert "never saw it fresh" in book.problem


def test_probation_survives_the_round_trip_and_changes_no_connection(tmp_path: Path) -> None:
    """A pod going on probation or off it keeps its connections: the book tells the gateway,
    it does not revoke the pod; old tables (no field) mean no probation; a non-boolean is
    refused."""
    on = Caller(A.address, A.model_id, A.pod, A.uid, probation=True)
    assert decode(encode(CallerTable("n", 1.0, (on, B)))).callers == (on, B)
    assert b'"probation"' not in encode(CallerTable("n", 1.0, (A,)))
    entry = {"address": "10.0.0.1", "modelId": "m", "pod": "p", "uid": "u", "probation": "yes"}
    document = {"format": "tritonshare.io/callers/v1", "node": "n", "writtenAt": 1}
    with pytest.raises(CallerTableError, match="probation 'yes' is not true or false"):
        decode(json.dumps({**document, "callers": [entry]}).encode())
    path, clock = tmp_path / "callers.json", Clock()
    revoked: list[set[str]] = []
    changed: list[Caller] = []
    book = CallerBook(
        path, max_age=60, on_revoke=revoked.append, on_probation=changed.append, clock=clock
    )
    write_table(path, CallerTable("n", clock.now, (A, B)))
    book.check()
    clock.now += 1
    write_table(path, CallerTable("n", clock.now, (on, B)))
    book.check()
    assert (revoked, changed, book.lookup(A.address)) == ([], [on], {on.model_id: on})
    clock.now += 1
    write_table(path, CallerTable("n", clock.now, (A, B)))
    book.check()
    assert (revoked, changed) == ([], [on, A])
    # Probation with another change is a revocation like any other.
    clock.now += 1
    moved = Caller(A.address, "x", A.pod, "uid-2", probation=True)
    write_table(path, CallerTable("n", clock.now, (moved, B)))
    book.check()
    assert revoked == [{A.address}] and changed == [on, A]


# -- a model host: one address, one row per replica ------------------------------------------------

HOST_POD = "team-h/tritonshare-host-0123456789abcdef"
HA = Caller("10.1.0.9", "a", HOST_POD, "uid-a/0", 2, "team-h.a.0a0a")
HB = Caller("10.1.0.9", "b", HOST_POD, "uid-b/1", 0, "team-h.b.0b0b")


def test_a_hosts_rows_share_its_address_and_are_read_by_model() -> None:
    decoded = decode(encode(CallerTable("n", 1.0, (HB, A, HA))))
    assert set(decoded.callers) == {A, HA, HB}
    assert decoded.by_address() == {A.address: {A.model_id: A}, HA.address: {"a": HA, "b": HB}}
    assert HA.replica and not A.replica


@pytest.mark.parametrize(
    ("rows", "words"),
    [
        ((HA, Caller(HA.address, "c", "team-x/other", "uid-x")), "given to two pods"),
        ((HA, Caller(HA.address, "a", HOST_POD, "uid-a/1")), "two rows for model a"),
    ],
    ids=["two-pods", "two-rows-of-a-model"],
)
def test_an_address_of_two_pods_or_a_model_twice_is_refused(
    rows: tuple[Caller, ...], words: str
) -> None:
    with pytest.raises(CallerTableError, match=words):
        decode(encode(CallerTable("n", 1.0, rows)))


def test_a_host_losing_a_row_keeps_its_place_and_losing_all_is_revoked(tmp_path: Path) -> None:
    path, clock = tmp_path / "callers.json", Clock()
    revoked: list[set[str]] = []
    rows: list[tuple[str, dict[str, Caller]]] = []
    book = CallerBook(
        path,
        max_age=60,
        on_revoke=revoked.append,
        on_rows=lambda address, now: rows.append((address, dict(now))),
        clock=clock,
    )
    write_table(path, CallerTable("n", clock.now, (HA, HB, A)))
    book.check()
    assert book.lookup(HA.address) == {"a": HA, "b": HB}
    clock.now += 1
    write_table(path, CallerTable("n", clock.now, (HA, A)))  # b's replica left the host
    book.check()
    assert (revoked, rows) == ([], [(HA.address, {"a": HA})])
    clock.now += 1
    quarantined = Caller(HA.address, "b", HOST_POD, "uid-b/1", 0, "team-h.b.0b0b", "why")
    write_table(path, CallerTable("n", clock.now, (HA, quarantined, A)))  # back, quarantined
    book.check()
    assert revoked == [] and rows[-1] == (HA.address, {"a": HA, "b": quarantined})
    clock.now += 1
    write_table(path, CallerTable("n", clock.now, (A,)))  # the host lost every replica
    book.check()
    assert revoked == [{HA.address}] and book.lookup(HA.address) is None


def test_a_hosts_row_moving_to_another_replica_keeps_the_host(tmp_path: Path) -> None:
    # Each of a host's rows is served on its own: its change touches that model's requests only.
    path, clock = tmp_path / "callers.json", Clock()
    revoked: list[set[str]] = []
    rows: list[dict[str, Caller]] = []
    book = CallerBook(
        path,
        max_age=60,
        on_revoke=revoked.append,
        on_rows=lambda address, now: rows.append(dict(now)),
        clock=clock,
    )
    write_table(path, CallerTable("n", clock.now, (HA, HB, A)))
    book.check()
    moved = Caller(HA.address, "a", HOST_POD, "uid-a/1", 2, "team-h.a.ffff")
    quarantined = replace(HB, quarantined="why")
    for table in ((moved, HB), (HA, quarantined), (HA,), (moved,)):
        clock.now += 1
        write_table(path, CallerTable("n", clock.now, (*table, A)))
        book.check()
        assert revoked == [] and rows[-1] == {row.model_id: row for row in table}
    clock.now += 1
    other = Caller(HA.address, "a", "team-h/tritonshare-host-fedcba9876543210", "uid-a/1")
    write_table(path, CallerTable("n", clock.now, (other, A)))  # another host at the address
    book.check()
    assert revoked == [{HA.address}] and book.lookup(HA.address) == {"a": other}


def test_a_model_pods_private_name_changing_revokes_it(tmp_path: Path) -> None:
    path, clock = tmp_path / "callers.json", Clock()
    revoked: list[set[str]] = []
    book = CallerBook(path, max_age=60, on_revoke=revoked.append, clock=clock)
    write_table(path, CallerTable("n", clock.now, (A, B)))
    book.check()
    clock.now += 1
    renamed = replace(A, triton_name="team-a.add_one.ffff")
    write_table(path, CallerTable("n", clock.now, (renamed, B)))
    book.check()
    assert revoked == [{A.address}] and book.lookup(A.address) == {A.model_id: renamed}


def test_a_stale_table_keeps_only_the_rows_it_still_has(tmp_path: Path) -> None:
    path, clock = tmp_path / "callers.json", Clock()
    book = CallerBook(path, max_age=60, stale_grace=300, clock=clock)
    write_table(path, CallerTable("n", clock.now, (HA, HB)))
    book.check()
    clock.now += 100  # stale: an older table put back may take rows away, never add
    write_table(path, CallerTable("n", clock.now - 200, (HA,)))
    book.check()
    assert book.stale and book.lookup(HA.address) == {"a": HA}


def _followed(tmp_path: Path, *tables: tuple[Caller, ...]) -> tuple[list[set[str]], list[Caller]]:
    """What a book following `tables` (one a second) revoked, and the rows it told of as
    changed but for their standing (probation, hold, stop)."""
    path, clock = tmp_path / "callers.json", Clock()
    revoked: list[set[str]] = []
    changed: list[Caller] = []
    book = CallerBook(
        path, max_age=60, on_revoke=revoked.append, on_probation=changed.append, clock=clock
    )
    for rows in tables:
        write_table(path, CallerTable("n", clock.now, rows))
        book.check()
        clock.now += 1
    return revoked, changed


def test_a_hold_survives_the_round_trip_and_changes_no_connection(tmp_path: Path) -> None:
    """A probationer held while a watched load settles keeps its connections: the book tells
    the gateway as for probation; old tables (no field) mean no hold; a non-boolean is refused."""
    on = Caller(A.address, A.model_id, A.pod, A.uid, probation=True)
    held = Caller(A.address, A.model_id, A.pod, A.uid, probation=True, held=True)
    assert decode(encode(CallerTable("n", 1.0, (held, B)))).callers == (held, B)
    assert b'"held"' not in encode(CallerTable("n", 1.0, (on,)))
    entry = {"address": "10.0.0.1", "modelId": "m", "pod": "p", "uid": "u", "held": 1}
    document = {"format": "tritonshare.io/callers/v1", "node": "n", "writtenAt": 1}
    with pytest.raises(CallerTableError, match="held 1 is not true or false"):
        decode(json.dumps({**document, "callers": [entry]}).encode())
    trial = Caller(A.address, A.model_id, A.pod, A.uid, probation=True, held=True, trial=True)
    assert decode(encode(CallerTable("n", 1.0, (trial,)))).callers == (trial,)
    with pytest.raises(CallerTableError, match="trial 1 is not true or false"):
        decode(json.dumps({**document, "callers": [{**entry, "held": True, "trial": 1}]}).encode())
    followed = _followed(tmp_path, (on, B), (held, B), (trial, B), (on, B))
    assert followed == ([], [held, trial, on])


def test_a_key_digest_survives_the_round_trip_and_names_its_address(tmp_path: Path) -> None:
    keyed = replace(A, key="ab" * 32)
    assert decode(encode(CallerTable("node-1", 1.0, (keyed, B)))).callers == (keyed, B)
    path = tmp_path / "callers.json"
    write_table(path, CallerTable("node-1", time.time(), (keyed, B)))
    book = CallerBook(path, max_age=60)
    book.check()
    assert book.by_key("ab" * 32) == (A.address, {"add_one": keyed})
    assert book.by_key("cd" * 32) is None  # a row without a key is found by its address only


@pytest.mark.parametrize("key", ["AB" * 32, "ab" * 31, 7, "zz" * 32])
def test_a_key_that_is_no_sha256_in_hex_is_refused(key: object) -> None:
    document = {"format": "tritonshare.io/callers/v1", "node": "n", "writtenAt": 1,
                "callers": [{"address": "10.0.0.1", "modelId": "m", "pod": "p", "uid": "u",
                             "key": key}]}  # fmt: skip
    with pytest.raises(CallerTableError, match="SHA-256"):
        decode(json.dumps(document).encode())


def test_a_hosts_rows_with_different_keys_are_refused() -> None:
    rows = (
        Caller("10.1.0.9", "m1", "team/host", "uid-m1/0", key="ab" * 32),
        Caller("10.1.0.9", "m2", "team/host", "uid-m2/0", key="cd" * 32),
    )
    with pytest.raises(CallerTableError, match="different keys"):
        decode(encode(CallerTable("node-1", 1.0, rows)))


def test_a_stop_survives_the_round_trip_and_changes_no_connection(tmp_path: Path) -> None:
    """A model pod leaving its Service as the node pod stops keeps its connections (its
    requests are served to the end): the book tells the gateway as for probation; old tables
    (no field) mean it stays; anything but a string is refused."""
    leaving = replace(A, stopping="the node pod is stopping")
    assert decode(encode(CallerTable("n", 1.0, (leaving, B)))).callers == (leaving, B)
    assert b'"stopping"' not in encode(CallerTable("n", 1.0, (A,)))
    entry = {"address": "10.0.0.1", "modelId": "m", "pod": "p", "uid": "u", "stopping": True}
    document = {"format": "tritonshare.io/callers/v1", "node": "n", "writtenAt": 1}
    with pytest.raises(CallerTableError, match="stopping True is not a string"):
        decode(json.dumps({**document, "callers": [entry]}).encode())
    assert _followed(tmp_path, (A, B), (leaving, B), (A, B)) == ([], [leaving, A])
