"""The informers: list+watch of one kind each, on a daemon thread, handed to the event loop.

An informer lists once, then watches from the last resourceVersion (kept across reconnects,
advanced by bookmarks) and relists only on 410 Gone. Its thread ends only when asked to: an
unreachable API server (refused, reset, timed out) is tried again about every second, jittered,
for a connection attempt costs a server that is down nothing and the caches must be back in touch
within a second of it answering again; 429 and 5xx, from a server that answers but is
overloaded, mean backing off (doubling from 1 s to 30 s, jittered, or the server's Retry-After);
even an unexpected error is logged and retried. Each informer says since when it has been
failing, for /readyz. What it lists and sees is applied on the loop by its callbacks
(binder.cluster.cache's ClusterCache, the autoscaler's index); it decides nothing.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from binder.api.inbox import Inbox
from binder.api.kube import Kube
from binder.api.listwatch import Kind
from common.kubeapi.errors import ApiError, GoneError, NotFoundError, UnavailableError
from common.kubeapi.session import JsonObject

log = logging.getLogger(__name__)

RETRY_SECONDS = 1.0
RETRY_MAX_SECONDS = 30.0
UNREACHABLE_RETRY_SECONDS = 1.0
"""While the API server cannot be reached, each watch tries again after 50-100 % of this."""
FAILURE_LOG_SECONDS = 30.0
"""While a watch keeps failing, it says so once in this many seconds."""


class Informer:
    """List+watch of one kind on a daemon thread, delivering to the event loop."""

    def __init__(
        self,
        kube: Kube,
        kind: Kind,
        loop: asyncio.AbstractEventLoop,
        *,
        on_list: Callable[[list[JsonObject]], None],
        on_event: Callable[[str, JsonObject], None],
        monotonic: Callable[[], float] = time.monotonic,
        inbox: Inbox,
        optional: bool = False,
    ) -> None:
        """`inbox` (on `loop`) carries the lists and events to the loop. `optional`: a kind the
        cluster may not serve (a CRD not installed): while the list answers 404 the cache
        holds none of it, counts as filled, and asks again every RETRY_MAX_SECONDS."""
        self._kube = kube
        self._optional = optional
        self._absent = False
        self._kind = kind.name
        self.kind = kind.name
        self._source = kind
        self._loop = loop
        self._on_list = on_list
        self._on_event = on_event
        self._stop = threading.Event()
        self.synced = asyncio.Event()
        self.relists = 0
        self.failures = 0
        """Failed lists and watches so far."""
        self._monotonic = monotonic
        self._failing_since: float | None = None
        self._logged_failure_at: float | None = None
        self._thread = threading.Thread(target=self._run, name=f"watch-{kind.name}", daemon=True)
        self._inbox = inbox

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end; the caller cuts open watches with Kube.close_watches()."""
        self._stop.set()

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _deliver(self, callback: Callable[..., None], *args: Any) -> None:
        """Hand a change to the event loop, in order; a burst of changes (from every informer
        and the API writers sharing the inbox) costs the loop one wake-up, not one per event."""
        if not self._inbox.post(self._guarded, callback, *args):
            self._stop.set()  # the loop is closed: we are shutting down

    def _guarded(self, callback: Callable[..., None], *args: Any) -> None:
        if self._stop.is_set():
            return
        try:
            callback(*args)
        except Exception:
            log.exception("Applying a %s change has failed: the cache may be stale.", self._kind)

    def _listed(self, items: list[JsonObject]) -> None:
        self._on_list(items)
        self.synced.set()

    @property
    def absent(self) -> bool:
        """An optional kind the API server does not serve (its last list answered 404)."""
        return self._absent

    def failing_for(self) -> float:
        """Seconds since the list or watch last failed without a success since; 0 when it works."""
        since = self._failing_since
        return 0.0 if since is None else max(0.0, self._monotonic() - since)

    def _should_log_failure(self) -> bool:
        """Whether this failure is worth a log line: the first of an outage, then one every
        FAILURE_LOG_SECONDS, since an unreachable server is tried about every second."""
        now = self._monotonic()
        if self._logged_failure_at is not None and now - self._logged_failure_at < (
            FAILURE_LOG_SECONDS
        ):
            return False
        self._logged_failure_at = now
        return True

    def _working(self) -> None:
        self._logged_failure_at = None
        if self._failing_since is not None:
            log.info(
                "The %s cache is back in touch with the API server after %.0f s.",
                self._kind,
                self.failing_for(),
            )
            self._failing_since = None

    def _run(self) -> None:
        version = ""
        delay = RETRY_SECONDS
        while not self._stop.is_set():
            try:
                if not version:
                    items, version = self._kube.list_all(self._source)
                    self.relists += 1
                    self._working()
                    self._deliver(self._listed, items)
                self._absent = False
                for event, obj in self._kube.watch(self._source, version, self._working):
                    if self._stop.is_set():
                        return
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if event != "BOOKMARK":
                        self._deliver(self._on_event, event, obj)
                delay = RETRY_SECONDS
            except GoneError:
                log.info("The %s watch is too old to resume: relisting.", self._kind)
                version = ""
            except Exception as e:  # the thread must outlive every failure, even a bug
                if self._stop.is_set():
                    return
                if self._optional and isinstance(e, NotFoundError):
                    if not self._absent:
                        self._absent = True
                        log.info("The API server serves no %s: none are placed.", self._kind)
                        self._deliver(self._listed, [])
                    version = ""
                    self._stop.wait(RETRY_MAX_SECONDS)
                    continue
                self.failures += 1
                if self._failing_since is None:
                    self._failing_since = self._monotonic()
                wait = _retry_wait(e, delay)
                if isinstance(e, ApiError | OSError | ValueError):
                    if self._should_log_failure():
                        log.warning(
                            "Watching %s has failed (%s): the cache keeps what it has and "
                            "retries in %.1f s (failing for %.0f s).",
                            self._kind,
                            e,
                            wait,
                            self.failing_for(),
                        )
                else:
                    log.exception(
                        "Watching %s has failed unexpectedly: the cache keeps what it has and "
                        "retries in %.0f s.",
                        self._kind,
                        wait,
                    )
                self._stop.wait(wait)
                if not _unreachable(e):
                    delay = min(delay * 2, RETRY_MAX_SECONDS)


def _unreachable(e: Exception) -> bool:
    """The API server did not answer at all (status 0: refused, reset, timed out)."""
    return isinstance(e, UnavailableError) and e.status == 0


def _retry_wait(e: Exception, delay: float) -> float:
    """How long a watch waits after `e`, jittered so the informers (and replicas) do not retry
    in step: about a second while the server is unreachable, `delay` (or the server's
    Retry-After, if longer) while it answers with errors."""
    if _unreachable(e):
        return UNREACHABLE_RETRY_SECONDS * random.uniform(0.5, 1.0)  # noqa: S311 (not security)
    if isinstance(e, UnavailableError) and e.retry_after is not None:
        return max(delay, e.retry_after)
    return delay * random.uniform(0.5, 1.0)  # noqa: S311 (jitter, not security)
