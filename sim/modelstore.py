"""A model store for the simulated cluster: Triton model directories as archives over HTTPS.

Stands in for the bucket or web server a team keeps its models in. `publish(name, directory)`
packs a model directory (config.pbtxt and version directories at the archive's root, the layout
KServe's storage initializer unpacks into /mnt/models) as `<name>.tar.gz`, with the config's
`name` set to `name`, as the team would upload it; `url(name)` is where a pod's
`tritonshare.io/model-uri` points. `publish(name, directory, release="v2")` puts another release
of the same model (same name, other files) at `v2/<name>.tar.gz`, as a rollout to new model files
points the pod template at it. `protect(release, token)` makes a release private, as a bucket
behind a credential: its files answer 401 without `Authorization: Bearer <token>`, and `seen`
lists every request's (client address, path, whether it bore a token). `refuse()` answers every
request 503 until `refuse(False)`, as a store that is down. It serves files and nothing else: no
listing, no uploads.
"""

from __future__ import annotations

import functools
import http.server
import io
import re
import ssl
import tarfile
import threading
from pathlib import Path
from typing import Any

_NAME_LINE = re.compile(r'^name:\s*"[^"]*"', re.MULTILINE)


class _Files(http.server.SimpleHTTPRequestHandler):
    store: ModelStore

    def do_GET(self) -> None:
        bearer = self.headers.get("Authorization", "")
        self.store.seen.append((self.client_address[0], self.path, bool(bearer)))
        if self.store.refusing:
            self.send_error(503, "the model store is down")
            return
        for release, token in self.store.tokens.items():
            if self.path.startswith(f"/triton/{release}/") and bearer != f"Bearer {token}":
                self.send_error(401, "this release needs its credential")
                return
        super().do_GET()

    def list_directory(self, path: Any) -> None:
        self.send_error(404, "no listing")

    def log_message(self, format: str, *args: Any) -> None:
        pass


class ModelStore:
    """Start with start(), stop with stop(); `host` 127.0.0.1, a free port."""

    def __init__(self, directory: Path, cert: Path, key: Path) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.tokens: dict[str, str] = {}
        """Release -> the bearer token its files need (`protect`)."""
        self.seen: list[tuple[str, str, bool]] = []
        """Every request: (client address, path, whether it bore a token)."""
        self.refusing = False
        """Every request is answered 503 (`refuse`), as a store that is down behind its load
        balancer."""
        files = type("Files", (_Files,), {"store": self})
        handler = functools.partial(files, directory=str(directory))
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="model-store"
        )

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self._server.server_address[1]}"

    def url(self, name: str, release: str = "") -> str:
        folder = f"triton/{release}/" if release else "triton/"
        return f"{self.base_url}/{folder}{name}.tar.gz"

    def protect(self, release: str, token: str) -> None:
        """Serve `release`'s files only to requests bearing `token`."""
        self.tokens[release] = token

    def refuse(self, refusing: bool = True) -> None:
        """Answer every request 503 from now on (False: serve again)."""
        self.refusing = refusing

    def publish(self, name: str, model: Path, release: str = "") -> str:
        """Pack the model directory `model` as `name` (under `release/` when given); its URL."""
        if release and not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", release):
            raise ValueError(f"release {release!r}: use lower-case letters, digits, '.' and '-'")
        folder = self.directory / "triton" / release if release else self.directory / "triton"
        target = folder / f"{name}.tar.gz"
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        with tarfile.open(partial, "w:gz") as archive:
            for path in sorted(model.rglob("*")):
                if "__pycache__" in path.parts or not path.is_file():
                    continue
                relative = path.relative_to(model).as_posix()
                if relative == "config.pbtxt":
                    text = _NAME_LINE.sub(f'name: "{name}"', path.read_text(), count=1)
                    data = text.encode()
                    info = tarfile.TarInfo(relative)
                    info.size, info.mode = len(data), 0o644
                    archive.addfile(info, io.BytesIO(data))
                else:
                    archive.add(path, relative)
        partial.replace(target)
        return self.url(name, release)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(10)
        self._server.server_close()
