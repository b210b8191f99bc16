"""What a namespace's TritonModels can make the binder do is bounded by what can be placed: a scale
past the CRD's maximum is refused by the API server; a model of any size costs a reconcile what
its placed replicas cost; thousands of models that fit nowhere, or one scaled to the maximum,
delay another namespace's new model by a turn, not by their number (the real binder against the
simulated API server serving the chart's CRD, through the official client)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import kubernetes.client
import pytest

from benchmarks.model_hosts import Turns, add, tritonmodel
from binder.api.kube import Kube
from binder.cluster.clusterstate import ClusterState
from binder.cluster.ledger import Ledger
from binder.cluster.objects import lease_expiry, node_from_api
from binder.framework.noderules import NODE_RULES
from binder.tritonmodels.placer import PLACEMENTS_PER_TURN
from binder.tritonmodels.status import StatusWriter, Write
from common.kubeapi.errors import ApiError
from tests.binder.cluster.test_cache import make_cache
from tests.binder.objects import GI, KEYS, lease_obj, node_obj
from tests.binder.simcluster import MakeBinder, add_node, eventually
from tests.binder.tritonmodels.test_tritonmodels import (  # noqa: F401 (fixtures)
    GROUP,
    NODES,
    PLURAL,
    VERSION,
    apiserver,
    binder,
    custom,
    model,
)

MAXIMUM = 10_000


def scale(api: Any, name: str, replicas: int, namespace: str = "default") -> Any:
    return api.patch_namespaced_custom_object_scale(
        GROUP, VERSION, namespace, PLURAL, name, {"spec": {"replicas": replicas}}
    )


def status(api: Any, name: str, namespace: str = "default") -> dict[str, Any]:
    obj = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    found: dict[str, Any] = obj.get("status") or {}
    return found


def placed_condition(api: Any, name: str, namespace: str = "default") -> dict[str, Any]:
    conditions = status(api, name, namespace).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Placed"), {})


async def newcomer_placed(api: Any) -> float:
    """Create a model of 1Gi in namespace team-b; the seconds until its replica is placed."""
    started = time.monotonic()
    api.create_namespaced_custom_object(GROUP, VERSION, "team-b", PLURAL, model("new", 1, "1Gi"))
    await eventually(
        lambda: status(api, "new", "team-b").get("replicas") == 1,
        within=30,
        what="the other namespace's model placed",
    )
    return time.monotonic() - started


async def test_a_scale_past_the_maximum_is_refused_and_the_maximum_delays_no_one(
    binder: Any,  # noqa: F811 (the fixtures imported above)
    custom: Any,  # noqa: F811
    core: Any,
) -> None:
    # 10Gi: a GPU of 16Gi each, so the bomb's placed replicas leave room for the newcomer.
    custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, model("bomb", 1, "10Gi")
    )
    for replicas in (12_000_000, 10**9, MAXIMUM + 1):
        with pytest.raises(kubernetes.client.ApiException) as refused:
            scale(custom, "bomb", replicas)
        assert refused.value.status == 422
        assert f"should be less than or equal to {MAXIMUM}" in str(refused.value.body)
    with pytest.raises(kubernetes.client.ApiException) as refused:
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, "bomb", {"spec": {"replicas": 12_000_000}}
        )
    assert refused.value.status == 422

    scale(custom, "bomb", MAXIMUM)

    def bomb_refused() -> bool:
        condition = placed_condition(custom, "bomb")
        return condition.get("status") == "False" and status(custom, "bomb")["replicas"] == 3

    await eventually(bomb_refused, what="the scaled model's 3 replicas placed, the rest refused")
    assert "Insufficient GPU memory" in placed_condition(custom, "bomb")["message"]

    core.create_namespace({"metadata": {"name": "team-b"}})
    assert await newcomer_placed(custom) < 3.0, "placed within about a second, not after retries"


@pytest.fixture
async def flooded(
    kube_api: kubernetes.client.ApiClient,
    make_binder: MakeBinder,
    custom: Any,  # noqa: F811
    core: Any,
) -> Any:
    """1,000 TritonModels of 20Gi (more than any GPU) in namespace `attacker`, created before the
    binder starts, so that it meets them all at once."""
    for node in NODES:
        add_node(kube_api, node, [16 * GI])
    for namespace in ("attacker", "team-b"):
        core.create_namespace({"metadata": {"name": namespace}})
    for i in range(1000):
        huge = model(f"huge-{i:04d}", 1, "20Gi")
        custom.create_namespaced_custom_object(GROUP, VERSION, "attacker", PLURAL, huge)
    return await make_binder()


def refused_so_far(api: Any) -> int:
    found = api.list_namespaced_custom_object(GROUP, VERSION, "attacker", PLURAL)["items"]
    return sum(1 for obj in found if (obj.get("status") or {}).get("conditions"))


async def test_a_namespace_of_unplaceable_models_delays_another_by_a_turn(
    flooded: Any,
    custom: Any,  # noqa: F811
    core: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each is refused once, in its words, with one Event; then retried only with backoff.
    await eventually(lambda: refused_so_far(custom) == 1000, within=240, what="all refused")
    condition = placed_condition(custom, "huge-0999", "attacker")
    assert condition["status"] == "False" and "more than any healthy GPU" in condition["message"]

    # The Event follows its model's status on the writer's task.
    def refusal_events() -> list[tuple[str, int]]:
        selector = "involvedObject.name=huge-0999"
        events = core.list_namespaced_event("attacker", field_selector=selector).items
        return [(e.reason, e.count or 1) for e in events]

    events = await eventually(refusal_events, within=30, what="huge-0999's Event")
    assert events == [("FailedScheduling", 1)]

    # What the model controller does from the moment it learns of another namespace's model
    # until its turn: at most the attacker's turn under way and the one before it.
    models = flooded.models
    seen: list[str] = []
    reconcile, changed = models._reconcile, models.changed

    async def reconciling(uid: str) -> bool:
        model = flooded.ledger.models.get(uid)
        seen.append(model.name if model is not None else uid)
        result: bool = await reconcile(uid)
        return result

    def learning(uid: str) -> None:
        model = flooded.ledger.models.get(uid)
        if model is not None and model.namespace == "team-b" and "learnt" not in seen:
            seen.append("learnt")
        changed(uid)

    monkeypatch.setattr(models, "_reconcile", reconciling)
    monkeypatch.setattr(models, "changed", learning)
    flooded.cache.models._on_model = learning
    waited = await newcomer_placed(custom)
    between = seen[seen.index("learnt") + 1 : seen.index("new")]
    assert len(between) <= 2, f"{len(between)} attacking reconciles first ({waited:.2f} s)"
    # A turn, not the flood: generous for a busy machine; the order above is the guarantee.
    assert waited < 30.0


def test_a_model_of_a_billion_replicas_costs_what_its_placed_ones_do() -> None:
    """A CRD without the maximum (an older one, or edited) must not let a scale bomb in: the
    reconcile places what fits (a GPU each), counts the rest, and lists none of them."""
    state = ClusterState(rules=NODE_RULES, reserve=0)
    for i in range(3):
        state.set_node(node_from_api(node_obj(f"n{i}", [16 * GI]), KEYS))
        state.set_lease(f"n{i}", lease_expiry(lease_obj(f"n{i}", time.time())))
    ledger = Ledger(state)
    models = Turns(ledger)
    bomb = tritonmodel("attacker", "bomb", 10**9, 10 * GI)
    add(ledger, models, bomb)
    tracemalloc.start()
    try:
        took = models.turn()
        models.changed(bomb.uid)
        again = models.turn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert took is not None and again is not None
    assert took[1] == again[1] == 3
    assert "replica 3: 0/3 nodes are available" in took[2]
    assert peak < 4 << 20, f"{peak} bytes held for a model of 10^9 replicas"


def test_the_cache_walks_the_charged_replicas_not_spec_replicas() -> None:
    cache, _ = make_cache()
    obj = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TritonModel",
        "metadata": {"name": "bomb", "namespace": "a", "uid": "u-bomb", "generation": 1},
        "spec": {"storageUri": "https://x/m.tar.gz", "gpuMemory": "1Gi", "replicas": 10**9},
    }
    cache.models.apply_model("ADDED", obj)
    started = time.process_time()
    assert cache.ledger.replica_uids("u-bomb") == []
    cache.models.apply_model("MODIFIED", obj)
    assert time.process_time() - started < 1.0


async def test_status_writes_keep_the_latest_and_take_turns_by_namespace() -> None:
    """A namespace's hundred refused models' writes delay another namespace's by one of theirs;
    a model's newer status replaces one not sent yet, and keeps its refusal's Event."""
    sent: list[tuple[str, str, object]] = []

    class Recorder:
        def patch_model_status(self, namespace: str, name: str, uid: str, status: Any) -> None:
            sent.append(("status", f"{namespace}/{name}", status["n"]))

        def record_object_event(self, involved: Any, **kw: Any) -> None:
            sent.append(("event", f"{involved['namespace']}/{involved['name']}", kw["message"]))

    def model_ref(namespace: str, name: str) -> dict[str, str]:
        return {"namespace": namespace, "name": name, "uid": f"{namespace}.{name}"}

    leading = asyncio.Event()
    leading.set()
    failed: list[tuple[str, bool]] = []
    with ThreadPoolExecutor(1) as executor:
        writer = StatusWriter(
            cast(Kube, Recorder()),
            executor,
            "binder-0",
            leading=leading,
            on_failed=lambda uid, owed: failed.append((uid, owed)),
        )
        for i in range(100):
            writer.put(Write(model_ref("attacker", f"m{i}"), {"n": 1}, "fits nowhere"))
        writer.put(Write(model_ref("attacker", "m0"), {"n": 2}, ""))
        writer.put(Write(model_ref("team-b", "new"), {"n": 1}, ""))
        stop = asyncio.Event()
        task = asyncio.create_task(writer.run(stop))
        try:
            await eventually(lambda: len(writer) == 0, within=30, what="every write sent")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    order = [who for _, who, _ in sent]
    assert order.index("team-b/new") <= 2, order[:5]
    assert [(kind, n) for kind, who, n in sent if who == "attacker/m0"] == [
        ("status", 2),
        ("event", "fits nowhere"),
    ]
    assert len(sent) == 201 and not failed


async def test_a_failed_status_write_repeats_only_an_event_not_written() -> None:
    """A write that fails is reconciled again; its refusal's Event is owed again only when it was
    not written, so a status write that fails after its Event does not count the refusal twice."""
    failing = {"status": 0, "event": 0}
    sent: list[str] = []

    class Flaky:
        def patch_model_status(self, namespace: str, name: str, uid: str, status: Any) -> None:
            if failing["status"]:
                failing["status"] -= 1
                raise ApiError(504, "Timeout", f"status of {name}: timed out")
            sent.append(f"status {name}")

        def record_object_event(self, involved: Any, **kw: Any) -> None:
            if failing["event"]:
                failing["event"] -= 1
                raise ApiError(504, "Timeout", f"event of {involved['name']}: timed out")
            sent.append(f"event {involved['name']}")

    def ref(name: str) -> dict[str, str]:
        return {"namespace": "a", "name": name, "uid": name}

    leading = asyncio.Event()
    leading.set()
    failed: list[tuple[str, bool]] = []
    with ThreadPoolExecutor(1) as executor:
        writer = StatusWriter(
            cast(Kube, Flaky()),
            executor,
            "binder-0",
            leading=leading,
            on_failed=lambda uid, owed: failed.append((uid, owed)),
        )
        stop = asyncio.Event()
        task = asyncio.create_task(writer.run(stop))
        try:
            # The Event fails after its status: owed. The status fails first: both owed.
            failing["event"] = 1
            writer.put(Write(ref("m1"), {"n": 1}, "fits nowhere"))
            await eventually(lambda: len(failed) == 1, what="the first failure")
            failing["status"] = 1
            writer.put(Write(ref("m2"), {"n": 1}, "fits nowhere"))
            await eventually(lambda: len(failed) == 2, what="the second failure")
            # Its Event written, a later status write alone fails: no Event owed.
            writer.put(Write(ref("m3"), {"n": 1}, "fits nowhere"))
            await eventually(lambda: "event m3" in sent, what="m3's Event")
            failing["status"] = 1
            writer.put(Write(ref("m3"), {"n": 2}, ""))
            await eventually(lambda: len(failed) == 3, what="the third failure")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert failed == [("m1", True), ("m2", True), ("m3", False)]
    assert sent == ["status m1", "status m3", "event m3"]


def test_a_model_of_many_small_replicas_places_a_bounded_number_per_turn() -> None:
    """Replicas may share nodes, so a scaled model is bounded by GPU memory: each of its turns
    places at most PLACEMENTS_PER_TURN, and another namespace's model has its turn between."""
    state = ClusterState(rules=NODE_RULES, reserve=0)
    state.set_node(node_from_api(node_obj("n0", [1024 * GI]), KEYS))
    state.set_lease("n0", lease_expiry(lease_obj("n0", time.time())))
    ledger = Ledger(state)
    models = Turns(ledger)
    add(ledger, models, tritonmodel("attacker", "bomb", 10**9, GI // 4))
    add(ledger, models, tritonmodel("team-b", "small", 1, GI))
    took = models.turn()
    assert took is not None and took[1] == PLACEMENTS_PER_TURN and not took[2]
    took = models.turn()
    assert took is not None and took[0].name == "small" and took[1] == 1
    took = models.turn()
    assert took is not None and took[0].name == "bomb" and took[1] == 2 * PLACEMENTS_PER_TURN
