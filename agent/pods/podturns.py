"""This node's pod events, handed from the watch's thread to the agent's loop in turns by
namespace.

A tenant can rewrite its own pods (its model host's annotation among them) as fast as the API
server takes it, and each event costs the agent a reading of the pod. So events wait here, one
per pod (a later event of a pod replaces the one waiting, an addition staying one: the agent
acts on a pod's state, not on its history), and the loop takes them a batch at a time, one
namespace's oldest waiting pod after another's: a namespace writing a thousand times a second
has one pod's event taken per round, the same as a namespace writing once. A list (the watch
starting again) replaces every event waiting, which it includes. Thread-safe; no I/O.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

JsonObject = dict[str, Any]


class PodTurns:
    """Pod events waiting for the loop, by namespace and pod."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listed: list[JsonObject] | None = None
        self._waiting: dict[str, dict[str, tuple[str, JsonObject]]] = {}
        """Namespace -> pod name -> its latest event (kind, object), oldest pod first."""
        self._turns: deque[str] = deque()
        """The namespaces with events waiting, in the order they take their turns."""
        self._busy = False
        """The loop has a take scheduled (`put` and `listed` said so once)."""

    def listed(self, items: list[JsonObject]) -> bool:
        """The watch listed the pods: every event waiting is older. True when the loop must be
        asked to take."""
        with self._lock:
            self._listed = items
            self._waiting.clear()
            self._turns.clear()
            return self._wake()

    def put(self, kind: str, obj: JsonObject) -> bool:
        """An event of the watch; True when the loop must be asked to take."""
        metadata = obj.get("metadata") or {}
        namespace, name = str(metadata.get("namespace", "")), str(metadata.get("name", ""))
        with self._lock:
            waiting = self._waiting.get(namespace)
            if waiting is None:
                waiting = self._waiting[namespace] = {}
                self._turns.append(namespace)
            before = waiting.pop(name, None)
            if before is not None and before[0] == "ADDED" and kind == "MODIFIED":
                kind = "ADDED"  # the loop has not seen the pod yet: still an addition
            waiting[name] = (kind, obj)
            return self._wake()

    def _wake(self) -> bool:
        if self._busy:
            return False
        self._busy = True
        return True

    def take(self, most: int) -> tuple[list[JsonObject] | None, list[tuple[str, JsonObject]], bool]:
        """A list to apply first (None when none came), then at most `most` events, one per
        namespace in turn; and whether more wait (then the caller takes again later, else the
        next event asks it to)."""
        with self._lock:
            listed, self._listed = self._listed, None
            events: list[tuple[str, JsonObject]] = []
            while len(events) < most and self._turns:
                namespace = self._turns.popleft()
                waiting = self._waiting[namespace]
                events.append(waiting.pop(next(iter(waiting))))
                if waiting:
                    self._turns.append(namespace)
                else:
                    del self._waiting[namespace]
            more = bool(self._turns)
            self._busy = more
            return listed, events, more
