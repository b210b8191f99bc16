"""Replacing a small file that other processes read, so that a reader never sees it half written."""

import os
import tempfile
from pathlib import Path


def replace_file(path: Path, data: bytes, prefix: str) -> None:
    """Write `data` to a temporary file named `prefix`… beside `path`, then rename it over `path`.

    The temporary file lives in the same directory so the rename stays on one filesystem and is
    atomic; it is removed when anything fails, so a crash leaves no stray file for the reader.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=prefix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        Path(temporary).chmod(0o644)
        Path(temporary).replace(path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def read_file(path: Path, what: str, error: type[ValueError], missing: str | None) -> bytes | None:
    """The bytes at `path`, or `error` naming `what` when they cannot be read. A missing file is
    `error` with the `missing` hint (who writes it, what to check), or None when `missing` is
    None because no file yet is a valid state."""
    try:
        return path.read_bytes()
    except FileNotFoundError as e:
        if missing is None:
            return None
        raise error(f"no {what} at {path}: {missing}") from e
    except OSError as e:
        raise error(f"cannot read the {what} {path}: {e.strerror}") from e
