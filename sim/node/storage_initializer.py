"""The simulated kubelet's stand-in for KServe's storage-initializer image.

`python -m sim.node.storage_initializer SOURCE DIRECTORY` is what the kubelet runs for a
container of the image `kserve/storage-initializer` that gives no command
(`sim.node.podspec.IMAGE_ENTRYPOINTS`), as the pods the tritonshare webhook completes are: args
`[URI, /mnt/models]`. It puts the model where KServe's initializer puts it:

- `https://` and `http://`: the file the URI names is downloaded into DIRECTORY; an archive
  (`.tar`, `.tar.gz`, `.tgz`, `.zip`) is unpacked there and removed, so a Triton model directory
  shipped as `add_one.tar.gz` (config.pbtxt and 1/ at its root) becomes DIRECTORY/config.pbtxt
  and DIRECTORY/1/. TLS trusts the process's default CA store (`SSL_CERT_FILE`).
- a local path (what `pvc://CLAIM/PATH` becomes once the claim is mounted): its contents are
  copied into DIRECTORY.

`gs://` and `s3://` need the cloud's credentials and client libraries: it refuses them and says
so (exit 1). It does not parse models; the loader checks what was fetched.
"""

from __future__ import annotations

import shutil
import sys
import tarfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from urllib.parse import urlsplit

_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
_CHUNK = 1 << 20


class FetchError(RuntimeError):
    """The model cannot be fetched; the message says why."""


def _download(uri: str, directory: Path) -> Path:
    name = urlsplit(uri).path.rpartition("/")[2]
    if not name:
        raise FetchError(f"{uri} names no file; point it at the model's archive (model.tar.gz)")
    target = directory / name
    try:
        with urllib.request.urlopen(uri, timeout=60) as answer, target.open("wb") as out:  # noqa: S310
            while chunk := answer.read(_CHUNK):
                out.write(chunk)
    except urllib.error.HTTPError as e:
        raise FetchError(f"{uri} answered HTTP {e.code} {e.reason}") from e
    except (urllib.error.URLError, OSError) as e:
        raise FetchError(f"{uri} could not be downloaded: {e}") from e
    return target


def _unpack(archive: Path, directory: Path) -> bool:
    """Unpack `archive` into `directory` and remove it; False if it is no archive."""
    if archive.name.endswith(_TAR_SUFFIXES):
        with tarfile.open(archive) as tar:
            # The "data" filter refuses members that escape the directory, links out of it and
            # device files, as an archive from the network deserves.
            tar.extractall(directory, filter="data")
    elif archive.name.endswith(".zip"):
        root = directory.resolve()
        with zipfile.ZipFile(archive) as zipped:
            for member in zipped.namelist():
                if not (root / member).resolve().is_relative_to(root):
                    raise FetchError(f"{archive.name} holds {member!r}, outside its directory")
            zipped.extractall(directory)  # noqa: S202  (every member checked just above)
    else:
        return False
    archive.unlink()
    return True


def fetch(source: str, directory: Path) -> str:
    """Put the model `source` names into `directory`; a sentence saying what was done."""
    directory.mkdir(parents=True, exist_ok=True)
    scheme = urlsplit(source).scheme
    if scheme in ("http", "https"):
        downloaded = _download(source, directory)
        if _unpack(downloaded, directory):
            return f"downloaded {source} and unpacked it into {directory}"
        return f"downloaded {source} into {directory}"
    if scheme in ("", "file"):
        local = Path(urlsplit(source).path if scheme else source)
        if not local.exists():
            raise FetchError(f"{local} does not exist (is the volume mounted?)")
        if local.is_dir():
            shutil.copytree(local, directory, dirs_exist_ok=True)
        else:
            shutil.copy2(local, directory / local.name)
        return f"copied {local} into {directory}"
    raise FetchError(
        f"{scheme}:// needs the real kserve/storage-initializer (the cloud's credentials and "
        "client); the simulated one fetches https://, http:// and local paths"
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m sim.node.storage_initializer SOURCE DIRECTORY", file=sys.stderr)
        return 2
    try:
        print(fetch(args[0], Path(args[1])), flush=True)
    except (FetchError, tarfile.TarError, zipfile.BadZipFile) as e:
        print(f"the model could not be fetched: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
