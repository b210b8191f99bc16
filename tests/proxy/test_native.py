"""The native build (`python -m proxy.native`): built once per session when the sources changed
(started in the background as the session starts: tests/native_build.py), then some of the
proxy's end-to-end tests run again against it.

The rest of the suite runs the pure working tree in process. Here pytest runs a second time, in a
subprocess whose `proxy` package is build/native's (PYTHONPATH first, `python -P` and
`--import-mode=append` so neither the working directory nor the rootdir comes before it), over
`NATIVE_TESTS` (tests/native_build.py, which runs them in the background beside the suite): REST
and gRPC through a real Triton, isolation, the gRPC relay's conformance and edges, HTTP/2's
frames and HPACK, and the gateway. Not among them: tests that monkeypatch the
relays' classes or functions (grpc/test_channel.py, grpc/test_compression.py: a compiled call does
not look the name up again) and http1/test_prepared_heads.py, which checks a cache hit by the
identity of the tuple it returns (compiled, a fixed-length tuple is packed anew on return).

Building needs a C compiler and Python's headers: the tests skip without them on a developer's
machine and fail in CI (`CI=true`), as for any tool.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proxy import native
from tests.conftest import require_tool
from tests.native_build import (
    BUILD_IN_BACKGROUND,
    BuildFailedError,
    in_xdist_worker,
    native_env,
    rerun_in_foreground,
    tools_problem,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="session")
def native_build(pytestconfig: pytest.Config) -> Path:
    """build/native, brought up to date (a hash of the sources when nothing changed)."""
    problem = tools_problem()
    require_tool(not problem, problem)
    building = pytestconfig.stash.get(BUILD_IN_BACKGROUND, None)
    if building is not None:
        try:
            building.wait(timeout=900)
        except BuildFailedError as e:
            pytest.fail(f"the native build failed:\n{e}")
    try:
        native.build()  # up to date after the background build: only the hash is checked
    except subprocess.CalledProcessError as e:
        pytest.fail(f"the native build failed:\n{e.stdout}{e.stderr}")
    return native.DEFAULT_OUT


def test_every_module_of_the_relays_is_compiled_or_left_out_on_purpose() -> None:
    # A module of the relays' folders missing from both lists runs interpreted under the
    # native build, and every call into it from compiled code is a generic Python call
    # (grpc/framing.py was: about 2,500 instructions per renamed gRPC call).
    listed = set(native.COMPILED) | set(native.LEFT_OUT)
    for folder in ("http1", "http2", "grpc", "policy"):
        for path in sorted((native.ROOT / "proxy" / folder).glob("*.py")):
            module = path.relative_to(native.ROOT).as_posix()
            assert module in listed, f"{module} is neither in native.COMPILED nor in LEFT_OUT"


def test_the_native_build_is_what_python_m_proxy_imports(native_build: Path) -> None:
    modules = [path.removesuffix(".py").replace("/", ".") for path in native.COMPILED]
    shown = "; ".join(f"print({m}.__file__)" for m in modules)
    found = subprocess.run(
        [sys.executable, "-P", "-c", f"import {', '.join(modules)}; {shown}"],
        cwd=native.ROOT, env=native_env(native_build), capture_output=True, text=True, check=True,
        timeout=60,
    )  # fmt: skip
    files = found.stdout.split()
    assert len(files) == len(modules)
    for module, file in zip(modules, files, strict=True):
        assert Path(file).is_relative_to(native_build), f"{module} came from {file}"
        assert file.endswith(".so"), f"{module} is not compiled: {file}"
    assert not list((native.ROOT / "proxy").rglob("*.so")), "a .so next to the sources"


def test_the_end_to_end_tests_pass_against_the_native_build(
    native_build: Path, pytestconfig: pytest.Config
) -> None:
    # Run by the background job (tests/native_build.py) beside the suite, which the session
    # started because this test was collected; the build fixture has waited for it. In an xdist
    # worker there is no background job: the other worker keeps the second core busy instead.
    if in_xdist_worker():
        code, output = rerun_in_foreground(native_build, timeout=900)
    else:
        building = pytestconfig.stash.get(BUILD_IN_BACKGROUND, None)
        assert building is not None and building.rerun, "the background job did not run the tests"
        code, output = building.wait(timeout=900)
    assert code == 0, f"against build/native:\n{output[-9000:]}"
