"""The stand-in rule of a host's replacement (`binder.tritonmodels.hostreplace`), decided alone:
which models a replaced host leaves unserved, when the host may go, and when a stand-in leaves.
The whole flow against the simulated API server is in test_host_gaps.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, cast

from binder.cluster.clusterstate import ClusterState
from binder.cluster.ledger import Ledger
from binder.cluster.modelviews import ModelInfo, model_from_api
from binder.framework.noderules import NODE_RULES
from binder.tritonmodels.hostreplace import HostReplacements, Replicas, Where
from binder.tritonmodels.placer import listed_parked
from binder.tritonmodels.replicabook import ReplicaBook
from binder.tritonmodels.rolling import Loaded
from common.contract import Keys
from common.hosted import Parked, encode_parked
from tests.binder.tritonmodels.test_tritonmodels import model as tritonmodel

N1: Where = ("n1", "")
N2: Where = ("n2", "")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _model(uid: str, replicas: int = 1) -> Any:
    return SimpleNamespace(uid=uid, replicas=replicas, namespace="ns", storage_secret="", key=uid)


def _host(uid: str) -> dict[str, Any]:
    return {"metadata": {"uid": uid}}


class Rule:
    def __init__(self) -> None:
        self.clock = Clock()
        self.served: set[str] = set()
        self.stopping: set[str] = set()
        ledger = cast(Ledger, SimpleNamespace(draining=set()))
        self.book = ReplicaBook(ledger, drain_seconds=60.0, clock=self.clock)
        self.changed: list[str] = []
        self.models = {"solo": _model("solo"), "pair": _model("pair", 2)}
        self.replacements = HostReplacements(
            Keys(),
            drain_seconds=60.0,
            clock=self.clock,
            book=self.book,
            served=self._served,
            models=self.models,
            changed=self.changed.append,
        )

    @property
    def stand_ins(self) -> Mapping[str, str]:
        return self.book.stand_ins

    def _served(self, model: Any, replica: Any) -> Loaded:
        if replica.uid in self.stopping:
            return Loaded(False, "NodePodStopping: stopping", "NodePodStopping")
        return Loaded(replica.uid in self.served, "")

    def wanted(self, stand_in: bool = False) -> dict[Where, Replicas]:
        solo, pair = self.models["solo"], self.models["pair"]
        on_n1: Replicas = [
            (solo, 0, SimpleNamespace(uid="solo/0")),  # type: ignore[list-item]
            (pair, 0, SimpleNamespace(uid="pair/0")),  # type: ignore[list-item]
        ]
        on_n2: Replicas = [(pair, 1, SimpleNamespace(uid="pair/1"))]  # type: ignore[list-item]
        if stand_in:
            on_n2.append((solo, 1, SimpleNamespace(uid="solo/1")))  # type: ignore[arg-type]
        return {N1: on_n1, N2: on_n2}


def test_only_a_model_no_other_host_serves_gets_a_stand_in_and_the_host_waits_for_it() -> None:
    rule = Rule()
    rule.served |= {"solo/0", "pair/0", "pair/1"}
    old = _host("old-n1")
    assert not rule.replacements.stood_in(N1, old, rule.wanted())
    assert rule.stand_ins == {"solo": "n1"}, "pair is served on n2 too"
    assert rule.changed == ["solo"]
    rule.clock.now += 30
    assert not rule.replacements.stood_in(N1, old, rule.wanted(stand_in=True)), "not served yet"
    assert rule.changed == ["solo"], "asked once"
    rule.served.add("solo/1")
    assert rule.replacements.stood_in(N1, old, rule.wanted(stand_in=True))


def test_with_no_stand_in_served_the_host_goes_after_the_drain_bound() -> None:
    rule = Rule()
    rule.served |= {"solo/0", "pair/0", "pair/1"}
    old = _host("old-n1")
    assert not rule.replacements.stood_in(N1, old, rule.wanted())
    rule.clock.now += 59
    assert not rule.replacements.stood_in(N1, old, rule.wanted())
    rule.clock.now += 1
    assert rule.replacements.stood_in(N1, old, rule.wanted())


def test_a_stand_in_leaves_once_the_new_host_serves_its_model_and_not_before() -> None:
    rule = Rule()
    rule.served |= {"solo/0", "pair/0", "pair/1"}
    rule.replacements.stood_in(N1, _host("old-n1"), rule.wanted())
    rule.served |= {"solo/1"}
    rule.served.discard("solo/0")  # the old host gone, the new one loading
    there = {N1: _host("new-n1"), N2: _host("n2")}
    assert rule.replacements.release("ns", rule.wanted(stand_in=True), there)
    assert rule.stand_ins == {"solo": "n1"}
    assert rule.replacements.release("ns", rule.wanted(stand_in=True), {N2: _host("n2")})
    rule.served.add("solo/0")
    assert not rule.replacements.release("ns", rule.wanted(stand_in=True), there)
    assert rule.stand_ins == {} and rule.changed == ["solo", "solo"]


def test_a_host_whose_template_comes_back_keeps_no_stand_in() -> None:
    rule = Rule()
    rule.served |= {"solo/0", "pair/0", "pair/1"}
    old = _host("old-n1")
    rule.replacements.stood_in(N1, old, rule.wanted())
    rule.replacements.settled("ns", N2, _host("n2"))
    assert rule.stand_ins == {"solo": "n1"}, "another host settling releases nothing"
    rule.replacements.settled("ns", N1, old)
    assert rule.stand_ins == {}
    # Nor does the old host, still there as it was, keep one through `release`.
    assert not rule.replacements.release("ns", rule.wanted(), {N1: old})


def test_a_model_served_alone_on_a_stopping_node_gets_a_stand_in_until_it_serves_there() -> None:
    rule = Rule()
    rule.served |= {"pair/1"}
    rule.stopping |= {"solo/0", "pair/0"}  # n1's node pod stops
    rule.replacements.stopping("ns", N1, rule.wanted())
    assert rule.stand_ins == {"solo": "n1"}, "pair is served on n2"
    rule.replacements.stopping("ns", N1, rule.wanted(stand_in=True))
    assert rule.changed == ["solo"], "asked once"
    n1 = {N1: _host("n1"), N2: _host("n2")}  # the same host: nodes' hosts outlive node pods
    rule.served.add("solo/1")
    assert rule.replacements.release("ns", rule.wanted(stand_in=True), n1), "n1 serves it not"
    rule.stopping.clear()
    rule.served |= {"solo/0", "pair/0"}  # the new node pod loaded them again
    assert not rule.replacements.release("ns", rule.wanted(stand_in=True), n1)
    assert rule.stand_ins == {}


def test_a_model_parked_at_zero_on_a_replaced_host_gets_a_stand_in_until_it_is_replaced() -> None:
    """Scaled to zero, the model's requests are held by the host it is parked on: before that
    host goes, a stand-in replica serves it on another node; it leaves once a new host stands
    where the old one was (the model is then parked on the stand-in's host as it drains)."""
    rule = Rule()
    zero = rule.models["zero"] = _model("zero", 0)
    rule.served |= {"solo/0", "pair/0", "pair/1", "solo/1"}
    old = _host("old-n1")
    on_n2: Replicas = [(zero, 0, SimpleNamespace(uid="zero/0"))]  # type: ignore[list-item]
    wanted = rule.wanted(stand_in=True)
    assert not rule.replacements.stood_in(N1, old, wanted, [zero])
    assert rule.stand_ins == {"zero": "n1"}, "solo is served on n2 too"
    assert not rule.replacements.stood_in(N1, old, wanted, [zero]), "not served yet"
    rule.served.add("zero/0")
    wanted = {N1: wanted[N1], N2: [*wanted[N2], *on_n2]}
    assert not rule.replacements.stood_in(N1, old, wanted, [zero]), "parked here until its turn"
    assert rule.replacements.stood_in(N1, old, wanted, [])
    # The old host goes: the stand-in stays until the new one is there.
    assert rule.replacements.release("ns", wanted, {N1: old, N2: _host("n2")})
    deleting = {"metadata": {"uid": "old-n1", "deletionTimestamp": "now"}}
    assert rule.replacements.release("ns", wanted, {N1: deleting, N2: _host("n2")})
    assert rule.replacements.release("ns", wanted, {N2: _host("n2")})
    assert rule.stand_ins == {"zero": "n1"}
    assert not rule.replacements.release("ns", wanted, {N1: _host("new-n1"), N2: _host("n2")})
    assert rule.stand_ins == {}


def test_no_other_host_of_the_namespace_is_replaced_while_one_hosts_stand_ins_are_asked() -> None:
    """The host whose stand-ins were asked goes first: another replaced meanwhile could be
    where its stand-ins are placed."""
    rule = Rule()
    rule.served |= {"solo/0", "pair/0", "pair/1"}
    old_n1, n2 = _host("old-n1"), _host("old-n2")
    there = {N1: old_n1, N2: n2}
    assert rule.replacements.may_replace("ns", N2, rule.wanted(), there)
    assert not rule.replacements.stood_in(N1, old_n1, rule.wanted())
    assert not rule.replacements.may_replace("ns", N2, rule.wanted(), there)
    assert rule.replacements.may_replace("ns", N1, rule.wanted(), there)
    # Once released (the new host on n1 serves solo), n2's turn comes.
    rule.served.add("solo/1")
    new = {N1: _host("new-n1"), N2: n2}
    assert not rule.replacements.release("ns", rule.wanted(stand_in=True), new)
    assert rule.replacements.may_replace("ns", N2, rule.wanted(), new)


def _autoscaled(name: str, secret: str = "") -> ModelInfo:
    obj = tritonmodel(name, 0)
    obj["metadata"].update(uid=f"uid-{name}", namespace="ns")
    obj["spec"]["autoscaling"] = {"target": 1, "minReplicas": 0}
    if secret:
        obj["spec"]["storageSecret"] = secret
    return model_from_api(obj, Keys(), "tritonshare")


def _parking_host(*names: str) -> dict[str, Any]:
    value = encode_parked(Parked(name, name, 0) for name in names)
    return {"metadata": {"annotations": {"tritonshare.io/parked-models": value}}}


def test_a_new_leader_finds_the_parks_its_hosts_name_before_it_writes_or_replaces_one() -> None:
    """What the last leader parked is in its hosts' annotations: the new one parks the same
    models there before its first host write, which would otherwise drop the annotation (and
    replace the host under a parked model's held requests)."""
    ledger = Ledger(ClusterState(rules=NODE_RULES))
    zero, private, plain = _autoscaled("zero"), _autoscaled("private", "creds"), _autoscaled("x")
    plain = replace(plain, autoscaling=None)
    for found in (zero, private, plain):
        ledger.models[found.uid] = found
    ledger.hosts["ns"] = {"n2": _parking_host("zero", "private", "x"), "n1": _parking_host("zero")}
    ledger.hosts["other"] = {"n1": _parking_host("zero")}
    ledger.hosts["ns/creds"] = {"n3": _parking_host("private")}
    parks = sorted((m.name, node) for m, node in listed_parked(ledger, Keys()))
    assert parks == [("private", "n3"), ("zero", "n1")]
