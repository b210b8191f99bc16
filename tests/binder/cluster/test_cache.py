"""The informer cache: 410 Gone relists (against sim/ with a short history), and how API events
change the state, the pending pods and the "helpful change" signal."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from binder.api.inbox import Inbox
from binder.api.informer import Informer
from binder.api.kube import Kube
from binder.api.listwatch import NODES, Kind
from binder.cluster.cache import ClusterCache
from binder.cluster.chargedpods import Unproven, sign
from binder.cluster.clusterstate import ClusterState
from binder.cluster.ledger import Ledger
from binder.cluster.modelviews import model_from_api
from binder.cluster.objects import ModelKey, PodInfo, pod_from_api
from binder.framework.noderules import NODE_RULES
from common.hosted import host_label, host_name
from common.kubeapi.errors import GoneError
from common.kubeapi.session import JsonObject, RetryPolicy
from common.proofs import Claim, KeyRing, Proof
from sim.apiserver import ApiServerSettings, RunningApiServer, start_in_thread
from tests.binder.objects import GI, KEYS, lease_obj, node_obj, pod_obj, signed
from tests.binder.simcluster import eventually
from tests.fixtures_sim import TEST_RING, core_v1


class Recorder:
    def __init__(self) -> None:
        self.changed: list[str] = []
        self.pending: list[str] = []
        self.gone: list[str] = []
        self.unproven: list[str] = []

    def pending_changed(self, pod: PodInfo, relevant: bool) -> None:
        self.pending.append(f"{pod.name}:{'relevant' if relevant else 'minor'}")

    def pending_gone(self, uid: str) -> None:
        self.gone.append(uid)

    def cluster_changed(self, why: str) -> None:
        self.changed.append(why)

    def unproven_seen(self, verdict: Unproven) -> None:
        self.unproven.append(f"{verdict.pod.name}:{verdict.reason}")


NOW = 1_000_000.0


def make_cache() -> tuple[ClusterCache, Recorder]:
    recorder = Recorder()
    cache = ClusterCache(
        KEYS,
        Ledger(ClusterState(rules=NODE_RULES, reserve=0)),
        scheduler_name="tritonshare",
        listener=recorder,
        placement_keys=lambda: TEST_RING,
        clock=lambda: NOW,
    )
    return cache, recorder


def test_pending_pods_are_ours_unbound_and_alive() -> None:
    cache, recorder = make_cache()
    cache.apply_pod("ADDED", pod_obj("ours"))
    cache.apply_pod("ADDED", pod_obj("theirs", scheduler="default-scheduler"))
    done = pod_obj("done", phase="Succeeded")
    cache.apply_pod("ADDED", done)
    assert [p.name for p in cache.pending.values()] == ["ours"]
    changed = pod_obj("ours")
    changed["metadata"]["annotations"][KEYS.gpu] = "GPU-x"  # our own patch: not relevant
    cache.apply_pod("MODIFIED", changed)
    bigger = pod_obj("ours", mem="2Gi")
    cache.apply_pod("MODIFIED", bigger)
    assert recorder.pending == ["ours:relevant", "ours:minor", "ours:relevant"]
    cache.apply_pod("MODIFIED", pod_obj("ours", node="n1", gpu="GPU-n1-0"))
    assert cache.pending == {}
    assert recorder.gone == ["uid-models-ours"]


def test_memory_freed_on_a_node_is_a_helpful_change_and_a_new_bound_pod_is_not() -> None:
    cache, recorder = make_cache()
    cache.apply_node("ADDED", node_obj("n1", [8 * GI]))
    recorder.changed.clear()
    cache.apply_pod(
        "ADDED", signed(pod_obj("a", node="n1", gpu="GPU-n1-0", phase="Running"), TEST_RING)
    )
    assert recorder.changed == []
    assert cache.state.memory.free("n1") == [7 * GI]
    cache.apply_pod(
        "MODIFIED", signed(pod_obj("a", node="n1", gpu="GPU-n1-0", phase="Succeeded"), TEST_RING)
    )
    assert recorder.changed == ["pod models/a finished (Succeeded)"]
    assert cache.state.memory.free("n1") == [8 * GI]
    cache.apply_pod(
        "ADDED", signed(pod_obj("b", node="n1", gpu="GPU-n1-0", phase="Running"), TEST_RING)
    )
    cache.apply_pod(
        "DELETED", signed(pod_obj("b", node="n1", gpu="GPU-n1-0", phase="Running"), TEST_RING)
    )
    assert recorder.changed[-1] == "pod models/b was deleted"


def test_a_pod_in_its_loader_the_agent_marks_failed_frees_its_gpu_memory() -> None:
    """A quarantined model's pod, still Pending in its loader, marked Failed through pods/status
    (the agent's ModelCrashedTriton): terminated, it holds nothing, as kube-scheduler counts it."""
    cache, recorder = make_cache()
    cache.apply_node("ADDED", node_obj("n1", [8 * GI]))
    pod = signed(pod_obj("crasher", node="n1", gpu="GPU-n1-0", phase="Pending"), TEST_RING)
    cache.apply_pod("ADDED", pod)
    assert cache.state.memory.free("n1") == [7 * GI]
    pod["status"].update(phase="Failed", reason="ModelCrashedTriton", message="quarantined")
    cache.apply_pod("MODIFIED", pod)
    assert recorder.changed[-1] == "pod models/crasher finished (Failed)"
    assert cache.state.memory.free("n1") == [8 * GI]


def test_node_changes_count_only_when_placement_inputs_change() -> None:
    cache, recorder = make_cache()
    cache.apply_node("ADDED", node_obj("n1", [8 * GI]))
    heartbeat = node_obj("n1", [8 * GI])
    heartbeat["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    cache.apply_node("MODIFIED", heartbeat)
    cache.apply_node("MODIFIED", node_obj("n1", [8 * GI], labels={"zone": "a"}))
    assert recorder.changed == [
        "node n1 was added or changed",
        "node n1 was added or changed",
    ]


def test_an_agent_coming_alive_is_a_helpful_change_but_a_renewal_is_not() -> None:
    cache, recorder = make_cache()
    cache.apply_lease("ADDED", lease_obj("n1", NOW - 100, 40))
    assert recorder.changed == []
    cache.apply_lease("MODIFIED", lease_obj("n1", NOW - 1, 40))
    cache.apply_lease("MODIFIED", lease_obj("n1", NOW, 40))
    assert recorder.changed == ["the agent of node n1 is alive"]
    other = lease_obj("n1", NOW, 40)
    other["metadata"]["name"] = "tritonshare-binder"
    cache.apply_lease("MODIFIED", other)
    assert set(cache.state.leases) == {"n1"}
    cache.apply_lease("DELETED", lease_obj("n1", NOW, 40))
    assert cache.state.leases["n1"] == 0.0


@pytest.fixture
def short_history(tmp_path: Path) -> Iterator[tuple[RunningApiServer, Path]]:
    server = start_in_thread(settings=ApiServerSettings(history_size=4))
    try:
        yield server, server.write_kubeconfig(tmp_path / "kubeconfig")
    finally:
        server.stop()


def test_a_watch_from_a_version_older_than_the_history_is_gone(
    short_history: tuple[RunningApiServer, Path],
) -> None:
    server, kubeconfig = short_history
    kube = Kube(str(kubeconfig), retry=RetryPolicy())
    client: Any = server.api_client()
    try:
        _, version = kube.list_all(NODES)
        for i in range(10):
            core_v1(client).create_node(node_obj(f"n{i}"))
        with pytest.raises(GoneError):
            list(kube.watch(NODES, version))
    finally:
        client.close()
        kube.close()


async def test_the_informer_relists_on_gone_and_catches_up(
    short_history: tuple[RunningApiServer, Path],
) -> None:
    server, kubeconfig = short_history
    kube = Kube(str(kubeconfig), retry=RetryPolicy())
    client: Any = server.api_client()
    real_watch = kube.watch
    watches: list[str] = []
    lists: list[list[str]] = []
    seen: list[str] = []
    proceed = asyncio.Event()
    loop = asyncio.get_running_loop()

    def stale_first(kind: Kind, version: str, *rest: Any) -> Iterator[tuple[str, JsonObject]]:
        watches.append(version)
        if len(watches) == 1:
            # Fall behind while the history moves on, as a slow or disconnected watcher does.
            asyncio.run_coroutine_threadsafe(proceed.wait(), loop).result(timeout=30)
        return real_watch(kind, version, *rest)

    kube.watch = stale_first  # type: ignore[assignment]
    informer = Informer(
        kube,
        NODES,
        loop,
        on_list=lambda items: lists.append([i["metadata"]["name"] for i in items]),
        on_event=lambda event, obj: seen.append(f"{event} {obj['metadata']['name']}"),
        inbox=Inbox(loop),
    )
    informer.start()
    try:
        await informer.synced.wait()
        for i in range(6):
            core_v1(client).create_node(node_obj(f"n{i}"))
        proceed.set()
        await eventually(lambda: len(lists) == 2, what="a relist after 410")
        assert lists == [[], [f"n{i}" for i in range(6)]]
        assert informer.relists == 2
        core_v1(client).create_node(node_obj("late"))
        await eventually(lambda: "ADDED late" in seen, what="the watch after the relist")
    finally:
        informer.stop()
        kube.close_watches()
        await loop.run_in_executor(None, informer.join, 5.0)
        client.close()
        kube.close()


class CountingRing(KeyRing):
    """A key ring that counts its verifications."""

    verified = 0

    def verify(self, claim: Claim, value: str) -> Proof:
        CountingRing.verified += 1
        return super().verify(claim, value)


OLD_KEY, NEW_KEY, NEWER_KEY = (
    f"placement key {n:02d} for the cache's tests!!".encode() for n in range(3)
)


def rotating_cache() -> tuple[ClusterCache, Recorder, list[KeyRing]]:
    """A cache whose key ring the test replaces, as KeyDirectory does after a rotation."""
    recorder = Recorder()
    rings: list[KeyRing] = [CountingRing(OLD_KEY)]
    cache = ClusterCache(
        KEYS,
        Ledger(ClusterState(rules=NODE_RULES, reserve=0)),
        scheduler_name="tritonshare",
        listener=recorder,
        placement_keys=lambda: rings[-1],
        clock=lambda: NOW,
    )
    cache.apply_node("ADDED", node_obj("n1", [16 * GI]))
    cache.apply_node("ADDED", node_obj("plain", None))  # no agent: not a tritonshare node
    recorder.changed.clear()
    return cache, recorder, rings


def test_bound_pods_are_charged_only_with_a_proof_and_at_the_request_it_booked() -> None:
    cache, recorder, rings = rotating_cache()
    proven = signed(pod_obj("proven", mem="2Gi", node="n1", gpu="GPU-n1-0"), rings[0])
    cache.apply_pod("ADDED", proven)
    unsigned = pod_obj("unsigned", mem="8Gi", node="n1", gpu="GPU-n1-0", namespace="team-b")
    cache.apply_pod("ADDED", unsigned)
    elsewhere = pod_obj("elsewhere", mem="8Gi", node="plain", namespace="team-b")
    cache.apply_pod("ADDED", elsewhere)
    plain = pod_obj("plain-pod", mem=None, model=None, node="n1", namespace="kube-system")
    cache.apply_pod("ADDED", plain)
    assert cache.state.memory.free("n1") == [14 * GI]
    assert cache.state.tallies.nodes_with_model(ModelKey("team-b", "unsigned", "")) == []
    assert sorted(cache.unproven) == ["uid-team-b-elsewhere", "uid-team-b-unsigned"]
    # Reported only where the agent runs; a pod with nothing of tritonshare is nobody's concern.
    assert recorder.unproven == ["unsigned:NotPlacedByBinder"]
    # The proof carries what was booked: a proof of 4Gi charges 4Gi, whatever the spec says.
    claim = Claim("uid-models-booked", "models", "booked", "n1", "GPU-n1-0", "booked", 4 * GI)
    booked = pod_obj("booked", mem="1Gi", node="n1", gpu="GPU-n1-0")
    booked["metadata"]["annotations"][KEYS.placement] = rings[0].sign(claim)
    cache.apply_pod("ADDED", booked)
    assert cache.state.memory.free("n1") == [10 * GI]


def test_a_proof_is_verified_once_and_again_only_when_what_it_covers_changes() -> None:
    cache, recorder, rings = rotating_cache()
    pod = signed(pod_obj("p", node="n1", gpu="GPU-n1-0", phase="Pending"), rings[0])
    before = CountingRing.verified
    cache.apply_pod("ADDED", pod)
    for phase in ("Running", "Running", "Running"):  # status updates: nothing the proof covers
        pod["status"]["phase"] = phase
        cache.apply_pod("MODIFIED", pod)
    assert CountingRing.verified == before + 1
    assert cache.state.memory.free("n1") == [15 * GI]
    pod["metadata"]["annotations"][KEYS.model_id] = "victim"  # edited after binding
    cache.apply_pod("MODIFIED", pod)
    assert CountingRing.verified == before + 2
    assert cache.state.memory.free("n1") == [16 * GI]
    assert cache.state.tallies.nodes_with_model(ModelKey("models", "victim", "")) == []
    assert recorder.unproven == ["p:PlacementChanged"]
    assert recorder.changed == ["pod models/p no longer proves its place"]
    cache.apply_pod("DELETED", pod)
    assert cache.unproven == {}


def test_after_a_rotation_previous_still_counts_and_a_dropped_key_is_reported_not_charged() -> None:
    cache, recorder, rings = rotating_cache()
    old = signed(pod_obj("old", mem="4Gi", node="n1", gpu="GPU-n1-0"), rings[0])
    cache.apply_pod("ADDED", old)
    rings.append(CountingRing(NEW_KEY, previous=OLD_KEY))
    new = signed(pod_obj("new", mem="2Gi", node="n1", gpu="GPU-n1-0"), rings[-1])
    cache.apply_pod("ADDED", new)
    assert cache.state.memory.free("n1") == [10 * GI]
    assert recorder.unproven == []
    # OLD_KEY leaves the Secret: the pod it signed is judged again at the next event of any pod.
    rings.append(CountingRing(NEWER_KEY, previous=NEW_KEY))
    cache.apply_pod("MODIFIED", new)
    assert cache.state.memory.free("n1") == [14 * GI]
    assert recorder.unproven == ["old:PlacementKeyUnknown"]
    assert "key the binder no longer holds" in cache.unproven["uid-models-old"].message
    assert recorder.changed == ["the placement keys changed"]
    # And a key that arrives late (a binder whose Secret mount lagged) makes its pods count.
    rings.append(CountingRing(NEWER_KEY, previous=OLD_KEY))
    cache.apply_pod("MODIFIED", new)
    assert list(cache.unproven) == ["uid-models-new"]
    assert recorder.unproven == ["old:PlacementKeyUnknown", "new:PlacementKeyUnknown"]
    assert cache.state.memory.free("n1") == [12 * GI]


def test_without_a_key_ring_a_proofs_form_is_all_that_is_checked() -> None:
    """`tritonshare status` run by someone who cannot read the key: absent and malformed proofs
    are seen as such; a well-formed one is taken at its word (the binder verifies it)."""
    cache = ClusterCache(
        KEYS,
        Ledger(ClusterState(rules=NODE_RULES, reserve=0)),
        scheduler_name="tritonshare",
        listener=Recorder(),
        placement_keys=None,
    )
    cache.apply_node("ADDED", node_obj("n1", [16 * GI]))
    cache.apply_pod("ADDED", signed(pod_obj("a", node="n1", gpu="GPU-n1-0"), TEST_RING))
    forged = pod_obj("b", node="n1", gpu="GPU-n1-0")
    forged["metadata"]["annotations"][KEYS.placement] = "v1.signed-by-me"
    cache.apply_pod("ADDED", forged)
    cache.apply_pod("ADDED", pod_obj("c", node="n1", gpu="GPU-n1-0"))
    assert cache.state.memory.free("n1") == [15 * GI]
    assert {u.pod.name: u.reason for u in cache.unproven.values()} == {
        "b": "NotPlacedByBinder",
        "c": "NotPlacedByBinder",
    }


def test_a_pod_the_binder_assumed_comes_back_charged_without_a_second_check() -> None:
    cache, recorder, rings = rotating_cache()
    obj = signed(pod_obj("ours", mem="3Gi", node="n1", gpu="GPU-n1-0"), rings[0])
    pending = pod_from_api({**obj, "spec": {**obj["spec"], "nodeName": ""}}, KEYS)
    cache.state.assume(pending, "n1", "GPU-n1-0", obj["metadata"]["annotations"][KEYS.placement])
    before = CountingRing.verified
    cache.apply_pod("MODIFIED", obj)
    assert CountingRing.verified == before
    assert cache.state.assumed_uids() == [] and cache.state.memory.free("n1") == [13 * GI]
    # Bound with another proof than the one it signed (edited in between): checked, refused.
    other = signed(pod_obj("ours-2", mem="3Gi", node="n1", gpu="GPU-n1-0"), rings[0])
    pending = pod_from_api({**other, "spec": {**other["spec"], "nodeName": ""}}, KEYS)
    cache.state.assume(pending, "n1", "GPU-n1-0", other["metadata"]["annotations"][KEYS.placement])
    other["metadata"]["annotations"][KEYS.placement] = obj["metadata"]["annotations"][
        KEYS.placement
    ]
    cache.apply_pod("MODIFIED", other)
    assert CountingRing.verified == before + 1
    assert cache.state.memory.free("n1") == [13 * GI]
    assert recorder.unproven == ["ours-2:PlacementChanged"]


def test_unproven_pods_are_reported_when_their_node_becomes_a_tritonshare_node() -> None:
    cache, recorder, _ = rotating_cache()
    cache.apply_pod("ADDED", pod_obj("early", node="later", namespace="team-b"))
    cache.apply_pod("ADDED", pod_obj("on-plain", node="plain", namespace="team-b"))
    assert recorder.unproven == []  # node "later" is unknown, "plain" publishes no GPUs
    cache.apply_node("ADDED", node_obj("later", [16 * GI]))  # its agent starts
    cache.apply_node("MODIFIED", node_obj("later", [16 * GI], labels={"a": "b"}))
    assert recorder.unproven == ["early:NotPlacedByBinder"]


def test_an_unreadable_overcommit_label_is_logged_once_and_counts_as_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache, _ = make_cache()
    label = {KEYS.gpu_mem_overcommit: "three"}
    with caplog.at_level(logging.WARNING, logger="binder.cluster.cache"):
        cache.apply_node("ADDED", node_obj("n1", [8 * GI], labels=label))
        cache.apply_node("MODIFIED", node_obj("n1", [8 * GI], labels=label))  # same labels
    warnings = [r.getMessage() for r in caplog.records if "over-commit" in r.getMessage()]
    assert warnings == [
        f"Node n1: label {KEYS.gpu_mem_overcommit}='three' is not an over-commit factor; write a "
        f'number from 1 (no over-commit) to 100, such as {KEYS.gpu_mem_overcommit}: "3"; the '
        f"binder places this node's GPUs without over-commit."
    ]
    assert cache.state.nodes["n1"].overcommit == 1.0


def _tritonmodel(name: str, replicas: int, placed: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "models", "uid": f"uid-{name}", "generation": 1},
        "spec": {"gpuMemory": "1Gi", "replicas": replicas, "storageUri": "s3://b/m"},
        "status": {"placements": placed},
    }


def test_a_replica_is_charged_only_with_the_proof_the_binder_signed_for_it() -> None:
    cache, _ = make_cache()
    cache.apply_node("ADDED", node_obj("n1", [16 * GI]))
    model = model_from_api(_tritonmodel("m", 2, []), KEYS, "tritonshare")
    proof = sign(TEST_RING, model.replica(0), "n1", "GPU-n1-0")
    entry = {"replica": 0, "node": "n1", "gpu": "GPU-n1-0", "proof": proof}
    # Replica 1 carries replica 0's proof; a second model carries it too.
    cache.models.apply_model("ADDED", _tritonmodel("m", 2, [entry, {**entry, "replica": 1}]))
    cache.models.apply_model("ADDED", _tritonmodel("other", 1, [entry]))
    state = cache.state
    assert state.is_accounted("uid-m/0")
    assert not state.is_accounted("uid-m/1") and not state.is_accounted("uid-other/0")
    assert state.memory.allocated("n1") == [GI]
    assert state.pods.pod_count("n1") == 1, "one host for the namespace's one replica"
    cache.models.apply_model("DELETED", _tritonmodel("m", 2, [entry]))
    assert state.account_uids() == set() and state.pods.pod_count("n1") == 0


def test_a_pod_dressed_as_a_model_host_counts_as_a_pod_unless_its_namespace_has_a_host() -> None:
    cache, _ = make_cache()
    cache.apply_node("ADDED", node_obj("n1", [16 * GI]))
    fake = pod_obj(host_name("n1"), mem=None, model=None, node="n1", scheduler="default-scheduler")
    fake["metadata"]["labels"] = {host_label(KEYS): "true"}
    cache.apply_pod("ADDED", fake)
    assert cache.state.pods.pod_count("n1") == 1, "no replica of its namespace there: a pod"
    model = model_from_api(_tritonmodel("m", 1, []), KEYS, "tritonshare")
    proof = sign(TEST_RING, model.replica(0), "n1", "GPU-n1-0")
    entry = {"replica": 0, "node": "n1", "gpu": "GPU-n1-0", "proof": proof}
    cache.models.apply_model("ADDED", _tritonmodel("m", 1, [entry]))
    cache.apply_pod("MODIFIED", fake)
    assert cache.state.pods.pod_count("n1") == 1, "the host's slot, charged once"
    other = pod_obj(host_name("n2"), mem=None, model=None, node="n1", scheduler="x")
    other["metadata"]["labels"] = {host_label(KEYS): "true"}
    cache.apply_pod("ADDED", other)
    assert cache.state.pods.pod_count("n1") == 2, "another node's host name: a pod"


def _named(name: str, model_name: str, created: str) -> dict[str, Any]:
    obj = _tritonmodel(name, 1, [])
    obj["metadata"]["creationTimestamp"] = created
    obj["spec"]["modelName"] = model_name
    return obj


def test_a_model_name_is_the_replicas_id_and_one_namespace_serves_each_id_once() -> None:
    cache, _ = make_cache()
    cache.models.apply_model("ADDED", _named("zeta", "resnet_50", "2026-11-26T10:00:00Z"))
    cache.models.apply_model("ADDED", _named("alpha", "resnet_50", "2026-11-26T10:00:01Z"))
    cache.models.apply_model("ADDED", _named("other", "bert", "2026-11-26T09:00:00Z"))
    models = {m.name: m for m in cache.ledger.models.values()}
    assert models["zeta"].replica(0).model_id == "resnet_50"
    assert models["zeta"].replica(0).name == "zeta/0"
    # The first created keeps the id (not the first by name); the later one says who has it.
    assert cache.ledger.name_clash(models["zeta"]) == ""
    assert cache.ledger.name_clash(models["other"]) == ""
    assert cache.ledger.name_clash(models["alpha"]) == (
        'model id "resnet_50" is already served by tritonmodel "zeta" of namespace models '
        "(created first); one namespace's models share their hosts by model id, so give this "
        "one another spec.modelName (or delete one of the two)"
    )
    # zeta renamed (the simulated API server runs no CEL): alpha has the id to itself, then not.
    cache.models.apply_model("MODIFIED", _named("zeta", "resnet_51", "2026-11-26T10:00:00Z"))
    assert cache.ledger.name_clash(models["alpha"]) == ""
    cache.models.apply_model("MODIFIED", _named("zeta", "resnet_50", "2026-11-26T10:00:00Z"))
    assert 'tritonmodel "zeta"' in cache.ledger.name_clash(models["alpha"])
    cache.models.apply_model("DELETED", _named("zeta", "resnet_50", "2026-11-26T10:00:00Z"))
    assert cache.ledger.name_clash(models["alpha"]) == ""
    assert set(cache.ledger.by_model_id) == {("models", "resnet_50"), ("models", "bert")}


@pytest.mark.parametrize(
    ("model_name", "says"),
    [
        ("", ""),
        ("resnet_50.v2-b", ""),
        (".hidden", "spec.modelName: model id '.hidden' starts with a dot"),
        ("a/b", "spec.modelName: model id 'a/b' has characters outside [A-Za-z0-9_.-]"),
        ("x" * 129, "spec.modelName: model id 'xxxx"),
    ],
)
def test_a_model_name_follows_the_model_id_grammar(model_name: str, says: str) -> None:
    obj = _tritonmodel("m", 1, [])
    obj["spec"]["modelName"] = model_name
    model = model_from_api(obj, KEYS, "tritonshare")
    assert model.template.model_id == (model_name or "m")
    assert model.template.problem.startswith(says) and bool(says) == bool(model.template.problem)
