"""A TritonModel's status has one writer: its turn's conditions and the autoscaler's verdict
race on one model against the simulated API server, each built from a read that the other's
write may have made stale, and nothing is lost.

Each round reads the model twice (the turn's view and the autoscaler's), then hands both writes
on, in each of the orders a cache's lag allows; every version of the object the API server
makes is checked: no owner's newer condition is ever replaced by an older one or dropped, and
Ready's lastTransitionTime moves only with its status. The same rounds with each owner patching
the conditions it read (how two writers of one list behave) lose conditions: the check finds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import pytest

from binder.api.kube import Kube
from binder.tritonmodels.status import (
    AUTOSCALING,
    LOADED,
    PLACED,
    PROGRESSING,
    READY,
    StatusWriter,
    Write,
)
from common.conditions import Condition, find, set_condition
from common.kubeapi.session import RetryPolicy
from sim.apiserver import RunningApiServer
from tests.binder.simcluster import eventually
from tests.binder.tritonmodels.test_tritonmodels import (  # noqa: F401 (fixtures)
    GROUP,
    PLURAL,
    VERSION,
    apiserver,
    custom,
    model,
)

ROUNDS = 50
"""Rounds of every order of two reads and two writes: 300 interleavings."""
ORDERS = [
    order
    for order in itertools.permutations(("read turn", "read scaler", "turn", "scaler"))
    if order.index("read turn") < order.index("turn")
    and order.index("read scaler") < order.index("scaler")
]


class Recorded:
    """The binder's API door, keeping the version of the model each status patch made (read
    back at once: one patch at a time, so nothing else comes between)."""

    def __init__(self, kube: Kube, objects: Any) -> None:
        self._kube = kube
        self._custom = objects
        self.seen: list[dict[str, Any]] = []

    def patch_model_status(self, namespace: str, name: str, uid: str, status: Any) -> None:
        self._kube.patch_model_status(namespace, name, uid, status)
        self.seen.append(
            self._custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        )


def number(condition: dict[str, Any] | None) -> int:
    """The round a condition was said in (its message ends with it); -1 for none."""
    return -1 if condition is None else int(str(condition["message"]).rsplit(" ", 1)[1])


def lost(versions: list[dict[str, Any]]) -> list[str]:
    """What the versions show lost: an owner's condition replaced by an older one or dropped,
    or Ready's lastTransitionTime moved with its status kept."""
    found: list[str] = []
    last = {READY: -1, AUTOSCALING: -1}
    ready_before: dict[str, Any] | None = None
    for at, obj in enumerate(versions):
        conditions = (obj.get("status") or {}).get("conditions")
        for kind in last:
            said = number(find(conditions, kind))
            if said < last[kind]:
                found.append(f"version {at}: {kind} of round {last[kind]} became {said}")
            last[kind] = max(last[kind], said)
        ready = find(conditions, READY)
        if ready is not None and ready_before is not None:
            kept = ready["status"] == ready_before["status"]
            moved = ready["lastTransitionTime"] != ready_before["lastTransitionTime"]
            if kept and moved:
                found.append(f"version {at}: Ready's lastTransitionTime moved at {ready['status']}")
        ready_before = ready or ready_before
    return found


def turn_said(round_: int) -> dict[str, Condition | None]:
    """What a model's turn says in `round_`: Ready flips every third round."""
    ready = "True" if round_ % 3 else "False"
    return {
        PLACED: Condition(PLACED, "True", "AllReplicasPlaced", f"placed {round_}"),
        READY: Condition(READY, ready, "AllReplicasReady", f"ready {round_}"),
        PROGRESSING: Condition(PROGRESSING, "True", "NewFilesServed", f"served {round_}"),
        LOADED: Condition(LOADED, "True", "FilesLoaded", f"loaded {round_}"),
    }


def scaler_said(round_: int) -> tuple[str, str, str]:
    return ("True", "BuiltIn", f"scaled {round_}")


@pytest.fixture
def kube(apiserver: RunningApiServer, tmp_path: Path) -> Iterator[Kube]:  # noqa: F811
    door = Kube(str(apiserver.write_kubeconfig(tmp_path / "kubeconfig")), retry=RetryPolicy())
    try:
        yield door
    finally:
        door.close()


@pytest.fixture
def made(custom: Any) -> dict[str, Any]:  # noqa: F811
    created = custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, model("raced", 1)
    )
    return cast(dict[str, Any], created)


def involved(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TritonModel",
        "namespace": meta["namespace"],
        "name": meta["name"],
        "uid": meta["uid"],
    }


def read_conditions(custom: Any) -> list[Any]:  # noqa: F811
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "raced")
    return list((obj.get("status") or {}).get("conditions") or [])


@contextlib.contextmanager
def running(writer: StatusWriter) -> Iterator[None]:
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(writer.run(stop))
    try:
        yield
    finally:
        task.cancel()


async def play(
    custom: Any,  # noqa: F811
    turn: Callable[[int, list[Any]], None],
    scaler: Callable[[int, list[Any]], None],
    drained: Callable[[], bool],
) -> None:
    """Every order of the two reads and the two writes, ROUNDS times."""
    round_ = 0
    for _ in range(ROUNDS):
        for order in ORDERS:
            round_ += 1
            views: dict[str, list[Any]] = {}
            for step in order:
                if step.startswith("read "):
                    views[step.removeprefix("read ")] = read_conditions(custom)
                elif step == "turn":
                    turn(round_, views["turn"])
                else:
                    scaler(round_, views["scaler"])
            await eventually(drained, within=10, what="the writes sent")


async def test_the_turn_and_the_autoscaler_racing_on_one_model_lose_nothing(
    kube: Kube,
    custom: Any,  # noqa: F811
    made: dict[str, Any],
) -> None:
    leading = asyncio.Event()
    leading.set()
    failed: list[str] = []
    ref = involved(made)
    versions = Recorded(kube, custom)
    with ThreadPoolExecutor(1) as executor:
        writer = StatusWriter(
            cast(Kube, versions),
            executor,
            "binder-0",
            leading=leading,
            on_failed=lambda uid, _: failed.append(uid),
        )

        def turn(round_: int, current: list[Any]) -> None:
            write = Write(ref, {"observedGeneration": 1}, "")
            write.said, write.current = turn_said(round_), current
            writer.put(write)

        def scaler(round_: int, current: list[Any]) -> None:
            writer.autoscaling(ref, current, scaler_said(round_), 1)

        with running(writer):
            await play(custom, turn, scaler, lambda: len(writer) == 0)
    last = len(ORDERS) * ROUNDS
    final = read_conditions(custom)
    assert not failed
    assert lost(versions.seen) == []
    assert number(find(final, READY)) == last
    assert number(find(final, AUTOSCALING)) == last
    assert [c["type"] for c in final] == [PLACED, READY, PROGRESSING, LOADED, AUTOSCALING]


async def test_two_writers_of_the_conditions_list_lose_what_the_other_wrote(
    kube: Kube,
    custom: Any,  # noqa: F811
    made: dict[str, Any],
) -> None:
    """The same rounds with each owner patching the whole list it read (its own conditions
    set, the others' kept from its read): the check above finds the losses."""
    ref = involved(made)
    versions = Recorded(kube, custom)

    def patch(conditions: list[Any]) -> None:
        versions.patch_model_status("default", "raced", ref["uid"], {"conditions": conditions})

    def turn(round_: int, current: list[Any]) -> None:
        conditions = current
        for condition in turn_said(round_).values():
            assert condition is not None
            conditions = set_condition(conditions, condition)
        patch(conditions)

    def scaler(round_: int, current: list[Any]) -> None:
        patch(set_condition(current, Condition(AUTOSCALING, *scaler_said(round_))))

    await play(custom, turn, scaler, lambda: True)
    assert lost(versions.seen), "two writers of one list lost nothing"
