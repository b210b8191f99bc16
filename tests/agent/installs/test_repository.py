"""Installing files into the repository: staging outside the root, checks, atomic rename."""

from __future__ import annotations

import errno
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.errors import DigestMismatchError, InvalidRequestError, ResourceExhaustedError
from agent.installs.repository import (
    DISK_HEADROOM_BYTES,
    MANIFEST_FILE,
    Repository,
    Staging,
    build_manifest,
)
from agent.pods.modelpods import PodInfo
from agent.pods.ownership import OwnerStore
from agent.pods.provenpods import Proven
from common.manifest import Manifest, ManifestEntry
from tests.agent.nodeview import NoGpus, OwnersAlive, bare_models

CONFIG = b'name: "m"\nbackend: "python"\n'
MODEL = b"print('hello')\n"


def entry(path: str, data: bytes) -> ManifestEntry:
    return ManifestEntry(path, len(data), hashlib.sha256(data).hexdigest())


@pytest.fixture
def repository(tmp_path: Path) -> Repository:
    repo = Repository(tmp_path / "models")
    repo.prepare()
    return repo


def install(repo: Repository, files: dict[str, bytes], model_id: str = "m") -> Manifest:
    manifest = build_manifest(model_id, [entry(p, d) for p, d in files.items()])
    staging = repo.begin(model_id, manifest)
    try:
        for path, data in files.items():
            for offset in range(0, len(data), 4):
                staging.write(path, offset, data[offset : offset + 4])
        staging.finish()
        repo.commit(staging)
    except BaseException:
        staging.abort()
        raise
    return manifest


def test_install_stages_outside_the_root_and_renames_into_place(repository: Repository) -> None:
    assert repository.staging_root.parent == repository.root.parent
    manifest = install(repository, {"config.pbtxt": CONFIG, "1/model.py": MODEL})
    assert (repository.root / "m" / "1" / "model.py").read_bytes() == MODEL
    assert repository.installed_manifest("m") == manifest
    assert repository.is_intact("m", manifest)
    assert repository.installed_models() == ["m"]
    assert list(repository.staging_root.iterdir()) == []
    # The manifest digest follows agent.proto: sha256 over sorted "path\0size\0sha256\n".
    expected = hashlib.sha256()
    for e in sorted(manifest.files, key=lambda e: e.path):
        expected.update(f"{e.path}\0{e.size}\0{e.sha256}\n".encode())
    assert manifest.digest == expected.hexdigest()


def test_empty_files_are_created(repository: Repository) -> None:
    install(repository, {"config.pbtxt": CONFIG, "1/model.py": MODEL, "1/empty": b""})
    assert (repository.root / "m" / "1" / "empty").read_bytes() == b""


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("../escape", "'..'"),
        ("1/../../escape", "'..'"),
        ("/etc/passwd", "absolute"),
        ("1//model.py", "empty"),
        ("./config.pbtxt", "'.'"),
        ("1\\model.py", "backslash"),
        (MANIFEST_FILE, "reserved"),
        ("", "empty path"),
    ],
)
def test_paths_that_could_escape_are_refused(path: str, why: str) -> None:
    with pytest.raises(InvalidRequestError, match=why):
        build_manifest("m", [entry("config.pbtxt", CONFIG), entry(path, MODEL)])


def test_other_bad_manifests_are_refused() -> None:
    with pytest.raises(InvalidRequestError, match=r"config\.pbtxt"):
        build_manifest("m", [entry("1/model.py", MODEL)])
    with pytest.raises(InvalidRequestError, match="twice"):
        build_manifest("m", [entry("config.pbtxt", CONFIG), entry("config.pbtxt", CONFIG)])
    with pytest.raises(InvalidRequestError, match="both as a file and as a directory"):
        build_manifest("m", [entry("config.pbtxt", CONFIG), entry("1", b"x"), entry("1/a", b"y")])
    with pytest.raises(InvalidRequestError, match="64 lowercase hex"):
        build_manifest("m", [ManifestEntry("config.pbtxt", 1, "ABC")])
    with pytest.raises(InvalidRequestError, match="dot"):
        build_manifest(".hidden", [entry("config.pbtxt", CONFIG)])


def test_size_and_digest_mismatches_are_refused_and_leave_nothing(
    repository: Repository,
) -> None:
    manifest = build_manifest("m", [entry("config.pbtxt", CONFIG), entry("1/model.py", MODEL)])
    staging = repository.begin("m", manifest)
    staging.write("config.pbtxt", 0, CONFIG)
    with pytest.raises(DigestMismatchError, match="larger"):
        staging.write("1/model.py", 0, MODEL + b"extra")
    staging.abort()

    staging = repository.begin("m", manifest)
    staging.write("config.pbtxt", 0, CONFIG)
    staging.write("1/model.py", 0, MODEL[:-1] + b"!")
    with pytest.raises(DigestMismatchError, match="sha256"):
        staging.finish()
    staging.abort()

    staging = repository.begin("m", manifest)
    staging.write("config.pbtxt", 0, CONFIG)
    with pytest.raises(DigestMismatchError, match="arrived with 0 bytes"):
        staging.finish()
    staging.abort()

    staging = repository.begin("m", manifest)
    with pytest.raises(InvalidRequestError, match="in order"):
        staging.write("config.pbtxt", 5, CONFIG[5:])
    with pytest.raises(InvalidRequestError, match="not in the manifest"):
        staging.write("other.py", 0, b"x")
    staging.abort()

    assert not (repository.root / "m").exists()
    assert list(repository.staging_root.iterdir()) == []


def test_a_symlink_in_an_installed_model_is_not_trusted(
    repository: Repository, tmp_path: Path
) -> None:
    manifest = install(repository, {"config.pbtxt": CONFIG, "1/model.py": MODEL})
    target = repository.root / "m" / "1" / "model.py"
    outside = tmp_path / "outside.py"
    outside.write_bytes(MODEL)
    target.unlink()
    target.symlink_to(outside)
    assert not repository.is_intact("m", manifest)
    # Reinstalling replaces the tampered directory with real files.
    install(repository, {"config.pbtxt": CONFIG, "1/model.py": MODEL})
    assert not target.is_symlink() and target.read_bytes() == MODEL
    assert outside.exists(), "replacing a model must never follow a link out of the repository"


def test_a_symlinked_model_directory_is_not_an_installed_model(
    repository: Repository, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (repository.root / "linked").symlink_to(elsewhere)
    assert repository.installed_models() == []
    assert repository.installed_manifest("linked") is None


def test_remove_takes_the_directory_out_of_the_root(repository: Repository) -> None:
    install(repository, {"config.pbtxt": CONFIG, "1/model.py": MODEL})
    repository.remove("m")
    assert repository.installed_models() == []
    assert list(repository.staging_root.iterdir()) == []


def test_disk_is_admitted_as_bytes_arrive_and_refusals_name_no_free_space(
    tmp_path: Path,
) -> None:
    repository = Repository(tmp_path / "models", namespace_bytes=len(CONFIG) + 3)
    repository.prepare()
    huge = ManifestEntry("config.pbtxt", 1 << 60, "0" * 64)
    with pytest.raises(ResourceExhaustedError, match="--max-install-bytes-per-namespace"):
        repository.begin("m", Manifest((huge,)), "team-a")
    manifest = build_manifest("m", [entry("config.pbtxt", CONFIG)])
    first = repository.begin("m", manifest, "team-a")
    second = repository.begin("n", manifest, "team-a")
    assert repository.staged_bytes("team-a") == 0, "a header alone holds nothing"
    first.write("config.pbtxt", 0, CONFIG[:4])
    assert repository.staged_bytes("team-a") == 4
    with pytest.raises(ResourceExhaustedError, match="namespace team-a"):
        second.write("config.pbtxt", 0, CONFIG)
    other = repository.begin("o", manifest, "team-b")
    other.write("config.pbtxt", 0, CONFIG)  # another namespace is not held back
    first.abort()
    second.abort()
    assert repository.staged_bytes("team-a") == 0
    repository.disk_free = lambda _: DISK_HEADROOM_BYTES + 1
    full = repository.begin("m", manifest, "team-a")
    with pytest.raises(ResourceExhaustedError, match="no room") as refused:
        full.write("config.pbtxt", 0, CONFIG)
    assert str(DISK_HEADROOM_BYTES + 1) not in str(refused.value)
    full.abort()
    other.abort()


def test_staging_inside_the_root_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="Triton would list it"):
        Repository(tmp_path / "models", tmp_path / "models" / ".staging").prepare()


def test_leftovers_of_a_crashed_install_are_dropped(tmp_path: Path) -> None:
    repo = Repository(tmp_path / "models")
    repo.prepare()
    leftover = repo.staging_root / "m.abc123"
    leftover.mkdir()
    (leftover / "config.pbtxt").write_bytes(CONFIG)
    repo.prepare()
    assert not leftover.exists()
    assert list(repo.root.iterdir()) == []


async def test_a_full_disk_mid_install_is_reported_and_leaves_nothing(
    repository: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(self: Staging, path: str, offset: int, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Staging, "write", disk_full)
    owners = OwnerStore(repository.root.parent / "state")
    owners.load()

    async def not_in_triton(name: str) -> None:
        return None

    models = bare_models(
        repository, owners, frozenset({"default"}), gpus=NoGpus(), pods=OwnersAlive(False)
    )
    monkeypatch.setattr(models.triton, "state", not_in_triton)
    manifest = build_manifest("m", [entry("config.pbtxt", CONFIG)])
    owner = Proven(
        PodInfo("default", "p", "uid-p", "node", "tritonshare", "Pending", "m", ""), 1024
    )

    async def chunks() -> AsyncIterator[tuple[str, int, bytes]]:
        yield "config.pbtxt", 0, CONFIG

    try:
        with pytest.raises(ResourceExhaustedError, match="disk filled up"):
            await models.install("m", manifest, chunks(), owner)
    finally:
        await models.close()
    assert repository.installed_models() == []
    assert list(repository.staging_root.iterdir()) == []


def test_installing_over_a_symlinked_model_directory_never_touches_its_target(
    repository: Repository, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_bytes(b"keep me")
    (repository.root / "m").symlink_to(elsewhere, target_is_directory=True)
    install(repository, {"config.pbtxt": CONFIG, "1/model.py": MODEL})
    model = repository.root / "m"
    assert not model.is_symlink() and (model / "1" / "model.py").read_bytes() == MODEL
    assert (elsewhere / "precious").read_bytes() == b"keep me"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["precious"]
