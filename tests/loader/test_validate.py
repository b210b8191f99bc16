"""The model directory checks: each broken directory gets its own message saying what to fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from loader.errors import ExitCode, InvalidModelError
from loader.validate import is_version_name, validate_model_directory
from tests.conftest import copy_model

LIMIT = 1024**3


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A valid copy of the add_one test model, named add_one."""
    return copy_model("add_one", tmp_path)


def test_a_good_model_lists_its_files_sorted_with_relative_paths(model: Path) -> None:
    checked = validate_model_directory(model, "add_one", LIMIT)
    paths = [f.path for f in checked.files]
    assert paths == sorted(paths)
    assert "config.pbtxt" in paths
    assert "1/model.py" in paths
    assert checked.versions == (1,)
    assert checked.backend == "python"
    assert checked.total_bytes == sum((model / p).stat().st_size for p in paths)


def test_the_config_may_leave_the_name_out(model: Path) -> None:
    config = model / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "add_one"', ""))
    assert validate_model_directory(model, "renamed", LIMIT).model_id == "renamed"


def test_a_missing_directory_says_where_to_mount(tmp_path: Path) -> None:
    with pytest.raises(InvalidModelError, match=r"does not exist; mount the model there") as e:
        validate_model_directory(tmp_path / "absent", "m", LIMIT)
    assert e.value.exit_code == ExitCode.INVALID_MODEL


def test_a_file_instead_of_a_directory_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(InvalidModelError, match="is not a directory"):
        validate_model_directory(path, "m", LIMIT)


def test_a_missing_config_is_named(model: Path) -> None:
    (model / "config.pbtxt").unlink()
    with pytest.raises(InvalidModelError, match=r"has no config\.pbtxt; write one"):
        validate_model_directory(model, "add_one", LIMIT)


def test_an_unparseable_config_points_at_the_line(model: Path) -> None:
    (model / "config.pbtxt").write_text('name: "add_one"\nbackend: "python"\nmax_batch_size: x\n')
    with pytest.raises(InvalidModelError, match=r"not a valid Triton model configuration: 3:") as e:
        validate_model_directory(model, "add_one", LIMIT)
    assert "fix that line" in str(e.value)


def test_an_unknown_field_in_the_config_is_refused(model: Path) -> None:
    (model / "config.pbtxt").write_text('name: "add_one"\nbackend: "python"\nbatch_size: 4\n')
    with pytest.raises(InvalidModelError, match="batch_size"):
        validate_model_directory(model, "add_one", LIMIT)


def test_a_name_other_than_the_model_id_says_how_to_fix_it(model: Path) -> None:
    with pytest.raises(InvalidModelError, match=r"names the model 'add_one' but the model id") as e:
        validate_model_directory(model, "other", LIMIT)
    assert 'set name: "other"' in str(e.value)


@pytest.mark.parametrize("names", [[], ["00"], ["01", "v1", "latest"]])
def test_no_servable_version_directory_is_refused(model: Path, names: list[str]) -> None:
    (model / "1" / "model.py").unlink()
    (model / "1").rmdir()
    for name in names:
        (model / name).mkdir()
    with pytest.raises(InvalidModelError, match=r"has no version directory.*numbered subdirectory"):
        validate_model_directory(model, "add_one", LIMIT)


def test_a_version_file_is_not_a_version_directory(model: Path) -> None:
    (model / "1" / "model.py").rename(model / "model.py")
    (model / "1").rmdir()
    (model / "2").write_text("not a directory")
    with pytest.raises(InvalidModelError, match="has no version directory"):
        validate_model_directory(model, "add_one", LIMIT)


def test_version_names_follow_triton() -> None:
    assert is_version_name("1")
    assert is_version_name("20240101")
    assert is_version_name("0")
    assert not is_version_name("00")
    assert not is_version_name("007")
    assert not is_version_name("v1")
    assert not is_version_name("\u0661")  # an Arabic-Indic digit is a digit, but not to Triton


def test_several_versions_are_reported_in_order(model: Path) -> None:
    for version in ("10", "2", "0"):
        (model / version).mkdir()
        (model / version / "model.py").write_text("pass\n")
    assert validate_model_directory(model, "add_one", LIMIT).versions == (0, 1, 2, 10)


def test_a_symlink_leaving_the_directory_is_refused(model: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("not part of the model")
    (model / "1" / "weights.bin").symlink_to(secret)
    with pytest.raises(InvalidModelError, match=r"1/weights\.bin .* outside the model directory"):
        validate_model_directory(model, "add_one", LIMIT)


def test_a_relative_symlink_climbing_out_is_refused(model: Path, tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (model / "1" / "up").symlink_to(Path("..") / ".." / "elsewhere")
    with pytest.raises(InvalidModelError, match="outside the model directory"):
        validate_model_directory(model, "add_one", LIMIT)


def test_a_symlink_inside_the_directory_is_sent_as_the_file(model: Path) -> None:
    (model / "labels.txt").write_text("a\nb\n")
    (model / "1" / "labels.txt").symlink_to(Path("..") / "labels.txt")
    checked = validate_model_directory(model, "add_one", LIMIT)
    linked = next(f for f in checked.files if f.path == "1/labels.txt")
    assert linked.size == 4
    assert linked.source == (model / "labels.txt").resolve()


def test_a_dangling_symlink_is_refused(model: Path) -> None:
    (model / "1" / "gone.bin").symlink_to(model / "nowhere.bin")
    with pytest.raises(InvalidModelError, match=r"1/gone\.bin .* which does not exist"):
        validate_model_directory(model, "add_one", LIMIT)


def test_a_directory_symlink_loop_is_refused(model: Path) -> None:
    (model / "1" / "again").symlink_to(model / "1")
    with pytest.raises(InvalidModelError, match="symlink loop"):
        validate_model_directory(model, "add_one", LIMIT)


def test_a_fifo_is_refused(model: Path) -> None:
    os.mkfifo(model / "1" / "pipe")
    with pytest.raises(InvalidModelError, match=r"1/pipe .* not a regular file"):
        validate_model_directory(model, "add_one", LIMIT)


def test_a_model_over_the_size_limit_says_how_big_it_is(model: Path) -> None:
    (model / "1" / "weights.bin").write_bytes(b"\0" * 3000)
    total = validate_model_directory(model, "add_one", LIMIT).total_bytes
    with pytest.raises(InvalidModelError, match=rf"holds .*\({total} bytes\).*--max-model-bytes"):
        validate_model_directory(model, "add_one", total - 1)
    assert validate_model_directory(model, "add_one", total).total_bytes == total
