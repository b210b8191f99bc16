"""`pip install tritonshare` is the CLI: its dependencies are what `tritonshare` imports, and
the parts' own (gRPC, Triton's client, NVML, aiohttp, ...) come with the `server` extra, which
the image and the test environment install."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
SERVER_ONLY = (
    *("grpc", "google.protobuf", "prometheus_client", "aiohttp"),
    *("tritonclient", "uvloop", "hpack", "pynvml"),
)


def _names(requirements: list[str]) -> set[str]:
    return {r.split("[")[0].split(">")[0].split("<")[0].split("=")[0].strip() for r in requirements}


def test_the_cli_needs_only_the_base_dependencies() -> None:
    """The CLI runs (`--help` of each command) with every server-only library hidden."""
    hide = f"""
import importlib.abc, sys
class Hidden(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if any(name == h or name.startswith(h + ".") for h in {SERVER_ONLY!r}):
            raise ImportError(f"{{name}} is not installed with the CLI")
sys.meta_path.insert(0, Hidden())
from binder.cli.main import main
for argv in (["--help"], ["status", "--help"], ["explain", "--help"], ["quarantine", "--help"]):
    try:
        main(argv)
    except SystemExit as e:
        assert e.code == 0, (argv, e.code)
"""
    done = subprocess.run(
        [sys.executable, "-c", hide], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "status" in done.stdout


def test_the_parts_dependencies_are_the_server_extra() -> None:
    base = _names(PROJECT["dependencies"])
    assert base == {"kubernetes", "pyyaml", "numpy"}
    server = _names(PROJECT["optional-dependencies"]["server"])
    assert {"grpcio", "protobuf", "aiohttp", "tritonclient", "nvidia-ml-py"} <= server
    # The demo runs the parts; the tests run the demo's simulated cluster.
    assert "tritonshare[server]" in PROJECT["optional-dependencies"]["demo"]
    assert "tritonshare[demo]" in PROJECT["optional-dependencies"]["test"]
    demo = _names(PROJECT["optional-dependencies"]["demo"])
    assert {"nvidia-pytriton", "cel-python", "onnx", "onnxruntime"} <= demo
    assert not demo & {"pytest", "mypy", "moto", "helm-python-sdk"}, "test tools stay in test"
    assert "pip install '.[server]'" in (ROOT / "Dockerfile").read_text()


def test_make_installs_with_uv_and_falls_back_to_pip() -> None:
    """`make demo` and `make test` install their extra with uv, installed into the venv (minutes
    less than pip from PyPI: docs/results.md), and with pip where uv cannot be had or fails."""
    for target, extra in (("demo", "demo"), ("venv", "test")):
        done = subprocess.run(
            ["make", "-n", "-B", target, "VENV=/nowhere/venv"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        python = "/nowhere/venv/bin/python"
        uv = (
            f"{python} -m uv pip install --quiet --compile-bytecode --python {python} "
            f"-e '.[{extra}]'"
        )
        pip = f"{python} -m pip install --quiet -e '.[{extra}]'"
        assert f"{python} -m pip install --quiet --disable-pip-version-check uv" in done.stdout
        assert f"&& {uv} || {{" in done.stdout, done.stdout
        assert pip in done.stdout.split(uv, 1)[1], done.stdout
