"""The kubelet's log endpoint: `GET /containerLogs/<namespace>/<pod>/<container>`, which the API
server calls for `pods/<name>/log` (`kubectl logs`), as a real kubelet serves it on its port.

Query parameters as upstream's: `previous` (the run before the current one), `tailLines`,
`limitBytes` and `follow` (stream until the container's run ends). Errors are plain text with
the kubelet's status and wording (`container "x" in pod "y" is waiting to start:
PodInitializing`). Threads of its own; it reads the runs a `ContainerRun` recorded, and must not
call the API.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from sim.node.containers import ContainerRun

log = logging.getLogger(__name__)

FOLLOW_POLL_SECONDS = 0.1
Lookup = Callable[[str, str], "list[ContainerRun] | None"]
"""The containers of a pod the kubelet runs, by (namespace, name); None for an unknown pod."""


class LogError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _flag(value: str) -> bool:
    return value.lower() in ("true", "1")


def _tail(data: bytes, lines: int | None, limit: int | None) -> bytes:
    if lines is not None:
        kept = data.splitlines(keepends=True)
        data = b"".join(kept[-lines:]) if lines > 0 else b""
    if limit is not None:
        data = data[:limit]
    return data


def select(lookup: Lookup, namespace: str, pod: str, name: str, previous: bool) -> ContainerRun:
    """The container whose log is asked for, or the kubelet's error."""
    containers = lookup(namespace, pod)
    if containers is None:
        raise LogError(HTTPStatus.NOT_FOUND, f'pod "{pod}" in namespace "{namespace}" not found')
    container = next((c for c in containers if c.name == name), None)
    if container is None:
        raise LogError(HTTPStatus.BAD_REQUEST, f'container "{name}" in pod "{pod}" not found')
    if previous and len(container.run_offsets) < 2:
        raise LogError(
            HTTPStatus.BAD_REQUEST,
            f'previous terminated container "{name}" in pod "{pod}" not found',
        )
    if not container.run_offsets:
        reason = (container.state.get("waiting") or {}).get("reason", "ContainerCreating")
        raise LogError(
            HTTPStatus.BAD_REQUEST,
            f'container "{name}" in pod "{pod}" is waiting to start: {reason}',
        )
    return container


class _Handler(BaseHTTPRequestHandler):
    server: LogServer

    def log_message(self, format: str, *args: object) -> None:
        log.debug("kubelet log server: " + format, *args)

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        segments = [unquote(p) for p in parts.path.strip("/").split("/")]
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        try:
            if len(segments) != 4 or segments[0] != "containerLogs":
                raise LogError(HTTPStatus.NOT_FOUND, f"no such endpoint: {parts.path}")
            _, namespace, pod, name = segments
            previous, follow = _flag(query.get("previous", "")), _flag(query.get("follow", ""))
            lines = int(query["tailLines"]) if query.get("tailLines") else None
            limit = int(query["limitBytes"]) if query.get("limitBytes") else None
            container = select(self.server.lookup, namespace, pod, name, previous)
        except ValueError as e:
            self._fail(HTTPStatus.BAD_REQUEST, f"a bad query parameter: {e}")
            return
        except LogError as e:
            self._fail(e.status, e.message)
            return
        runs = len(container.run_offsets)
        data = _tail(container.run_log(previous) or b"", lines, limit)
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(data)
        if not follow or previous:
            return
        sent = len(container.run_log() or b"")
        # Follow this run until it ends (or the caller goes): what it writes, as it writes it.
        while not self.server.stopping.is_set() and len(container.run_offsets) == runs:
            running = container.running()
            current = container.run_log() or b""
            if len(current) > sent:
                self.wfile.write(current[sent:])
                self.wfile.flush()
                sent = len(current)
            if not running:
                return
            time.sleep(FOLLOW_POLL_SECONDS)

    def _fail(self, status: HTTPStatus, message: str) -> None:
        body = message.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class LogServer(ThreadingHTTPServer):
    """Serves the logs of the pods `lookup` finds, on (host, port) (0: a free port). `stop()`
    ends every request, followed ones too, and joins their threads."""

    def __init__(self, host: str, lookup: Lookup, port: int = 0) -> None:
        super().__init__((host, port), _Handler)
        self.lookup = lookup
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self.serve_forever, name="kubelet-log-server")

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self._thread.is_alive():
            self.shutdown()
            self._thread.join(10)
        self.server_close()
