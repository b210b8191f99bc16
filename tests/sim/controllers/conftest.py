"""The simulated controller manager over the test's API server, started and synced."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sim.apiserver import RunningApiServer
from sim.controllers.manager import ControllerManager


@pytest.fixture
def manager(apiserver: RunningApiServer) -> Iterator[ControllerManager]:
    api = apiserver.api_client()
    running = ControllerManager(api, clock=apiserver.clock.now)
    running.start()
    try:
        assert running.wait_synced(10)
        yield running
    finally:
        running.stop()
        api.close()  # type: ignore[no-untyped-call]
