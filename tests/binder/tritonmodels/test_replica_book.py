"""The replica book's transitions: the one writer of the ledger's drains, parks, stand-ins and
host refusals, each read back as the placer, serving and the host writer read them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

from binder.cluster.ledger import Ledger
from binder.tritonmodels.replicabook import ReplicaBook


def test_a_drain_is_mirrored_in_the_ledger_and_ends_at_its_bound() -> None:
    now = [100.0]
    ledger = SimpleNamespace(draining=set())
    book = ReplicaBook(cast(Ledger, ledger), drain_seconds=30.0, clock=lambda: now[0])
    book.drain("m/0")
    book.drain("m/1")
    book.drain("other/0")
    assert ledger.draining == {"m/0", "m/1", "other/0"}
    assert book.draining("m/0") and not book.draining("m/2")
    assert sorted(book.drains_of("m")) == ["m/0", "m/1"]
    assert book.drain_ends("m/1") == 130.0
    assert sorted(book.draining_models()) == ["m", "other"]
    book.undrain("m/0")
    book.forget("m")
    assert ledger.draining == {"other/0"}
    assert book.drains_of("m") == [] and list(book.draining_models()) == ["other"]


def test_parks_stand_ins_and_refusals_say_when_they_change() -> None:
    book = ReplicaBook(cast(Ledger, SimpleNamespace(draining=set())), drain_seconds=1, clock=float)
    assert book.park("m", "n1") and not book.park("m", "n1") and book.park("m", "n2")
    assert book.parked_at("m") == "n2"
    book.ask_stand_in("m", "n1")
    assert book.stand_in("m") == "n1" and book.stand_ins == {"m": "n1"}
    assert book.refuse_host("ns", ("n1", ""), "quota") and not book.refuse_host(
        "ns", ("n1", ""), "quota"
    )
    assert book.host_refused("ns", ("n1", "")) == "quota"
    assert book.refused_hosts("ns") == [("n1", "")] and book.refused_hosts("other") == []
    assert book.accept_host("ns", ("n1", "")) and not book.accept_host("ns", ("n1", ""))
    book.forget("m")
    assert book.parked_at("m") is None and book.stand_in("m") is None
