"""The overall deadline of one fetch, whatever its door (loader/fetch.py, loader/buckets.py): the
time left for a socket to wait, the check made between listing pages, keys and chunks read, and
the one sentence that says it passed. A storage that answers slowly, trickles or lists without
end fails here, however little it sends at a time. Pure but for the clock it is given.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from loader.errors import FetchError

DEFAULT_FETCH_SECONDS = 300.0
"""Seconds one fetch may take in all by default (the loader's --fetch-timeout)."""


def deadline_passed(uri: str, seconds: float) -> FetchError:
    """The failure of a fetch of `uri` that took longer than `seconds`."""
    return FetchError(
        f"{uri} was not fetched within {seconds:g} s (--fetch-timeout): the storage answers too "
        f"slowly or without end; check that the storage URI names the model's own folder or "
        f"archive, and the storage's health"
    )


class Deadline:
    """`seconds` from now for fetching `uri`; `stop`, once set, ends it early."""

    def __init__(
        self,
        uri: str,
        seconds: float,
        stop: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.uri = uri
        self.seconds = seconds
        self._stop = stop
        self._clock = clock
        self._end = clock() + seconds

    def check(self) -> None:
        """Raise FetchError when the fetch was stopped or its deadline has passed."""
        if self._stop is not None and self._stop.is_set():
            raise FetchError(f"the download of {self.uri} was stopped")
        if self._clock() >= self._end:
            raise deadline_passed(self.uri, self.seconds)

    def left(self, at_most: float) -> float:
        """Seconds one wait (a connection, a read) may take: `at_most`, or what is left if less,
        never 0 (a socket takes 0 as never waiting); FetchError once nothing is left."""
        self.check()
        return max(0.001, min(at_most, self._end - self._clock()))
