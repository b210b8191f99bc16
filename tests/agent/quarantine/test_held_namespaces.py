"""The namespace count of the crash ledger (agent/quarantine/crashledger.py) and the held loads'
turns (agent/models/heldloads.py): a namespace whose files were quarantined is held, its further
crashes count against it, at the limit its new loads are quarantined on the node; the record
survives a restart and a new node pod (through the Node's annotation) and is cleared by
`NAMESPACE/*`. A held namespace's load begins alone and keeps the node quiet after. The whole path
through a real Triton is tests/agent/quarantine/test_namespace_quarantine.py."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from agent.models.heldloads import HeldLoads
from agent.quarantine.crashledger import CrashLedger, Marker, NamespaceRecord
from agent.quarantine.published import annotation, from_annotation, namespaces_from_annotation


def marker(version: int, namespace: str = "team-a") -> Marker:
    return Marker(f"m-{version}", f"{version:02d}" * 32, "bad", f"{namespace}/bad-{version}")


def test_a_namespace_is_held_once_its_files_are_quarantined_and_counted_from_then(
    tmp_path: Path,
) -> None:
    ledger = CrashLedger(tmp_path, 2, namespace_quarantine_after=2)
    ledger.load()
    ledger.crashed(marker(1))
    assert not ledger.held("team-a"), "a crash in a row is no quarantine yet"
    assert ledger.crashed(marker(1)).quarantined
    assert ledger.held("team-a") and not ledger.held("team-b")
    assert [n.crashes for n in ledger.namespaces()] == [2], "every crash of its loads counts"
    assert ledger.quiet_seconds >= 5.0, "held loads keep a quiet period even with settling off"

    ledger.crashed(marker(2))  # one byte more: a new digest, counted against the namespace too
    assert ledger.namespace_quarantine("team-a") is None
    ledger.loaded(marker(2).digest)  # a good load ends the files' run, not the namespace's
    ledger.crashed(marker(3))
    held = ledger.namespace_quarantine("team-a")
    assert held == NamespaceRecord("team-a", "team-a/bad-3", 4, True, held.at if held else 0)
    ledger.crashed(marker(4, "team-b"))
    assert ledger.namespace_quarantine("team-b") is None, "another namespace is not held"

    restarted = CrashLedger(tmp_path, 2)
    restarted.load()
    assert restarted.namespace_quarantine("team-a") == held

    shown = annotation(restarted.records(), (), restarted.namespaces())
    held = replace(held, at=0.0)  # the Node shows no time of the last crash
    assert namespaces_from_annotation(shown) == [held]
    assert [r.model_id for r in from_annotation(shown)[0]] == ["bad"], "files read as before"
    fresh = CrashLedger(tmp_path / "new-node-pod", 2)
    fresh.load()
    assert fresh.restore_namespaces(namespaces_from_annotation(shown)) == [held]
    assert fresh.namespace_quarantine("team-a") == held

    assert fresh.clear_namespaces(["team-a", "team-a/bad"]) == [], "only NAMESPACE/* names it"
    assert fresh.clear_namespaces([" team-a/* "]) == [held]
    assert fresh.namespace_quarantine("team-a") is None


def test_a_namespace_whose_versions_each_crash_once_is_held_and_quarantined_at_the_bound(
    tmp_path: Path,
) -> None:
    now = [1000.0]
    ledger = CrashLedger(
        tmp_path, 3, namespace_quarantine_after=2, expiry_seconds=60, wall=lambda: now[0]
    )
    ledger.load()
    for version in range(1, 6):  # five files, one byte apart, each crashing Triton once
        assert not ledger.held("team-a") or version > 3
        ledger.crashed(marker(version))
        ledger.crashed(marker(version, "team-b"), alone=False)  # a neighbour's load beside it
    assert not any(r.quarantined for r in ledger.records()), "no files reached their limit"
    assert ledger.held("team-a"), "three crashes of its loads hold it"
    quarantined = ledger.namespace_quarantine("team-a")
    assert quarantined is not None and quarantined.crashes == 5
    assert not ledger.held("team-b"), "a load only beside the exit counts against nobody"

    ledger.crashed(marker(9, "team-c"))
    now[0] += 61
    ledger.expire()
    assert ledger.namespace_quarantine("team-a") is not None, "a quarantine waits for an admin"
    assert [n.namespace for n in ledger.namespaces()] == ["team-a"], "a count lapses"


async def test_a_held_load_goes_alone_and_keeps_the_node_quiet() -> None:
    turns = HeldLoads()
    await turns.begin(held=False)  # another namespace's load under way
    held = asyncio.get_running_loop().create_task(turns.begin(held=True))
    await asyncio.sleep(0)
    assert not held.done(), "it waits for the other load"
    turns.end(held=False, quiet=0.0)
    await asyncio.wait_for(held, 5)
    assert turns.alone
    other = asyncio.get_running_loop().create_task(turns.begin(held=False))
    await asyncio.sleep(0)
    assert not other.done(), "nothing begins beside a held load"
    loop = asyncio.get_running_loop()
    ended = loop.time()
    turns.end(held=True, quiet=0.2)
    await asyncio.sleep(0)
    assert not other.done(), "nor in its quiet period"
    second_held = loop.create_task(turns.begin(held=True))
    await asyncio.wait_for(other, 5)
    assert loop.time() - ended >= 0.2 - 0.01
    assert turns.loads == 1
    await asyncio.sleep(0)
    assert not second_held.done(), "the next held load waits for the others first"
    turns.end(held=False, quiet=0.0)
    await asyncio.wait_for(second_held, 5)
    assert turns.alone
