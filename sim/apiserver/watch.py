"""Watch streams: one JSON event a line over a chunked HTTP response, as kube-apiserver sends.

A watch starts from a resourceVersion (replaying the history after it), or with no version (or
"0") from synthetic ADDED events for the current objects. It filters by namespace, label and field
selector the way the watch cache does: an object that starts matching is ADDED, one that stops
matching is DELETED (its previous state at the new version). A start older than the history gets
an in-stream ERROR event with a 410 Expired Status, and so does a watcher that falls so far behind
that its next events left the history. BOOKMARK events carry the current version when asked for;
the stream ends after `timeoutSeconds` or when the server stops.

Each stream registers a `Watcher` inbox with the store before reading anything; a pod watch with
`spec.nodeName=X` is indexed by node, so a write wakes only the watches it concerns. A watch that
starts from a resourceVersion, or whose inbox overflowed, reads the history ring until it has
caught up, then switches to its inbox. No state of its own beyond the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from sim.apiserver.errors import ApiError
from sim.apiserver.resources import Resource
from sim.apiserver.selectors import FieldSelector, LabelSelector
from sim.apiserver.store import (
    ADDED,
    DELETED,
    MODIFIED,
    TRIGGER_FIELDS,
    Event,
    Store,
    Stored,
    Watcher,
)

log = logging.getLogger(__name__)

INITIAL_EVENTS_END = "k8s.io/initial-events-end"


@dataclass(frozen=True)
class WatchRequest:
    resource: Resource
    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector
    start_rv: int | None
    """None: start with the current state as ADDED events ("" or "0" in the request)."""
    timeout_seconds: float
    bookmarks: bool
    send_initial_events: bool
    as_table: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    """Set when the client asked for the Table form (`kubectl get -w`): each event's object
    becomes the Table of that object."""

    def matches(self, stored: Stored) -> bool:
        if self.namespace is not None and stored.namespace != self.namespace:
            return False
        return self.labels.matches(stored.obj) and self.fields.matches(stored.obj)

    def concerns(self, event: Event) -> bool:
        """Whether this watch sees anything of `event` (its object matches, now or before)."""
        return self.matches(event.stored) or (event.prev is not None and self.matches(event.prev))


def _line(event_type: str, payload: bytes) -> bytes:
    return b'{"type":"' + event_type.encode() + b'","object":' + payload + b"}\n"


def _with_version(stored: Stored, rv: int) -> bytes:
    obj = dict(stored.obj)
    obj["metadata"] = {**stored.obj["metadata"], "resourceVersion": str(rv)}
    return Stored(obj, rv).full()


def translate(watch: WatchRequest, event: Event) -> bytes | None:
    """The line this watcher sees for `event`, or None if the event is not for it."""
    if event.resource is not watch.resource and (
        event.resource.group_resource != watch.resource.group_resource
    ):
        return None
    if event.type == ADDED:
        return _line(ADDED, event.stored.full()) if watch.matches(event.stored) else None
    if event.type == DELETED:
        return _line(DELETED, event.stored.full()) if watch.matches(event.stored) else None
    now = watch.matches(event.stored)
    before = event.prev is not None and watch.matches(event.prev)
    if now and before:
        return _line(MODIFIED, event.stored.full())
    if now:
        return _line(ADDED, event.stored.full())
    if before and event.prev is not None:
        return _line(DELETED, _with_version(event.prev, event.rv))
    return None


def bookmark(resource: Resource, rv: int, initial_events_end: bool = False) -> bytes:
    metadata: dict[str, object] = {"resourceVersion": str(rv)}
    if initial_events_end:
        metadata["annotations"] = {INITIAL_EVENTS_END: "true"}
    payload = {"kind": resource.kind, "apiVersion": resource.api_version, "metadata": metadata}
    return _line("BOOKMARK", json.dumps(payload, separators=(",", ":")).encode())


def error_line(error: ApiError) -> bytes:
    return _line("ERROR", json.dumps(error.status(), separators=(",", ":")).encode())


async def stream(
    request: web.Request, store: Store, watch: WatchRequest, bookmark_interval: float
) -> web.StreamResponse:
    """Serve one watch until its timeout, the client leaving, or the server stopping."""
    trigger = (
        watch.fields.equality(TRIGGER_FIELDS[watch.resource.group_resource])
        if (watch.resource.group_resource in TRIGGER_FIELDS)
        else None
    )
    # Registered before anything is read, so no write can fall between the start and the inbox.
    watcher = store.add_watcher(watch.resource, trigger, watch.concerns)
    try:
        response = web.StreamResponse(
            status=200, headers={"Content-Type": "application/json", "Cache-Control": "no-cache"}
        )
        response.enable_chunked_encoding()
        await response.prepare(request)
        try:
            await _serve(response, store, watch, watcher, bookmark_interval)
            await response.write_eof()
        except ConnectionResetError:
            log.debug("A watch client on %s went away.", watch.resource.group_resource)
        return response
    finally:
        store.remove_watcher(watcher)


async def _serve(
    response: web.StreamResponse,
    store: Store,
    watch: WatchRequest,
    watcher: Watcher,
    bookmark_interval: float,
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + watch.timeout_seconds
    next_bookmark = loop.time() + bookmark_interval
    if watch.start_rv is None:
        position = store.rv
        initial = [
            _line(ADDED, s.full())
            for s in store.objects(watch.resource, watch.namespace)
            if watch.matches(s)
        ]
        if watch.send_initial_events and watch.bookmarks:
            initial.append(bookmark(watch.resource, position, initial_events_end=True))
        await _write_batches(response, initial, watch)
    else:
        position = watch.start_rv
        watcher.behind = True  # replay the history first, then switch to the inbox
    while not store.closed:
        lines: list[bytes] = []
        if watcher.behind:
            try:
                events = store.events_after(position)
            except ApiError as e:
                log.info(
                    "A watch on %s from resourceVersion %d has expired (%s): telling the client"
                    " to relist.",
                    watch.resource.group_resource,
                    position,
                    e.message,
                )
                await response.write(error_line(e))
                return
            if not events:
                # Caught up with no await since reading the history: the inbox takes over.
                watcher.behind = False
                watcher.queue.clear()
                continue
            position = events[-1].rv
            lines = [line for e in events if (line := translate(watch, e)) is not None]
        elif watcher.queue:
            while watcher.queue:
                event = watcher.queue.popleft()
                if event.rv <= position:
                    continue
                position = event.rv
                line = translate(watch, event)
                if line is not None:
                    lines.append(line)
        else:
            # Nothing pending: every event up to now that concerns this watch has been sent.
            position = max(position, store.rv)
            now = loop.time()
            if now >= deadline:
                return
            if watch.bookmarks and now >= next_bookmark:
                await response.write(bookmark(watch.resource, position))
                next_bookmark = loop.time() + bookmark_interval
                continue
            wake = deadline if not watch.bookmarks else min(deadline, next_bookmark)
            watcher.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(watcher.wake.wait(), timeout=max(0.0, wake - now))
            continue
        if lines:
            await _write_batches(response, lines, watch)


def _tabled(line: bytes, as_table: Callable[[dict[str, Any]], dict[str, Any]]) -> bytes:
    event = json.loads(line)
    if event["type"] in (ADDED, MODIFIED, DELETED):
        event["object"] = as_table(event["object"])
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


async def _write_batches(
    response: web.StreamResponse, lines: list[bytes], watch: WatchRequest
) -> None:
    if watch.as_table is not None:
        lines = [_tabled(line, watch.as_table) for line in lines]
    for start in range(0, len(lines), 500):
        await response.write(b"".join(lines[start : start + 500]))
