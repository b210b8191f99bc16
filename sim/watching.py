"""One watch loop for the simulated cluster's controllers (the kubelet, the controller manager,
the Service-style endpoints): the official client's watch, resumed from the last resourceVersion
it saw every time the server ends it, bookmarks taken for their version only, until `stop` is
set. A watch the server refuses (an ERROR event, such as 410 Gone) raises, so the caller lists
again."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import watch

JsonObject = dict[str, Any]


def watch_events(
    list_call: Callable[..., Any],
    stop: threading.Event,
    resource_version: str,
    *args: Any,
    **selectors: Any,
) -> Iterator[tuple[str, JsonObject]]:
    """(type, object) of each change `list_call(*args, **selectors)` watches, from
    `resource_version` on, until `stop` is set."""
    while not stop.is_set():
        stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
            list_call,
            *args,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=2,
            _request_timeout=10,
            **selectors,
        )
        for event in stream:
            if stop.is_set():
                return
            raw = event["raw_object"]
            if event["type"] == "ERROR":
                raise RuntimeError(f"watch error {raw.get('code')}: {raw.get('message')}")
            resource_version = raw["metadata"]["resourceVersion"]
            if event["type"] != "BOOKMARK":
                yield event["type"], raw
