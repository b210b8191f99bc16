"""How the suite splits between pytest-xdist workers (`make test` runs `-n 3 --dist loadfile`).

A worker takes whole files, so a module-scoped fixture (a real Triton, a gateway, a simulated
cluster) starts once per file, not once per worker. The files that read the demo's run
(`demo_run`, about two minutes) go to one worker together, so the demo runs once per session;
they go first after the workers' first files, with the end-to-end tests, whose minute-long
waits then overlap the rest of the suite instead of ending it. Without xdist this plugin does
nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

DEMO_READERS = frozenset(
    {"tests/e2e/test_demo.py", "tests/e2e/test_rbac.py", "tests/e2e/test_metric_names.py"}
)
"""The test files whose tests request the session's `demo_run`: one work unit."""

FIRST = ("demo", "tests/proxy/test_native.py", "tests/e2e/")
"""Units handed out before the others, in this order (by prefix): the longest ones, so that
none of them is left to run alone at the end (the native build compiles for a minute or two
before its tests run again)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker, fail at collection when a file outside `DEMO_READERS` reads the
    demo: its worker would run the demo a second time."""
    if not hasattr(config, "workerinput"):
        return
    strays = sorted(
        {
            item.nodeid.partition("::")[0]
            for item in items
            if "demo_run" in getattr(item, "fixturenames", ())
        }
        - DEMO_READERS
    )
    if strays:
        raise pytest.UsageError(
            f"{', '.join(strays)} read demo_run: add them to DEMO_READERS in tests/parallel.py "
            "so that the demo runs once per session under xdist"
        )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile`, with the demo's readers as one unit and `FIRST` handed out first."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling  # type: ignore[import-untyped]

    class Scheduling(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.partition("::")[0]
            return "demo" if path in DEMO_READERS else path

        def schedule(self) -> None:
            super().schedule()
            # The first units are out already; reorder what is left (a stable sort).
            units = sorted(self.workqueue.items(), key=lambda unit: _rank(unit[0]))
            self.workqueue.clear()
            self.workqueue.update(units)

    config.option.loadscopereorder = False  # the collection's order, but for `FIRST`
    return Scheduling(config, log)


def _rank(scope: str) -> int:
    """The place of `scope` in `FIRST`; after them all when it is in none."""
    return next((i for i, prefix in enumerate(FIRST) if scope.startswith(prefix)), len(FIRST))
