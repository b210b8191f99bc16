"""tests/gpu/run_on_gpu.sh without a GPU: its environment for the Python backend's stub (numpy<2
first on PATH, built from the carried wheels), its Triton start in dry-run mode, and its pytest
run that needs neither the project's pytest configuration nor its plugins."""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).with_name("run_on_gpu.sh")
ROOT = SCRIPT.parents[2]


def fake_python(path: Path, *, extra: str = "", flags: str = "") -> Path:
    """A python3 for the venv the script would build: this test's Python, with `flags`, and
    `extra` first on its PYTHONPATH; `-m pip` is recorded, never run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = -m ] && [ "$2" = pip ]; then echo "$@" >>"{path}.pip"; exit 1; fi\n'
        f'PYTHONPATH="{extra}${{PYTHONPATH:+:$PYTHONPATH}}" exec {sys.executable} {flags} "$@"\n'
    )
    path.chmod(0o755)
    return path


def script(tmp_path: Path, *argv: str, dry: bool = False) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "GPU_ROOT": str(tmp_path / "gpu"),
        "OUT": str(tmp_path / "out"),
        "CARRY": str(tmp_path / "carry"),
        "DRY_RUN": "1" if dry else "",
    }
    return subprocess.run(
        ["bash", str(SCRIPT), *argv], capture_output=True, text=True, env=env, timeout=120
    )


def test_the_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=30)


def test_a_venv_with_numpy_1_is_put_first_on_path_for_the_stub(tmp_path: Path) -> None:
    venv_python = fake_python(tmp_path / "gpu" / "venv" / "bin" / "python3")
    result = script(tmp_path, "env")
    assert result.returncode == 0, result.stderr
    said = (tmp_path / "out" / "stub-env.txt").read_text()
    assert f"takes its packages from {venv_python}: numpy 1." in said, said
    assert not Path(f"{venv_python}.pip").exists(), "nothing to install"


def test_missing_packages_are_installed_from_the_carried_wheels(tmp_path: Path) -> None:
    # -S: no site-packages, so numpy and the rest are missing from this python.
    venv_python = fake_python(tmp_path / "gpu" / "venv" / "bin" / "python3", flags="-S")
    (tmp_path / "carry" / "wheels").mkdir(parents=True)
    result = script(tmp_path, "env", dry=True)
    assert result.returncode == 0, result.stderr
    wheels = tmp_path / "carry" / "wheels"
    assert (
        f"would run: {venv_python} -m pip install -q --no-index --find-links {wheels} "
        f"numpy==1.26.4 tritonclient==2.73.0 protobuf==6.33.6 aiohttp==3.14.5" in result.stdout
    ), result.stdout
    assert f"python3 first on PATH: {venv_python}" in result.stdout


def test_numpy_2_in_the_stubs_python_is_refused(tmp_path: Path) -> None:
    """The stub with numpy 2 answers nothing right: the script installs numpy<2, and stops when
    it cannot."""
    numpy2 = tmp_path / "numpy2"
    (numpy2 / "numpy").mkdir(parents=True)
    (numpy2 / "numpy" / "__init__.py").write_text('__version__ = "2.1.3"\n')
    venv_python = fake_python(tmp_path / "gpu" / "venv" / "bin" / "python3", extra=str(numpy2))
    result = script(tmp_path, "env")
    assert result.returncode == 1
    assert "cannot install numpy==1.26.4 tritonclient" in result.stderr, result.stderr
    assert "numpy==1.26.4" in Path(f"{venv_python}.pip").read_text()


def test_triton_starts_with_the_venv_first_on_path(tmp_path: Path) -> None:
    fake_python(tmp_path / "gpu" / "venv" / "bin" / "python3")
    (tmp_path / "carry").mkdir()
    (tmp_path / "carry" / "triton.tar.xz").write_bytes(b"")
    result = script(tmp_path, "triton", dry=True)
    assert result.returncode == 0, result.stderr
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert f"python_backend_stubs/{version}/triton_python_backend_stub" in result.stdout
    assert f"(PATH starts {tmp_path}/gpu/venv/bin)" in result.stdout
    assert "agent/gpus/relay.py --socket" in result.stdout


def test_the_gpu_tests_run_without_the_projects_pytest_config_or_plugins() -> None:
    """As the script runs them, with pytest-asyncio turned off: they are collected and skip (no
    GPU here) instead of stopping with INTERNALERROR."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            "tests/gpu/pytest-gpu.ini",
            "--rootdir",
            ".",
            "--noconftest",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:asyncio",
            "-p",
            "no:xdist",
            "tests/gpu/test_real_gpu.py",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "TRITONSHARE_REQUIRE_GPU": ""},
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "INTERNALERROR" not in result.stdout
    assert "4 skipped" in result.stdout, result.stdout


def test_a_python_inside_a_venv_lends_its_packages_to_the_check_s_venv(tmp_path: Path) -> None:
    """The GPU machine's python3 may itself be a venv's (or uv's): a venv made from it with
    --system-site-packages sees only the base interpreter's packages, so the script lists the
    launching venv's site-packages in a .pth, and nothing is missing."""
    if sys.prefix == sys.base_prefix:
        raise AssertionError("the suite runs in the project's venv (make test)")
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "GPU_ROOT": str(tmp_path / "gpu"),
        "OUT": str(tmp_path / "out"),
        "CARRY": str(tmp_path / "carry"),
        "DRY_RUN": "1",
    }
    result = subprocess.run(
        ["bash", str(SCRIPT), "env"], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "would run" not in result.stdout, result.stdout  # nothing to install
    venv = tmp_path / "gpu" / "venv"
    [pth] = venv.glob("lib/python*/site-packages/zz-tritonshare-launcher.pth")
    assert site.getsitepackages()[0] in pth.read_text().splitlines()
    probe = subprocess.run(
        [str(venv / "bin" / "python3"), "-c", "import pynvml, numpy"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0, probe.stderr
