"""One run of the demo scenario, shared by the end-to-end tests (it takes about two minutes)."""

from __future__ import annotations

import pytest

from sim.demo.report import DemoResult
from sim.demo.run import run_demo
from sim.triton import TritonInstall


@pytest.fixture(scope="session")
def demo_run(
    tmp_path_factory: pytest.TempPathFactory, triton_install: TritonInstall
) -> tuple[DemoResult, str]:
    """The demo's result and its transcript. Every process it starts is stopped before it
    returns, so the per-test leak guard holds."""
    lines: list[str] = []
    result = run_demo(tmp_path_factory.mktemp("demo"), lines.append)
    return result, "\n".join(lines)
