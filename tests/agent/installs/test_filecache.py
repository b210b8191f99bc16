"""Files a node keeps after a model's last pod leaves, and the disk bound per namespace: through
the real agent and Triton (a new replica installs from the node's copy and loads; another
namespace cannot use or detect it; a changed copy is dropped; one namespace cannot fill the disk
another installs on), and the cache itself on a real directory."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import grpc
import kubernetes.client
import pytest

from agent import phases
from agent.installs.filecache import FileCache, KeptCopy, NamespaceDisk
from agent.installs.repository import DISK_HEADROOM_BYTES, MANIFEST_FILE, manifest_to_json
from agent.phases import Event, Phase, RefusedTransitionError
from common.manifest import Manifest, ManifestEntry
from protos import agent_pb2
from sim.apiserver import RunningApiServer
from tests.agent.conftest import (
    RunningAgent,
    StartAgent,
    bearer,
    eventually,
    install_dir,
    make_pod,
    manifest_of,
    name_in_triton,
)
from tests.agent.test_attacks import events, namespaces, refused, unnamed_model

MIB = 1024 * 1024
MODEL = "m"
KEPT = "tritonshare_agent_kept_copies"


def header(directory: Path, model_id: str = MODEL) -> agent_pb2.InstallHeader:
    return agent_pb2.InstallHeader(
        model_id=model_id,
        manifest=agent_pb2.Manifest(
            files=[
                agent_pb2.FileEntry(path=p, size=s, sha256=h) for p, s, h in manifest_of(directory)
            ]
        ),
    )


def digest_of(directory: Path) -> str:
    entries = [ManifestEntry(p, s, h) for p, s, h in manifest_of(directory)]
    return Manifest(tuple(entries)).digest


@pytest.mark.triton
async def test_a_new_replica_installs_from_the_nodes_copy_which_no_other_namespace_can_use(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    model_repository: Path,
    tmp_path: Path,
) -> None:
    running: RunningAgent = await start_custom_agent()
    cache = running.agent.cache
    core = kubernetes.client.CoreV1Api(kube_api)
    namespaces(kube_api, "team-a", "team-b")
    source = unnamed_model(tmp_path)
    (source / "1" / "weights.bin").write_bytes(b"\1" * MIB)
    digest = digest_of(source)
    gpu = running.mock.gpus[0].uuid
    tokens = {}
    for namespace, pod in (("team-a", "a1"), ("team-a", "a2"), ("team-a", "a3")):
        make_pod(kube_api, pod, MODEL, namespace=namespace, gpu_uuid=gpu)
        tokens[pod] = apiserver.mint_token(namespace, pod)
    for pod in ("b1", "b2"):
        make_pod(kube_api, pod, MODEL, namespace="team-b", gpu_uuid=gpu)
        tokens[pod] = apiserver.mint_token("team-b", pod)

    # Nothing kept yet: a miss, and the loader sends the files.
    miss = await refused(running.stub.InstallKept(header(source), metadata=bearer(tokens["a1"])))
    assert miss.code() == grpc.StatusCode.NOT_FOUND
    await install_dir(running.stub, tokens["a1"], source, MODEL)
    loaded = await running.stub.LoadModel(
        agent_pb2.LoadModelRequest(model_id=MODEL), metadata=bearer(tokens["a1"])
    )
    assert loaded.state == agent_pb2.MODEL_STATE_READY, loaded.reason

    # The pod leaves: its files leave the repository and are kept for its namespace.
    a1 = name_in_triton(kube_api, "a1", MODEL, "team-a")
    assert (model_repository / a1).is_dir()
    core.delete_namespaced_pod("a1", "team-a", grace_period_seconds=0)
    await eventually(lambda: cache.holds("team-a", digest), what="a1's files to be kept")
    assert not (model_repository / a1).exists()
    assert cache.bytes_of("team-a") == sum(s for _, s, _ in manifest_of(source))
    registry = running.agent.metrics.registry
    assert registry.get_sample_value(KEPT, {"namespace": "team-a"}) == 1

    # Another pod of the namespace with the same files: installed from the copy, and loaded.
    reply = await running.stub.InstallKept(header(source), metadata=bearer(tokens["a2"]))
    assert reply.kept and not reply.unchanged
    assert reply.manifest_digest == digest
    assert reply.bytes_written == sum(s for _, s, _ in manifest_of(source))
    loaded = await running.stub.LoadModel(
        agent_pb2.LoadModelRequest(model_id=MODEL), metadata=bearer(tokens["a2"])
    )
    assert loaded.state == agent_pb2.MODEL_STATE_READY, loaded.reason
    # The copy was read, not moved: it stays kept for the next replica.
    assert [c.phase for c in cache.kept()] == [Phase.CACHED]
    assert registry.get_sample_value(KEPT, {"namespace": "team-a"}) == 1

    # Another namespace with the very same files gets the answer a miss gets, word for word.
    other = await refused(running.stub.InstallKept(header(source), metadata=bearer(tokens["b1"])))
    changed = unnamed_model(tmp_path / "changed")
    (changed / "1" / "weights.bin").write_bytes(b"\2" * MIB)
    nothing = await refused(
        running.stub.InstallKept(header(changed), metadata=bearer(tokens["b2"]))
    )
    assert other.code() == nothing.code() == grpc.StatusCode.NOT_FOUND
    assert other.details() == nothing.details()
    assert not cache.holds("team-b", digest)

    # A copy changed on the node's disk is never served: dropped, and read as a miss.
    kept = cache.root / "team-a" / digest / "1" / "weights.bin"
    kept.write_bytes(b"\3" * MIB)
    tampered = await refused(
        running.stub.InstallKept(header(source), metadata=bearer(tokens["a3"]))
    )
    assert tampered.code() == grpc.StatusCode.NOT_FOUND
    assert not cache.holds("team-a", digest)
    assert not (cache.root / "team-a" / digest).exists()
    assert cache.kept() == [] and registry.get_sample_value(KEPT, {"namespace": "team-a"}) is None
    status = await running.stub.GetModel(
        agent_pb2.GetModelRequest(model_id=MODEL), metadata=bearer(tokens["a3"])
    )
    assert status.state == agent_pb2.MODEL_STATE_ABSENT


@pytest.mark.triton
async def test_one_namespace_cannot_fill_the_disk_another_namespace_installs_on(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    """team-a's pods install big models until the node's disk would be full: past its bound
    team-a is refused with its own figures only, and team-b's new replica still installs (it
    used to be refused "no room")."""
    running = await start_custom_agent(max_installed_bytes_per_namespace=8 * MIB)
    agent = running.agent
    roots = (agent.repository.root, agent.repository.staging_root, agent.cache.root)

    def used() -> int:
        return sum(p.stat().st_size for r in roots for p in r.rglob("*") if p.is_file())

    # The model volume has the headroom and 10 MiB.
    agent.repository.disk_free = lambda _: DISK_HEADROOM_BYTES + 10 * MIB - used()
    namespaces(kube_api, "team-a", "team-b")
    pods = [("team-a", "a1"), ("team-a", "a2"), ("team-a", "a3"), ("team-b", "b1")]
    tokens = {}
    for namespace, pod in pods:
        make_pod(kube_api, pod, pod, namespace=namespace)
        tokens[pod] = apiserver.mint_token(namespace, pod)

    def big(name: str, fill: bytes) -> Path:
        source = unnamed_model(tmp_path / name)
        (source / "1" / "weights.bin").write_bytes(fill * (3 * MIB))
        return source

    for pod in ("a1", "a2"):
        await install_dir(running.stub, tokens[pod], big(pod, b"\1"), pod)
    third = await refused(install_dir(running.stub, tokens["a3"], big("a3", b"\1"), "a3"))
    # Refused before any chunk is read; grpc's client may report that as "Internal error from
    # Core" while it is still writing, so the agent's reason is read off the pod's Event.
    assert third.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INTERNAL)
    await eventually(
        lambda: any(r == "ModelInstallNoRoom" for r, _ in events(kube_api, "team-a", "a3")),
        what="the Event on pod team-a/a3",
    )
    details = next(m for r, m in events(kube_api, "team-a", "a3") if r == "ModelInstallNoRoom")
    assert "namespace team-a" in details and "--max-installed-bytes-per-namespace" in details
    assert "team-b" not in details and "free" not in details

    reply = await install_dir(running.stub, tokens["b1"], big("b1", b"\2"), "b1")
    assert reply.bytes_written >= 3 * MIB


def _kept_dir(tmp_path: Path, name: str, size: int) -> tuple[Path, Manifest]:
    directory = tmp_path / "repo" / name
    directory.mkdir(parents=True)
    data = name.encode() * size
    (directory / "config.pbtxt").write_bytes(data)
    manifest = Manifest(
        (ManifestEntry("config.pbtxt", len(data), hashlib.sha256(data).hexdigest()),)
    )
    (directory / MANIFEST_FILE).write_text(manifest_to_json(manifest))
    return directory, manifest


def test_kept_copies_are_bounded_evicted_least_recently_used_and_survive_a_restart(
    tmp_path: Path,
) -> None:
    now = [0.0]
    cache = FileCache(tmp_path / "kept", 250, clock=lambda: now[0])
    cache.prepare()
    kept = []
    for i, name in enumerate(("x", "y", "z")):
        now[0] = float(i)
        directory, manifest = _kept_dir(tmp_path, name, 100)
        assert cache.keep("team-a", directory, manifest)
        kept.append(manifest.digest)
    # Three copies of 100 bytes in 250: the least recently used one is gone.
    assert not cache.holds("team-a", kept[0])
    assert cache.holds("team-a", kept[1]) and cache.holds("team-a", kept[2])
    assert cache.total_bytes() == 200
    # A namespace that needs room loses its own copies first, oldest first.
    assert cache.evict("team-a", 1) == 100
    assert not cache.holds("team-a", kept[1]) and cache.holds("team-a", kept[2])
    # Larger than the whole cache: not kept, the directory left for the caller to remove.
    huge, manifest = _kept_dir(tmp_path, "w", 300)
    assert not cache.keep("team-b", huge, manifest) and huge.exists()
    # Another agent on the same directory takes up what is kept, and drops what is not valid.
    (cache.root / "Not-A-Namespace").mkdir()
    (cache.root / "team-a" / ("0" * 64)).mkdir()
    again = FileCache(tmp_path / "kept", 250)
    again.prepare()
    assert again.holds("team-a", kept[2]) and again.total_bytes() == 100
    assert not (cache.root / "Not-A-Namespace").exists()
    assert not (cache.root / "team-a" / ("0" * 64)).exists()


async def test_a_kept_copy_is_cached_while_kept_and_read_and_its_eviction_is_a_removal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = FileCache(tmp_path / "kept", 1000)
    cache.prepare()
    directory, manifest = _kept_dir(tmp_path, "x", 100)
    assert cache.keep("team-a", directory, manifest)
    assert cache.kept() == [KeptCopy("team-a", manifest.digest, 100, Phase.CACHED)]
    # A new pod's install reads the copy; the copy itself stays kept.
    read = [data async for _, _, data in cache.chunks("team-a", manifest)]
    assert b"".join(read) == b"x" * 100
    assert [c.phase for c in cache.kept()] == [Phase.CACHED]
    # Taken up again by a restarted agent: kept files at rest, so CACHED.
    again = FileCache(tmp_path / "kept", 1000)
    again.prepare()
    assert [c.phase for c in again.kept()] == [Phase.CACHED]
    # Evicting walks the table's row (CACHED, REMOVED): without it the eviction is refused.
    life = cache.drop("team-a", manifest.digest)
    assert life is not None and life.phase is Phase.ABSENT
    assert cache.kept() == [] and cache.drop("team-a", manifest.digest) is None
    monkeypatch.delitem(phases.TRANSITIONS, (Phase.CACHED, Event.REMOVED))
    other, kept = _kept_dir(tmp_path, "y", 100)
    assert again.keep("team-b", other, kept)
    with pytest.raises(RefusedTransitionError):
        again.evict("team-b", 1)


def test_the_namespace_bound_names_only_the_namespaces_own_figures() -> None:
    bound = NamespaceDisk(10 * MIB)
    assert bound.problem("team-a", "m", 4 * MIB, 6 * MIB) == ""
    problem = bound.problem("team-a", "m", 5 * MIB, 6 * MIB)
    assert "namespace team-a" in problem and "--max-installed-bytes-per-namespace" in problem
    assert re.findall(r"\d+", problem) == [str(5 * MIB), str(6 * MIB), str(10 * MIB)]
    assert NamespaceDisk(0).problem("team-a", "m", 10**15, 10**15) == ""


@pytest.mark.triton
async def test_kept_copies_make_way_for_an_install_the_disk_has_no_room_for(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    """team-a's pod left its files on the node; the volume then has room for team-b's model only
    without them: the kept copy is evicted and team-b's install succeeds."""
    running = await start_custom_agent()
    agent = running.agent
    roots = (agent.repository.root, agent.repository.staging_root, agent.cache.root)

    def used() -> int:
        return sum(p.stat().st_size for r in roots for p in r.rglob("*") if p.is_file())

    agent.repository.disk_free = lambda _: DISK_HEADROOM_BYTES + 5 * MIB - used()
    namespaces(kube_api, "team-a", "team-b")
    make_pod(kube_api, "a1", MODEL, namespace="team-a")
    make_pod(kube_api, "b1", MODEL, namespace="team-b")
    source = unnamed_model(tmp_path / "a")
    (source / "1" / "weights.bin").write_bytes(b"\1" * (3 * MIB))
    await install_dir(running.stub, apiserver.mint_token("team-a", "a1"), source, MODEL)
    kubernetes.client.CoreV1Api(kube_api).delete_namespaced_pod(
        "a1", "team-a", grace_period_seconds=0
    )
    digest = digest_of(source)
    await eventually(lambda: agent.cache.holds("team-a", digest), what="a1's files kept")

    other = unnamed_model(tmp_path / "b")
    (other / "1" / "weights.bin").write_bytes(b"\2" * (3 * MIB))
    reply = await install_dir(running.stub, apiserver.mint_token("team-b", "b1"), other, MODEL)
    assert reply.bytes_written >= 3 * MIB
    assert not agent.cache.holds("team-a", digest)
