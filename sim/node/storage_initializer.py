"""The simulated kubelet's stand-in for KServe's storage-initializer image.

`python -m sim.node.storage_initializer SOURCE DIRECTORY` is what the kubelet runs for a
container of the image `kserve/storage-initializer` that gives no command
(`sim.node.podspec.IMAGE_ENTRYPOINTS`), as the pods the tritonshare webhook completes are: args
`[URI, /mnt/models]`. It puts the model where KServe's initializer puts it:

- `s3://`, `gs://`, `https://` and `http://`: fetched by the model host's own fetcher
  (`loader.fetch`, one implementation for both doors), with what KServe's environment variables
  give (`loader.credentials.environment_access`: the webhook's AWS_*, S3_* and
  GOOGLE_APPLICATION_CREDENTIALS); one archive (`.tar`, `.tar.gz`, `.tgz`, `.zip`) is unpacked
  into DIRECTORY and removed. TLS trusts the process's default CA store (`SSL_CERT_FILE`).
- a local path (what `pvc://CLAIM/PATH` becomes once the claim is mounted): its contents are
  copied into DIRECTORY.

It does not parse models; the loader checks what was fetched.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from urllib.parse import urlsplit

from loader.credentials import environment_access
from loader.errors import FetchError
from loader.fetch import SCHEMES
from loader.fetch import fetch as fetch_remote

# KServe's initializer has no size bound; the shared fetcher needs one.
_MAX_BYTES = 1 << 40


def fetch(source: str, directory: Path) -> str:
    """Put the model `source` names into `directory`; a sentence saying what was done."""
    directory.mkdir(parents=True, exist_ok=True)
    scheme = urlsplit(source).scheme
    if scheme in SCHEMES:
        access = environment_access(os.environ)
        return fetch_remote(source, directory, max_bytes=_MAX_BYTES, bucket=access)
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
        f"{source}: the storage initializer fetches s3://, gs://, https://, http:// and local "
        f"paths (a pvc:// claim once mounted)"
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m sim.node.storage_initializer SOURCE DIRECTORY", file=sys.stderr)
        return 2
    try:
        print(fetch(args[0], Path(args[1])), flush=True)
    except FetchError as e:
        print(f"the model could not be fetched: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
