"""Property-based: many pods, nodes and deletions, with the invariants checked after every step
against an oracle that recomputes everything from scratch:

- no GPU ever holds more requested memory than it offers;
- a model's replicas share a node only when no node without one could take the pod;
- every pending pod that fits somewhere (by the oracle) ends up bound.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from binder.cluster.clusterstate import ClusterState
from binder.cluster.objects import PodInfo, node_from_api, pod_from_api
from binder.framework.noderules import NODE_RULES
from binder.framework.placement import Placement, Unschedulable, node_fits, place
from tests.binder.objects import GI, KEYS, node_obj, pod_obj

NOW = 1000.0
RESERVE = GI // 2
MODELS = ["resnet", "bert", "yolo", "t5"]
ZONES = ["a", "b"]


@dataclass
class World:
    state: ClusterState = field(
        default_factory=lambda: ClusterState(rules=NODE_RULES, reserve=RESERVE)
    )
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)
    bound: dict[str, tuple[dict[str, Any], str, str]] = field(default_factory=dict)
    """uid -> (pod object, node, gpu uuid)."""

    def usage(self) -> dict[str, int]:
        used: dict[str, int] = defaultdict(int)
        for obj, node, gpu in self.bound.values():
            if node in self.nodes:
                used[gpu] += pod_from_api(obj, KEYS).request
        return used

    def oracle_fits(self, obj: dict[str, Any], *, without_replica: bool = False) -> bool:
        pod = pod_from_api(obj, KEYS)
        used = self.usage()
        for name, node in self.nodes.items():
            if node_fits(obj, node):
                continue
            models = {
                pod_from_api(o, KEYS).model_id for o, n, _ in self.bound.values() if n == name
            }
            if without_replica and pod.model_id in models:
                continue
            for gpu in node_from_api(node, KEYS).gpus:
                if gpu.healthy and gpu.memory - RESERVE - used[gpu.uuid] >= pod.request:
                    return True
        return False

    def schedule_all(self) -> None:
        progress = True
        while progress:
            progress = False
            for uid, obj in sorted(self.pending.items()):
                pod = pod_from_api(obj, KEYS)
                result = place(self.state, pod, now=NOW)
                if isinstance(result, Placement):
                    beside = {
                        pod_from_api(o, KEYS).model_id
                        for o, n, _ in self.bound.values()
                        if n == result.node
                    }
                    if pod.model_id in beside:
                        assert not self.oracle_fits(obj, without_replica=True), (
                            f"{pod.name} joined a replica on {result.node} while a node "
                            f"without one fitted"
                        )
                    self.state.assume(pod, result.node, result.gpu.uuid)
                    self.bound[uid] = (obj, result.node, result.gpu.uuid)
                    del self.pending[uid]
                    progress = True

    def check(self) -> None:
        used = self.usage()
        for node in self.nodes.values():
            for gpu in node_from_api(node, KEYS).gpus:
                assert used[gpu.uuid] <= gpu.memory - RESERVE, f"{gpu.uuid} is overcommitted"
        for obj in self.pending.values():
            assert not self.oracle_fits(obj), f"{obj['metadata']['name']} fits but stayed pending"
            result = place(self.state, pod_from_api(obj, KEYS), now=NOW)
            assert isinstance(result, Unschedulable)
            if result.reasons:  # every node is counted once, under one reason
                assert sum(result.reasons.values()) == len(self.nodes), result.message


operation = st.one_of(
    st.tuples(
        st.just("node"),
        st.lists(st.sampled_from([4, 8, 16]), min_size=1, max_size=3),
        st.sampled_from(ZONES),
        st.booleans(),
    ),
    st.tuples(
        st.just("pod"),
        st.sampled_from(MODELS),
        st.sampled_from(["512Mi", "1Gi", "2Gi", "3.5Gi", "6Gi", "12Gi"]),
        st.sampled_from([None, *ZONES]),
        st.booleans(),
    ),
    st.tuples(st.just("delete"), st.integers(0, 1000)),
    st.tuples(st.just("remove-node"), st.integers(0, 1000)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(operation, min_size=5, max_size=40))
def test_invariants_hold_at_every_step(ops: list[tuple[Any, ...]]) -> None:
    world = World()
    for step, op in enumerate(ops):
        if op[0] == "node":
            _, sizes, zone, tainted = op
            name = f"node{step}"
            taints = [{"key": "gpu", "value": "", "effect": "NoSchedule"}] if tainted else None
            obj = node_obj(name, [s * GI for s in sizes], labels={"zone": zone}, taints=taints)
            world.nodes[name] = obj
            world.state.set_node(node_from_api(obj, KEYS))
            world.state.set_lease(name, NOW + 60)
        elif op[0] == "pod":
            _, model, mem, zone, tolerates = op
            extra: dict[str, Any] = {}
            if zone:
                extra["nodeSelector"] = {"zone": zone}
            if tolerates:
                extra["tolerations"] = [{"key": "gpu", "operator": "Exists"}]
            obj = pod_obj(f"pod{step}", mem=mem, model=model, spec_extra=extra)
            world.pending[obj["metadata"]["uid"]] = obj
        elif op[0] == "delete" and world.bound:
            uid = sorted(world.bound)[op[1] % len(world.bound)]
            del world.bound[uid]
            world.state.remove_pod(uid)
        elif op[0] == "remove-node" and world.nodes:
            name = sorted(world.nodes)[op[1] % len(world.nodes)]
            del world.nodes[name]
            world.state.remove_node(name)
            for uid in [u for u, (_, n, _) in world.bound.items() if n == name]:
                del world.bound[uid]
                world.state.remove_pod(uid)
        world.schedule_all()
        world.check()


def test_the_state_matches_a_fresh_recount_after_churn() -> None:
    state = ClusterState(rules=NODE_RULES)
    for i in range(4):
        state.set_node(node_from_api(node_obj(f"n{i}", [16 * GI, 16 * GI]), KEYS))
        state.set_lease(f"n{i}", NOW + 60)
    pods: list[PodInfo] = []
    for i in range(40):
        pod = pod_from_api(pod_obj(f"p{i}", mem="3Gi", model=f"m{i % 9}"), KEYS)
        result = place(state, pod, now=NOW)
        if isinstance(result, Placement):
            state.assume(pod, result.node, result.gpu.uuid)
            pods.append(pod)
    for pod in pods[::2]:
        state.remove_pod(pod.uid)
    fresh = ClusterState(rules=NODE_RULES)
    for info in state.nodes.values():
        fresh.set_node(info)
    for pod in state.assigned_pods():
        fresh.set_pod(pod)
    assert {n: fresh.memory.free(n) for n in fresh.nodes} == {
        n: state.memory.free(n) for n in state.nodes
    }
