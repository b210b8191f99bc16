"""Checks a model directory before anything is sent, so a broken model fails fast in its own pod.

Owns the walk of the model directory: which files will be sent, under which relative path, and
every reason the directory cannot be served (no or unparseable config.pbtxt, a name that is not
the model id, no version directory, a symlink leaving the directory, too many bytes). Each failure
raises InvalidModelError with a message that says what to fix. Reads the filesystem only; it must
not hash files (manifest.py does) or talk to the agent.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from common.modelconfig import ModelConfig, ModelConfigError, parse_model_config
from common.quantity import format_bytes
from loader.errors import InvalidModelError

CONFIG_FILE = "config.pbtxt"


@dataclass(frozen=True)
class ModelFile:
    """One regular file to send: its path in the model ("1/model.py") and where to read it."""

    path: str
    source: Path
    size: int


@dataclass(frozen=True)
class ModelDirectory:
    """A model directory that passed every check."""

    root: Path
    model_id: str
    files: tuple[ModelFile, ...]
    versions: tuple[int, ...]
    total_bytes: int
    backend: str


def is_version_name(name: str) -> bool:
    """Triton serves a subdirectory as a version only if it is a plain decimal number.

    Seen on Triton 2.51: `0` and `3` load, `01` is ignored ("at least one version must be
    available"), and so is anything not made of ASCII digits.
    """
    return name.isascii() and name.isdigit() and (name == "0" or not name.startswith("0"))


def validate_model_directory(root: Path, model_id: str, max_bytes: int) -> ModelDirectory:
    """Check `root` can be served as `model_id`; return its files, or raise InvalidModelError."""
    if not root.exists():
        raise InvalidModelError(
            f"model directory {root} does not exist; mount the model there or set --model-dir"
        )
    if not root.is_dir():
        raise InvalidModelError(
            f"model directory {root} is not a directory; point --model-dir at the folder that "
            f"holds config.pbtxt and the version directories"
        )
    real_root = root.resolve()
    files = _walk(root, real_root)
    config = _parse_config(root, model_id)
    versions = sorted(
        int(entry.name)
        for entry in root.iterdir()
        if is_version_name(entry.name) and _is_directory_inside(entry, real_root)
    )
    if not versions:
        others = sorted(entry.name for entry in root.iterdir() if entry.name != CONFIG_FILE)
        found = f" (found: {', '.join(others[:10])})" if others else ""
        raise InvalidModelError(
            f"model directory {root} has no version directory{found}; put the model files in a "
            f"numbered subdirectory such as {root}/1 (Triton ignores names like 01 or v1)"
        )
    total = sum(f.size for f in files)
    if total > max_bytes:
        raise InvalidModelError(
            f"model directory {root} holds {format_bytes(total)} ({total} bytes), more than the "
            f"limit of {format_bytes(max_bytes)}; slim the model or raise --max-model-bytes"
        )
    return ModelDirectory(
        root=root,
        model_id=model_id,
        files=tuple(sorted(files, key=lambda f: f.path)),
        versions=tuple(versions),
        total_bytes=total,
        backend=config.backend or config.platform,
    )


def _parse_config(root: Path, model_id: str) -> ModelConfig:
    path = root / CONFIG_FILE
    if not path.is_file():
        raise InvalidModelError(
            f"model directory {root} has no {CONFIG_FILE}; write one that names the backend, "
            f"inputs and outputs (see Triton's model configuration documentation)"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InvalidModelError(f"{path} is not UTF-8 text; save it as UTF-8") from e
    except OSError as e:
        raise InvalidModelError(f"{path} cannot be read ({e.strerror}); fix its permissions") from e
    try:
        return parse_model_config(text, model_id, source=str(path))
    except ModelConfigError as e:
        rename = f'set name: "{model_id}" in {CONFIG_FILE}, or remove the name line'
        raise InvalidModelError(e.advised(wrong_name=rename, invalid="fix that line")) from e


def _is_directory_inside(entry: Path, real_root: Path) -> bool:
    if not entry.is_dir():
        return False
    return entry.resolve().is_relative_to(real_root)


def _walk(root: Path, real_root: Path) -> list[ModelFile]:
    """Every regular file under root; symlinks are followed only while they stay inside it."""
    files: list[ModelFile] = []
    # Real paths of the directories on the current descent, to refuse a symlink loop.
    stack: list[tuple[Path, str, frozenset[Path]]] = [(root, "", frozenset({real_root}))]
    while stack:
        directory, prefix, ancestors = stack.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as e:
            raise InvalidModelError(
                f"directory {directory} cannot be listed ({e.strerror}); fix its permissions"
            ) from e
        for entry in entries:
            relative = f"{prefix}{entry.name}"
            path = Path(entry.path)
            target = _inside_target(path, relative, real_root) if entry.is_symlink() else path
            try:
                info = target.stat()
            except OSError as e:
                raise InvalidModelError(
                    f"{relative} in the model directory cannot be read ({e.strerror}); "
                    f"fix its permissions"
                ) from e
            if stat.S_ISDIR(info.st_mode):
                real = target.resolve()
                if real in ancestors:
                    raise InvalidModelError(
                        f"{relative} in the model directory is a symlink loop back to one of its "
                        f"parents; remove it"
                    )
                stack.append((path, f"{relative}/", ancestors | {real}))
            elif stat.S_ISREG(info.st_mode):
                if not os.access(target, os.R_OK):
                    raise InvalidModelError(
                        f"{relative} in the model directory is not readable by the loader; "
                        f"fix its permissions"
                    )
                files.append(ModelFile(path=relative, source=target, size=info.st_size))
            else:
                raise InvalidModelError(
                    f"{relative} in the model directory is not a regular file or directory "
                    f"(a socket, pipe or device); remove it"
                )
    return files


def _inside_target(link: Path, relative: str, real_root: Path) -> Path:
    """Where a symlink inside the model points, if that is inside the model too."""
    try:
        target = link.resolve(strict=True)
    except FileNotFoundError as e:
        raise InvalidModelError(
            f"{relative} in the model directory is a symlink to {str(link.readlink())!r}, "
            f"which does not exist; remove the link or copy the file in"
        ) from e
    except RuntimeError as e:  # Python 3.11 reports a loop of links this way
        raise InvalidModelError(
            f"{relative} in the model directory is a symlink loop; remove it"
        ) from e
    except OSError as e:
        raise InvalidModelError(
            f"{relative} in the model directory is a symlink that cannot be followed "
            f"({e.strerror}); remove it or copy the file in"
        ) from e
    if not target.is_relative_to(real_root):
        raise InvalidModelError(
            f"{relative} in the model directory is a symlink to {target}, outside the model "
            f"directory; copy the file into the model directory instead of linking to it"
        )
    return target
