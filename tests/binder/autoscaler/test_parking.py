"""Scale to zero's pure parts in the binder: where a TritonModel at zero replicas is parked
(binder/autoscaler/parkedmodels.py), the parking host as the autoscaler's source of its demand
(binder/autoscaler/targets.py), and the decision on fake time: requests held at zero scale the model
to one and keep it from zero while they wait."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace
from typing import Any, cast

from binder.autoscaler.kpa import Decider, Scaling
from binder.autoscaler.loop import Autoscaling
from binder.autoscaler.parkedmodels import park_node, parked_on
from binder.autoscaler.targets import Index, model_target
from binder.cluster.modelviews import ModelInfo, model_from_api
from common.contract import Keys
from common.hosted import Parked, decode_parked, encode_parked, parked_models_annotation

KEYS = Keys()
AUTOSCALING = {"target": 1, "minReplicas": 0, "window": "6s"}


def model(
    replicas: int, autoscaling: dict[str, Any] | None = AUTOSCALING, model_name: str = ""
) -> ModelInfo:
    spec: dict[str, Any] = {"storageUri": "s3://b/m", "gpuMemory": "1Gi", "replicas": replicas}
    if autoscaling is not None:
        spec["autoscaling"] = autoscaling
    if model_name:
        spec["modelName"] = model_name
    obj = {
        "apiVersion": "tritonshare.io/v1alpha1",
        "kind": "TritonModel",
        "metadata": {"name": "m", "namespace": "team-a", "uid": "u1", "generation": 1},
        "spec": spec,
    }
    return model_from_api(obj, KEYS, "tritonshare")


def host(address: str, parked: list[str] | None = None) -> dict[str, Any]:
    annotations = (
        {}
        if parked is None
        else {parked_models_annotation(KEYS): encode_parked(Parked(m, m, 0) for m in parked)}
    )
    return {"metadata": {"annotations": annotations}, "status": {"podIP": address}}


def where(found: ModelInfo, **given: Any) -> str | None:
    arguments: dict[str, Any] = {
        "current": None,
        "replica_nodes": [],
        "served": False,
        "hosts": {},
        "keys": KEYS,
    }
    return park_node(found, **(arguments | given))


def test_a_model_scaled_to_zero_is_parked_on_its_last_replica_s_node_until_one_is_served() -> None:
    # Scaled to zero: its last replica, draining, says where.
    assert where(model(0), replica_nodes=["n2"], hosts={"n1": host("a"), "n2": host("b")}) == "n2"
    # Scaled up again by its requests: parked until a replica of it is served.
    assert where(model(1), current="n2", replica_nodes=["n1"]) == "n2"
    assert where(model(1), current="n2", replica_nodes=["n1"], served=True) is None
    # A model with replicas is never parked; nor one at zero that nothing would scale up.
    assert where(model(1), replica_nodes=["n1"]) is None
    assert where(model(0, None), replica_nodes=["n1"]) is None
    assert where(model(0, None), current="n1") is None


def test_a_new_leader_keeps_the_host_its_annotation_names_else_any_host() -> None:
    hosts = {"n1": host("a"), "n2": host("b", ["m", "other"]), "n3": host("c")}
    assert where(model(0), hosts=hosts) == "n2"
    assert where(model(0), hosts={"n3": host("c"), "n1": host("a")}) == "n1"
    assert where(model(0)) is None  # no host of the namespace left: nothing to park on


def test_a_new_leader_keeps_the_annotated_host_over_its_replicas_nodes() -> None:
    """Moving the park would put a host whose proxy does not hold the model yet behind its
    Service (a 404 for an unknown model), and take away the one that holds its requests."""
    hosts = {"n1": host("a"), "n2": host("b", ["m"])}
    # Scaled to zero before the failover: a replica still draining on another node.
    assert where(model(0), replica_nodes=["n1"], hosts=hosts) == "n2"
    # Woken before it: its replica placed elsewhere and not served yet.
    assert where(model(1), replica_nodes=["n1"], hosts=hosts) == "n2"
    assert where(model(1), replica_nodes=["n1"], hosts=hosts, served=True) is None


def test_a_host_being_deleted_is_never_chosen_to_park_on() -> None:
    """A host being replaced still names the model in its annotation: the park goes to the
    last replica's node (a stand-in's, as the host is replaced), not to the leaving host."""
    going = host("a", ["m"])
    going["metadata"]["deletionTimestamp"] = "2026-11-29T00:00:00Z"
    hosts = {"n1": going, "n2": host("b")}
    assert where(model(0), replica_nodes=["n2"], hosts=hosts) == "n2"
    assert where(model(0), hosts=hosts) == "n2"
    assert where(model(0), hosts={"n1": going}) is None


def test_a_malformed_or_oversized_parked_annotation_parks_nothing() -> None:
    for value in (
        "{",
        '{"m": 1}',
        '["m"]',
        '[{"model": "../x"}]',
        '[{"model": "m", "maxConcurrency": "2"}]',
        '[{"model": "m", "modelId": "../x"}]',
        '[{"model": "m", "modelId": 7}]',
    ):
        bad = {"metadata": {"annotations": {parked_models_annotation(KEYS): value}}}
        assert parked_on(bad, KEYS) == []


def test_the_parking_host_is_the_autoscaler_s_source_while_no_replica_is_ready() -> None:
    hosts = {"n1": host("10.0.0.1"), "n2": host("10.0.0.2", ["m"])}
    target = model_target(model(0), hosts, KEYS)
    assert target is not None and target.sources == (("n2", "10.0.0.2", "m"),)
    # A host of the namespace that does not name it is no source.
    target = model_target(model(0), {"n1": host("10.0.0.1", ["other"])}, KEYS)
    assert target is not None and target.sources == ()


def test_a_model_named_by_spec_model_name_is_parked_and_counted_under_that_id() -> None:
    """Its clients send spec.modelName: the host holds, and counts, its requests under it."""
    value = encode_parked([Parked("resnet-50", "resnet_50", 2), Parked("m", "m", 0)])
    assert value == (
        '[{"model":"m","maxConcurrency":0},'
        '{"model":"resnet-50","maxConcurrency":2,"modelId":"resnet_50"}]'
    )
    annotated = {"metadata": {"annotations": {parked_models_annotation(KEYS): value}}}
    assert parked_on(annotated, KEYS) == ["m", "resnet-50"]
    assert decode_parked(value, 10)[0][1] == Parked("resnet-50", "resnet_50", 2)
    named = model(0, model_name="m_1")
    hosts = {"n2": {**annotated, "status": {"podIP": "10.0.0.2"}}}
    target = model_target(named, hosts, KEYS)
    assert target is not None and target.sources == (("n2", "10.0.0.2", "m_1"),)
    # A placed replica's host counts it under that id too.
    placed = dataclasses.replace(model(1, model_name="m_1"), placed={0: ("n1", "GPU-0", "p")})
    target = model_target(placed, {"n1": host("10.0.0.1")}, KEYS)
    assert target is not None and target.sources == (("n1", "10.0.0.1", "m_1"),)


def test_requests_held_at_zero_scale_the_model_to_one_and_keep_it_from_zero() -> None:
    """Fake time: the parking host's held request-seconds are the model's concurrency."""
    scaling = Scaling(target=1.0, min_replicas=0, window=6.0)
    decider, held, replicas = Decider(), 0.0, 1
    for now in range(1, 9):  # a whole window without a request: zero
        decider.observe(float(now), {"n2": held}, scaling)
        replicas = decider.decide(float(now), scaling, replicas, replicas).replicas
    assert replicas == 0
    history = []
    for now in range(9, 20):  # one request held for 3 s (the model's load), then answered
        held += 1.0 if now < 12 else 0.0
        decider.observe(float(now), {"n2": held}, scaling)
        ready = 1 if now >= 12 else 0
        replicas = decider.decide(float(now), scaling, ready, replicas).replicas
        history.append(replicas)
    assert history[0] >= 1, "asked for at the first read that sees the held request"
    # Held at 9, 10 and 11: not back to zero while its request-seconds are in the window
    # (to 16), then zero again a whole window after.
    assert 0 not in history[:8] and history[8:] == [0, 0, 0], history


def test_another_namespace_s_host_naming_the_model_is_no_source_of_its_demand() -> None:
    """Attack: team-b parks a model named as team-a's on its own host and floods it: team-a's
    model reads only team-a's hosts, so team-b wakes nothing but its own."""
    ledger = SimpleNamespace(
        models={"u1": model(0)},
        hosts={
            "team-a": {"n1": host("10.0.0.1", ["m"])},
            "team-b": {"n1": host("10.0.9.9", ["m"]), "n2": host("10.0.9.8", ["m"])},
        },
        state=SimpleNamespace(is_accounted=lambda uid: False),
    )
    autoscaling = Autoscaling(
        cast(Any, None),
        cast(Any, ledger),
        Index(KEYS),
        leading=asyncio.Event(),
        executor=cast(Any, None),
        inbox=cast(Any, None),
        period=1.0,
        port=9002,
        identity="test",
        verdicts=lambda involved, conditions, verdict, generation: False,
        on_load=lambda now, readings: None,
        keys=KEYS,
    )
    [target] = autoscaling.targets()
    assert target.sources == (("n1", "10.0.0.1", "m"),)
