"""Hashing a model directory into its manifest (the digest itself is tested in tests/common)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from common.manifest import manifest_digest
from loader.errors import InvalidModelError
from loader.manifest import build_manifest, hash_file
from loader.validate import ModelFile, validate_model_directory
from tests.conftest import copy_model


def test_a_model_directory_hashes_to_its_files(tmp_path: Path) -> None:
    model = copy_model("add_one", tmp_path)
    manifest = build_manifest(validate_model_directory(model, "add_one", 10**9).files)
    by_path = {e.path: e for e in manifest.files}
    for path, entry in by_path.items():
        data = (model / path).read_bytes()
        assert entry.size == len(data)
        assert entry.sha256 == hashlib.sha256(data).hexdigest()
    assert manifest.total_bytes == sum(e.size for e in manifest.files)
    assert manifest.digest == manifest_digest(manifest.files)


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
