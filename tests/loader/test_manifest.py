"""The manifest and its canonical digest, exactly as protos/agent.proto defines them."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loader.errors import InvalidModelError
from loader.manifest import ManifestEntry, build_manifest, hash_file, manifest_digest
from loader.validate import ModelFile, validate_model_directory
from tests.conftest import copy_model


def test_the_digest_is_sha256_over_sorted_path_size_sha_lines() -> None:
    entries = [
        ManifestEntry("config.pbtxt", 12, "b" * 64),
        ManifestEntry("1/model.py", 300, "a" * 64),
    ]
    expected = hashlib.sha256(
        f"1/model.py\0{300}\0{'a' * 64}\nconfig.pbtxt\0{12}\0{'b' * 64}\n".encode()
    ).hexdigest()
    assert manifest_digest(entries) == expected
    assert manifest_digest(reversed(entries)) == expected


def test_a_model_directory_hashes_to_its_files(tmp_path: Path) -> None:
    model = copy_model("add_one", tmp_path)
    manifest = build_manifest(validate_model_directory(model, "add_one", 10**9).files)
    by_path = {e.path: e for e in manifest.entries}
    for path, entry in by_path.items():
        data = (model / path).read_bytes()
        assert entry.size == len(data)
        assert entry.sha256 == hashlib.sha256(data).hexdigest()
    assert manifest.total_bytes == sum(e.size for e in manifest.entries)
    assert manifest.digest == manifest_digest(manifest.entries)


def test_the_same_files_elsewhere_give_the_same_digest(tmp_path: Path) -> None:
    first = copy_model("add_one", tmp_path / "a")
    second = copy_model("add_one", tmp_path / "b")
    digest = build_manifest(validate_model_directory(first, "add_one", 10**9).files).digest
    same = build_manifest(validate_model_directory(second, "add_one", 10**9).files).digest
    assert digest == same
    (second / "1" / "model.py").write_text("# changed\n")
    changed = build_manifest(validate_model_directory(second, "add_one", 10**9).files).digest
    assert changed != digest


def test_a_file_that_changed_size_since_the_check_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"12345")
    with pytest.raises(InvalidModelError, match=r"weights\.bin .* changed size"):
        hash_file(ModelFile(path="weights.bin", source=path, size=4))


def test_an_empty_file_has_the_empty_digest(tmp_path: Path) -> None:
    path = tmp_path / "empty"
    path.write_bytes(b"")
    entry = hash_file(ModelFile(path="empty", source=path, size=0))
    assert entry.sha256 == hashlib.sha256(b"").hexdigest()


_names = st.text(alphabet="abc/._-1", min_size=1, max_size=8)


@given(
    st.lists(
        st.tuples(_names, st.integers(0, 10**12), st.sampled_from(["0" * 64, "f" * 64])),
        min_size=1,
        max_size=6,
        unique_by=lambda t: t[0],
    ),
    st.data(),
)
def test_changing_any_field_of_any_entry_changes_the_digest(
    rows: list[tuple[str, int, str]], data: st.DataObject
) -> None:
    entries = [ManifestEntry(*row) for row in rows]
    index = data.draw(st.integers(0, len(entries) - 1))
    victim = entries[index]
    field = data.draw(st.sampled_from(["size", "sha256"]))
    if field == "size":
        changed = ManifestEntry(victim.path, victim.size + 1, victim.sha256)
    else:
        first = "1" if victim.sha256[0] != "1" else "2"
        changed = ManifestEntry(victim.path, victim.size, first + victim.sha256[1:])
    other = [*entries[:index], changed, *entries[index + 1 :]]
    assert manifest_digest(other) != manifest_digest(entries)
